"""Per-token log-probabilities and entropies from logits (torch only).

The trainer feeds these functions one chunk of rows at a time, so the float32 `(rows, T, V)` tensor below only ever
exists for a chunk, never for the whole batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .truncation import Truncation, kept_mask, kept_threshold, truncate_logits


def token_logps_and_entropy(
    logits: Tensor,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = True,
    truncation: Truncation | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probability of each label token, and the entropy of each position's distribution.

    Sampling divides the logits by `temperature`, so the log-probabilities of the sampled tokens are those of
    `softmax(logits / temperature)`; both outputs use that tempered distribution, computed in float32.

    Args:
        logits: `(B, T, V)` next-token logits; `logits[:, t]` predicts `labels[:, t]`.
        labels: `(B, T)` token ids.
        temperature: > 0.
        compute_entropy: also return the entropies (else None).
        truncation: the sampler's top-k / top-p / min-p: both outputs are then of the distribution renormalised over
            the tokens they keep at each position (`grpokit.algorithms.truncation`); None: the whole vocabulary.

    Returns:
        `logps` `(B, T)` float32, and `entropies` `(B, T)` float32 (nats) or None. Both carry gradient.
    """
    tempered = truncate_logits(logits.float() / temperature, truncation, labels)
    log_probs = torch.log_softmax(tempered, dim=-1)  # (B, T, V)
    logps = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    if not compute_entropy:
        return logps, None
    probs = log_probs.exp()
    entropies = -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(-1)  # (B, T)
    return logps, entropies


# Logits (rows x vocabulary) one chunk of `linear_token_logps` holds at once, in float32: 2**23 floats = 32 MiB. The
# chunk's rows are the M of its products with the LM head: with SmolLM2's 49,152-token vocabulary, 170 rows run them
# at about 285 GFLOP/s on 2 cores where 85 rows (16 MiB) ran them at 185-245 (fwd + bwd of 508 rows: 0.50 s, 0.62 s).
LOGITS_PER_CHUNK = 2**23
ENTROPY_MODES = ("none", "detached", "grad")


def linear_token_logps(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    entropy: str = "none",
    logits_per_chunk: int = LOGITS_PER_CHUNK,
    truncation: Truncation | None = None,
    tied=None,
) -> tuple[Tensor, Tensor | None]:
    """`token_logps_and_entropy` of the logits `hidden @ weight.T + bias`, without ever holding them all.

    The LM head and the log-softmax run together over chunks of rows (at most `logits_per_chunk` logits each). The
    backward pass recomputes each chunk's logits instead of keeping them, so memory holds one chunk of logits plus
    `hidden`, whatever the number of rows or the vocabulary.

    Args:
        hidden: `(N, d)` final hidden states, one row per scored token.
        weight: `(V, d)` the LM head; bias: `(V,)` or None.
        labels: `(N,)` the token each row predicts.
        temperature: the logits are divided by it.
        entropy: "none" (not computed), "detached" (computed, without gradient: for logging and masks) or "grad".
        truncation: as in `token_logps_and_entropy`; the kept set's threshold per row is computed in the forward pass
            and reused by the backward pass, which recomputes the logits but not the filters.
        tied: None, or for a weight tied to the input embedding an object whose `hand_over(grad)` backward calls with
            the weight's gradient instead of returning it (`grpokit.scoring.tied`: the embedding's backward then adds
            its rows to it, and the weight receives the sum).

    Returns:
        `logps` `(N,)` float32 with gradient, and `entropies` `(N,)` float32 or None.
    """
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"entropy={entropy!r}: expected one of {ENTROPY_MODES}")
    rows = max(1, logits_per_chunk // weight.size(0))
    truncation = truncation if truncation is not None and truncation.active else None
    logps, entropies = _LinearLogSoftmax.apply(
        hidden, weight, bias, labels, temperature, entropy, rows, truncation, tied
    )
    return logps, (None if entropy == "none" else entropies)


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float) -> Tensor:
    """`(n, V)` float32 tempered logits of a chunk of rows (the product in the inputs' dtype, as the LM head)."""
    logits = (hidden @ weight.t() if bias is None else torch.addmm(bias, hidden, weight.t())).float()
    return logits if temperature == 1.0 else logits.div_(temperature)  # a fresh tensor: in place, one pass less


def _truncate_(logits: Tensor, truncation, labels: Tensor, threshold: Tensor) -> Tensor:
    """`logits` with -inf outside the kept set at or above `threshold` (one per row), the labels kept; in place."""
    return logits.masked_fill_(~kept_mask(logits, truncation, labels, threshold), -torch.inf)


class _LinearLogSoftmax(torch.autograd.Function):
    """Forward: per chunk, logits -> log-sum-exp -> label log-probability (and entropy). Backward: per chunk,
    recomputed logits -> d(loss)/d(logits) -> gradients of `hidden`, `weight` and `bias`."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, entropy, rows, truncation, tied):
        ctx.set_materialize_grads(False)
        n = hidden.size(0)
        logps = hidden.new_empty(n, dtype=torch.float32)
        log_norms = hidden.new_empty(n, dtype=torch.float32)  # log-sum-exp of each row's tempered logits
        entropies = hidden.new_zeros(n if entropy != "none" else 0, dtype=torch.float32)
        # the kept set of a truncating sampler, one logit threshold per row: computed here, reused by backward
        thresholds = hidden.new_empty(n if truncation is not None else 0, dtype=torch.float32)
        for start in range(0, n, rows):
            chunk = slice(start, start + rows)
            logits = _chunk_logits(hidden[chunk], weight, bias, temperature)  # (n, V)
            if truncation is not None:
                thresholds[chunk] = kept_threshold(logits, truncation)
                _truncate_(logits, truncation, labels[chunk], thresholds[chunk])
            log_norms[chunk] = torch.logsumexp(logits, dim=-1)
            log_probs = logits.sub_(log_norms[chunk].unsqueeze(-1))  # in place: the logits are not needed after
            logps[chunk] = log_probs.gather(-1, labels[chunk].unsqueeze(-1)).squeeze(-1)
            if entropy != "none":
                entropies[chunk] = _entropy(log_probs)
            del logits, log_probs
        ctx.save_for_backward(hidden, weight, bias, labels, log_norms, entropies, thresholds)
        ctx.temperature, ctx.rows, ctx.truncation, ctx.tied = temperature, rows, truncation, tied
        device = hidden.device.type  # the backward pass recomputes the logits under the same autocast state
        ctx.autocast = (device, torch.get_autocast_dtype(device), torch.is_autocast_enabled(device))
        if entropy != "grad":
            ctx.mark_non_differentiable(entropies)
        return logps, entropies

    @staticmethod
    def backward(ctx, grad_logps, grad_entropies):
        hidden, weight, bias, labels, log_norms, entropies, thresholds = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if need_bias else None
        for start in range(0, hidden.size(0), ctx.rows):
            chunk = slice(start, start + ctx.rows)
            device, dtype, enabled = ctx.autocast
            with torch.autocast(device, dtype=dtype, enabled=enabled):
                logits = _chunk_logits(hidden[chunk], weight, bias, ctx.temperature)
            if ctx.truncation is not None:
                _truncate_(logits, ctx.truncation, labels[chunk], thresholds[chunk])
            grad_logits = _chunk_grad_logits(
                logits,
                labels[chunk],
                log_norms[chunk],
                entropies[chunk] if grad_entropies is not None else None,
                None if grad_logps is None else grad_logps[chunk],
                None if grad_entropies is None else grad_entropies[chunk],
            )  # (n, V) float32: d(loss)/d(tempered logits)
            if ctx.temperature != 1.0:
                grad_logits.div_(ctx.temperature)  # d(loss)/d(untempered logits)
            if need_hidden:
                grad_hidden[chunk] = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)
            if need_weight:
                grad_weight.addmm_(grad_logits.t(), hidden[chunk].float())  # in place: no (V, d) temporary
            if need_bias:
                grad_bias += grad_logits.sum(0)
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        if grad_weight is not None and ctx.tied is not None:
            ctx.tied.hand_over(grad_weight)  # the tied embedding's backward adds its rows and returns the sum
            grad_weight = None
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


def _entropy(log_probs: Tensor) -> Tensor:
    """`-sum p log p` over the last dimension (0 log 0 = 0): one row-wise dot product of `p` and `log p` (two passes
    over the rows, where masking the zeros first took five); rows holding a -inf log-probability (a truncated
    sampler's) are summed again without their zeros."""
    probs = log_probs.exp()
    entropies = -torch.linalg.vecdot(probs, log_probs)
    bad = entropies.isnan()
    if bad.any():
        rows = bad.nonzero().squeeze(-1)
        p, logp = probs[rows], log_probs[rows]
        entropies[rows] = -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)
    return entropies


def _chunk_grad_logits(logits, labels, log_norms, entropies, grad_logps, grad_entropies) -> Tensor:
    """d(loss)/d(logits) `(n, V)` of one chunk, given the upstream gradients of its log-probabilities and entropies.

    d log p_label / d z_j = 1[j = label] - p_j;   d H / d z_j = -p_j (log p_j + H).

    `logits` (float32, recomputed for this call) are overwritten: without entropies the gradient is built in their
    storage (three passes over `(n, V)`, no other tensor of that size); with entropies, a plain computation.
    """
    if grad_entropies is None:
        if grad_logps is None:
            return logits.zero_()
        grad = logits.sub_(log_norms.unsqueeze(-1)).exp_().mul_(-grad_logps.unsqueeze(-1))  # -g p
        return grad.scatter_add_(-1, labels.unsqueeze(-1), grad_logps.unsqueeze(-1))  # + g at the label
    log_probs = logits - log_norms.unsqueeze(-1)
    probs = torch.exp(log_probs)
    grad = torch.zeros_like(logits)
    if grad_logps is not None:
        grad -= grad_logps.unsqueeze(-1) * probs
        grad.scatter_add_(-1, labels.unsqueeze(-1), grad_logps.unsqueeze(-1))
    if grad_entropies is not None:
        log_probs = log_probs.masked_fill(probs == 0, 0.0)
        grad -= grad_entropies.unsqueeze(-1) * probs * (log_probs + entropies.unsqueeze(-1))
    return grad
