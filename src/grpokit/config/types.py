"""Type-directed coercion of config values.

A YAML value and a command-line string go through the same function, so `num_generations: 8.5` in a file fails
exactly like `--num_generations 8.5` does. Errors are raised as `CoercionError` with a one-line message.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import types
import typing
from typing import Any, Literal, Union

# List fields whose items may also be mappings: reward entries written `{name: ..., kwargs: {...}}` in YAML.
MAPPING_ITEM_FIELDS = frozenset({"reward_funcs"})

_TRUE = {"true", "yes", "y", "t", "1", "on"}
_FALSE = {"false", "no", "n", "f", "0", "off"}


class CoercionError(ValueError):
    """A value that does not fit its field's type; `suggestion` is the nearest valid value, if any."""

    def __init__(self, message: str, suggestion: Any = None):
        super().__init__(message)
        self.suggestion = suggestion


@functools.cache
def field_types(cls) -> dict[str, Any]:
    """Resolved type hints of a dataclass's fields (annotations may be strings)."""
    return typing.get_type_hints(cls)


def _union_args(tp) -> tuple | None:
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return typing.get_args(tp)
    return None


def strip_optional(tp) -> tuple[Any, bool]:
    """(type without None, whether None is allowed)."""
    args = _union_args(tp)
    if args is None:
        return tp, False
    rest = tuple(a for a in args if a is not type(None))
    optional = len(rest) < len(args)
    if len(rest) == 1:
        return rest[0], optional
    return Union[rest], optional  # noqa: UP007


def _literal_or_enum_values(member) -> list | None:
    if typing.get_origin(member) is Literal:
        return list(typing.get_args(member))
    if isinstance(member, type) and issubclass(member, enum.Enum):
        return [m.value for m in member]
    return None


def field_choices(tp) -> list | None:
    """The allowed values of an enumerated field (a Literal or an Enum, possibly inside a union), else None.

    `SchedulerType | str` is an enumeration (the `str` is the enum's spelling); `str | Literal[False]` is not: there
    the Literal only adds a value to a wider type (transformers' `trackio_static_space_id`)."""
    tp, _ = strip_optional(tp)
    members = _union_args(tp) or (tp,)
    choices, others = None, []
    for member in members:
        values = _literal_or_enum_values(member)
        if values is None:
            others.append(member)
        elif choices is None:
            choices = values
    if choices is None:
        return None
    if others and not (all(o is str for o in others) and all(isinstance(c, str) for c in choices)):
        return None
    return choices


def type_label(tp) -> str:
    """A short human name of a type, for messages: 'an integer', 'a number', 'a mapping', ..."""
    tp, optional = strip_optional(tp)
    choices = field_choices(tp)
    if choices is not None:
        label = "one of " + ", ".join(repr(c) for c in choices)
    else:
        members = _union_args(tp) or (tp,)
        label = " or ".join(_single_label(m) for m in members)
    return label + (" or null" if optional else "")


def _single_label(tp) -> str:
    origin = typing.get_origin(tp)
    if tp is bool:
        return "a boolean"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is dict or origin is dict:
        return "a mapping"
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if origin is list or tp is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"a list of {_single_label(inner).split(' ', 1)[-1]}s" if inner is not Any else "a list"
    return getattr(tp, "__name__", str(tp))


def _to_bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise CoercionError(f"{value!r} is not a boolean (true/false)")


def _to_int(value):
    if isinstance(value, bool):
        raise CoercionError(f"{value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    suggestion = None
    try:
        as_float = float(value)
        if math.isfinite(as_float):
            suggestion = round(as_float)
    except (TypeError, ValueError):
        pass
    raise CoercionError(f"{value!r} is not an integer", suggestion)


def _to_float(value):
    if isinstance(value, bool):
        raise CoercionError(f"{value!r} is not a number")
    if isinstance(value, (int, float)):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            raise CoercionError(f"{value!r} is not a number") from None
    else:
        raise CoercionError(f"{value!r} is not a number")
    if math.isnan(result):
        raise CoercionError(f"{value!r} is not a number")
    return result


def _to_str(value):
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # what the command line would have passed
    raise CoercionError(f"{value!r} is not a string")


def _to_dict(value):
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise CoercionError(f"{value!r} is not valid JSON ({exc.msg})") from None
        if isinstance(parsed, dict):
            return parsed
    raise CoercionError(f"{value!r} is not a mapping")


def coerce(value: Any, tp: Any, *, mapping_items: bool = False) -> Any:
    """Convert `value` (a YAML value or a command-line string) to type `tp`, or raise `CoercionError`.

    `mapping_items`: list items may also be mappings (for reward entries written `{name: ..., kwargs: ...}`).
    """
    inner, optional = strip_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in ("null", "~")):
        if optional or tp is Any:
            return None
        raise CoercionError("null is not allowed here")
    choices = field_choices(inner)
    if choices is not None:
        return _to_choice(value, choices, inner)
    members = _union_args(inner) or (inner,)
    if isinstance(value, str) and value.lstrip().startswith("{") and any(_is_dict(m) for m in members):
        # `dict | str` fields (generation_kwargs, lr_scheduler_kwargs, ...): on the command line a mapping is JSON.
        return _to_dict(value)
    if isinstance(value, str) and int in members and str in members:
        try:
            return int(value.strip())  # `--pad_to_multiple_of 64` is the integer 64, not the string '64'
        except ValueError:
            pass
    # Prefer Literal members (exact values), then the member that matches the value's own shape, then the others.
    errors = []
    order = sorted(members, key=lambda m: (typing.get_origin(m) is not Literal, not _shape_matches(value, m)))
    for member in order:
        try:
            return _coerce_single(value, member, mapping_items)
        except CoercionError as exc:
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    raise CoercionError(
        f"{value!r} is not {type_label(tp)}", next((e.suggestion for e in errors if e.suggestion), None)
    )


def _is_dict(tp) -> bool:
    return tp is dict or typing.get_origin(tp) is dict


def _shape_matches(value, tp) -> bool:
    origin = typing.get_origin(tp) or tp
    if origin is list:
        return isinstance(value, list)
    if origin is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp in (int, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return False


def _coerce_single(value, tp, mapping_items):
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if tp is bool:
        return _to_bool(value)
    if tp is int:
        return _to_int(value)
    if tp is float:
        return _to_float(value)
    if tp is str:
        return _to_str(value)
    if tp is dict or origin is dict:
        return _to_dict(value)
    if origin is Literal:
        return _to_choice(value, list(typing.get_args(tp)), tp)
    if tp is list or origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        items = value if isinstance(value, list) else [value]
        out = []
        for i, item in enumerate(items):
            if mapping_items and isinstance(item, dict):
                out.append(item)
                continue
            try:
                out.append(coerce(item, item_tp))
            except CoercionError as exc:
                raise CoercionError(f"item {i}: {exc}", exc.suggestion) from None
        return out
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _to_choice(value, [m.value for m in tp], tp)
    if isinstance(value, tp):
        return value
    if isinstance(value, dict) and hasattr(tp, "__dataclass_fields__"):
        return value  # nested dataclasses (e.g. ParallelismConfig, DatasetConfig) are built by their owner
    raise CoercionError(f"{value!r} is not {_single_label(tp)}")


def _to_choice(value, choices, tp):
    if isinstance(value, enum.Enum):
        value = value.value
    for choice in choices:
        if value == choice and type(value) is type(choice):
            return choice
    for choice in choices:
        # Command-line strings for non-string choices (e.g. Literal[1, 2]).
        if isinstance(value, str) and not isinstance(choice, str) and value == str(choice):
            return choice
        if isinstance(value, str) and isinstance(choice, bool):
            if value.strip().lower() in (_TRUE if choice else _FALSE):
                return choice
    from .suggest import closest

    near = closest(str(value), [str(c) for c in choices])
    listed = ", ".join(repr(c) for c in choices)
    raise CoercionError(f"{value!r} is not one of {listed}", near)
