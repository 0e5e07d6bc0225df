"""Scoring completions with a causal LM: per-token log-probabilities (and entropies) of the completion tokens.

Two passes compute the same numbers. The shared-prefix pass (`grpokit.scoring.prefix`) runs each distinct prompt
once and fuses the LM head with the log-softmax in chunks; it serves standard transformers causal LMs. The plain pass
runs the model on every row and serves everything else (wrapped models, prompt-learning PEFT, activation
checkpointing, MoE router losses, models whose logits are not `lm_head(hidden state)`).

Memory in the plain pass: only the completion positions' logits are computed (`logits_to_keep`); the model runs on
`chunk_size` rows at a time; and the float32 softmax arithmetic runs on slices of at most `FLOAT32_BUDGET` logits.
When gradients are needed that arithmetic is checkpointed: backward keeps the logits (in the model's dtype) and
recomputes the float32 tensors one slice at a time, so no float32 `(rows, completion length, vocab)` tensor ever
spans the whole batch.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from grpokit import routing
from grpokit.algorithms.logprobs import token_logps_and_entropy

from .prefix import score_shared_prefix, shared_prefix_model

# Logits (rows x positions x vocab) turned into float32 at once: 2**28 floats = 1 GiB.
FLOAT32_BUDGET = 2**28


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
    entropy_grad: bool = True,
    compute_aux_loss: bool = False,
    share_prefix: bool = True,
    vision=None,
    truncation=None,
    routes: Tensor | None = None,
    agreement=None,
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
        entropy_grad: whether the entropies need a gradient (an entropy bonus); without, they are computed outside
            the autograd graph (logging, entropy masks).
        compute_aux_loss: ask a Mixture-of-Experts model for its router load-balancing loss (plain pass).
        share_prefix: use the shared-prefix pass where the model allows it.
        vision: a vision-language model's image inputs (`grpokit.vision.VisionRows`, one entry per row); the plain
            pass then runs, giving each chunk of rows its own images.
        truncation: the sampler's top-k / top-p / min-p (`grpokit.algorithms.truncation.Truncation`): the
            log-probabilities and entropies are then over the tokens it keeps at each position; None: the vocabulary.
        routes: `(B, P + C, routers, top_k)` the sampler's experts per token (`grpokit.routing`): a mixture-of-experts
            model's forward then routes each token to them (-1: its own choice); the plain pass runs. Under gradients
            the routers keep replaying until `grpokit.routing.release(model)`, after the backward pass.
        agreement: a `grpokit.routing.Agreement` counting how often the model's own routing was the replayed one.

    Returns:
        `TokenScores` with `(B, C)` float32 tensors; gradients flow unless called under `torch.no_grad()`. Positions
        where the completion is padding hold arbitrary values (0 in the shared-prefix pass).
    """
    plain_only = compute_aux_loss or vision is not None or routes is not None
    lm = shared_prefix_model(model) if share_prefix and not plain_only else None
    chunk_size = chunk_size or input_ids.size(0)
    if routes is not None and torch.is_grad_enabled() and chunk_size < input_ids.size(0):
        raise ValueError(
            "routing replay with gradients scores all rows in one chunk (its routers replay until backward)"
        )
    entropy = "none" if not compute_entropy else "grad" if entropy_grad else "detached"
    logps, entropies, aux_losses = [], [], []
    for start in range(0, input_ids.size(0), chunk_size):
        rows = slice(start, start + chunk_size)
        if lm is not None:
            chunk_logps, chunk_entropies = score_shared_prefix(
                lm,
                input_ids[rows],
                attention_mask[rows],
                logits_to_keep,
                temperature=temperature,
                entropy=entropy,
                truncation=truncation,
            )
        else:
            extra = (
                {}
                if vision is None
                else vision.model_inputs(
                    input_ids.size(1) - logits_to_keep, logits_to_keep, rows=rows, device=input_ids.device
                )
            )
            replay = contextlib.nullcontext()
            if routes is not None:  # with a backward to come, replayed until it is done (routing.release)
                replay = routing.replaying(model, routes[rows], agreement, until_released=torch.is_grad_enabled())
            with replay:
                chunk_logps, chunk_entropies, aux_loss = _score_plain(
                    model,
                    input_ids[rows],
                    attention_mask[rows],
                    logits_to_keep,
                    temperature,
                    entropy,
                    compute_aux_loss,
                    extra,
                    truncation,
                )
            aux_losses.append(aux_loss)
        logps.append(chunk_logps)
        entropies.append(chunk_entropies)
    return TokenScores(
        logps=torch.cat(logps),
        entropies=torch.cat(entropies) if compute_entropy else None,
        aux_loss=torch.stack(aux_losses).mean() if compute_aux_loss else None,
    )


def _score_plain(
    model, input_ids, attention_mask, logits_to_keep, temperature, entropy, compute_aux_loss, extra, truncation=None
):
    """`(logps, entropies or None, aux_loss or None)` of one chunk of rows by the model's own forward pass; `extra`:
    more model inputs (images)."""
    extra = {**extra, "output_router_logits": True} if compute_aux_loss else extra
    # One more logit than completion tokens: position t predicts token t + 1, so the logits that predict the C
    # completion tokens are those of the C positions before the last one.
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        logits_to_keep=logits_to_keep + 1,
        use_cache=False,
        **extra,
    )
    logits = outputs.logits[:, -logits_to_keep - 1 : -1]  # (rows, C, V), in the model's dtype
    labels = input_ids[:, -logits_to_keep:]
    logps, entropies = _logps_in_slices(logits, labels, temperature, entropy == "grad", truncation)
    if entropy == "detached":
        with torch.no_grad():
            entropies = _logps_in_slices(logits.detach(), labels, temperature, True, truncation)[1]
    return logps, entropies, outputs.aux_loss if compute_aux_loss else None


def _logps_in_slices(logits: Tensor, labels: Tensor, temperature: float, compute_entropy: bool, truncation=None):
    """`token_logps_and_entropy` over slices of rows small enough for the float32 budget; checkpointed under grad."""
    rows_per_slice = max(1, FLOAT32_BUDGET // max(1, logits.size(1) * logits.size(2)))
    fn = functools.partial(
        token_logps_and_entropy, temperature=temperature, compute_entropy=compute_entropy, truncation=truncation
    )
    logps, entropies = [], []
    for start in range(0, logits.size(0), rows_per_slice):
        rows = slice(start, start + rows_per_slice)
        if torch.is_grad_enabled() and logits.requires_grad:
            slice_logps, slice_entropies = checkpoint(fn, logits[rows], labels[rows], use_reentrant=False)
        else:
            slice_logps, slice_entropies = fn(logits[rows], labels[rows])
        logps.append(slice_logps)
        entropies.append(slice_entropies)
    return torch.cat(logps), torch.cat(entropies) if compute_entropy else None
