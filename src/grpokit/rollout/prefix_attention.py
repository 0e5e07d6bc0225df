"""The completion pass of shared-prefix scoring for Llama-family models, with attention that reads each prompt's keys
and values once per group (the Prefix Grouper idea).

`prefix._hidden_states_shared` runs the distinct prompts through the model once and then the completions on top.
Through the model's own attention, that second pass needs the prompts' keys and values copied to every row, and its
attention (and backward) works over `rows x heads x (prompt + completion)` keys. Here the decoder layers run with
their own modules (norms, projections, MLP, so adapters such as LoRA still apply) except for attention: each group's
queries meet its prompt's keys in one product, each row's queries meet its own completion's keys in another, and a
single softmax spans both, so the result is plain attention over the whole sequence. The prompt's gradient sums over
its group's rows through the products themselves.

Only Llama and Qwen2 models, on CPU, with no hooks on the layers whose forward this replaces; `prefix` checks the
result against the model's plain forward pass once per model (`_agrees_with_plain_pass`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .column_step import ARCHITECTURES

# Attention scores `(rows, heads, completion, prompt + completion)` this pass may hold in float32 at once; above it the
# model's own attention runs.
SCORES_BUDGET = 2**26


def grouped_attention_model(lm) -> bool:
    """Whether `lm`'s completion pass can run here."""
    if type(lm).__name__ not in ARCHITECTURES or lm.lm_head.weight.device.type != "cpu":
        return False
    if lm.training and getattr(lm.config, "attention_dropout", 0.0):
        return False
    modules = [lm.model, *lm.model.layers, *(layer.self_attn for layer in lm.model.layers)]
    if any(m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__ for m in modules):
        return False
    return all(not getattr(layer.self_attn, "sliding_window", None) for layer in lm.model.layers)


def fits(rows: int, heads: int, completion_len: int, prompt_len: int) -> bool:
    return rows * heads * completion_len * (prompt_len + completion_len) <= SCORES_BUDGET


def completion_hidden_states(lm, cache, completion_ids: Tensor, prompt_mask: Tensor, inverse: Tensor) -> Tensor:
    """`(B, C, d)` last hidden states (after the final norm) of `completion_ids` `(B, C)` following the G prompts whose
    keys and values fill `cache` (`(G, Hkv, P, D)` per layer, left-padded as `prompt_mask` `(G, P)`); row b continues
    prompt `inverse[b]`. Positions P, P + 1, ... as in the plain pass over the padded sequence."""
    rows, groups = completion_ids.size(0), prompt_mask.size(0)
    counts = torch.bincount(inverse, minlength=groups)
    if bool((counts == counts[0]).all()) and int(counts[0]) > 1:  # whole groups: sort the rows into group order
        order = torch.argsort(inverse, stable=True)
        in_order = bool(torch.equal(order, torch.arange(rows, device=order.device)))
        hidden = _grouped_pass(lm, cache, completion_ids if in_order else completion_ids[order], prompt_mask, None)
        return hidden if in_order else hidden.index_select(0, torch.argsort(order))
    return _grouped_pass(lm, cache, completion_ids, prompt_mask, inverse)


def _grouped_pass(lm, cache, completion_ids: Tensor, prompt_mask: Tensor, inverse: Tensor | None) -> Tensor:
    """`completion_hidden_states` for rows in whole groups, in order (`inverse` None), or for any rows, each its own
    group (`inverse` maps rows to prompts, whose keys and values are then copied to the rows)."""
    backbone = lm.model
    rows, length = completion_ids.shape
    prompt_len = prompt_mask.size(1)
    group_size = rows // prompt_mask.size(0) if inverse is None else 1
    if inverse is not None:
        prompt_mask = prompt_mask[inverse]
    x = backbone.embed_tokens(completion_ids)  # (B, C, d)
    positions = torch.arange(prompt_len, prompt_len + length, device=x.device).expand(rows, -1)
    cos, sin = backbone.rotary_emb(x, positions)  # (B, C, D)
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, C, D)
    floor = torch.finfo(torch.float32).min
    prompt_bias = torch.zeros(prompt_mask.shape, device=x.device).masked_fill_(prompt_mask == 0, floor)  # (G', P)
    causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril_()
    causal_bias = torch.zeros(length, length, device=x.device).masked_fill_(~causal, floor)  # (C, C)
    prompt_bias = prompt_bias[:, None, None, None, None, :]  # (G', 1, 1, 1, 1, P), as the grouped prompt scores
    for index, layer in enumerate(backbone.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q, k, v = (
            proj(h).view(rows, length, -1, attn.head_dim).transpose(1, 2)  # (B, heads, C, D)
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        prompt_keys, prompt_values = cache.layers[index].keys, cache.layers[index].values  # (G, Hkv, P, D)
        if inverse is not None:  # index_select: its backward (index_add) is far faster than indexing's on CPU
            prompt_keys, prompt_values = prompt_keys.index_select(0, inverse), prompt_values.index_select(0, inverse)
        attended = grouped_attention(
            q, k, v, prompt_keys, prompt_values, prompt_bias, causal_bias, attn.scaling, group_size
        )  # (B, C, Hq D)
        x = x + attn.o_proj(attended)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return backbone.norm(x)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of `x` `(B, heads, C, D)` (the model's formula: x cos + rotate_half(x) sin)."""
    half = x.size(-1) // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


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
