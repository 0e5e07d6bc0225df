"""A decoding loop for GRPO's batches, run by transformers' `generate` as its `custom_generate` callable.

GRPO generates `num_generations` completions of each prompt. `generate` would run the prompt through the model once
per completion; this loop runs each distinct prompt once (the prefill), gives its KV cache to the rows that share it
(copied to each row, or for long prompts kept once per group: `kv_cache.py`), and decodes all rows together. Rows that finish (EOS, or any stopping criterion) leave the decode batch, so they
stop costing work. The KV cache lives in preallocated buffers, so a decode step writes one position instead of
concatenating the whole cache. On CPU, a decode step of a Llama-family model runs as the short sequence of tensor
operations of `column_step.py`; other models run their own forward pass with linear layers that use a matrix product
that suits a few rows better.

`generate` still does everything else: merging the generation config with the model's, the logits processors
(temperature, top-k/p, min-p, repetition penalty, min_new_tokens, ...), the stopping criteria, the position ids. So
every generation setting is honoured exactly as by `generate`; settings this loop cannot follow (beams, contrastive
search, a static/offloaded/quantized cache, a cache with sliding-window or linear-attention layers) raise
`Unsupported` before any model call, and the caller falls back to plain `generate`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation.configuration_utils import GenerationMode

from grpokit.fastpath.column_step import column_step
from grpokit.fastpath.kv_cache import buffered_cache, cache_kwarg, ungrouped
from grpokit.scoring.prefix import prompt_groups

# Finished rows leave the decode batch once they are at least this share of it (each removal copies the KV cache).
DROP_FINISHED_SHARE = 1 / 8


class Unsupported(Exception):
    """This generation cannot run in the shared-prefix loop; use plain `generate`."""


def shared_prefix_decoding(
    model, input_ids: Tensor, logits_processor, stopping_criteria, generation_config, **model_kwargs
) -> Tensor:
    """The decoding loop `generate(custom_generate=...)` calls: sampling or greedy decoding of `input_ids` `(B, P)`
    (left-padded), each distinct prompt prefilled once. Returns `(B, P + T)` ids, padding after each row's end."""
    _check_supported(generation_config, model_kwargs)
    attention_mask = model_kwargs.get("attention_mask")  # (B, P), None when no row is padded
    position_ids = model_kwargs["position_ids"]  # (B, P): 0-based among each row's real tokens (padding: 0)
    unique_index, inverse = prompt_groups(input_ids, attention_mask)  # (G,), (B,)
    prefill_cache = _cache_of(model_kwargs)  # the empty DynamicCache `generate` made for this model
    step = decode_step(model)  # before the linear layers are patched: the column step reads their weights itself
    with small_batch_linears(model):
        prefill = model(
            input_ids=input_ids[unique_index],
            attention_mask=None if attention_mask is None else attention_mask[unique_index],
            position_ids=position_ids[unique_index],
            **{cache_kwarg(model.forward): prefill_cache},
            use_cache=True,
            logits_to_keep=1,
        )
        state = _DecodeState(
            input_ids,
            attention_mask,
            position_ids[:, -1],
            step.cache(prefill_cache, inverse, capacity=generation_config.max_length),
            pad_id=_pad_id(generation_config),
            can_drop_rows=not _holds_row_state([*logits_processor, *stopping_criteria], input_ids.size(0)),
        )
        logits = prefill.logits[inverse, -1]  # (B, V)
        del prefill, prefill_cache
        processors = [_in_place(p) for p in logits_processor]
        while True:
            scores = logits.to(dtype=torch.float32, copy=True)  # (n, V), ours to change
            for processor in processors:
                scores = processor(state.sequences, scores)
            next_tokens = sample(scores) if generation_config.do_sample else torch.argmax(scores, dim=-1)
            state.append(next_tokens)
            if not state.stop(stopping_criteria(state.sequences, scores)):
                break
            logits = step(state)
    return state.output()


def _in_place(processor):
    """`processor`, or for transformers' minimum-length processors a function doing what they do in place: while the
    sequences are shorter than the minimum, every end-of-sequence token's score is -inf. Theirs copy the
    `(n, vocabulary)` scores and build a vocabulary-wide mask at every step, needed or not (0.6-1 ms a step each for
    SmolLM2's 49,152 tokens, 16 rows); the decoding loop owns its scores, so setting the few entries suffices."""
    from transformers.generation.logits_process import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

    if type(processor) is MinLengthLogitsProcessor:
        skip, minimum = 0, processor.min_length
    elif type(processor) is MinNewTokensLengthLogitsProcessor:
        skip, minimum = processor.prompt_length_to_skip, processor.min_new_tokens
    else:
        return processor
    ids = torch.as_tensor(processor.eos_token_id).reshape(-1)

    def apply(input_ids: Tensor, scores: Tensor) -> Tensor:
        if input_ids.shape[-1] - skip < minimum:
            kept = ids[(ids >= 0) & (ids < scores.size(-1))].to(scores.device)  # as `isin` over the vocabulary
            scores.index_fill_(-1, kept, -torch.inf)
        return scores

    return apply


def decode_step(model):
    """The decode step for `model`: on CPU, the column step of `column_step.py` when it can follow this model
    exactly; otherwise the model's own forward pass. Called with the decode state, it returns the `(n, V)` next-token
    logits of the rows in the batch; its `cache(prefill_cache, inverse, capacity=...)` makes the KV cache it reads."""
    fast = column_step(model) if next(model.parameters()).device.type == "cpu" else None
    return _ColumnDecodeStep(fast) if fast is not None else _ModelDecodeStep(model)


class _ModelDecodeStep:
    def __init__(self, model):
        self.model = model

    def cache(self, prefill_cache, inverse: Tensor, *, capacity: int):
        return buffered_cache(prefill_cache, inverse, capacity=capacity)

    def __call__(self, state) -> Tensor:
        return self.model(**state.model_inputs(cache_kwarg(self.model.forward)), use_cache=True).logits[:, -1]


class _ColumnDecodeStep:
    def __init__(self, step):
        self.step = step

    def cache(self, prefill_cache, inverse: Tensor, *, capacity: int):
        return self.step.cache(prefill_cache, inverse, capacity=capacity)

    def __call__(self, state) -> Tensor:
        return self.step(state.next_tokens, state.positions, state.attention_mask, state.cache)


def sample(scores: Tensor) -> Tensor:
    """One token per row from `softmax(scores)` `(n, V)`, by inverting the cumulative distribution at a uniform draw.

    The same distribution as `torch.multinomial` (what `generate` uses), for one random number per row instead of
    one per vocabulary entry: with a 32k vocabulary, multinomial's random numbers cost more than the model's step.
    """
    cdf = nn.functional.softmax(scores, dim=-1).cumsum_(dim=-1)  # (n, V)
    draws = torch.rand(cdf.size(0), 1, device=cdf.device, dtype=cdf.dtype) * cdf[:, -1:]  # (n, 1) in [0, total)
    return torch.searchsorted(cdf, draws, right=True).squeeze(1).clamp_(max=cdf.size(1) - 1)


def _holds_row_state(objects, rows: int) -> bool:
    """Whether any of these logits processors / stopping criteria keeps a tensor with one entry per row (e.g. the
    repetition penalty's prompt padding lengths): rows cannot then leave the batch without breaking it."""
    return any(
        isinstance(value, Tensor) and value.dim() > 0 and value.size(0) == rows
        for obj in objects
        for value in vars(obj).values()
    )


def _pad_id(generation_config) -> int:
    pad = getattr(generation_config, "_pad_token_tensor", None)
    if pad is None:
        pad = generation_config.pad_token_id
    return 0 if pad is None else int(pad)


def _cache_of(kw):
    """The cache `generate` prepared: `past_key_values` up to transformers 5.23, `cache` from 5.24 on."""
    return kw.get("past_key_values", kw.get("cache"))


def _check_supported(generation_config, kw) -> None:
    if generation_config.get_generation_mode() not in (GenerationMode.SAMPLE, GenerationMode.GREEDY_SEARCH):
        raise Unsupported(f"generation mode {generation_config.get_generation_mode()}")
    cache = _cache_of(kw)
    if not kw.get("use_cache", True) or type(cache) is not DynamicCache or cache.get_seq_length() != 0:
        raise Unsupported("needs an empty DynamicCache")
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise Unsupported("a cache layer that is not a plain DynamicLayer (sliding window, linear attention)")
    if kw.get("position_ids") is None or generation_config.max_length is None:
        raise Unsupported("no position ids or maximum length")
    known = {"attention_mask", "position_ids", "past_key_values", "cache", "use_cache", "logits_to_keep"}
    if set(kw) - known:
        raise Unsupported(f"model inputs {sorted(set(kw) - known)}")


class _DecodeState:
    """The rows still in the decode batch (their sequences, KV cache, masks, positions) and every row's tokens."""

    def __init__(self, input_ids, attention_mask, last_positions, cache, *, pad_id: int, can_drop_rows: bool):
        self.prompt_ids = input_ids  # (B, P)
        self.pad_id = pad_id
        self.can_drop_rows = can_drop_rows
        self.rows = torch.arange(input_ids.size(0), device=input_ids.device)  # (n,) original row of each batch row
        self.sequences = input_ids  # (n, P + t) prompt and tokens so far
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # nothing to mask: each step then skips extending and applying it
        self.attention_mask = attention_mask  # (n, P + t) or None (no padding anywhere)
        self.positions = last_positions  # (n,) position of each row's last token
        self.cache = cache
        self.finished = torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)  # (n,)
        self.steps: list[tuple[Tensor, Tensor]] = []  # per step: (original rows in the batch, their tokens or padding)

    def append(self, next_tokens: Tensor) -> None:
        """Add this step's tokens (padding for rows already finished, as `generate` does)."""
        next_tokens = next_tokens.masked_fill(self.finished, self.pad_id)
        self.steps.append((self.rows, next_tokens))
        self.sequences = torch.cat([self.sequences, next_tokens[:, None]], dim=1)
        self.next_tokens = next_tokens

    def stop(self, done: Tensor) -> bool:
        """Mark rows the stopping criteria ended; drop the finished rows from the batch once they are
        `DROP_FINISHED_SHARE` of it. False when every row is done."""
        self.finished = self.finished | done
        if bool(self.finished.all()):
            return False
        if self.attention_mask is not None:
            self.attention_mask = nn.functional.pad(self.attention_mask, (0, 1), value=1)
        self.positions = self.positions + 1
        if self.can_drop_rows and int(self.finished.sum()) >= DROP_FINISHED_SHARE * self.finished.numel():
            self._select((~self.finished).nonzero().squeeze(1))
        return True

    def _select(self, index: Tensor) -> None:
        self.rows, self.sequences, self.positions = self.rows[index], self.sequences[index], self.positions[index]
        self.next_tokens, self.finished = self.next_tokens[index], self.finished[index]
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask[index]
        self.cache = ungrouped(self.cache)  # prompts kept once per group need the rows in whole groups
        self.cache.batch_select_indices(index)

    def model_inputs(self, cache_name: str) -> dict:
        """The model's inputs for the next step, the cache under `cache_name` (`cache_kwarg`)."""
        return {
            "input_ids": self.next_tokens[:, None],
            "attention_mask": self.attention_mask,
            "position_ids": self.positions[:, None],
            cache_name: self.cache,
        }

    def output(self) -> Tensor:
        """`(B, P + T)`: the prompts, then each row's tokens, padding after the row's end."""
        prompt_ids = self.prompt_ids
        completions = prompt_ids.new_full((prompt_ids.size(0), len(self.steps)), self.pad_id)
        for step, (rows, tokens) in enumerate(self.steps):
            completions[rows, step] = tokens
        return torch.cat([prompt_ids, completions], dim=1)


# ------------------------------------------------------------------------------------------------ linear layers


# (rows, in features, out features, dtype) -> whether `(W @ x^T)^T` ran faster than `x @ W^T` for that shape.
_TRANSPOSED_IS_FASTER: dict[tuple, bool] = {}
FEW_ROWS = 64


def _few_rows_linear(layer: nn.Linear, x: Tensor) -> Tensor:
    """`layer(x)`, for inputs of at most `FEW_ROWS` rows (decode steps) computed as `(W @ x^T)^T` when that is faster.

    On CPU, BLAS picks its kernel by the operands' layout: for a few dozen rows and wide layers `W @ x^T` can run 2-3x
    faster than the `x @ W^T` of `nn.functional.linear`, and for a few rows or narrow layers slower, depending on the
    BLAS build. The first call of each shape times both products and remembers the faster. Equal up to rounding.
    """
    rows = x.numel() // x.size(-1)
    if rows > FEW_ROWS or x.dim() < 2:
        return nn.functional.linear(x, layer.weight, layer.bias)
    key = (rows, layer.in_features, layer.out_features, x.dtype)
    if key not in _TRANSPOSED_IS_FASTER:
        transposed = _seconds(lambda: _transposed_linear(layer, x))
        _TRANSPOSED_IS_FASTER[key] = transposed < _seconds(lambda: nn.functional.linear(x, layer.weight, layer.bias))
    if _TRANSPOSED_IS_FASTER[key]:
        return _transposed_linear(layer, x)
    return nn.functional.linear(x, layer.weight, layer.bias)


def _transposed_linear(layer: nn.Linear, x: Tensor) -> Tensor:
    flat = x.reshape(-1, x.size(-1)).t()  # (in, rows)
    if layer.bias is None:
        out = torch.mm(layer.weight, flat)
    else:
        out = torch.addmm(layer.bias.unsqueeze(1), layer.weight, flat)
    return out.t().contiguous().view(*x.shape[:-1], -1)


def _seconds(fn, repeats: int = 3) -> float:
    """Best of `repeats` timings of `fn()` (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@contextlib.contextmanager
def small_batch_linears(model: nn.Module) -> Iterator[None]:
    """Within this context the model's plain `nn.Linear` layers use `_few_rows_linear` (CPU only)."""
    if next(model.parameters()).device.type != "cpu":
        yield
        return
    layers = [m for m in model.modules() if type(m) is nn.Linear and "forward" not in m.__dict__]
    for layer in layers:
        layer.forward = _few_rows_linear.__get__(layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
