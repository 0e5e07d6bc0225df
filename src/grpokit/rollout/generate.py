"""Prompt encoding, completion generation and decoding.

A generation backend turns prompt token ids into completion token ids; `TransformersGenerator` does it with
transformers' `generate`. Other backends (vLLM, continuous batching) would implement the same one-method interface.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import Tensor


def is_conversational(prompt: Any) -> bool:
    """A conversational prompt is a list of `{"role", "content"}` messages (TRL's convention)."""
    return isinstance(prompt, list) and len(prompt) > 0 and isinstance(prompt[0], dict) and "role" in prompt[0]


def encode_prompts(
    tokenizer,
    prompts: Sequence[Any],
    *,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict | None = None,
) -> list[list[int]]:
    """Token ids of each prompt, cut from the left to at most `max_prompt_length` tokens.

    Conversational prompts go through the chat template with the generation prompt appended; text prompts through
    the tokenizer (with its special tokens, as TRL does). Cutting from the left keeps the end of the prompt, the part
    the completion continues.
    """
    if is_conversational(prompts[0]):
        encoded = tokenizer.apply_chat_template(
            list(prompts), add_generation_prompt=True, tokenize=True, return_dict=True, **(chat_template_kwargs or {})
        )["input_ids"]
    else:
        encoded = tokenizer(text=list(prompts))["input_ids"]
    return [left_truncate(list(ids), max_prompt_length) for ids in encoded]


def left_truncate(ids: list[int], max_length: int | None) -> list[int]:
    """Keep the last `max_length` ids (all of them when `max_length` is None)."""
    if max_length is None or len(ids) <= max_length:
        return ids
    return ids[len(ids) - max_length :]


def cut_after_eos(ids: Sequence[int], eos_token_ids: Sequence[int]) -> list[int]:
    """The ids up to and including the first EOS; everything after it (padding, further tokens) is dropped."""
    eos = set(eos_token_ids)
    for i, token in enumerate(ids):
        if token in eos:
            return list(ids[: i + 1])
    return list(ids)


def is_truncated(ids: Sequence[int], eos_token_ids: Sequence[int], pad_token_id: int | None) -> bool:
    """A completion is truncated when it stopped at the length limit: its last token is neither EOS nor padding."""
    return len(ids) == 0 or ids[-1] not in {*eos_token_ids, pad_token_id}


def pad(
    sequences: Sequence[Sequence[int | float]],
    *,
    value: float,
    side: str,
    multiple_of: int | None = None,
    dtype: torch.dtype = torch.long,
) -> Tensor:
    """Pad lists to one `(B, L)` tensor, on the left or right; L rounded up to a multiple of `multiple_of`."""
    length = max((len(s) for s in sequences), default=0)
    if multiple_of:
        length = -(-length // multiple_of) * multiple_of
    out = torch.full((len(sequences), length), value, dtype=dtype)
    for row, seq in enumerate(sequences):
        if len(seq) == 0:
            continue
        values = torch.as_tensor(list(seq), dtype=dtype)
        if side == "left":
            out[row, length - len(seq) :] = values
        else:
            out[row, : len(seq)] = values
    return out


def decode_completions(tokenizer, completion_ids: Sequence[Sequence[int]], *, conversational: bool) -> list:
    """Completion texts (special tokens skipped); assistant messages `[{"role": "assistant", ...}]` when the prompts
    are conversational."""
    texts = tokenizer.batch_decode([list(ids) for ids in completion_ids], skip_special_tokens=True)
    if conversational:
        return [[{"role": "assistant", "content": text}] for text in texts]
    return texts


class GenerationBackend(Protocol):
    def generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        """Completion ids per prompt, ending at (and including) the first EOS; unpadded."""


class TransformersGenerator:
    """Generation with `model.generate` on left-padded prompts.

    With `share_prefix`, `generate` runs grpokit's decoding loop (`grpokit.rollout.decoding`): each distinct prompt
    is prefilled once and finished rows leave the decode batch. Every generation setting is still honoured by
    `generate`'s own preparation; where the loop cannot follow one (beam search, a static cache, ...), or the model is
    not a standard transformers causal LM, plain `generate` runs instead.

    Args:
        model_context: a callable returning a context manager that yields the model to generate with (the trainer
            unwraps it from DDP and switches gradient checkpointing off meanwhile); or a plain model.
        generation_config: a `transformers.GenerationConfig` (sampling settings, max_new_tokens, eos and pad ids).
        pad_token_id: left padding of the prompts.
        eos_token_ids: every id that ends a completion.
        pad_to_multiple_of: round the padded prompt length up to this multiple.
        device: where the prompt tensors go; default the model's device.
        share_prefix: use the shared-prefix decoding loop where possible.
    """

    def __init__(
        self,
        model_context: Callable[[], AbstractContextManager] | Any,
        generation_config,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        pad_to_multiple_of: int | None = None,
        device: torch.device | str | None = None,
        share_prefix: bool = True,
    ):
        self.model_context = model_context
        self.generation_config = generation_config
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.device = device
        self.share_prefix = share_prefix

    def _context(self) -> AbstractContextManager:
        if isinstance(self.model_context, torch.nn.Module):
            from contextlib import nullcontext

            return nullcontext(self.model_context)
        return self.model_context()

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        input_ids = pad(prompt_ids, value=self.pad_token_id, side="left", multiple_of=self.pad_to_multiple_of)
        attention_mask = pad(
            [[1] * len(p) for p in prompt_ids], value=0, side="left", multiple_of=self.pad_to_multiple_of
        )
        with self._context() as model:
            device = self.device if self.device is not None else model.device
            inputs = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
            output = self._generate(model, inputs)
        completions = output[:, input_ids.size(1) :].cpu().tolist()  # (B, C)
        return [cut_after_eos(ids, self.eos_token_ids) for ids in completions]

    def _generate(self, model, inputs: dict[str, Tensor]) -> Tensor:
        if self.share_prefix and _standard_causal_lm(model):
            from .decoding import Unsupported, shared_prefix_decoding

            try:
                return model.generate(
                    **inputs, generation_config=self.generation_config, custom_generate=shared_prefix_decoding
                )
            except Unsupported:  # raised before any model call: nothing to undo
                pass
        return model.generate(**inputs, generation_config=self.generation_config)


def _standard_causal_lm(model) -> bool:
    """A transformers decoder-only LM (possibly under a LoRA-style PEFT adapter) that `generate` can run our loop on."""
    from transformers import PreTrainedModel

    from .models import is_peft_model

    if is_peft_model(model):
        if model.peft_config[model.active_adapter].is_prompt_learning:
            return False
        model = model.get_base_model()
    return isinstance(model, PreTrainedModel) and not model.config.is_encoder_decoder
