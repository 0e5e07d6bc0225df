"""TRL 1.16's asynchronous-trainer metrics that describe a step rather than the loss: what a batch held (`batch/*`,
`sample/*_tokens_*`), where a step's time went (`perf/*`), and how far the policy is from the sampler (`ratio`,
`kl`), under TRL's names. grpokit trains one sample per row (no packing), so a row's tokens are one sample's.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from transformers import TrainerCallback

from grpokit.rollout.correction import LossStepCorrection

from .samples import split


def batch_metrics(samples, padded_tokens: int) -> dict[str, object]:
    """One step's batch as TRL logs it; `padded_tokens`: the positions the padded batch forwards (all processes)."""
    forwarded = [len(s.input_ids) for s in samples]
    trained = [int(np.asarray(s.completion_mask).sum()) for s in samples]
    return {
        "batch/samples_per_step": float(len(samples)),
        "batch/groups_per_step": float(len({s.group_id for s in samples})),
        "batch/forwarded_tokens_per_step": float(sum(forwarded)),
        "batch/trained_tokens_per_step": float(sum(trained)),
        "batch/masked_token_frac": (float(sum(forwarded) - sum(trained)), float(sum(forwarded))),
        "batch/pad_frac": (float(padded_tokens - sum(forwarded)), float(padded_tokens)),
        "batch/row_tokens_mean": sum(forwarded) / len(forwarded),
        "batch/row_tokens_max": float(max(forwarded)),
        "sample/forwarded_tokens_mean": sum(forwarded) / len(forwarded),
        "sample/forwarded_tokens_max": float(max(forwarded)),
        "sample/trained_tokens_mean": sum(trained) / len(trained),
    }


class SamplerDistance(LossStepCorrection):
    """The loss step's importance-sampling correction, also logging TRL's `ratio` (pi / pi_sampler, token mean) and
    `kl` (the k3 estimate (r - 1) - log r of KL(sampler || pi), token mean), over every process's trained tokens."""

    def __init__(self, dist, metric_buffers):
        super().__init__(dist)
        self.metric_buffers = metric_buffers

    def __call__(self, logps, inputs, loss_mask, settings, *, parts: int, metrics):
        sampling = inputs.get("sampling_logps")
        if sampling is not None:
            log_ratio = (logps.detach() - sampling).clamp(-20.0, 20.0) * loss_mask
            ratio = torch.exp(log_ratio)
            metrics["ratio"].append(self.metric_buffers.global_mean(ratio, loss_mask))
            metrics["kl"].append(self.metric_buffers.global_mean(ratio - 1 - log_ratio, loss_mask))
        return super().__call__(logps, inputs, loss_mask, settings, parts=parts, metrics=metrics)


class StepClock(TrainerCallback):
    """`perf/step_s` (between two step ends), `perf/optimizer_s`, `perf/fwd_bwd_s` (the micro-steps' forward and
    backward) and the token rates over both, as TRL logs them."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.last_end = self.optimizer_started = None
        self.optimizer_s = 0.0

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer_started = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.optimizer_started is not None:
            self.optimizer_s += time.perf_counter() - self.optimizer_started

    def on_step_end(self, args, state, control, **kwargs):
        now, trainer = time.perf_counter(), self.trainer
        metrics = trainer._metrics["train"]
        fwd_bwd = (metrics.get("step_time") or [0.0])[-1]  # the synchronous trainer's: this step's micro-steps
        tokens = trainer._step_tokens  # (forwarded, trained) of this step's batch
        metrics["perf/optimizer_s"].append(self.optimizer_s)
        metrics["perf/fwd_bwd_s"].append(fwd_bwd)
        if tokens is not None and fwd_bwd:
            metrics["perf/forwarded_tok_s_fwd_bwd"].append((tokens[0], fwd_bwd))
        if self.last_end is not None:
            step = now - self.last_end
            metrics["perf/step_s"].append(step)
            if tokens is not None:
                metrics["perf/forwarded_tok_s_wall_clock"].append((tokens[0], step))
                metrics["perf/trained_tok_s_wall_clock"].append((tokens[1], step))
        self.last_end, self.optimizer_s = now, 0.0


def padded_positions(samples: list, processes: int, multiple: int | None) -> int:
    """The positions every process's padded slice of the batch forwards (prompt width + completion width, per row)."""
    share, total = len(samples) // processes, 0
    for start in range(0, len(samples), share):
        parts = [split(s) for s in samples[start : start + share]]
        width = max(len(p) for p, *_ in parts), max(len(c) for _, c, *_ in parts)
        if multiple:
            width = tuple(-(-w // multiple) * multiple for w in width)
        total += sum(width) * len(parts)
    return total
