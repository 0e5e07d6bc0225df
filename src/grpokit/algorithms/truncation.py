"""Truncated sampling: the set of tokens top-k, top-p and min-p let the sampler draw from, and log-probabilities
renormalised over it (torch only).

A sampler that truncates draws from `pi_K(a) = pi(a) / pi(K)` for `a` in the kept set `K`, 0 elsewhere, and vLLM's
processed log-probabilities are `log pi_K`. A learner that scores the full distribution gets `log pi`, lower by
`-log pi(K)` at every position, so the ratio of two equal policies is the kept mass `pi(K) < 1`, not 1. Scoring with
the same filters applied to the learner's own logits gives `log pi_K` on both sides.

The filters, on tempered logits `z` (one row per position), keep at least one token each:

| filter | keeps |
|--------|-------|
| top-k (`top_k > 0`) | the `top_k` largest logits (ties with the k-th kept) |
| top-p (`top_p < 1`) | the most likely tokens down to the first that brings their mass to `top_p`: sorted ascending, a token goes when the mass up to and including it is at most `1 - top_p` |
| min-p (`min_p > 0`) | tokens whose probability is at least `min_p` times the largest |

Each filter sees the distribution the previous ones left (renormalised). top-k and min-p commute with everything (min-p
compares probabilities with their maximum, which renormalising keeps); top-p does not, so the order matters when
min-p and top-p are both set: transformers runs top-k, top-p, min-p; vLLM runs min-p, then top-k, then top-p.

The sampled token always counts as kept: the learner's filters, computed from its own logits, may drop a token at
the boundary that the sampler kept (rounding), and its log-probability must stay finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# The order each backend applies the filters in
FILTER_ORDER = {"transformers": ("top_k", "top_p", "min_p"), "vllm": ("min_p", "top_k", "top_p")}
ORDERS = tuple(FILTER_ORDER)


@dataclass(frozen=True)
class Truncation:
    """The sampler's filters: `top_k` (0: off), `top_p` (1: off), `min_p` (0: off), and the `order` its backend
    applies them in ("transformers" or "vllm")."""

    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    order: str = "transformers"

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order={self.order!r}: expected one of {ORDERS}")

    @property
    def active(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


def _top_k(z: Tensor, k: int) -> Tensor:
    k = min(k, z.size(-1))
    return z >= torch.topk(z, k, dim=-1).values[..., -1:]


def _top_p(z: Tensor, p: float) -> Tensor:
    """z: tempered logits with -inf where an earlier filter dropped a token."""
    ordered, order = torch.sort(z, dim=-1)  # ascending
    mass = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
    drop = mass <= 1 - p
    drop[..., -1] = False  # the most likely token always stays
    return ~drop.scatter(-1, order, drop)


def _min_p(z: Tensor, p: float) -> Tensor:
    # log(prob_i) >= log(min_p) + log(prob_max)  <=>  z_i >= z_max + log(min_p): no softmax needed
    return z >= z.amax(dim=-1, keepdim=True) + torch.log(torch.tensor(p, dtype=z.dtype, device=z.device))


def kept_mask(z: Tensor, truncation: Truncation, labels: Tensor | None = None) -> Tensor:
    """`(..., V)` bool: the tokens the sampler could draw at each position of the tempered logits `z` `(..., V)`;
    each `labels` token (`(...)`, the sampled ones) is kept whatever the filters say."""
    keep = torch.ones_like(z, dtype=torch.bool)
    for step in FILTER_ORDER[truncation.order]:
        if step == "top_k" and truncation.top_k > 0:
            keep &= _top_k(z.masked_fill(~keep, -torch.inf), truncation.top_k)
        elif step == "top_p" and truncation.top_p < 1.0:
            keep &= _top_p(z.masked_fill(~keep, -torch.inf), truncation.top_p)
        elif step == "min_p" and truncation.min_p > 0.0:
            keep &= _min_p(z.masked_fill(~keep, -torch.inf), truncation.min_p)
    if labels is not None:
        keep.scatter_(-1, labels.unsqueeze(-1), True)
    return keep


def truncate_logits(z: Tensor, truncation: Truncation | None, labels: Tensor | None = None) -> Tensor:
    """The tempered logits `z` with -inf outside the kept set (a new tensor; `z` itself when `truncation` is None or
    inactive). A log-softmax of the result is `log pi_K`; its gradient is 0 outside the set."""
    if truncation is None or not truncation.active:
        return z
    with torch.no_grad():
        keep = kept_mask(z.detach(), truncation, labels)
    return z.masked_fill(~keep, -torch.inf)


def sampling_truncation(args) -> Truncation | None:
    """The filters the run's sampler applies (`top_k`, `top_p`, `min_p`, with `generation_kwargs` winning, as the
    backends take them), in its backend's order; None when it does not truncate or `logprobs_over_kept_tokens` is
    off."""
    if not getattr(args, "logprobs_over_kept_tokens", True):
        return None
    overrides = getattr(args, "generation_kwargs", None) or {}
    if isinstance(overrides, str):
        import json

        overrides = json.loads(overrides)
    top_k = overrides.get("top_k", args.top_k) or 0
    top_p = overrides.get("top_p", args.top_p)
    min_p = overrides.get("min_p", args.min_p) or 0.0
    truncation = Truncation(
        top_k=int(top_k),
        top_p=1.0 if top_p is None else float(top_p),
        min_p=float(min_p),
        order="vllm" if getattr(args, "use_vllm", False) else "transformers",
    )
    return truncation if truncation.active else None
