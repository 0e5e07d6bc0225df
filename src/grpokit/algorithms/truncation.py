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
the boundary that the sampler kept (rounding: top-p's cumulative mass is summed here from the most likely token down,
transformers and vLLM sum it from the least likely up, so a nucleus whose mass lands within rounding of `top_p` may
end one token apart), and its log-probability must stay finite.

Each filter keeps the tokens at or above a cut, so the kept set is one threshold per position: the fused LM-head
path computes it once in the forward pass and keeps it (a float per token) for the backward pass, which recomputes
the logits but not the filters. top-p finds its cut among the `TOP_P_CANDIDATES` most likely tokens (a top-k, not a
sort of the vocabulary), sorting the whole row only when the nucleus is larger.
"""

from __future__ import annotations

import math
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


# top-p looks for its cut among this many most likely tokens first; a row whose nucleus is larger is sorted whole
TOP_P_CANDIDATES = 1024


def _top_p_threshold(z: Tensor, p: float, floor: Tensor | None, candidates: int) -> Tensor:
    """`(n,)` the smallest logit top-p keeps in each row of `z` `(n, V)`, over the tokens at or above `floor` (what
    earlier filters left; None: all), renormalised: in descending order a token is kept while the mass before it is
    below `p` (transformers' and vLLM's rule, read from the other end), the first always."""
    masked = z if floor is None else z.masked_fill(z < floor.unsqueeze(-1), -torch.inf)
    log_norm = torch.logsumexp(masked, dim=-1, keepdim=True)

    def cut(values: Tensor, norm: Tensor) -> tuple[Tensor, Tensor]:  # values: descending; (cut, nucleus not closed)
        mass = torch.exp(values - norm)
        keep = ((torch.cumsum(mass, dim=-1) - mass) < p) & (values > -torch.inf)  # never what a floor took away
        keep[:, 0] = True
        return values.gather(-1, (keep.sum(dim=-1) - 1).unsqueeze(-1)).squeeze(-1), keep.all(dim=-1)

    k = min(candidates, z.size(-1))
    threshold, all_kept = cut(torch.topk(masked, k, dim=-1).values, log_norm)
    if k < z.size(-1) and all_kept.any():  # the nucleus may reach past the candidates: those rows sorted whole
        rows = all_kept.nonzero().flatten()
        values = torch.sort(masked[rows], dim=-1, descending=True).values
        threshold[rows] = cut(values, log_norm[rows])[0]
    return threshold


def kept_threshold(z: Tensor, truncation: Truncation, candidates: int = TOP_P_CANDIDATES) -> Tensor:
    """`(...)` per position of the tempered logits `z` `(..., V)`: the smallest logit the filters keep. Each filter
    keeps every token at or above a cut (top-k: the k-th largest logit; top-p: see `_top_p_threshold`; min-p:
    `max + log(min_p)`), so together they keep the tokens at or above the largest of the cuts, each computed on what
    the filters before it left (tokens tied with a cut are all kept)."""
    flat = z.reshape(-1, z.size(-1))
    threshold = None
    for step in FILTER_ORDER[truncation.order]:
        if step == "top_k" and truncation.top_k > 0:
            cut = torch.topk(flat, min(truncation.top_k, flat.size(-1)), dim=-1).values[:, -1]
        elif step == "top_p" and truncation.top_p < 1.0:
            cut = _top_p_threshold(flat, truncation.top_p, threshold, candidates)
        elif step == "min_p" and truncation.min_p > 0.0:
            cut = flat.amax(dim=-1) + math.log(truncation.min_p)
        else:
            continue
        threshold = cut if threshold is None else torch.maximum(threshold, cut)
    if threshold is None:
        threshold = flat.new_full((flat.size(0),), -torch.inf)
    return threshold.reshape(z.shape[:-1])


def kept_mask(
    z: Tensor, truncation: Truncation, labels: Tensor | None = None, threshold: Tensor | None = None
) -> Tensor:
    """`(..., V)` bool: the tokens the sampler could draw at each position of the tempered logits `z` `(..., V)`
    (those at or above `threshold`, `kept_threshold`'s, computed when not given); each `labels` token (`(...)`, the
    sampled ones) is kept whatever the filters say."""
    if threshold is None:
        threshold = kept_threshold(z, truncation)
    keep = z >= threshold.unsqueeze(-1)
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
