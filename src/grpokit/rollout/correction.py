"""vLLM's importance-sampling correction: where the policy's old log-probabilities come from, and the weights and
`sampling/*` metrics computed from them.

The correction compares the policy's log-probabilities of the sampled tokens *before any update* (`old_logps`) with
the sampler's own. TRL 1.16 scores them in a separate no-grad pass right after generation, every round. When updates
are on-policy (every micro-batch of the round is trained inside one optimizer step, each once) the weights cannot
change between generation and the loss, so the training forward's own log-probabilities, detached, are those old
log-probabilities: the correction is then computed in the loss step (`LossStepCorrection`) and the separate pass is
skipped. The weights are the same function of the same numbers; the metrics are reduced over the same rows (the
whole generation batch of each process, then over processes), so they are logged as the separate pass logs them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from grpokit.algorithms import vllm_importance_weights, vllm_sampling_metrics
from grpokit.algorithms.importance_sampling import sampler_mismatch, sampler_mismatch_metrics, sequence_rejections

REDUCTIONS = {"mean": "mean", "min": "amin", "max": "amax"}


def sampling_correction(old_logps, sampling_logps, loss_mask, settings, dist) -> dict:
    """The vLLM importance weights (under "ratio") and TRL's `sampling/*` metrics of one process's generation batch,
    with grpokit's `sampler/*` ones, reduced over processes. Empty when either log-probability is missing; without a
    correction (`settings.importance_sampling_mode` None) only the `sampler/*` metrics."""
    if sampling_logps is None or old_logps is None:
        return {}
    if settings.importance_sampling_mode is None:
        return _reduced_metrics(old_logps, sampling_logps, loss_mask, None, settings, dist)
    ratio = _weights(old_logps, sampling_logps, loss_mask, settings)
    return {"ratio": ratio, **_reduced_metrics(old_logps, sampling_logps, loss_mask, ratio, settings, dist)}


def _weights(old_logps, sampling_logps, loss_mask, settings) -> Tensor:
    """`vllm_importance_weights` with the settings' mode, clipping bounds and geometric mean, times 0 for the
    sequences grpokit's KL rejection or token veto throw out (when set)."""
    weights = vllm_importance_weights(
        old_logps,
        sampling_logps,
        loss_mask,
        mode=settings.importance_sampling_mode,
        clip_min=settings.importance_sampling_clip_min,
        clip_max=settings.importance_sampling_clip_max,
        geometric=settings.importance_sampling_geometric,
    )
    if _rejects(settings):
        weights = weights * _rejections(old_logps, sampling_logps, loss_mask, settings)[0]
    return weights


def _rejects(settings) -> bool:
    return settings.sampler_kl_threshold is not None or settings.sampler_token_veto is not None


def _rejections(old_logps, sampling_logps, loss_mask, settings):
    return sequence_rejections(
        old_logps,
        sampling_logps,
        loss_mask,
        kl_threshold=settings.sampler_kl_threshold,
        kl_estimator=settings.sampler_kl_estimator,
        kl_reduction=settings.sampler_kl_reduction,
        token_veto=settings.sampler_token_veto,
    )


def _reduced_metrics(old_logps, sampling_logps, loss_mask, ratio, settings, dist) -> dict[str, float]:
    """TRL's `sampling/*` metrics (with a correction: `ratio` its weights) and grpokit's `sampler/*` ones."""
    mode = settings.importance_sampling_mode
    out = {}
    if mode is not None:
        stats = vllm_sampling_metrics(old_logps, sampling_logps, loss_mask, ratio, mode=mode)
        for name, (value, reduction) in stats.items():
            gathered = dist.gather(value.reshape(1).float())
            out[name] = getattr(gathered, REDUCTIONS[reduction])().item()
    sums, log_ratios = sampler_mismatch(
        old_logps,
        sampling_logps,
        loss_mask,
        mode=mode,
        clip_min=settings.importance_sampling_clip_min,
        clip_max=settings.importance_sampling_clip_max,
        geometric=settings.importance_sampling_geometric,
    )
    sums = dist.gather(sums.reshape(1, -1)).sum(dim=0)
    log_ratios = dist.gather_padded(log_ratios, pad_value=float("inf"))
    out.update(sampler_mismatch_metrics(sums, log_ratios, mode))
    if mode is not None and _rejects(settings):
        _, kl_rejected, vetoed = _rejections(old_logps, sampling_logps, loss_mask, settings)
        counts = [float(kl_rejected.numel()), float(kl_rejected.sum()), float(vetoed.sum())]
        counts = torch.tensor([counts], dtype=torch.float64, device=old_logps.device)
        sequences, rejected, vetoes = dist.gather(counts).sum(dim=0).tolist()
        if settings.sampler_kl_threshold is not None:
            out["sampler/kl_rejected_fraction"] = rejected / max(sequences, 1.0)
        if settings.sampler_token_veto is not None:
            out["sampler/veto_fraction"] = vetoes / max(sequences, 1.0)
    return out


def has_active_dropout(model: nn.Module) -> bool:
    """Whether the model drops activations in training mode (a `Dropout` module with p > 0, or a config's
    `attention_dropout` > 0): then a training forward is not the deterministic pass the correction needs."""
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    return bool(getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0)


def correction_in_loss_step(mode: str, off_policy: bool, num_iterations: int, model: nn.Module) -> bool:
    """Whether the correction can take its old log-probabilities from the training forward instead of a separate
    pass: always in evaluation (no update between rollout and loss, dropout off); in training when updates are
    on-policy (`off_policy` False: the round's micro-steps fall inside one optimizer step), each micro-batch is
    trained on once (`num_iterations` 1), and the model has no active dropout (a second forward would draw other
    masks, so TRL's separate pass would give other numbers)."""
    if mode != "train":
        return True
    return not off_policy and num_iterations == 1 and not has_active_dropout(model)


class LossStepCorrection:
    """The correction computed in the loss step, from the training forward's detached log-probabilities.

    `weights` is called once per micro-batch of a round, in order; it returns the micro-batch's importance weights
    (exactly `vllm_importance_weights` of them: the weights are per row), and, at the round's last micro-batch,
    the round's `sampling/*` metrics over all its rows, reduced over processes as the separate pass reduces them
    (every process calls it the same number of times). `reset` at each new round: nothing is kept between rounds.
    """

    def __init__(self, dist):
        self._dist = dist
        self._rows: list[tuple[Tensor, ...]] = []

    def __call__(
        self, logps: Tensor, inputs: dict, loss_mask: Tensor, settings, *, parts: int, metrics
    ) -> Tensor | None:
        """The importance weights of this micro-batch (`inputs`, a micro-batch without old log-probabilities), or
        None when the correction is off or the backend gave no sampling logprobs. At the round's last micro-batch
        (the `parts`-th call) the round's metrics are appended to `metrics` (name -> list): TRL's `sampling/*`
        with a correction, grpokit's `sampler/*` whenever the backend gave sampling logprobs."""
        sampling_logps = inputs.get("sampling_logps")
        if sampling_logps is None:
            return None
        ratio, stats = self.weights(logps, sampling_logps, loss_mask, settings, parts)
        for name, value in stats.items():
            metrics[name].append(value)
        return ratio

    def weights(
        self, logps: Tensor, sampling_logps: Tensor, loss_mask: Tensor, settings, parts: int
    ) -> tuple[Tensor, dict[str, float]]:
        """(weights for this micro-batch (None without a correction), the round's metrics or {} before its last of
        `parts` micro-batches)."""
        logps = logps.detach()
        ratio = (
            None if settings.importance_sampling_mode is None else _weights(logps, sampling_logps, loss_mask, settings)
        )
        self._rows.append((logps, sampling_logps, loss_mask, ratio))
        if len(self._rows) < parts:
            return ratio, {}
        columns = [
            None if any(p is None for p in parts_) else torch.cat(parts_, dim=0)
            for parts_ in zip(*self._rows, strict=True)
        ]
        self._rows = []
        return ratio, _reduced_metrics(*columns, settings, self._dist)

    def reset(self) -> None:
        """Drop a partial round (a new round starts before the last one was trained to its end)."""
        self._rows = []
