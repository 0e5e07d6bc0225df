"""Token-level helpers every generation backend shares: prompt encoding, padding, EOS handling and decoding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .base import GenerationError


def is_conversational(prompt: Any) -> bool:
    """A conversational prompt is a list of `{"role", "content"}` messages (TRL's convention)."""
    return isinstance(prompt, list) and len(prompt) > 0 and isinstance(prompt[0], dict) and "role" in prompt[0]


def encode_prompts(
    tokenizer,
    prompts: Sequence[Any],
    *,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict | None = None,
    tools: list[dict] | None = None,
) -> list[list[int]]:
    """Token ids of each prompt, cut from the left to at most `max_prompt_length` tokens.

    Conversational prompts go through the chat template with the generation prompt appended; text prompts through
    the tokenizer (with its special tokens, as TRL does). Cutting from the left keeps the end of the prompt, the part
    the completion continues. `tools` (JSON schemas) are rendered by the chat template, for an agent's prompts.
    """
    if is_conversational(prompts[0]):
        with_tools = {"tools": tools} if tools else {}  # not `tools=[]`: some templates render tool text for it
        encoded = tokenizer.apply_chat_template(
            list(prompts),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **with_tools,
            **(chat_template_kwargs or {}),
        )["input_ids"]
    else:
        encoded = tokenizer(text=list(prompts))["input_ids"]
    return [left_truncate(list(ids), max_prompt_length) for ids in encoded]


def check_prompt_lengths(
    prompt_ids: Sequence[Sequence[int]],
    prompts: Sequence[Any],
    max_completion_length: int | None,
    max_positions: int | None,
) -> None:
    """Refuse, in one line naming the prompt, a prompt whose tokens plus `max_completion_length` do not fit the
    model's `max_positions`: generating past them fails or degrades silently, depending on the model."""
    if not max_positions or max_completion_length is None:
        return
    for ids, prompt in zip(prompt_ids, prompts, strict=True):
        if len(ids) + max_completion_length > max_positions:
            shown = repr(prompt if isinstance(prompt, str) else prompt[-1].get("content", prompt[-1]))
            shown = shown if len(shown) <= 80 else f"{shown[:60]}...{shown[-17:]}"
            raise GenerationError(
                f"a prompt of {len(ids)} tokens ({shown}) with max_completion_length={max_completion_length} needs "
                f"{len(ids) + max_completion_length} positions, more than the model's {max_positions} "
                f"(max_position_embeddings): set max_prompt_length to at most {max_positions - max_completion_length} "
                "(it keeps the end of each prompt), or shorten such prompts"
            )


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
