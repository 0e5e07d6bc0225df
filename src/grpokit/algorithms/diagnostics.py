"""What TRL 1.16 logs about a policy-loss step, per loss type: clipping fractions, CISPO's capped fraction, VESPO's
weights, and the KL to the reference.

The diagnostics read the ratio and the KL term the loss computed (`losses.RatioTerms`), not fresh copies of them.
Each diagnostic is returned *unreduced* with the name of its reduction, because the trainer reduces across
processes: `MEAN` is the mean over active tokens (or over sequences for `(B, 1)` values), `SEQ_MIN` / `SEQ_MAX` the
min / max over sequences of the per-sequence mean.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .loss_settings import LossSettings
from .losses import RatioTerms, ratio_terms, vespo_parameters, vespo_weights

MEAN, SEQ_MIN, SEQ_MAX = "mean", "seq_min", "seq_max"

Diagnostics = dict[str, tuple[Tensor, str]]


def _clip(ratio: Tensor, advantages: Tensor, log_ratio: Tensor, mask: Tensor, settings: LossSettings) -> Diagnostics:
    # Clipped where the clip removes the gradient: below 1 - eps_low with A < 0, above 1 + eps_high with A > 0.
    if settings.delta is not None:
        ratio = ratio.clamp(max=settings.delta)
    low = ((ratio < 1 - settings.epsilon_low) & (advantages < 0)).float()
    high = ((ratio > 1 + settings.epsilon_high) & (advantages > 0)).float()
    return {
        "clip_ratio/low_mean": (low, MEAN),
        "clip_ratio/low_min": (low, SEQ_MIN),
        "clip_ratio/high_mean": (high, MEAN),
        "clip_ratio/high_max": (high, SEQ_MAX),
        "clip_ratio/region_mean": (torch.maximum(low, high), MEAN),
    }


def _cispo(ratio: Tensor, advantages: Tensor, log_ratio: Tensor, mask: Tensor, settings: LossSettings) -> Diagnostics:
    return {"cispo_clip_ratio": (((ratio > settings.epsilon_high) & (advantages > 0)).float(), MEAN)}


def _vespo(ratio: Tensor, advantages: Tensor, log_ratio: Tensor, mask: Tensor, settings: LossSettings) -> Diagnostics:
    phi = vespo_weights(advantages, log_ratio, mask, **vespo_parameters(settings))
    return {"vespo/phi_seq_mean": (phi, MEAN)}


def _nothing(
    ratio: Tensor, advantages: Tensor, log_ratio: Tensor, mask: Tensor, settings: LossSettings
) -> Diagnostics:
    return {}


DIAGNOSTICS: dict[str, Callable[..., Diagnostics]] = {
    "grpo": _clip,
    "dr_grpo": _clip,
    "dapo": _clip,
    "bnpo": _clip,
    "luspo": _clip,
    "cispo": _cispo,
    "sapo": _nothing,
    "vespo": _vespo,
}


@torch.no_grad()
def step_diagnostics(terms: RatioTerms, advantages: Tensor, mask: Tensor, settings: LossSettings) -> Diagnostics:
    """The loss type's diagnostics of one step, plus `kl` (exactly the term the loss adds) when the step had one.

    Args:
        terms: the `RatioTerms` the loss computed (`policy_loss(...).terms`); read detached.
        advantages: `(B,)` or `(B, 1)`.
        mask: `(B, T)`.
        settings: the `LossSettings` the loss ran with.

    Returns:
        name -> (values `(B, T)` or `(B, 1)`, reduction).
    """
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio, log_ratio = terms.ratio.detach(), terms.log_ratio.detach()
    diagnostics = DIAGNOSTICS[settings.loss_type](ratio, advantages, log_ratio, mask, settings)
    if terms.per_token_kl is not None:
        diagnostics["kl"] = (terms.per_token_kl.detach(), MEAN)
    return diagnostics


@torch.no_grad()
def loss_diagnostics(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logps: Tensor | None = None,
    **loss_settings,
) -> Diagnostics:
    """`step_diagnostics` of a batch whose loss was not computed: the ratio and, when `ref_logps` is given, the KL
    term (k3, times the ratio when `use_bias_correction_kl`) are computed here. `loss_settings` are the fields of
    `LossSettings` (`loss_type` required).

    Args:
        logps, old_logps, ref_logps: `(B, T)`; `old_logps` None means on-policy.
        advantages: `(B,)`.
        mask: `(B, T)`.
    """
    settings = LossSettings(**loss_settings)
    terms = ratio_terms(logps.detach(), old_logps, mask, settings, ref_logps)
    return step_diagnostics(terms, advantages, mask, settings)
