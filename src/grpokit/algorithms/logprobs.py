"""Per-token log-probabilities and entropies from logits (torch only).

The trainer feeds these functions one chunk of rows at a time, so the float32 `(rows, T, V)` tensor below only ever
exists for a chunk, never for the whole batch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_logps_and_entropy(
    logits: Tensor, labels: Tensor, *, temperature: float = 1.0, compute_entropy: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Log-probability of each label token, and the entropy of each position's distribution.

    Sampling divides the logits by `temperature`, so the log-probabilities of the sampled tokens are those of
    `softmax(logits / temperature)`; both outputs use that tempered distribution, computed in float32.

    Args:
        logits: `(B, T, V)` next-token logits; `logits[:, t]` predicts `labels[:, t]`.
        labels: `(B, T)` token ids.
        temperature: > 0.
        compute_entropy: also return the entropies (else None).

    Returns:
        `logps` `(B, T)` float32, and `entropies` `(B, T)` float32 (nats) or None. Both carry gradient.
    """
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (B, T, V)
    logps = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    if not compute_entropy:
        return logps, None
    probs = log_probs.exp()
    entropies = -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)  # (B, T)
    return logps, entropies
