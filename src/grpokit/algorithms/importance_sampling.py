"""Importance-sampling correction for the gap between the sampler (vLLM) and the trainer, as in TRL 1.16.

vLLM samples a completion with log-probabilities `sampling_logps`; the trainer, scoring the same tokens with the same
weights before any update, gets `old_logps`. The two differ slightly (kernels, precision, batching), so the rollouts
come from a distribution a little off the one the loss assumes. The correction weights the policy term of the loss by
`pi_old / pi_sampler`, bounded to `[clip_min, clip_max]`, with one of four modes:

| mode              | weight shape | log-weight                                  | outside `[clip_min, clip_max]` |
|-------------------|--------------|---------------------------------------------|--------------------------------|
| token_truncate    | `(B, C)`     | `old_logps - sampling_logps` per token      | clamped to the bound           |
| token_mask        | `(B, C)`     | same                                        | set to 0                       |
| sequence_truncate | `(B, 1)`     | sum over the active tokens of the sequence  | clamped to the bound           |
| sequence_mask     | `(B, 1)`     | same                                        | set to 0                       |

A sequence weight is thus the *product* of its token weights (not a geometric mean), so it moves far from 1 on long
completions. Either bound may be None (no bound on that side); a truncate mode needs at least one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

VLLM_IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
SEQUENCE_MODES = ("sequence_truncate", "sequence_mask")
TRUNCATE_MODES = ("token_truncate", "sequence_truncate")

# How the trainer combines the per-process values over processes (one 0-dim value per process).
PROCESS_MEAN, PROCESS_MIN, PROCESS_MAX = "mean", "min", "max"

SamplingMetrics = dict[str, tuple[Tensor, str]]


def _check_mode(mode: str) -> None:
    if mode not in VLLM_IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"mode must be one of {VLLM_IMPORTANCE_SAMPLING_MODES}, got {mode!r}")


@torch.no_grad()
def vllm_importance_weights(
    old_logps: Tensor,
    sampling_logps: Tensor,
    completion_mask: Tensor,
    *,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
    geometric: bool = False,
) -> Tensor:
    """Weights `pi_old / pi_sampler` that correct the policy loss for the sampler's mismatch, without gradient.

    The per-token log-difference `old_logps - sampling_logps` is zeroed where `completion_mask` is 0 and where it is
    NaN (a token vLLM could not score), so such tokens weigh exactly 1 in the token modes and add nothing to a
    sequence's sum. Then: token modes exponentiate each token's difference; sequence modes exponentiate the sum over
    the row (an all-masked row gets 1). `*_truncate` clamps the weight into `[clip_min, clip_max]`; `*_mask` sets the
    weights outside it to 0 (strictly outside: a weight equal to a bound is kept). A None bound leaves that side open.

    Padded positions are not special-cased after the exponential: in token modes they start at `exp(0) = 1` and then go
    through the same clamp / mask as any token (so they stay 1 unless `clip_min > 1` or `clip_max < 1`). The loss
    never reads them through its reductions, but VESPO sums `log(weight)` over every position, exactly as TRL does.

    Args:
        old_logps: `(B, C)` log-probabilities of the sampled tokens under the trainer's model before the update.
        sampling_logps: `(B, C)` log-probabilities vLLM reported for the same tokens (NaN where unavailable; padding
            may hold anything).
        completion_mask: `(B, C)` 1 for tokens that count (completion mask times tool mask, if any), else 0.
        mode: one of `VLLM_IMPORTANCE_SAMPLING_MODES`.
        clip_min: lower bound, or None for none.
        clip_max: upper bound, or None for none.
        geometric: sequence modes only: the sequence's log-weight is the *mean* of its tokens' differences (the
            geometric mean of the token weights), not their sum; the mean is over the active tokens whose difference
            is known (an all-masked row gets 1). A grpokit extension: it does not grow with the length.

    Returns:
        `(B, C)` for the token modes, `(B, 1)` for the sequence modes, in `old_logps`'s dtype.
    """
    _check_mode(mode)
    if mode in TRUNCATE_MODES and clip_min is None and clip_max is None:
        raise ValueError(f"mode {mode!r} needs clip_min or clip_max (or both)")
    mask = completion_mask.to(old_logps.dtype)
    # Multiply first, then drop NaN: a NaN in a padded position (NaN * 0) must vanish too.
    log_diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode in SEQUENCE_MODES:
        if geometric:
            known = (mask * ~torch.isnan(sampling_logps)).sum(dim=-1, keepdim=True).clamp(min=1)
            log_diff = log_diff.sum(dim=-1, keepdim=True) / known
        else:
            log_diff = log_diff.sum(dim=-1, keepdim=True)
    weights = log_diff.exp()
    if mode in TRUNCATE_MODES:
        return weights.clamp(min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return weights.masked_fill((weights < low) | (weights > high), 0.0)


@torch.no_grad()
def vllm_sampling_metrics(
    old_logps: Tensor,
    sampling_logps: Tensor,
    completion_mask: Tensor,
    importance_weights: Tensor,
    *,
    mode: str,
) -> SamplingMetrics:
    """TRL 1.16's `sampling/*` metrics of one process: how far vLLM's log-probabilities are from the trainer's, and the
    weights `vllm_importance_weights` returned.

    Each value is a 0-dim tensor for *this process*, paired with how TRL combines the processes' values: gather one
    value per process, then take their plain mean (`PROCESS_MEAN`), min (`PROCESS_MIN`) or max (`PROCESS_MAX`). That is
    a mean of per-process means, not a mean over all tokens. TRL ignores NaN when combining the ratio metrics; these
    values are never NaN, so a plain min / mean / max gives the same result.

    - `sampling/sampling_logp_difference/mean` (mean), `.../max` (max): `|old_logps - sampling_logps|` over the
      active tokens with a non-NaN difference.
    - `sampling/importance_sampling_ratio/min` (min), `.../mean` (mean), `.../max` (max): the weights after clamping
      or masking, over the active tokens in token modes, over all B sequences (including all-masked ones) in
      sequence modes.

    A process with nothing to measure reports 0 for each metric, and that 0 takes part in the combination.

    Args:
        old_logps, sampling_logps, completion_mask: as given to `vllm_importance_weights`.
        importance_weights: its result, `(B, C)` or `(B, 1)`.
        mode: the mode it was computed with.

    Returns:
        name -> (0-dim tensor, reduction over processes).
    """
    _check_mode(mode)
    active = completion_mask.bool()
    delta = (old_logps - sampling_logps).abs()
    delta = delta[active & ~torch.isnan(delta)]
    weights = importance_weights.flatten() if mode in SEQUENCE_MODES else importance_weights[active]

    def stat(values: Tensor, fn) -> Tensor:
        return fn(values) if values.numel() else values.new_zeros(())

    return {
        "sampling/sampling_logp_difference/mean": (stat(delta, torch.mean), PROCESS_MEAN),
        "sampling/sampling_logp_difference/max": (stat(delta, torch.max), PROCESS_MAX),
        "sampling/importance_sampling_ratio/min": (stat(weights, torch.min), PROCESS_MIN),
        "sampling/importance_sampling_ratio/mean": (stat(weights, torch.mean), PROCESS_MEAN),
        "sampling/importance_sampling_ratio/max": (stat(weights, torch.max), PROCESS_MAX),
    }


@torch.no_grad()
def sampler_mismatch(
    old_logps: Tensor,
    sampling_logps: Tensor,
    completion_mask: Tensor,
    *,
    mode: str | None = None,
    clip_min: float | None = None,
    clip_max: float | None = None,
    geometric: bool = False,
) -> tuple[Tensor, Tensor]:
    """One process's share of grpokit's `sampler/*` metrics: how far the learner's log-probabilities of the sampled
    tokens (`old_logps`, before any update) are from the sampler's, whether or not a correction is on.

    Returns `(sums, log_ratios)`: `sums` float64 `(5,)` = [tokens, sum |d|, sum d, units, units outside], where
    d = old_logps - sampling_logps over the active tokens whose sampling log-probability is known (not NaN); units
    are those tokens in token modes, the sequences with at least one of them in sequence modes (and with no mode);
    "outside" counts the units whose weight `exp(d)` (a sequence: `exp(sum d)`, with `geometric` `exp(mean d)`, as
    `vllm_importance_weights` weighs it) lies strictly outside `[clip_min, clip_max]`: what a mask mode sets to 0 and a truncate mode clamps (0 without a mode). `log_ratios`:
    the d values `(tokens,)`, for quantiles over every process. Sums add up over processes, so their ratios are
    token means over all processes, not means of per-process means."""
    known = completion_mask.bool() & ~torch.isnan(sampling_logps)
    delta = (old_logps.double() - sampling_logps.double()).masked_fill(~known, 0.0)
    if mode in SEQUENCE_MODES or mode is None:
        rows = known.any(dim=-1)
        unit_log_weights = delta.sum(dim=-1)
        if geometric:
            unit_log_weights = unit_log_weights / known.sum(dim=-1).clamp(min=1)
        unit_log_weights = unit_log_weights[rows]
    else:
        unit_log_weights = delta[known]
    outside = torch.zeros((), dtype=torch.float64, device=delta.device)
    if mode is not None:
        low = -math.inf if clip_min is None or clip_min <= 0 else math.log(clip_min)
        high = math.inf if clip_max is None else math.log(clip_max)
        outside = ((unit_log_weights < low) | (unit_log_weights > high)).sum().double()
    sums = torch.stack(
        [
            known.sum().double(),
            delta.abs().sum(),
            delta.sum(),
            torch.tensor(float(unit_log_weights.numel()), dtype=torch.float64, device=delta.device),
            outside,
        ]
    )
    return sums, delta[known]


RATIO_QUANTILES = (0.05, 0.5, 0.95)


def sampler_mismatch_metrics(sums: Tensor, log_ratios: Tensor, mode: str | None) -> dict[str, float]:
    """The `sampler/*` metrics from `sampler_mismatch`'s values summed (`sums`) and concatenated (`log_ratios`) over
    processes: `sampler/logprob_gap` (mean |learner - sampler| per token, nats), `sampler/logprob_bias` (its signed
    mean: below 0 when the learner gives the sampled tokens less probability than the sampler did, as when a
    truncating sampler's kept set is ignored), `sampler/ratio/p05`, `/p50`, `/p95` (quantiles of the per-token ratio
    learner / sampler), and with a correction mode `sampler/masked_fraction` (mask modes) or
    `sampler/clipped_fraction` (truncate modes): the share of its units (tokens or sequences) outside the bounds.
    Empty when no token had both log-probabilities."""
    tokens, gap, bias, units, outside = sums.tolist()
    if tokens == 0:
        return {}
    quantiles = torch.quantile(log_ratios.double(), torch.tensor(RATIO_QUANTILES, dtype=torch.float64)).exp()
    metrics = {
        "sampler/logprob_gap": gap / tokens,
        "sampler/logprob_bias": bias / tokens,
        **{
            f"sampler/ratio/p{round(q * 100):02d}": v for q, v in zip(RATIO_QUANTILES, quantiles.tolist(), strict=True)
        },
    }
    if mode is not None:
        name = "sampler/clipped_fraction" if mode in TRUNCATE_MODES else "sampler/masked_fraction"
        metrics[name] = outside / max(units, 1.0)
    return metrics


KL_ESTIMATORS = ("k1", "k3")
KL_REDUCTIONS = ("mean", "max")


@torch.no_grad()
def sequence_rejections(
    old_logps: Tensor,
    sampling_logps: Tensor,
    completion_mask: Tensor,
    *,
    kl_threshold: float | None = None,
    kl_estimator: str = "k3",
    kl_reduction: str = "mean",
    token_veto: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Whole sequences a sampler correction throws out, beyond TRL's modes (grpokit extensions).

    With d = old_logps - sampling_logps per active token whose sampling log-probability is known (the log of the
    ratio learner / sampler, tokens drawn from the sampler):
    - KL rejection (`kl_threshold`): a sequence goes when its estimate of KL(sampler || learner) exceeds the
      threshold: per token k1 = -d or k3 = exp(d) - 1 - d (never negative), reduced over the sequence's tokens by
      their mean or max;
    - token veto (`token_veto`): a sequence goes when any of its tokens has a ratio exp(d) below `token_veto` (a
      token the learner finds far less likely than the sampler did).
    A sequence with no known token is kept.

    Returns `(keep, kl_rejected, vetoed)`: `(B, 1)` weights, 1.0 kept and 0.0 rejected, in `old_logps`'s dtype, and
    two `(B,)` bools saying which rule rejected each sequence (both may)."""
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {kl_estimator!r}")
    if kl_reduction not in KL_REDUCTIONS:
        raise ValueError(f"kl_reduction must be one of {KL_REDUCTIONS}, got {kl_reduction!r}")
    known = completion_mask.bool() & ~torch.isnan(sampling_logps)
    delta = (old_logps - sampling_logps).masked_fill(~known, 0.0)
    rows = delta.size(0)
    kl_rejected = torch.zeros(rows, dtype=torch.bool, device=delta.device)
    if kl_threshold is not None:
        per_token = -delta if kl_estimator == "k1" else torch.expm1(delta) - delta
        if kl_reduction == "mean":
            estimate = per_token.masked_fill(~known, 0.0).sum(-1) / known.sum(-1).clamp(min=1)
        else:
            estimate = per_token.masked_fill(~known, -math.inf).amax(-1)
        kl_rejected = known.any(-1) & (estimate > kl_threshold)
    vetoed = torch.zeros(rows, dtype=torch.bool, device=delta.device)
    if token_veto is not None:
        vetoed = (known & (delta < math.log(token_veto))).any(-1)
    keep = (~(kl_rejected | vetoed)).to(old_logps.dtype).unsqueeze(-1)
    return keep, kl_rejected, vetoed
