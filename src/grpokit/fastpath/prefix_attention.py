"""Shared-prefix scoring for Llama-family models in one pass: the distinct prompts and the completions go through the
decoder layers together, and attention reads each prompt's keys and values once per group (the Prefix Grouper idea).

Through the model's own forward, shared-prefix scoring (`prefix._hidden_states_shared`) is two passes: the prompts,
then the completions with the prompts' keys and values copied to every row. Here the decoder layers run once over the
tokens of both, `G x P` prompt tokens and `B x (C - 1)` completion tokens, with the layers' own modules (norms,
projections, MLP: adapters such as LoRA still apply); so every linear layer is one product (and one weight-gradient
product) over all the tokens. Only attention differs: prompts attend causally within themselves; each group's
completion queries meet their prompt's keys in one product per group, each row's queries its own completion's keys
in another, and one softmax spans both, which is plain attention over the whole sequence. The prompt's gradient sums
over its group's rows inside the products.

Positions are those of the plain pass over the padded sequence (0 .. P - 1 for the prompt, P .. for the completion),
as transformers numbers them without position ids. Only Llama and Qwen2 models on CPU with no hooks on the layers
whose forward this replaces; `prefix` also checks the result against the model's plain forward pass once per model.
Under transformers' activation checkpointing each checkpointed layer runs through that layer's own checkpoint
function (the user's kwargs, `every_n_layers`, offloading), so backward recomputes it as the model's forward would.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .column_step import hooked, llama_family_reason, rotate

# Attention scores (prompts' and completions') this pass may hold in float32 at once: 256 MB. Above it the model's
# own forward runs (`prefix._hidden_states_shared`).
SCORES_BUDGET = 2**26


def grouped_attention_model(lm) -> bool:
    """Whether `hidden_states` can score `lm` (a Llama or Qwen2 on CPU whose replaced forwards are its own)."""
    if llama_family_reason(lm) or lm.lm_head.weight.device.type != "cpu":
        return False
    return hooked([lm.model, *lm.model.layers, *(layer.self_attn for layer in lm.model.layers)]) is None


def fits(rows: int, groups: int, heads: int, completion_len: int, prompt_len: int) -> bool:
    """Whether the attention scores of `hidden_states` (prompts and completions) fit `SCORES_BUDGET`."""
    completion = rows * completion_len * (prompt_len + completion_len)
    return heads * (completion + groups * prompt_len * prompt_len) <= SCORES_BUDGET


def hidden_states(
    lm, input_ids: Tensor, attention_mask: Tensor, prompt_len: int, unique_index, inverse, tied=None
) -> Tensor:
    """`(B, C, d)` last hidden states (after the final norm) at the positions that predict the C completion tokens of
    `input_ids` `(B, P + C)`: the last prompt position, then the completion's first C - 1. Prompt `unique_index[g]`
    runs once; row b continues prompt `inverse[b]`. `tied`: None, or a `grpokit.scoring.tied.TiedWeight` whose
    `embed` runs the embedding."""
    rows, groups = input_ids.size(0), unique_index.numel()
    counts = torch.bincount(inverse, minlength=groups)
    if bool((counts == counts[0]).all()):  # whole groups: sort the rows into group order
        order = torch.argsort(inverse, stable=True)
        in_order = bool(torch.equal(order, torch.arange(rows, device=order.device)))
        unique_index = order[:: rows // groups]  # each group's first row, groups in order
        hidden = _one_pass(
            lm, input_ids if in_order else input_ids[order], attention_mask, prompt_len, unique_index, None, tied
        )
        return hidden if in_order else hidden.index_select(0, torch.argsort(order))
    return _one_pass(lm, input_ids, attention_mask, prompt_len, unique_index, inverse, tied)


def _one_pass(lm, input_ids, attention_mask, prompt_len, unique_index, inverse, tied) -> Tensor:
    """`hidden_states` for rows in whole groups, in order (`inverse` None; `unique_index` then indexes the original
    rows, `attention_mask` too), or for any rows, each its own group for attention (`inverse` maps rows to prompts,
    whose keys and values are then copied to the rows)."""
    backbone = lm.model
    rows, groups = input_ids.size(0), unique_index.numel()
    length = input_ids.size(1) - prompt_len - 1  # completion positions that predict a token
    group_size = rows // groups if inverse is None else 1
    prompt_ids = input_ids[:: rows // groups, :prompt_len] if inverse is None else input_ids[unique_index, :prompt_len]
    prompt_mask = attention_mask[unique_index, :prompt_len]  # (G, P)
    completion_ids = input_ids[:, prompt_len:-1]  # (B, C - 1)
    tokens = torch.cat([prompt_ids.reshape(-1), completion_ids.reshape(-1)])  # (G P + B (C - 1),)
    x = (backbone.embed_tokens(tokens) if tied is None else tied.embed(tokens))[None]  # (1, N, d)
    positions = torch.cat(
        [torch.arange(prompt_len).repeat(groups), torch.arange(prompt_len, prompt_len + length).repeat(rows)]
    ).to(x.device)
    cos, sin = backbone.rotary_emb(x, positions[None])  # (1, N, D)
    cos, sin = cos[0, :, None], sin[0, :, None]  # (N, 1, D)
    floor = torch.finfo(torch.float32).min
    causal = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=x.device).tril_()
    prompt_self_bias = torch.zeros(groups, 1, 1, prompt_len, prompt_len, device=x.device).masked_fill_(
        ~(causal & prompt_mask.bool()[:, None, None, None, :]), floor
    )  # (G, 1, 1, P, P): causal, padding keys masked
    if inverse is not None:
        prompt_mask = prompt_mask[inverse]
    prompt_bias = torch.zeros(prompt_mask.shape, device=x.device).masked_fill_(prompt_mask == 0, floor)
    prompt_bias = prompt_bias[:, None, None, None, None, :]  # (G', 1, 1, 1, 1, P), as the grouped prompt scores
    own = torch.ones(length, length, dtype=torch.bool, device=x.device).tril_()
    causal_bias = torch.zeros(length, length, device=x.device).masked_fill_(~own, floor)  # (C - 1, C - 1)
    shape = _Shape(groups, prompt_len, rows, length, group_size, inverse)
    masks = (cos, sin, prompt_self_bias, prompt_bias, causal_bias)
    for layer in backbone.layers:
        if _checkpointed(layer):  # the layer's own checkpoint function: the user's kwargs, offloading, every n layers
            x = layer._gradient_checkpointing_func(_layer, layer, x, shape, *masks)
        else:
            x = _layer(layer, x, shape, *masks)
    x = backbone.norm(x)[0]
    split = groups * prompt_len
    last = x[:split].view(groups, prompt_len, -1)[:, -1:]  # (G, 1, d): predicts each completion's first token
    last = last.repeat_interleave(group_size, 0) if inverse is None else last.index_select(0, inverse)
    return torch.cat([last, x[split:].view(rows, length, x.size(-1))], dim=1)


class _Shape(NamedTuple):
    groups: int
    prompt_len: int
    rows: int
    length: int  # completion positions that predict a token
    group_size: int
    inverse: Tensor | None


def _checkpointed(layer) -> bool:
    """Whether transformers' activation checkpointing recomputes `layer` in backward (training, with gradients)."""
    return (
        getattr(layer, "gradient_checkpointing", False) is True
        and layer.training
        and torch.is_grad_enabled()
        and callable(getattr(layer, "_gradient_checkpointing_func", None))
    )


def _layer(layer, x, shape, cos, sin, prompt_self_bias, prompt_bias, causal_bias) -> Tensor:
    """One decoder layer of `_one_pass` over `x` `(1, N, d)`."""
    groups, prompt_len, rows, length, group_size, inverse = shape
    split = groups * prompt_len
    attn = layer.self_attn
    h = layer.input_layernorm(x)[0]
    q, k, v = (proj(h).view(h.size(0), -1, attn.head_dim) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)  # (N, heads, D)
    prompt_q, prompt_k, prompt_v = (
        t[:split].view(groups, prompt_len, -1, attn.head_dim).transpose(1, 2) for t in (q, k, v)
    )  # (G, heads, P, D)
    attended = [_prompt_attention(prompt_q, prompt_k, prompt_v, prompt_self_bias, attn.scaling)]
    if length:
        keys, values = prompt_k, prompt_v
        if inverse is not None:  # index_select: its backward (index_add) is far faster than indexing's on CPU
            keys, values = keys.index_select(0, inverse), values.index_select(0, inverse)
        completion_q, completion_k, completion_v = (
            t[split:].view(rows, length, -1, attn.head_dim).transpose(1, 2) for t in (q, k, v)
        )  # (B, heads, C - 1, D)
        attended.append(
            grouped_attention(
                completion_q,
                completion_k,
                completion_v,
                keys,
                values,
                prompt_bias,
                causal_bias,
                attn.scaling,
                group_size,
            ).reshape(rows * length, -1)
        )
    x = x + attn.o_proj(torch.cat(attended))[None]
    x = x + layer.mlp(layer.post_attention_layernorm(x))
    return x


def _prompt_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scaling: float) -> Tensor:
    """Causal attention within the prompts: `q` `(G, Hq, P, D)`, `k`, `v` `(G, Hkv, P, D)`, additive `bias`
    `(G, 1, 1, P, P)`; returns `(G P, Hq D)`."""
    groups, q_heads, prompt_len, head_dim = q.shape
    kv_heads = k.size(1)
    scores = torch.matmul(q.reshape(groups, kv_heads, -1, prompt_len, head_dim), k[:, :, None].transpose(-1, -2))
    weights = (scores.to(torch.float32) * scaling + bias).softmax(dim=-1).to(q.dtype)  # (G, Hkv, g, P, P)
    out = torch.matmul(weights, v[:, :, None])  # (G, Hkv, g, P, D)
    return out.reshape(groups, q_heads, prompt_len, head_dim).transpose(1, 2).reshape(groups * prompt_len, -1)


def grouped_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prompt_keys: Tensor,
    prompt_values: Tensor,
    prompt_bias: Tensor,
    causal_bias: Tensor,
    scaling: float,
    group_size: int,
) -> Tensor:
    """Attention of completion queries `q` `(B, Hq, C, D)` over their prompt's keys `(G, Hkv, P, D)` and their own
    completion's keys `k` `(B, Hkv, C, D)` (causal), rows in G groups of `group_size` consecutive rows. Additive
    biases: `prompt_bias` `(G, 1, 1, 1, 1, P)`, `causal_bias` `(C, C)`. Returns `(B, C, Hq * D)`.

    Prompt part: one product per group and key head, `(m g C, D) @ (D, P)`, so a prompt is read once for its group
    (and its gradient sums over the group inside the product). Softmax in float32 over prompt and completion
    positions together, as the model's attention."""
    rows, q_heads, length, head_dim = q.shape
    groups, kv_heads, prompt_len, _ = prompt_keys.shape
    per_kv = q_heads // kv_heads
    # (G, m, Hkv, g, C, D) -> (G, Hkv, m, g, C, D): a group's queries for one key head side by side
    by_group = q.reshape(groups, group_size, kv_heads, per_kv, length, head_dim).transpose(1, 2)
    prompt_scores = torch.bmm(
        by_group.reshape(groups * kv_heads, -1, head_dim),
        prompt_keys.reshape(groups * kv_heads, prompt_len, head_dim).transpose(1, 2),
    ).view(groups, kv_heads, group_size, per_kv, length, prompt_len)
    prompt_scores = (prompt_scores.to(torch.float32) * scaling + prompt_bias).transpose(1, 2)  # (G, m, Hkv, g, C, P)
    own_scores = torch.bmm(
        q.reshape(rows * kv_heads, per_kv * length, head_dim),
        k.reshape(rows * kv_heads, length, head_dim).transpose(1, 2),
    ).view(rows, kv_heads, per_kv, length, length)
    own_scores = own_scores.to(torch.float32) * scaling + causal_bias
    scores = torch.cat([prompt_scores.reshape(rows, kv_heads, per_kv, length, prompt_len), own_scores], dim=-1)
    weights = scores.softmax(dim=-1).to(q.dtype)  # (B, Hkv, g, C, P + C)
    prompt_weights = weights[..., :prompt_len].reshape(groups, group_size, kv_heads, per_kv, length, prompt_len)
    from_prompt = torch.bmm(
        prompt_weights.transpose(1, 2).reshape(groups * kv_heads, -1, prompt_len),
        prompt_values.reshape(groups * kv_heads, prompt_len, head_dim),
    ).view(groups, kv_heads, group_size, per_kv, length, head_dim)
    from_prompt = from_prompt.transpose(1, 2).reshape(rows, q_heads, length, head_dim)
    own = torch.bmm(
        weights[..., prompt_len:].reshape(rows * kv_heads, per_kv * length, length),
        v.reshape(rows * kv_heads, length, head_dim),
    ).view(rows, q_heads, length, head_dim)
    return (from_prompt + own).transpose(1, 2).reshape(rows, length, -1)
