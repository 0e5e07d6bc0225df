"""Token and sequence masks that restrict which parts of a batch carry policy gradient."""

from __future__ import annotations

import torch
from torch import Tensor


def entropy_mask(entropies: Tensor, mask: Tensor, threshold_quantile: float) -> Tensor:
    """Keep only the high-entropy tokens: bool `(B, T)`, True where `entropies >= quantile(active entropies, q)`.

    The quantile `q = threshold_quantile` is taken over the active tokens only (`mask` true), with
    `torch.quantile`'s linear interpolation. Masked tokens are always False; with no active token everything is False.
    To reproduce TRL's `top_entropy_quantile = rho` (train on the top rho fraction), pass `threshold_quantile = 1 - rho`.
    TRL takes the quantile over the active tokens of all processes; this function sees only the tensors given to it.

    Args:
        entropies: `(B, T)` per-token entropies (>= 0).
        mask: `(B, T)` 1 for completion tokens that count, 0 for padding.
        threshold_quantile: in [0, 1].
    """
    active = mask.bool()
    values = entropies.detach()[active].float()
    if values.numel() == 0:
        return torch.zeros_like(active)
    threshold = torch.quantile(values, threshold_quantile)
    return (entropies.detach() * mask >= threshold) & active


def off_policy_mask(
    advantages: Tensor, logps: Tensor, sampling_logps: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """Off-policy sequence mask (DeepSeek-V3.2, Eq. 9): float `(B, 1)`, 1 to keep a sequence, 0 to drop it.

    A sequence is dropped when its advantage is negative AND its mean per-token KL from the sampling policy,
    `mean_t(sampling_logps - logps)` over active tokens, exceeds `threshold`. Positive-advantage sequences are always
    kept. NaN sampling log-probabilities (tokens the sampler could not score) count as zero KL. No gradient flows.

    Args:
        advantages: `(B,)` or `(B, 1)`.
        logps: `(B, T)` current policy log-probabilities (detached here).
        sampling_logps: `(B, T)` log-probabilities under the policy that generated the tokens (TRL uses the
            inference engine's when it has them, else the old policy's).
        mask: `(B, T)`.
        threshold: the KL threshold delta (> 0).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    per_token_kl = torch.nan_to_num(sampling_logps - logps.detach(), nan=0.0)
    mean_kl = (per_token_kl * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    keep = (advantages >= 0) | (mean_kl <= threshold)
    return keep.to(logps.dtype)
