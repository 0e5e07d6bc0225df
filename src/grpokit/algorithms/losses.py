"""GRPO-family policy losses, kept as two separate pieces: a per-token objective and a reduction.

Each loss type is a pair in `LOSSES`: the objective maps the batch to `per_token_loss` (`(B, T)`, or `(B, 1)` for the
sequence-level objectives), the reduction turns `per_token_loss` and `mask` into one scalar. `policy_loss` applies the
optional masks and KL term between the two, in the same order as TRL 1.16's `GRPOTrainer._compute_loss`, and matches
it in value and gradient (before TRL's division by the number of gradient-accumulation steps).

Notation: B completions of at most T tokens; `logps` are the log-probabilities of the sampled tokens under the policy
being trained, `old_logps` under the policy that produced the rollouts, `ratio = exp(logps - old_logps)` the importance
ratio (per token, or one per sequence: exp of the mean per-token log-ratio), A the advantage of the completion.

| loss_type | per-token objective                           | reduction                                            |
|-----------|-----------------------------------------------|------------------------------------------------------|
| grpo      | -min(ratio A, clip(ratio, 1-el, 1+eh) A)      | mean over each sequence's tokens, then over sequences |
| bnpo      | same                                          | mean over the active tokens of the micro-batch        |
| dr_grpo   | same                                          | sum / (B * max_completion_length)                     |
| dapo      | same                                          | sum / num_items_in_batch                              |
| luspo     | same                                          | sum over each sequence's tokens, mean over sequences  |
| cispo     | -sg(min(ratio, eh)) A logps                   | sum / num_items_in_batch                              |
| sapo      | -(4 / tau) sigmoid(tau (ratio - 1)) A         | as grpo                                               |
| vespo     | -sg(phi(w)) A logps, w the sequence ratio     | sum / num_items_in_batch                              |

(sg = stop-gradient.) With `delta` set, the unclipped `ratio` in the first four rows is also capped at `delta`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from .kl import kl_k3
from .loss_settings import LossSettings

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


class _Batch(NamedTuple):
    """Everything an objective or a reduction may read. Shapes: B sequences, T tokens."""

    logps: Tensor  # (B, T)
    log_ratio: Tensor  # (B, T), logps - old_logps, always per token
    ratio: Tensor  # (B, T) or (B, 1), following importance_sampling_level
    advantages: Tensor  # (B, 1) or (B, T)
    mask: Tensor  # (B, T), float
    importance_sampling_ratio: Tensor | None  # (B, T) or (B, 1): sampler -> old policy correction
    settings: LossSettings
    max_completion_length: int  # settings.max_completion_length, or T when unset
    num_items_in_batch: Tensor  # scalar


class RatioTerms(NamedTuple):
    """The per-token terms a loss step computes besides the objective, shared with its diagnostics."""

    log_ratio: Tensor  # (B, T) logps - old_logps, per token
    ratio: Tensor  # (B, T) or (B, 1), following importance_sampling_level
    per_token_kl: Tensor | None  # (B, T) k3 to the reference, times ratio with use_bias_correction_kl; None: no ref


class PolicyLoss(NamedTuple):
    """`policy_loss`'s result when given `LossSettings`: the scalar loss and the terms it was built from."""

    loss: Tensor  # 0-dim
    terms: RatioTerms


# ---------------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------------


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over the positions where `mask` is 1 (a count of 0 is treated as 1, giving 0).

    Args:
        x: `(B, T)`, or anything broadcastable to `mask`.
        mask: `(B, T)`.
        dim: None for one scalar over all active positions, or the dimension to reduce.
    """
    mask = mask.to(x.dtype) if x.is_floating_point() else mask.float()
    x = x.expand_as(mask) * mask
    if dim is None:
        return x.sum() / mask.sum().clamp(min=1.0)
    return x.sum(dim) / mask.sum(dim).clamp(min=1.0)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Shannon entropy (nats) of the softmax of `logits` along the last dimension, `(..., V) -> (...)`.

    Vocabulary entries with probability exactly 0 (logit -inf) contribute 0.
    """
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = log_probs.exp()
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(dim=-1)


def importance_ratio(
    logps: Tensor, old_logps: Tensor | None, mask: Tensor, importance_sampling_level: str = "token"
) -> Tensor:
    """Importance ratio pi_theta / pi_old: `(B, T)` per token, or `(B, 1)` per sequence.

    `"token"`: `exp(logps - old_logps)`. `"sequence"` (GSPO): `exp` of the mean per-token log-ratio over the active
    tokens of each sequence (a geometric mean of the token ratios; an all-masked row gets ratio 1).

    Args:
        logps: `(B, T)`.
        old_logps: `(B, T)`; None means on-policy (`logps.detach()`, so ratio == 1 with the gradient of `logps`).
        mask: `(B, T)`.
        importance_sampling_level: `"token"` or `"sequence"`.
    """
    if old_logps is None:
        old_logps = logps.detach()
    log_ratio = logps - old_logps
    if importance_sampling_level == "token":
        return log_ratio.exp()
    if importance_sampling_level == "sequence":
        mask = mask.to(log_ratio.dtype)
        mean_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return mean_log_ratio.unsqueeze(-1).exp()
    raise ValueError(
        f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {importance_sampling_level!r}"
    )


def _full(like: Tensor, value: float) -> Tensor:
    # A 0-dim constant in `like`'s dtype (torch.where with Python floats would round them to the default float32).
    return torch.tensor(value, dtype=like.dtype, device=like.device)


@torch.no_grad()
def vespo_weights(
    advantages: Tensor,
    log_ratio: Tensor,
    mask: Tensor,
    importance_sampling_ratio: Tensor | None = None,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> Tensor:
    """VESPO's per-sequence gamma weight phi(w) = exp(lambda) * w^k * exp(-lambda w), `(B, 1)`, no gradient.

    w is the sequence importance ratio as a *product* of token ratios: log w = sum_t clamp(log_ratio, -20, 20) over
    active tokens, plus sum_t log(importance_sampling_ratio) over all positions when a sampler correction is given (it
    must be 1 at padded positions), then clamped to [log(1e-8), 20]. (k, lambda) are (k_pos, lambda_pos) when A >= 0,
    else (k_neg, lambda_neg); lambda is clamped at 1e-4. phi(1) == 1; non-finite values become 0.

    Args:
        advantages: `(B,)` or `(B, 1)`.
        log_ratio: `(B, T)` per-token `logps - old_logps`.
        mask: `(B, T)`.
        importance_sampling_ratio: optional `(B, T)` pi_old / pi_sampler per token.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    log_floor = math.log(1e-8)
    log_w = (log_ratio.clamp(-20.0, 20.0) * mask).sum(dim=-1, keepdim=True)
    if importance_sampling_ratio is not None:
        log_w = log_w + importance_sampling_ratio.log().clamp(log_floor, 20.0).sum(dim=-1, keepdim=True)
    log_w = log_w.clamp(log_floor, 20.0)
    nonnegative = advantages >= 0
    k = torch.where(nonnegative, _full(log_w, k_pos), _full(log_w, k_neg))
    lam = torch.where(nonnegative, _full(log_w, lambda_pos), _full(log_w, lambda_neg)).clamp(min=1e-4)
    log_phi = lam + k * log_w - lam * log_w.exp()
    return log_phi.exp().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_parameters(settings: LossSettings) -> dict[str, float]:
    """`vespo_weights`' keyword arguments from the loss settings."""
    return dict(
        k_pos=settings.vespo_k_pos,
        lambda_pos=settings.vespo_lambda_pos,
        k_neg=settings.vespo_k_neg,
        lambda_neg=settings.vespo_lambda_neg,
    )


def _region_fraction(flags: Tensor, mask: Tensor) -> Tensor:
    # TRL's metric mean: over active tokens, or over sequences when the flags are per sequence (B, 1).
    flags = flags.float()
    if flags.size(-1) == 1:
        return flags.mean()
    return masked_mean(flags, mask)


def _sequence_fraction(flags: Tensor, mask: Tensor) -> Tensor:
    # Per-sequence fraction (B,), NaN for a sequence without active tokens (TRL's masked_seq_mean).
    flags = flags.float()
    if flags.size(-1) == 1:
        return flags.squeeze(-1)
    mask = mask.float()
    return (flags * mask).sum(-1) / mask.sum(-1)


def _nan_extreme(x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
    finite = x[~torch.isnan(x)]
    return fn(finite) if finite.numel() else x.new_tensor(float("nan"))


def clip_fractions(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    *,
    delta: float | None = None,
) -> dict[str, Tensor]:
    """The clipping metrics TRL logs for the PPO-clip loss types (grpo, bnpo, dr_grpo, dapo, luspo).

    A token is clipped low when `ratio < 1 - epsilon_low` and A < 0, high when `ratio > 1 + epsilon_high` and A > 0
    (i.e. where the clip actually removes the gradient); region is either. Pass `delta` if the loss used it: TRL tests
    the delta-capped ratio.

    Args:
        ratio: `(B, T)`, or `(B, 1)` for sequence-level importance sampling (see `importance_ratio`).
        advantages: `(B,)`, `(B, 1)` or `(B, T)`.
        mask: `(B, T)`.

    Returns:
        Scalars keyed as TRL logs them: `clip_ratio/low_mean`, `clip_ratio/high_mean`, `clip_ratio/region_mean`
        (fractions of active tokens, or of sequences when `ratio` is `(B, 1)`), `clip_ratio/low_min` and
        `clip_ratio/high_max` (min / max over sequences of the per-sequence fraction). TRL pools these over processes.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    ratio = ratio.detach()
    if delta is not None:
        ratio = ratio.clamp(max=delta)
    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    return {
        "clip_ratio/low_mean": _region_fraction(low, mask),
        "clip_ratio/high_mean": _region_fraction(high, mask),
        "clip_ratio/region_mean": _region_fraction(low | high, mask),
        "clip_ratio/low_min": _nan_extreme(_sequence_fraction(low, mask), torch.min),
        "clip_ratio/high_max": _nan_extreme(_sequence_fraction(high, mask), torch.max),
    }


def cispo_clip_fraction(ratio: Tensor, advantages: Tensor, mask: Tensor, epsilon_high: float) -> Tensor:
    """TRL's `cispo_clip_ratio`: fraction of active tokens (or sequences, for `(B, 1)` ratios) with
    `ratio > epsilon_high` and A > 0, i.e. whose IS weight CISPO caps.

    Args:
        ratio: `(B, T)` or `(B, 1)`.
        advantages: `(B,)`, `(B, 1)` or `(B, T)`.
        mask: `(B, T)`.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    return _region_fraction((ratio.detach() > epsilon_high) & (advantages > 0), mask)


def _sampling_corrected(per_token_loss: Tensor, batch: _Batch) -> Tensor:
    # Multiply by the sampler -> old-policy IS ratio when there is one (vespo folds it into its weight instead).
    if batch.importance_sampling_ratio is None:
        return per_token_loss
    return per_token_loss * batch.importance_sampling_ratio


# ---------------------------------------------------------------------------------------------------------------------
# Per-token objectives: _Batch -> per_token_loss, (B, T) or (B, 1)
# ---------------------------------------------------------------------------------------------------------------------


def clipped_objective(batch: _Batch) -> Tensor:
    """PPO clipped surrogate: `-min(ratio * A, clip(ratio, 1 - epsilon_low, 1 + epsilon_high) * A)`.

    With `delta` set (two-sided GRPO, INTELLECT-2), the unclipped `ratio` is first capped at `delta`, bounding the
    loss of negative-advantage tokens whose ratio has grown large. Shape follows `ratio`.
    """
    settings = batch.settings
    clipped_ratio = batch.ratio.clamp(1 - settings.epsilon_low, 1 + settings.epsilon_high)
    ratio = batch.ratio if settings.delta is None else batch.ratio.clamp(max=settings.delta)
    per_token_loss = -torch.min(ratio * batch.advantages, clipped_ratio * batch.advantages)
    return _sampling_corrected(per_token_loss, batch)


def cispo_objective(batch: _Batch) -> Tensor:
    """CISPO (MiniMax-M1): `-sg(min(ratio, epsilon_high)) * A * logps`, `(B, T)`.

    The IS weight is capped at `epsilon_high` itself (an absolute cap, e.g. 5.0, not 1 + epsilon_high) and detached,
    so every token keeps a REINFORCE gradient scaled by the capped weight. With the default `epsilon_high = 0.2` an
    on-policy step is scaled by 0.2 relative to grpo.
    """
    weight = batch.ratio.clamp(max=batch.settings.epsilon_high).detach()
    return _sampling_corrected(-weight * batch.advantages * batch.logps, batch)


def sapo_objective(batch: _Batch) -> Tensor:
    """SAPO soft gate: `-(4 / tau) * sigmoid(tau * (ratio - 1)) * A`, tau = `sapo_temperature_pos` if A > 0 else
    `sapo_temperature_neg`.

    At ratio 1 the gate's derivative is exactly 1, so the on-policy gradient equals grpo's; the value (-2A / tau)
    does not. Shape follows `ratio`.
    """
    positive, settings = batch.advantages > 0, batch.settings
    temperature = torch.where(
        positive, _full(batch.ratio, settings.sapo_temperature_pos), _full(batch.ratio, settings.sapo_temperature_neg)
    )
    gate = torch.sigmoid(temperature * (batch.ratio - 1)) * 4 / temperature
    return _sampling_corrected(-gate * batch.advantages, batch)


def vespo_objective(batch: _Batch) -> Tensor:
    """VESPO: `-sg(phi(w)) * A * logps`, `(B, T)`, phi the per-sequence gamma weight of `vespo_weights`.

    Always uses the per-token log-ratios (w is a product over tokens), whatever `importance_sampling_level`; the
    sampler IS ratio, if any, enters w rather than multiplying the loss.
    """
    phi = vespo_weights(
        batch.advantages,
        batch.log_ratio,
        batch.mask,
        batch.importance_sampling_ratio,
        **vespo_parameters(batch.settings),
    )
    return -phi * batch.advantages * batch.logps


# ---------------------------------------------------------------------------------------------------------------------
# Reductions: (per_token_loss, _Batch) -> scalar. per_token_loss broadcasts against mask (B, T).
# ---------------------------------------------------------------------------------------------------------------------


def sequence_mean(per_token_loss: Tensor, batch: _Batch) -> Tensor:
    """Mean over each sequence's active tokens, then mean over the B sequences (an empty sequence counts as 0)."""
    return masked_mean(per_token_loss, batch.mask, dim=-1).mean()


def token_mean(per_token_loss: Tensor, batch: _Batch) -> Tensor:
    """Mean over all active tokens of the micro-batch."""
    return masked_mean(per_token_loss, batch.mask)


def constant_length_sum(per_token_loss: Tensor, batch: _Batch) -> Tensor:
    """Sum over active tokens / (B * max_completion_length): independent of padding and of each length (Dr. GRPO)."""
    return (per_token_loss * batch.mask).sum() / (batch.mask.size(0) * batch.max_completion_length)


def global_token_sum(per_token_loss: Tensor, batch: _Batch) -> Tensor:
    """Sum over active tokens / num_items_in_batch (DAPO's token-level normalisation over the global batch)."""
    return (per_token_loss * batch.mask).sum() / batch.num_items_in_batch


def sequence_sum_mean(per_token_loss: Tensor, batch: _Batch) -> Tensor:
    """Sum over each sequence's active tokens, then mean over sequences: a sequence-level loss weighted by length."""
    return (per_token_loss * batch.mask).sum(-1).mean()


Objective = Callable[[_Batch], Tensor]
Reduction = Callable[[Tensor, _Batch], Tensor]

LOSSES: dict[str, tuple[Objective, Reduction]] = {
    "grpo": (clipped_objective, sequence_mean),
    "dr_grpo": (clipped_objective, constant_length_sum),
    "dapo": (clipped_objective, global_token_sum),
    "bnpo": (clipped_objective, token_mean),
    "cispo": (cispo_objective, global_token_sum),
    "sapo": (sapo_objective, sequence_mean),
    "luspo": (clipped_objective, sequence_sum_mean),
    "vespo": (vespo_objective, global_token_sum),
}

LOSS_TYPES: tuple[str, ...] = tuple(LOSSES)


def ratio_terms(
    logps: Tensor, old_logps: Tensor | None, mask: Tensor, settings: LossSettings, ref_logps: Tensor | None = None
) -> RatioTerms:
    """The importance ratio and, when `ref_logps` is given, the KL term of one micro-batch: what `policy_loss`
    computes besides the objective, for diagnostics of a batch whose loss was not computed. Gradients flow through
    `logps` (detach it for metrics only).

    Args:
        logps: `(B, T)`; old_logps: `(B, T)` or None for on-policy (`logps.detach()`); mask: `(B, T)`.
        ref_logps: `(B, T)` reference log-probabilities, or None for no KL term.
    """
    log_ratio, ratio = _log_ratio_and_ratio(logps, old_logps, mask, settings)
    per_token_kl = None if ref_logps is None else kl_term(logps, ref_logps, ratio, settings)
    return RatioTerms(log_ratio=log_ratio, ratio=ratio, per_token_kl=per_token_kl)


def _log_ratio_and_ratio(logps, old_logps, mask, settings: LossSettings) -> tuple[Tensor, Tensor]:
    if old_logps is None:
        old_logps = logps.detach()
    ratio = importance_ratio(logps, old_logps, mask, settings.importance_sampling_level)
    return logps - old_logps, ratio


def kl_term(logps: Tensor, ref_logps: Tensor, ratio: Tensor, settings: LossSettings) -> Tensor:
    """`(B, T)` k3 estimate of KL(policy || reference), times `ratio` with `use_bias_correction_kl` (TRL's default;
    it changes the KL gradient even on-policy, where `ratio == 1` in value but carries the gradient of `logps`)."""
    per_token_kl = kl_k3(logps, ref_logps)
    return per_token_kl * ratio if settings.use_bias_correction_kl else per_token_kl


def policy_loss(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    settings: LossSettings | None = None,
    *,
    ref_logps: Tensor | None = None,
    num_items_in_batch: Tensor | float | None = None,
    importance_sampling_ratio: Tensor | None = None,
    off_policy_mask: Tensor | None = None,
    entropy_mask: Tensor | None = None,
    **loss_settings,
) -> PolicyLoss | Tensor:
    """Scalar policy loss of one micro-batch, equal in value and gradient to TRL 1.16's `GRPOTrainer._compute_loss`
    before its division by the number of gradient-accumulation steps.

    Steps: `ratio` from `importance_ratio`; `per_token_loss` from the loss type's objective; multiplied by
    `off_policy_mask` and `entropy_mask` if given; plus `beta * per_token_kl` (k3, times `ratio` when
    `use_bias_correction_kl`) if `beta != 0`; reduced by the loss type's reduction over `mask`. The masks only silence
    the policy term: the KL term and the reduction's denominator still use `mask`, as in TRL.

    Two ways to call it: with `settings` (a `LossSettings`, as the trainer does) it returns a `PolicyLoss`, the loss
    and the `RatioTerms` the diagnostics reuse; with the fields of `LossSettings` as keywords instead
    (`loss_type="grpo", beta=0.04, ...`) it returns the loss alone.

    Args:
        logps: `(B, T)` log-probabilities of the sampled tokens under the policy being trained (requires grad).
        old_logps: `(B, T)` under the rollout policy; None means on-policy (`logps.detach()`).
        advantages: `(B,)` (or `(B, T)`).
        mask: `(B, T)` 1 for completion tokens that count, 0 for padding (and tool output).
        settings: the loss knobs (see `LossSettings`): loss type, clip range, delta, importance-sampling level, SAPO
            and VESPO parameters, beta, KL bias correction, dr_grpo's max_completion_length (default T). vespo always
            uses token log-ratios for its weight; `ratio` then only matters for the KL bias correction.
        ref_logps: `(B, T)` reference-model log-probabilities; required when `beta != 0`.
        num_items_in_batch: denominator of dapo, cispo and vespo (default: active tokens in this micro-batch,
            `mask.sum()`). TRL divides the summed loss by `N / num_processes * grad_accum_steps / steps_per_generation`
            where N is the number of active tokens (completion mask times tool mask) of the whole generation batch
            over all processes. Since the caller divides every loss type by `grad_accum_steps` afterwards, pass
            `N / (num_processes * steps_per_generation)` in training (the mean active-token count per micro-batch per
            process over the generation batch) and `N / num_processes` in evaluation (TRL neither splits nor
            accumulates there).
        importance_sampling_ratio: optional `(B, T)` or `(B, 1)` pi_old / pi_sampler correction (vLLM). Multiplies the
            policy term, except for vespo, which folds it into its weight (then it must be per token).
        off_policy_mask: optional `(B, 1)` keep-mask from `masks.off_policy_mask`.
        entropy_mask: optional `(B, T)` keep-mask from `masks.entropy_mask`.
        **loss_settings: the fields of `LossSettings`, when `settings` is not given.

    Returns:
        `PolicyLoss` with `settings`; else the 0-dim loss.
    """
    if settings is None:
        settings = LossSettings(**loss_settings)
        return policy_loss(
            logps,
            old_logps,
            advantages,
            mask,
            settings,
            ref_logps=ref_logps,
            num_items_in_batch=num_items_in_batch,
            importance_sampling_ratio=importance_sampling_ratio,
            off_policy_mask=off_policy_mask,
            entropy_mask=entropy_mask,
        ).loss
    if loss_settings:
        raise TypeError(f"policy_loss: pass either settings or its fields, not both ({', '.join(loss_settings)})")
    if settings.loss_type not in LOSSES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {settings.loss_type!r}")
    if settings.beta != 0.0 and ref_logps is None:
        raise ValueError("beta != 0 needs ref_logps")
    objective, reduction = LOSSES[settings.loss_type]
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    mask = mask.to(logps.dtype)
    log_ratio, ratio = _log_ratio_and_ratio(logps, old_logps, mask, settings)
    batch = _Batch(
        logps=logps,
        log_ratio=log_ratio,
        ratio=ratio,
        advantages=advantages,
        mask=mask,
        importance_sampling_ratio=importance_sampling_ratio,
        settings=settings,
        max_completion_length=mask.size(1)
        if settings.max_completion_length is None
        else settings.max_completion_length,
        num_items_in_batch=_num_items(num_items_in_batch, mask, logps),
    )
    per_token_loss = objective(batch)
    if off_policy_mask is not None:
        per_token_loss = per_token_loss * off_policy_mask
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask
    per_token_kl = None
    if settings.beta != 0.0:  # the KL term only where it enters the loss (the caller passes ref_logps only then)
        per_token_kl = kl_term(logps, ref_logps, ratio, settings)
        per_token_loss = per_token_loss + settings.beta * per_token_kl
    terms = RatioTerms(log_ratio=log_ratio, ratio=ratio, per_token_kl=per_token_kl)
    return PolicyLoss(loss=reduction(per_token_loss, batch), terms=terms)


def _num_items(num_items_in_batch: Tensor | float | None, mask: Tensor, logps: Tensor) -> Tensor:
    if num_items_in_batch is None:
        return mask.sum().clamp(min=1.0)
    # Only guards an all-masked global batch (0 / 0); any real count is used as given.
    num_items_in_batch = torch.as_tensor(num_items_in_batch, dtype=logps.dtype, device=logps.device)
    return num_items_in_batch.clamp(min=torch.finfo(logps.dtype).tiny)
