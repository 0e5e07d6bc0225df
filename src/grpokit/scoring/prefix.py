"""Shared-prefix scoring: each distinct prompt goes through the model once, its completions attend to its keys and values.

A GRPO batch holds `num_generations` completions of each prompt. The plain forward pass runs `(B, P + C)` tokens;
here the distinct prompts run once (`(G, P)`, with gradient) and the completions run on top (`(B, C - 1)`: the last
completion token predicts nothing). The LM head and log-softmax then run fused and chunked on the completion
positions that count (`linear_token_logps`). Log-probabilities and gradients equal the plain pass's up to float
rounding: same positions (0, 1, ... as in the plain pass), same masks, same weights.

Two ways to run it. For Llama-family models on CPU, `prefix_attention` runs prompts and completions through the
decoder layers in one pass, with attention that reads each prompt once per group (any prompt length). Otherwise the
model's own forward runs twice, the prompts and then the completions with the prompts' keys and values indexed out
to the rows (when that saves enough tokens; else one pass over every row).

This needs a standard transformers causal LM: `get_decoder()` returns the backbone, the logits are
`lm_head(last hidden state)`, the KV cache is a plain `DynamicCache`. `shared_prefix_model` checks that (once per
model, numerically, on a tiny batch) and returns None otherwise; callers then use the plain pass.
"""

from __future__ import annotations

import logging
import weakref

import torch
from torch import Tensor, nn

from grpokit.algorithms.logprobs import linear_token_logps
from grpokit.fastpath import prefix_attention
from grpokit.fastpath.kv_cache import cache_kwarg
from grpokit.fastpath.prefix_attention import fits, grouped_attention_model
from grpokit.scoring.tied import tied_weight
from grpokit.sharding import is_sharded

logger = logging.getLogger(__name__)

_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> passed the numerical check


def prompt_groups(prompt_ids: Tensor, prompt_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Rows with the same prompt: `(unique_index (G,), inverse (B,))`, with `prompt_ids[unique_index][inverse]` equal
    to `prompt_ids` (and likewise the mask). `unique_index` holds each distinct prompt's first row, in row order."""
    key = prompt_ids if prompt_mask is None else torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)  # groups numbered in sorted order
    rows = torch.arange(key.size(0), device=key.device)
    first = torch.full((int(inverse.max()) + 1,), key.size(0), device=key.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")  # (G,) first row of each group
    order = torch.argsort(first)  # renumber the groups by first appearance
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=key.device)
    return first[order], rank[inverse]


def shared_prefix_model(model) -> nn.Module | None:
    """The transformers causal LM to score `model` with shared prefixes, or None when only the plain pass is right:
    a wrapped model (DDP, ...), prompt-learning PEFT, activation checkpointing in training mode on a model that
    `prefix_attention` cannot run (the model's own two passes need the KV cache that checkpointed layers drop),
    sharded parameters (ZeRO-3, FSDP2), an LM head with its own forward (e.g. `cast_lm_head_to_fp32`), cache layers
    other than full attention, or logits that are not `lm_head(hidden state)` (checked numerically the first
    time)."""
    lm = _causal_lm(model)
    if lm is None or is_sharded(lm) or not _plain_cache(lm):
        return None
    if _checkpointing(lm) and not grouped_attention_model(lm):
        return None
    head = lm.get_output_embeddings()
    if type(head) is not nn.Linear or "forward" in head.__dict__:
        return None
    if lm not in _VERIFIED:
        training = lm.training
        try:
            _VERIFIED[lm] = _agrees_with_plain_pass(lm.eval())  # eval: dropout would make the two passes differ
        finally:
            lm.train(training)
        if not _VERIFIED[lm]:
            logger.warning(
                "%s: shared-prefix scoring disagrees with the model's forward; using the plain pass", type(lm).__name__
            )
    return lm if _VERIFIED[lm] else None


def _causal_lm(model) -> nn.Module | None:
    from transformers import PreTrainedModel

    from grpokit.models import is_peft_model

    if is_peft_model(model):
        if model.peft_config[model.active_adapter].is_prompt_learning:
            return None
        model = model.get_base_model()
    if not isinstance(model, PreTrainedModel) or model.config.is_encoder_decoder:
        return None
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    return model if isinstance(decoder, nn.Module) and decoder is not model else None


def _checkpointing(lm) -> bool:
    return lm.training and any(getattr(m, "gradient_checkpointing", False) is True for m in lm.modules())


def _plain_cache(lm) -> bool:
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=lm.config)
    except Exception:  # a config the cache cannot read
        return False
    return all(type(layer) is DynamicLayer for layer in cache.layers)


@torch.no_grad()
def _agrees_with_plain_pass(lm) -> bool:
    """Score a tiny batch (three rows sharing a left-padded prompt, one row alone) both ways."""
    vocab = lm.get_output_embeddings().weight.size(0)
    device = lm.get_output_embeddings().weight.device
    ids = torch.tensor([[0, 5, 6, 7, 8, 9], [0, 5, 6, 7, 9, 8], [0, 5, 6, 7, 3, 3], [4, 3, 2, 1, 8, 8]]) % vocab
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    ids, mask = ids.to(device), mask.to(device)
    assert _sharing_pays(2, *ids.shape, 4)  # the batch exercises the shared pass
    logits = lm(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, 3:-1]
    expected = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 4:].unsqueeze(-1)).squeeze(-1)
    logps, _ = score_shared_prefix(lm, ids, mask, 2)
    active = mask[:, 4:].bool()
    # bfloat16 / float16 weights, or autocast (mixed precision: the logits come back in float32, computed in bf16)
    low_precision = logits.dtype != torch.float32 or torch.is_autocast_enabled(device.type)
    tolerance = 5e-2 if low_precision else 1e-4
    return bool(torch.allclose(logps[active], expected[active], atol=tolerance, rtol=tolerance))


def score_shared_prefix(
    lm,
    input_ids: Tensor,
    attention_mask: Tensor,
    logits_to_keep: int,
    *,
    temperature: float = 1.0,
    entropy: str = "none",
    truncation=None,
) -> tuple[Tensor, Tensor | None]:
    """Per-token log-probabilities (and entropies) of the last `logits_to_keep` tokens, each prompt run once.

    Args:
        lm: a model `shared_prefix_model` accepted.
        input_ids, attention_mask: `(B, P + C)`, the prompt left-padded, the completion right-padded.
        logits_to_keep: C.
        entropy: "none", "detached" or "grad" (see `linear_token_logps`).
        truncation: the sampler's filters (`grpokit.algorithms.truncation.Truncation`), or None.

    Returns:
        `(B, C)` float32 log-probabilities and entropies (or None); 0 where the completion is padding.
    """
    prompt_len = input_ids.size(1) - logits_to_keep
    unique_index, inverse = prompt_groups(input_ids[:, :prompt_len], attention_mask[:, :prompt_len])
    heads, rows, groups = lm.config.num_attention_heads, input_ids.size(0), len(unique_index)
    # (A prompt with no real token, all padding, is left to the model's own handling of fully masked rows.)
    real_prompts = bool(attention_mask[:, :prompt_len].any(dim=1).all())
    tied = None
    if real_prompts and grouped_attention_model(lm) and fits(rows, groups, heads, logits_to_keep - 1, prompt_len):
        # under activation checkpointing each checkpointed layer is recomputed in backward, as in the model's forward
        tied = tied_weight(lm)  # the tied weight's two gradients summed in one tensor (the one pass embeds)
        hidden = prefix_attention.hidden_states(lm, input_ids, attention_mask, prompt_len, unique_index, inverse, tied)
    elif not _checkpointing(lm) and _sharing_pays(groups, *input_ids.shape, prompt_len):
        hidden = _hidden_states_shared(lm, input_ids, attention_mask, prompt_len, unique_index, inverse)
    else:
        hidden = _hidden_states_every_row(lm.get_decoder(), input_ids, attention_mask, prompt_len)
    active = attention_mask[:, prompt_len:].bool()  # (B, C)
    head = lm.get_output_embeddings()
    labels = input_ids[:, prompt_len:][active]
    logps, entropies = linear_token_logps(
        hidden[active],
        head.weight,
        head.bias,
        labels,
        temperature=temperature,
        entropy=entropy,
        truncation=truncation,
        tied=tied,
    )
    return _scatter(logps, active), None if entropies is None else _scatter(entropies, active)


def _scatter(values: Tensor, active: Tensor) -> Tensor:
    """`(B, C)` zeros with `values` `(N,)` at the `active` positions (connected to the graph even when N = 0)."""
    return values.new_zeros(active.shape).masked_scatter(active, values)


def _sharing_pays(groups: int, rows: int, length: int, prompt_len: int) -> bool:
    """Whether running the prompts apart saves enough: at least a quarter of the tokens. (A separate prompt pass has
    its own weight-gradient products, which cost about as much as the tokens they save when prompts are short.)"""
    return (rows - groups) * prompt_len >= 0.25 * rows * length


def _hidden_states_every_row(decoder, input_ids: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
    """`(B, C, d)` last hidden states at the positions that predict the C completion tokens, one pass over every row
    `(B, P + C - 1)` (the last token predicts nothing)."""
    hidden = decoder(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1], use_cache=False)
    return hidden.last_hidden_state[:, prompt_len - 1 :]


def _hidden_states_shared(lm, input_ids, attention_mask, prompt_len, unique_index, inverse) -> Tensor:
    """`(B, C, d)` last hidden states at the positions that predict the C completion tokens: the prompt's last position
    (from the pass over the G distinct prompts `(G, P)`), then the completion's first C - 1 positions `(B, C - 1)`,
    attending to the prompt's keys and values indexed out to the rows."""
    from transformers import DynamicCache

    decoder = lm.get_decoder()
    cache = DynamicCache(config=lm.config)
    prompt = decoder(
        input_ids=input_ids[unique_index, :prompt_len],
        attention_mask=attention_mask[unique_index, :prompt_len],
        **{cache_kwarg(decoder.forward): cache},
        use_cache=True,
    ).last_hidden_state  # (G, P, d)
    first = prompt[:, -1:].index_select(0, inverse)  # (B, 1, d): predicts the first completion token
    if input_ids.size(1) - prompt_len == 1:
        return first
    # (G, H, P, D) -> (B, H, P, D) keys and values; the backward pass sums the rows' gradients into the prompt.
    # `index_select` rather than `cache.batch_select_indices`: its backward (an index_add) is ~6x faster on CPU.
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.index_select(0, inverse), layer.values.index_select(0, inverse)
    rest = decoder(
        input_ids=input_ids[:, prompt_len:-1],
        attention_mask=attention_mask[:, :-1],
        **{cache_kwarg(decoder.forward): cache},
        use_cache=True,
    ).last_hidden_state  # (B, C - 1, d)
    return torch.cat([first, rest], dim=1)
