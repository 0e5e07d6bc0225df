"""A tied input embedding and LM head (one `(V, d)` weight, as in SmolLM2, Qwen2-0.5B, Llama-3.2-1B): the two
gradients of that weight summed in one tensor.

Autograd gives the tied weight two gradients in backward: the LM head's, which comes first, and the embedding's, which
comes last: `(V, d)` zeros with each token's row added. It holds the first until the second arrives, then adds them
into a third tensor. Three `(V, d)` tensors are alive at the end of backward, where every other gradient is held
too (108 MiB each for SmolLM2-135M in float32). Here the LM head (`linear_token_logps`) hands its gradient over and the
embedding's backward adds its tokens' rows into it in place. The weight then receives the same sum, once, as it
does from autograd: tensor hooks on the weight, its post-accumulate hooks and gradient accumulation see what they see
without this. Used where `prefix_attention`'s one pass runs the embedding itself.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from grpokit.fastpath.column_step import hooked, input_grads_hook_only


class TiedWeight:
    """The shared weight of `lm`'s embedding and LM head during one scoring pass: `embed` runs the embedding, and the
    LM head's backward calls `hand_over` with its gradient, which the embedding's backward then completes."""

    def __init__(self, embedding: nn.Embedding):
        self.embedding = embedding
        self._pending: Tensor | None = None

    def embed(self, tokens: Tensor) -> Tensor:
        """The embedding of `tokens` (any shape), as `embedding(tokens)`."""
        return _Embedding.apply(tokens, self.embedding.weight, self)

    def hand_over(self, grad: Tensor) -> None:
        """Called by the LM head's backward with its `(V, d)` gradient of the weight (a tensor nothing else holds);
        a second one before the embedding's backward takes them is added to the first."""
        if self._pending is None:
            self._pending = grad
        else:
            self._pending += grad

    def take(self) -> Tensor | None:
        grad, self._pending = self._pending, None
        return grad


def tied_weight(lm) -> TiedWeight | None:
    """A `TiedWeight` for `lm` when its LM head and input embedding share a weight that gets a gradient now and the
    embedding is a plain `nn.Embedding` (no max_norm, scale_grad_by_freq or sparse gradient, no hooks but the
    inputs-require-grads one of activation checkpointing); else None (the embedding module runs as usual)."""
    if not torch.is_grad_enabled():
        return None
    embedding, head = lm.get_input_embeddings(), lm.get_output_embeddings()
    if head is None or type(embedding) is not nn.Embedding or head.weight is not embedding.weight:
        return None
    weight = embedding.weight
    plain = type(weight) is nn.Parameter and type(weight.data) is torch.Tensor  # not a DTensor or other subclass
    if not plain or not weight.requires_grad:
        return None
    if embedding.max_norm is not None or embedding.scale_grad_by_freq or embedding.sparse:
        return None
    if hooked([embedding]) and not input_grads_hook_only(embedding):
        return None
    return TiedWeight(embedding)


class _Embedding(torch.autograd.Function):
    """`embedding(tokens)`; backward adds each token's gradient row into the LM head's gradient when it was handed
    over (else into zeros, as the embedding's own backward), rows of the padding token left out."""

    @staticmethod
    def forward(ctx, tokens, weight, tied):
        ctx.save_for_backward(tokens)
        ctx.tied = tied
        return nn.functional.embedding(tokens, weight, tied.embedding.padding_idx)

    @staticmethod
    def backward(ctx, grad_output):
        (tokens,) = ctx.saved_tensors
        tied = ctx.tied
        weight = tied.embedding.weight
        grad = tied.take()
        if grad is None:
            grad = torch.zeros(weight.shape, dtype=weight.dtype, device=weight.device)
        tokens = tokens.reshape(-1)
        rows = grad_output.reshape(tokens.numel(), -1).to(grad.dtype)
        padding = tied.embedding.padding_idx
        if padding is not None:
            kept = tokens != padding
            tokens, rows = tokens[kept], rows[kept]
        return None, grad.index_add_(0, tokens, rows), None
