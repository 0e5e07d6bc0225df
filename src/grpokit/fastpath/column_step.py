"""One decode step of a Llama-family model (Llama, Qwen2) as a short run of plain tensor operations.

A decode step pushes a few rows (one token per sequence) through the model. For a small model on a CPU the matrix
products are then a minority of the time: the rest is the module calls, views, transposes and copies of a general
forward pass written for any shape. This step computes the same function as a short run of tensor operations. Every
linear layer is one product `W @ x^T` straight from the stored weight, giving columns `(out, rows)` (for a few rows
BLAS serves this layout up to twice as fast as `x @ W^T`); q/k/v are one product and their rotary embedding one
operation, computed in that column layout; attention reads the KV cache's buffers in place, and with prompts kept
once per group (`kv_cache.GroupedLayer`) reads each prompt once for its group. Normalisation, rotary embeddings,
attention and dtype casts follow the model's own modules, so the logits equal the model's up to float rounding
(tested).

Only models whose parts are exactly the plain modules are taken (`column_step` returns None otherwise: PEFT layers,
hooks, other architectures, attention dropout in training mode); the caller then runs the model itself.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import few_rows
from .kv_cache import GroupedLayer, buffered_cache, grouped_cache

# Prompts at least this long are kept once per group in the KV cache (shorter ones cost more in index shuffling
# than reading them once per row).
GROUPED_PROMPT_MIN = 64

ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM"}


def column_step(model):
    """A `ColumnStep` for `model`, or None when this model is not one it can follow exactly."""
    reason = unsupported_reason(model)
    return None if reason else ColumnStep(model)


def llama_family_reason(model) -> str | None:
    """Why `model` is not a Llama-family model whose layers plain tensor code can follow (the checks the column step
    and `prefix_attention` share), or None when it is."""
    if type(model).__name__ not in ARCHITECTURES:
        return f"architecture {type(model).__name__}"
    if model.training and getattr(model.config, "attention_dropout", 0.0):
        return "attention dropout in training mode"
    if getattr(model.config, "pretraining_tp", 1) != 1:
        return "pretraining_tp"
    if any(getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers):
        return "sliding-window attention"
    return None


def hooked(modules) -> str | None:
    """The type name of the first of `modules` with a forward hook or a patched forward, or None."""
    for module in modules:
        if module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__:
            return type(module).__name__
    return None


def unsupported_reason(model) -> str | None:
    """Why `model` cannot use the column step, or None when it can."""
    reason = llama_family_reason(model)
    if reason:
        return reason
    linears = [model.lm_head]
    norms = [model.model.norm]
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears += [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
    if any(type(m) is not nn.Linear for m in linears):
        return "a linear layer that is not a plain nn.Linear (e.g. PEFT)"
    if any(not type(m).__name__.endswith("RMSNorm") or not hasattr(m, "variance_epsilon") for m in norms):
        return "a normalisation layer that is not the plain RMSNorm"
    if type(model.model.embed_tokens) is not nn.Embedding:
        return "an embedding that is not a plain nn.Embedding"
    modules = model.modules()
    if _autocast_forward(model):  # accelerate's mixed-precision wrapper: the step runs under the same autocast
        next(modules)
    module = hooked(m for m in modules if not (m is model.model.embed_tokens and input_grads_hook_only(m)))
    return f"a hook or patched forward on {module}" if module else None


def input_grads_hook_only(embedding: nn.Module) -> bool:
    """Whether the only hook on `embedding` is transformers' `enable_input_require_grads` one, which activation
    checkpointing (and PEFT with it) adds so that the embedding's output requires grad. A decode step runs without
    gradients, where that hook changes nothing."""
    hooks = list(embedding._forward_hooks.values())
    return (
        bool(hooks)
        and all(getattr(hook, "__name__", None) == "make_inputs_require_grads" for hook in hooks)
        and not embedding._forward_pre_hooks
        and "forward" not in embedding.__dict__
    )


def _autocast_forward(model) -> bool:
    """Whether `model`'s forward is accelerate's mixed-precision wrapper (autocast around the original forward) and
    that autocast is on now (the trainer generates inside `accelerator.autocast()`), so that plain tensor code under
    it computes what the wrapped forward computes; for bfloat16, only on a CPU with bfloat16 units (elsewhere the
    wrapped forward runs, as before: a bfloat16 copy of the weights would only be slower)."""
    from .cpu import has_bf16_units

    return (
        "forward" in model.__dict__
        and hasattr(model, "_original_forward")
        and not model._forward_hooks
        and not model._forward_pre_hooks
        and torch.is_autocast_enabled("cpu")
        and (torch.get_autocast_dtype("cpu") != torch.bfloat16 or has_bf16_units())
    )


def _autocast_dtype() -> torch.dtype | None:
    """The lower-precision dtype CPU autocast casts matrix products to, when it is on."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


def _cast(weight: Tensor | None, dtype: torch.dtype | None) -> Tensor | None:
    return weight if weight is None or dtype is None else weight.to(dtype)


def _rms_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """The model's RMSNorm of rows `x` `(n, hidden)`, with its dtype casts (in float32 on the C path of `few_rows`)."""
    if few_rows.rms_norm_applies(x, norm.weight):
        return few_rows.rms_norm(x, norm.weight, norm.variance_epsilon)
    h = nn.functional.rms_norm(x.to(torch.float32), x.shape[-1:], eps=norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, dim: int = -1) -> Tensor:
    """The model's rotary embedding, `x cos + rotate_half(x) sin`, with the head dimension of `x` at `dim` and `cos`,
    `sin` broadcasting against `x`."""
    half = x.size(dim) // 2
    rotated = torch.cat((-x.narrow(dim, half, half), x.narrow(dim, 0, half)), dim=dim)
    return x * cos + rotated * sin


class _Linear:
    """A linear layer's weight and bias column, in `dtype` (autocast's; None: as stored)."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype | None):
        self.weight = _cast(linear.weight, dtype)
        self.bias = _cast(_bias_column(linear), dtype)


class _Layer:
    """One decoder layer's weights, q/k/v stacked into one product. (Stacking gate/up as well would copy the largest
    weights every `generate` call, for a product no faster than the two apart.) Under autocast (bf16 mixed
    precision) the weights are cast once here, as autocast's weight cache would cast them once per forward: the
    decode steps then read half the bytes."""

    def __init__(self, layer, dtype: torch.dtype | None = None):
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        self.qkv_weight = _cast(torch.cat([p.weight for p in projections]), dtype)
        biases = [p.bias if p.bias is not None else p.weight.new_zeros(p.out_features) for p in projections]
        self.qkv_bias = None if all(p.bias is None for p in projections) else _cast(torch.cat(biases)[:, None], dtype)
        self.q_size, self.kv_size = attn.q_proj.out_features, attn.k_proj.out_features
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.o_proj = _Linear(attn.o_proj, dtype)
        self.gate_proj, self.up_proj, self.down_proj = (
            _Linear(m, dtype) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        )
        self.act = mlp.act_fn
        # SiLU without biases: gate, up, SiLU and their product can be one pass of `few_rows.gated`
        silu = type(self.act) is nn.SiLU or type(self.act).__name__ == "SiLUActivation"
        self.fused_gate = silu and self.gate_proj.bias is None and self.up_proj.bias is None


def _linear(weight: Tensor, bias: Tensor | None, x: Tensor) -> Tensor:
    """`weight @ x^T (+ bias)`, `(out, n)`, for rows `x` `(n, in)`; `bias` is `(out, 1)` or None. In float32 on an
    x86-64 CPU with AVX-512F, `few_rows.mm` (a kernel that streams the weight once for all rows); else BLAS, with
    `x` row-major, so that `x^T` is the column-major operand it multiplies fastest for a few rows."""
    if few_rows.applies(weight, x):
        return few_rows.mm(weight, x, bias)
    return torch.mm(weight, x.t()) if bias is None else torch.addmm(bias, weight, x.t())


def _linear_layer(linear: _Linear, x: Tensor) -> Tensor:
    return _linear(linear.weight, linear.bias, x)


def _bias_column(linear: nn.Linear) -> Tensor | None:
    return None if linear.bias is None else linear.bias[:, None]


class ColumnStep:
    """Callable `(tokens (n,), positions (n,), attention_mask (n, L) or None, cache) -> logits (n, V)`: the model's
    next-token logits for one new token per row, appending the token's keys and values to `cache` (made by
    `self.cache`). Weights are read when the step is built, so build one per `generate` call."""

    def __init__(self, model):
        self.model = model
        dtype = _autocast_dtype()
        self.layers = [_Layer(layer, dtype) for layer in model.model.layers]
        self.embed = model.model.embed_tokens.weight
        self.final_norm = model.model.norm
        self.lm_head = _Linear(model.lm_head, dtype)

    def cache(self, prefill_cache, inverse: Tensor, *, capacity: int):
        """The KV cache for rows `inverse` `(n,)` of the G prompts in `prefill_cache`: prompts kept once per group when
        the rows come in whole groups in order and the prompts are long, else per-row buffers."""
        groups = int(inverse.max()) + 1
        group_size = inverse.numel() // groups
        in_order = bool(
            torch.equal(inverse, torch.arange(groups, device=inverse.device).repeat_interleave(group_size))
        )
        if group_size > 1 and in_order and prefill_cache.get_seq_length() >= GROUPED_PROMPT_MIN:
            return grouped_cache(prefill_cache, group_size, capacity=capacity)
        return buffered_cache(prefill_cache, inverse, capacity=capacity)

    @torch.no_grad()
    def __call__(self, tokens: Tensor, positions: Tensor, attention_mask: Tensor | None, cache) -> Tensor:
        rows = tokens.size(0)
        x = self.embed[tokens]  # (n, d)
        cos, sin = self.model.model.rotary_emb(x, positions[:, None])  # (n, 1, head_dim), in x's dtype
        cos, sin = cos[:, 0].t(), sin[:, 0].t()  # (head_dim, n)
        bias = None
        if attention_mask is not None:  # (n, L + 1) of 0/1 -> additive (n, 1, L + 1)
            bias = torch.zeros(attention_mask.shape, dtype=torch.float32, device=x.device)
            bias = bias.masked_fill_(attention_mask == 0, torch.finfo(torch.float32).min)[:, None]
        for index, layer in enumerate(self.layers):
            qkv = _linear(layer.qkv_weight, layer.qkv_bias, _rms_norm(layer.input_norm, x))  # (q + 2 kv, n)
            qk = rotate(qkv[: layer.q_size + layer.kv_size].view(-1, layer.head_dim, rows), cos, sin, dim=1)
            q, k = qk[: layer.q_size // layer.head_dim], qk[layer.q_size // layer.head_dim :]  # (Hq | Hkv, D, n)
            v = qkv[layer.q_size + layer.kv_size :].view(-1, layer.head_dim, rows)
            layer_cache = cache.layers[index]
            keys, values = layer_cache.update(k.permute(2, 0, 1)[:, :, None], v.permute(2, 0, 1)[:, :, None])
            if isinstance(layer_cache, GroupedLayer):
                attended = _attend_grouped(
                    q, layer_cache.prompt_keys, layer_cache.prompt_values, keys, values, bias, layer.scaling
                )
            else:
                attended = _attend(q, keys, values, bias, layer.scaling)  # (n, Hq * D)
            x = x + _linear_layer(layer.o_proj, attended).t()
            h = _rms_norm(layer.post_norm, x)
            if layer.fused_gate and few_rows.gated_applies(layer.gate_proj.weight, layer.up_proj.weight, h):
                h = few_rows.gated(layer.gate_proj.weight, layer.up_proj.weight, h)  # (n, ff)
            else:
                h = layer.act(_linear_layer(layer.gate_proj, h)) * _linear_layer(layer.up_proj, h)  # (ff, n)
                h = h.t().contiguous()
            x = x + _linear_layer(layer.down_proj, h).t()
        return _linear_layer(self.lm_head, _rms_norm(self.final_norm, x)).t()  # (n, V)


def _attend(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None, scaling: float) -> Tensor:
    """Attention of one query per row, `q` `(Hq, D, n)`, over `keys`, `values` `(n, Hkv, L, D)`, with an additive
    `bias` `(n, 1, L)` or None; returns `(n, Hq * D)`. Each key/value head serves its `Hq / Hkv` query heads without
    being repeated; the softmax runs in float32, as the model's own attention."""
    rows, kv_heads, length, head_dim = keys.shape
    queries = q.permute(2, 0, 1).reshape(rows * kv_heads, -1, head_dim)  # (n Hkv, g, D)
    scores = torch.bmm(queries, keys.reshape(rows * kv_heads, length, head_dim).transpose(1, 2))  # (n Hkv, g, L)
    scores = scores.view(rows, -1, length).to(torch.float32) * scaling
    if bias is not None:
        scores = scores + bias
    weights = scores.softmax(dim=-1).to(q.dtype).view(rows * kv_heads, -1, length)
    return torch.bmm(weights, values.reshape(rows * kv_heads, length, head_dim)).view(rows, -1)


def _attend_grouped(
    q: Tensor, prompt_keys: Tensor, prompt_values: Tensor, keys: Tensor, values: Tensor, bias, scaling: float
) -> Tensor:
    """`_attend` for rows in G groups of m consecutive rows sharing a prompt: the prompts' keys and values
    `(G, Hkv, P, D)` are read once per group, the rows' own `keys`, `values` `(n, Hkv, t, D)` once per row; `bias`
    `(n, 1, P + t)` covers both. One softmax over the prompt's and the row's positions, as plain attention."""
    groups, kv_heads, prompt_len, head_dim = prompt_keys.shape
    rows, length = keys.size(0), keys.size(2)
    per_group = rows // groups
    queries = q.permute(2, 0, 1).reshape(groups, per_group, kv_heads, -1, head_dim)  # (G, m, Hkv, g, D)
    by_group = queries.transpose(1, 2).reshape(groups * kv_heads, -1, head_dim)  # (G Hkv, m g, D)
    prompt_keys_t = prompt_keys.view(groups * kv_heads, prompt_len, head_dim).transpose(1, 2)
    prompt_scores = torch.bmm(by_group, prompt_keys_t).view(groups, kv_heads, per_group, -1, prompt_len)
    prompt_scores = prompt_scores.transpose(1, 2).reshape(rows, -1, prompt_len)  # (n, Hq, P)
    own_keys_t = keys.reshape(rows * kv_heads, length, head_dim).transpose(1, 2)
    own_scores = torch.bmm(queries.reshape(rows * kv_heads, -1, head_dim), own_keys_t).view(rows, -1, length)
    scores = torch.cat([prompt_scores, own_scores], dim=-1).to(torch.float32) * scaling  # (n, Hq, P + t)
    if bias is not None:
        scores = scores + bias
    weights = scores.softmax(dim=-1).to(q.dtype)
    prompt_weights = weights[..., :prompt_len].reshape(groups, per_group, kv_heads, -1, prompt_len)
    prompt_weights = prompt_weights.transpose(1, 2).reshape(groups * kv_heads, -1, prompt_len)  # (G Hkv, m g, P)
    from_prompt = torch.bmm(prompt_weights, prompt_values.view(groups * kv_heads, prompt_len, head_dim))
    from_prompt = from_prompt.view(groups, kv_heads, per_group, -1, head_dim).transpose(1, 2)  # (G, m, Hkv, g, D)
    own_weights = weights[..., prompt_len:].reshape(rows * kv_heads, -1, length)
    own = torch.bmm(own_weights, values.reshape(rows * kv_heads, length, head_dim))  # (n Hkv, g, D)
    return from_prompt.reshape(rows, -1) + own.view(rows, -1)
