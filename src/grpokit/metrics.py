"""The trainer's metric buffers between two log calls, and the reductions that make every value the same on every
process: means over the active tokens of all processes, min / max over all sequences, sums of what reward functions
logged.

Values are buffered per mode (`"train"`, `"eval"`) as one float per micro-step or round; a log row is the mean of
each buffer over the interval, NaN values left out.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import Tensor

from .algorithms.diagnostics import SEQ_MAX, SEQ_MIN, Diagnostics
from .dist import LOCAL, Collective

MODES = ("train", "eval")


class MetricBuffers:
    """`buffers[mode][name]` is the list of values logged since the last log row.

    Args:
        dist: the cross-process operations the reductions use.
        device: where the tensors of a reduction go (the accelerator's device).
    """

    def __init__(self, dist: Collective = LOCAL, device: torch.device | str | None = None):
        self.dist = dist
        self.device = device
        self._modes = {mode: defaultdict(list) for mode in MODES}
        self._reported = defaultdict(list)  # from reward functions' log_metric, until the round is recorded

    def __getitem__(self, mode: str) -> defaultdict:
        return self._modes[mode]

    def __setitem__(self, mode: str, values: defaultdict) -> None:
        self._modes[mode] = values

    # ---------------------------------------------------------------------------------------------- reductions

    def global_mean(self, values: Tensor, mask: Tensor) -> float:
        """Mean over the active tokens of all processes (over sequences for per-sequence `(B, 1)` values)."""
        if values.size(1) == 1:
            stats = torch.stack([values.sum(), torch.tensor(float(values.size(0)), device=values.device)])
        else:
            stats = torch.stack([(values * mask).sum(), mask.sum().float()])
        total = self.dist.sum(stats.float())
        return (total[0] / total[1].clamp(min=1.0)).item()

    def gathered_mean(self, value: Tensor, *, skip_nan: bool = False) -> float:
        """Mean over processes of a per-process scalar (NaN ones left out with `skip_nan`)."""
        gathered = self.dist.gather(value.detach())
        return (gathered.nanmean() if skip_nan else gathered.mean()).item()

    def _sequence_extreme(self, values: Tensor, mask: Tensor, reduction: str) -> float:
        # Min or max over all processes' sequences of the per-sequence mean; sequences without tokens (NaN) left out.
        per_sequence = values.squeeze(1) if values.size(1) == 1 else (values * mask).sum(-1) / mask.sum(-1)
        gathered = self.dist.gather(per_sequence)
        gathered = gathered[~torch.isnan(gathered)]
        pick = torch.min if reduction == SEQ_MIN else torch.max
        return pick(gathered).item() if gathered.numel() else float("nan")

    # ---------------------------------------------------------------------------------------------- recording

    def add_diagnostics(self, mode: str, diagnostics: Diagnostics, mask: Tensor) -> None:
        """One value per diagnostic of `algorithms.diagnostics`, reduced over processes as each one asks."""
        for name, (values, reduction) in diagnostics.items():
            if reduction in (SEQ_MIN, SEQ_MAX):
                self._modes[mode][name].append(self._sequence_extreme(values, mask, reduction))
            else:
                self._modes[mode][name].append(self.global_mean(values, mask))

    def report(self, name: str, value: float) -> None:
        """A scalar a reward function logged (its `log_metric`); averaged over processes by `add_reported`."""
        self._reported[name].append(value)

    def add_reported(self, mode: str) -> None:
        """The reward functions' scalars of this round, averaged over processes (every process takes part in the
        reduction of every name, even one it did not log)."""
        for name in sorted(set(self.dist.gather_object(list(self._reported)))):
            values = self._reported.get(name, [])
            total = self.dist.sum(torch.tensor([sum(values), len(values)], device=self.device).float())
            self._modes[mode][name].append((total[0] / total[1].clamp(min=1)).item())
        self._reported.clear()

    def interval_means(self, mode: str) -> dict[str, float]:
        """The mean of each buffer of `mode`. A metric that is NaN in one batch (e.g. every reward None) must not
        poison the whole interval; NaN in every batch is logged as NaN (as TRL does)."""
        means = {}
        for name, values in self._modes[mode].items():
            valid = [v for v in values if not math.isnan(v)]
            means[name] = sum(valid) / len(valid) if valid else math.nan
        return means
