"""The field table: GRPOConfig's fields (TrainingArguments' own included) as plain data, generated from the classes.

`grpokit config validate|show|diff|plan` resolve a configuration without importing transformers or torch (about 4 s
on a 2-core machine). They need GRPOConfig's fields (names, types, defaults, choices, help, the class that defines
each), which live on a `transformers.TrainingArguments` subclass; this module writes them down once, from the real
classes, into `field_data.py`, and `tests/config/test_field_table.py` regenerates the table and asserts it equals the
committed one. The table is never edited by hand: after changing a field (or upgrading transformers), run

    python -m grpokit.config.field_table

It also records what the light path must not judge alone (`post_init_fields`: the TrainingArguments fields its
`__post_init__` reads; see `light.py`) and the integrations `report_to` may name.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import pprint
import textwrap
import typing
from pathlib import Path
from typing import Any, Literal

DATA_FILE = Path(__file__).with_name("field_data.py")

# The methods of TrainingArguments that `__post_init__` runs, whose reads of fields the light path must account for.
POST_INIT_METHODS = ("__post_init__", "_validate_args", "_setup_devices", "_process_fsdp_args")


def encode_type(tp) -> Any:
    """A type hint as plain data: ["int"], ["list", T], ["union", [T...]], ["literal", [v...]], ["enum", name,
    [[member, value]...]], ["dict", K, V] / ["dict"], ["any"], ["none"], ["class", name, is_dataclass]."""
    origin = typing.get_origin(tp)
    if tp is type(None) or tp is None:
        return ["none"]
    if tp is Any:
        return ["any"]
    if tp in (bool, int, float, str):
        return [tp.__name__]
    if tp is dict:
        return ["dict"]
    if tp is list:
        return ["list", ["any"]]
    if origin is typing.Union or (origin is not None and origin.__name__ == "UnionType"):
        return ["union", [encode_type(a) for a in typing.get_args(tp)]]
    if origin is Literal:
        return ["literal", list(typing.get_args(tp))]
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return ["list", encode_type(inner)]
    if origin is dict:
        args = typing.get_args(tp)
        return ["dict", *[encode_type(a) for a in args]] if args else ["dict"]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return ["enum", tp.__name__, [[m.name, m.value] for m in tp]]
    if isinstance(tp, type):
        return ["class", tp.__name__, dataclasses.is_dataclass(tp)]
    raise TypeError(f"cannot encode the type {tp!r}")


def _plain_default(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain_default(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain_default(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot write the default {value!r}")


def _post_init_fields(cls, names) -> list[str]:
    """The fields of `cls` that its `__post_init__` (and the methods it runs) read: as `self.NAME`, or named in a
    string (`getattr(self, "NAME")`, `_VALID_DICT_FIELDS`)."""
    import ast

    found = set(getattr(cls, "_VALID_DICT_FIELDS", ()))
    for method in POST_INIT_METHODS:
        function = inspect.getattr_static(cls, method, None)
        function = getattr(function, "func", getattr(function, "fget", function))  # cached_property, property
        if function is None:
            continue
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(function)))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                found.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return sorted(found & set(names))


def build_table() -> dict:
    """The table, from the real classes (imports transformers)."""
    from transformers import TrainingArguments
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    from .grpo_config import GRPOConfig
    from .types import field_types

    hints = field_types(GRPOConfig)
    own = set(GRPOConfig.__dict__.get("__annotations__", {}))
    fields = []
    for f in dataclasses.fields(GRPOConfig):
        entry = {
            "name": f.name,
            "type": encode_type(hints[f.name]),
            "help": f.metadata.get("help", ""),
            "owner": "GRPOConfig" if f.name in own else "TrainingArguments",
            "init": f.init,
        }
        if f.default is not dataclasses.MISSING:
            entry["default"] = _plain_default(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            entry["default_factory"] = _plain_default(f.default_factory())
        fields.append(entry)
    names = [f.name for f in dataclasses.fields(TrainingArguments)]
    return {
        "fields": fields,
        "post_init_fields": _post_init_fields(TrainingArguments, names),
        "integrations": sorted(INTEGRATION_TO_CALLBACK),
    }


def render(table: dict) -> str:
    """The text of `field_data.py` for `table`."""
    return (
        '"""GRPOConfig\'s fields as plain data, written by python -m grpokit.config.field_table;\n'
        'do not edit (tests/config/test_field_table.py checks that it equals a fresh one)."""\n\n'
        "# fmt: off\n"
        f"TABLE = {pprint.pformat(table, width=119, sort_dicts=False)}\n"
    )


def main() -> int:
    DATA_FILE.write_text(render(build_table()), encoding="utf-8")
    print(f"wrote {DATA_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
