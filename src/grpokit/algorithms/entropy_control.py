"""The entropy bonus's coefficient: fixed, or adapted step by step towards a target entropy (Skywork-OR1).

Plain Python state plus two tiny tensor functions; no trainer, no config objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class EntropyCoefficient:
    """Coefficient of the entropy bonus `loss - coef * mean_entropy`, as TRL 1.16 schedules it.

    Fixed (`adaptive=False`): `coef` is applied as given. Adaptive: at the end of every optimizer step the measured
    mean token entropy H of that step moves the coefficient, `coef + delta` (at most `coef_max`) when H <= target,
    else `coef - delta` (at least `coef_min`); the bonus of the *next* step uses `coef` only while the last measured
    H <= target (0 otherwise, and 0 before the first measurement).
    """

    coef: float
    adaptive: bool = False
    target: float = 0.2
    delta: float = 0.005
    coef_min: float = 0.0
    coef_max: float = 1.0
    last_entropy: float = math.inf

    @classmethod
    def from_config(cls, args) -> EntropyCoefficient:
        """The coefficient `args` (a `GRPOConfig`) sets: `entropy_coef`, `use_adaptive_entropy` and its bounds."""
        return cls(
            coef=args.entropy_coef,
            adaptive=args.use_adaptive_entropy,
            target=args.entropy_target,
            delta=args.entropy_coef_delta,
            coef_min=args.entropy_coef_min,
            coef_max=args.entropy_coef_max,
        )

    @property
    def enabled(self) -> bool:
        """Whether the bonus term exists at all (adaptive mode keeps it even while `coef` is at 0)."""
        return self.coef != 0.0 or self.adaptive

    def applied(self) -> float:
        """The coefficient to use for the micro-batches of the current optimizer step."""
        if self.adaptive and self.last_entropy > self.target:
            return 0.0
        return self.coef

    def update(self, step_entropy: float) -> None:
        """Adaptive mode: record the mean entropy of the optimizer step that just ended and move `coef`."""
        if not self.adaptive:
            return
        if step_entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.coef_max)
        else:
            self.coef = max(self.coef - self.delta, self.coef_min)
        self.last_entropy = step_entropy

    def state_dict(self) -> dict[str, float]:
        return {"entropy_coef": self.coef, "last_world_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["entropy_coef"])
        self.last_entropy = float(state["last_world_entropy"])


def masked_entropy_mean(entropies: Tensor, mask: Tensor) -> Tensor:
    """Mean entropy over the active positions, `(B, T), (B, T) -> ()`; 0 when nothing is active."""
    mask = mask.to(entropies.dtype)
    return (entropies * mask).sum() / mask.sum().clamp(min=1.0)


def high_entropy_mask(entropies: Tensor, mask: Tensor, threshold_quantile: float, pooled: Tensor | None = None):
    """Bool `(B, T)`: active tokens whose entropy is >= the `threshold_quantile` quantile of `pooled`.

    Same rule as `masks.entropy_mask`, but the quantile may be taken over a larger pool than this micro-batch: TRL
    pools the active entropies of every process. `pooled` (1-D) defaults to this micro-batch's active entropies.

    Args:
        entropies: `(B, T)`.
        mask: `(B, T)` 1 for active tokens.
        threshold_quantile: in [0, 1]; pass `1 - top_entropy_quantile`.
        pooled: 1-D entropies the quantile is taken over.
    """
    active = mask.bool()
    if pooled is None:
        pooled = entropies.detach()[active]
    if pooled.numel() == 0:
        return torch.zeros_like(active)
    threshold = torch.quantile(pooled.float(), threshold_quantile)
    return (entropies.detach() * mask >= threshold) & active
