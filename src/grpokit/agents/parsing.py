"""Reading a generated turn as an assistant message, tool calls included, and checking that a tokenizer can render
and parse tool calls at all.

Two parsers: the tokenizer's own (`tokenizer.parse_response`, when it has a `response_template` or legacy
`response_schema`, as TRL uses it), else grpokit's for the Hermes / Qwen format (`<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`), the format most open chat models use. Both read token ids, not text: a
delimiter counts only when the model generated it as its own token, so a completion that spells `<tool_call>` out in
characters calls nothing. A malformed call (bad JSON, a missing name) makes the whole turn plain text, as in TRL.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class TemplateError(ValueError):
    """A tokenizer whose chat template cannot render tool calls, or whose tool calls cannot be parsed: one line."""


def has_response_parser(tokenizer) -> bool:
    return getattr(tokenizer, "response_template", None) is not None or (
        getattr(tokenizer, "response_schema", None) is not None
    )


def hermes_delimiters(tokenizer) -> tuple[int, int] | None:
    """The ids of `<tool_call>` and `</tool_call>` when both are single tokens of `tokenizer`, else None."""
    ids = []
    for token in (OPEN, CLOSE):
        encoded = tokenizer.convert_tokens_to_ids(token)
        if encoded is None or encoded == tokenizer.unk_token_id:
            return None
        ids.append(encoded)
    return ids[0], ids[1]


_TINY = "; for a tiny offline model, grpokit.tiny.build_tool_tokenizer() gives a tokenizer that does tools"


def check_tool_template(tokenizer, chat_template_kwargs: dict | None = None, name: str = "the tokenizer") -> None:
    """Raise a one-line `TemplateError` unless `tokenizer` renders a whole tool conversation (user, assistant with a
    tool call, tool result) and its turns can be parsed for tool calls."""
    name = name or f"the tokenizer ({type(tokenizer).__name__}, built in memory)"
    probe = {
        "type": "function",
        "function": {
            "name": "probe",
            "description": "A probe.",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer", "description": "x"}}},
        },
    }
    conversation = [
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "probe", "arguments": {"x": 1}}}],
        },
        {"role": "tool", "name": "probe", "content": "1"},
    ]
    try:
        rendered = tokenizer.apply_chat_template(
            conversation, tools=[probe], tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
        )
    except Exception as exc:  # noqa: BLE001 - any template failure means the same thing here
        raise TemplateError(
            f"{name}'s chat template cannot render a tool-calling conversation ({' '.join(str(exc).split())[:200]}): "
            f"use a tool-capable template (e.g. Qwen2.5/Qwen3's) or set tokenizer.chat_template{_TINY}"
        ) from None
    if "probe" not in str(rendered):
        raise TemplateError(
            f"{name}'s chat template ignores tools and tool calls (the rendered conversation does not name the tool): "
            f"use a tool-capable template (e.g. Qwen2.5/Qwen3's) or set tokenizer.chat_template{_TINY}"
        )
    if not has_response_parser(tokenizer) and hermes_delimiters(tokenizer) is None:
        raise TemplateError(
            f"{name} cannot parse tool calls: it has no response_template and {OPEN} / {CLOSE} are not single tokens "
            "of its vocabulary; set tokenizer.response_template (transformers' response parsing) for its format"
        )


def parse_turn(tokenizer, ids: Sequence[int], prefix: Sequence[int] | None = None, tools=None) -> dict:
    """The assistant message of one generated turn: `{"role": "assistant", "content": str}` plus `"tool_calls"`
    (TRL's `{"type": "function", "function": {"name", "arguments"}}` dicts) when the turn calls tools."""
    ids = list(ids)
    if has_response_parser(tokenizer):
        return _parse_with_tokenizer(tokenizer, ids, prefix, tools)
    return _parse_hermes(tokenizer, ids)


def _plain(tokenizer, ids: list[int]) -> dict:
    return {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)}


def _parse_with_tokenizer(tokenizer, ids: list[int], prefix, tools) -> dict:
    try:
        kwargs = (
            {"prefix": list(prefix)} if prefix is not None and getattr(tokenizer, "response_template", None) else {}
        )
        if kwargs and tools:
            kwargs["tools"] = tools
        parsed = tokenizer.parse_response(ids, **kwargs)
        if not isinstance(parsed, dict):
            raise ValueError("no message")
        parsed = dict(parsed)
        content = parsed.get("content")
        if isinstance(content, str) and tokenizer.eos_token:
            content = content.removesuffix(tokenizer.eos_token)
        parsed["content"] = content or ""
        parsed.setdefault("role", "assistant")
        if "tool_calls" in parsed:
            parsed["tool_calls"] = [_checked_call(call) for call in parsed["tool_calls"] or []]
            if not parsed["tool_calls"]:
                del parsed["tool_calls"]
        return parsed
    except (ValueError, TypeError, KeyError, RecursionError):  # RecursionError: JSON nested past the limit
        return _plain(tokenizer, ids)


def _checked_call(call) -> dict:
    """A parsed tool call in TRL's shape; ValueError when its fields are missing or of the wrong type."""
    if not isinstance(call, dict):
        raise ValueError("a tool call is not an object")
    function = call.get("function", call)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError("a tool call has no name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        arguments = json.loads(arguments or "{}")
    if not isinstance(arguments, dict):
        raise ValueError("tool call arguments are not an object")
    return {"type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _parse_hermes(tokenizer, ids: list[int]) -> dict:
    delimiters = hermes_delimiters(tokenizer)
    if delimiters is None or delimiters[0] not in ids:
        return _plain(tokenizer, ids)
    open_id, close_id = delimiters
    outside: list[int] = []
    calls = []
    i = 0
    while i < len(ids):
        if ids[i] != open_id:
            if ids[i] == close_id:  # a closing delimiter with no opening one: not a well-formed turn
                return _plain(tokenizer, ids)
            outside.append(ids[i])
            i += 1
            continue
        try:
            end = ids.index(close_id, i + 1)
        except ValueError:  # an unclosed call (e.g. cut by the length limit)
            return _plain(tokenizer, ids)
        body = tokenizer.decode(ids[i + 1 : end], skip_special_tokens=False).strip()
        try:
            calls.append(_checked_call(json.loads(body)))
        except (ValueError, TypeError, RecursionError):  # a model may nest JSON past the limit
            return _plain(tokenizer, ids)
        i = end + 1
    message = {"role": "assistant", "content": tokenizer.decode(outside, skip_special_tokens=True).strip()}
    if calls:
        message["tool_calls"] = calls
    return message
