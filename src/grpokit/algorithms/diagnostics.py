"""What TRL 1.16 logs about a policy-loss step, per loss type: clipping fractions, CISPO's capped fraction, VESPO's
weights, and the KL to the reference.

Each diagnostic is returned *unreduced* with the name of its reduction, because the trainer reduces across
processes: `MEAN` is the mean over active tokens (or over sequences for `(B, 1)` values), `SEQ_MIN` / `SEQ_MAX` the
min / max over sequences of the per-sequence mean.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .kl import kl_k3
from .losses import importance_ratio, vespo_weights

MEAN, SEQ_MIN, SEQ_MAX = "mean", "seq_min", "seq_max"

Diagnostics = dict[str, tuple[Tensor, str]]


def _clip(ratio: Tensor, advantages: Tensor, log_ratio: Tensor, mask: Tensor, p: dict) -> Diagnostics:
    # Clipped where the clip removes the gradient: below 1 - eps_low with A < 0, above 1 + eps_high with A > 0.
    if p["delta"] is not None:
        ratio = ratio.clamp(max=p["delta"])
    low = ((ratio < 1 - p["epsilon_low"]) & (advantages < 0)).float()
    high = ((ratio > 1 + p["epsilon_high"]) & (advantages > 0)).float()
    return {
        "clip_ratio/low_mean": (low, MEAN),
        "clip_ratio/low_min": (low, SEQ_MIN),
        "clip_ratio/high_mean": (high, MEAN),
        "clip_ratio/high_max": (high, SEQ_MAX),
        "clip_ratio/region_mean": (torch.maximum(low, high), MEAN),
    }


def _cispo(ratio: Tensor, advantages: Tensor, log_ratio: Tensor, mask: Tensor, p: dict) -> Diagnostics:
    return {"cispo_clip_ratio": (((ratio > p["epsilon_high"]) & (advantages > 0)).float(), MEAN)}


def _vespo(ratio: Tensor, advantages: Tensor, log_ratio: Tensor, mask: Tensor, p: dict) -> Diagnostics:
    phi = vespo_weights(
        advantages,
        log_ratio,
        mask,
        k_pos=p["vespo_k_pos"],
        lambda_pos=p["vespo_lambda_pos"],
        k_neg=p["vespo_k_neg"],
        lambda_neg=p["vespo_lambda_neg"],
    )
    return {"vespo/phi_seq_mean": (phi, MEAN)}


def _nothing(ratio: Tensor, advantages: Tensor, log_ratio: Tensor, mask: Tensor, p: dict) -> Diagnostics:
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
def loss_diagnostics(
    logps: Tensor,
    old_logps: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_type: str,
    importance_sampling_level: str = "token",
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
    ref_logps: Tensor | None = None,
    use_bias_correction_kl: bool = True,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
) -> Diagnostics:
    """The loss type's diagnostics, plus `kl` (k3, times the ratio when `use_bias_correction_kl`, exactly the term
    the loss adds) when `ref_logps` is given.

    Args:
        logps, old_logps, ref_logps: `(B, T)`; `old_logps` None means on-policy.
        advantages: `(B,)`.
        mask: `(B, T)`.

    Returns:
        name -> (values `(B, T)` or `(B, 1)`, reduction).
    """
    logps = logps.detach()
    old_logps = logps if old_logps is None else old_logps
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = importance_ratio(logps, old_logps, mask, importance_sampling_level)
    params = dict(
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        delta=delta,
        vespo_k_pos=vespo_k_pos,
        vespo_lambda_pos=vespo_lambda_pos,
        vespo_k_neg=vespo_k_neg,
        vespo_lambda_neg=vespo_lambda_neg,
    )
    diagnostics = DIAGNOSTICS[loss_type](ratio, advantages, logps - old_logps, mask, params)
    if ref_logps is not None:
        kl = kl_k3(logps, ref_logps)
        diagnostics["kl"] = (kl * ratio if use_bias_correction_kl else kl, MEAN)
    return diagnostics
