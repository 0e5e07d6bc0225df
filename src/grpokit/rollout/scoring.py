"""Scoring completions with a causal LM: per-token log-probabilities (and entropies) of the completion tokens.

Rows are processed `chunk_size` at a time and only the completion positions' logits are computed
(`logits_to_keep`), so a float32 `(rows, completion length, vocab)` tensor exists for one chunk at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpokit.algorithms.logprobs import token_logps_and_entropy


@dataclass
class TokenScores:
    logps: Tensor  # (B, C)
    entropies: Tensor | None  # (B, C)
    aux_loss: Tensor | None  # () MoE load-balancing loss, mean over chunks


def score_tokens(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    logits_to_keep: int,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    compute_entropy: bool = False,
    compute_aux_loss: bool = False,
) -> TokenScores:
    """Log-probabilities of the last `logits_to_keep` tokens of each row under `model`.

    Args:
        model: a causal LM whose forward takes `logits_to_keep` (every transformers LM does).
        input_ids: `(B, P + C)` prompt (left-padded) then completion (right-padded).
        attention_mask: `(B, P + C)`.
        logits_to_keep: C, the completion length.
        temperature: the sampling temperature (logits are divided by it, as when sampling).
        chunk_size: rows per forward pass; default all rows at once.
        compute_entropy: also return the entropy of each completion position.
        compute_aux_loss: ask a Mixture-of-Experts model for its router load-balancing loss.

    Returns:
        `TokenScores` with `(B, C)` float32 tensors; gradients flow unless called under `torch.no_grad()`.
    """
    chunk_size = chunk_size or input_ids.size(0)
    labels = input_ids[:, -logits_to_keep:]  # (B, C)
    logps, entropies, aux_losses = [], [], []
    for start in range(0, input_ids.size(0), chunk_size):
        rows = slice(start, start + chunk_size)
        extra = {"output_router_logits": True} if compute_aux_loss else {}
        # One more logit than completion tokens: position t predicts token t + 1, so the logits that predict the C
        # completion tokens are those of the C positions before the last one.
        outputs = model(
            input_ids=input_ids[rows],
            attention_mask=attention_mask[rows],
            logits_to_keep=logits_to_keep + 1,
            use_cache=False,
            **extra,
        )
        logits = outputs.logits[:, :-1]  # (rows, C, V)
        chunk_logps, chunk_entropies = token_logps_and_entropy(
            logits, labels[rows], temperature=temperature, compute_entropy=compute_entropy
        )
        logps.append(chunk_logps)
        if compute_entropy:
            entropies.append(chunk_entropies)
        if compute_aux_loss:
            aux_losses.append(outputs.aux_loss)
        del outputs, logits
    return TokenScores(
        logps=torch.cat(logps),
        entropies=torch.cat(entropies) if compute_entropy else None,
        aux_loss=torch.stack(aux_losses).mean() if compute_aux_loss else None,
    )
