"""JSON Schema (draft 2020-12) of the YAML that `--config` accepts, built from the dataclasses and the rules."""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from typing import Any

from grpokit.config.migrations import REMOVED_KEY_ERRORS, RENAMED_KEYS, TRL_KEY_CHANGES
from grpokit.config.recipes import recipe_names
from grpokit.config.rules import MAPPING_FIELDS, RANGES
from grpokit.config.script_args import DatasetConfig
from grpokit.config.types import MAPPING_ITEM_FIELDS, _union_args, field_choices, field_types, strip_optional

# A number written as a string: YAML 1.1 reads `1e-6` or `5e-7` (no dot) as a string, which the parser accepts for a
# float field as the command line does.
NUMBER_STRING = {"type": "string", "pattern": r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"}
# `dict | str` fields whose string form is JSON only (on the command line); a plain string is not a mapping. Other
# `dict | str` fields (deepspeed, fsdp_config, accelerator_config) also take the path of a JSON file.
JSON_MAPPING_FIELDS = frozenset(MAPPING_FIELDS) | {
    "lr_scheduler_kwargs",
    "gradient_checkpointing_kwargs",
    "dataset_mixture",
}
JSON_OBJECT_STRING = {"type": "string", "pattern": r"^\s*\{"}
# A dotted path of the user's code (`tools`, `environment_factory`): `package.module.function` or
# `package.module:function` (grpokit.rewards.registry.check_dotted_path checks it further, without importing it).
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
DOTTED_PATH = {"type": "string", "pattern": rf"^{_NAME}(\.{_NAME})*[.:]{_NAME}(\.{_NAME})*$"}


def _json_mapping(schema: dict) -> dict:
    """`schema` of a `dict | str` field with its string option narrowed to a JSON object."""
    types = schema.pop("type", [])
    options = schema.pop("anyOf", None) or [{"type": t} for t in ([types] if isinstance(types, str) else types)]
    return {**schema, "anyOf": [JSON_OBJECT_STRING if o == {"type": "string"} else o for o in options]}


def _type_schema(tp) -> dict:
    inner, optional = strip_optional(tp)
    choices = field_choices(inner)
    if choices is not None:
        schema = {"enum": list(choices) + ([None] if optional else [])}
        return schema
    members = _union_args(inner) or (inner,)
    options = []
    for option in (_single(m) for m in members):
        options += option["anyOf"] if set(option) == {"anyOf"} else [option]  # float: number or number string
    if optional:
        options.append({"type": "null"})
    if len(options) == 1:
        return options[0]
    simple = [o for o in options if set(o) == {"type"}]
    if len(simple) == len(options):
        return {"type": [o["type"] for o in options]}
    return {"anyOf": options}


def _single(tp) -> dict:
    origin = typing.get_origin(tp)
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"anyOf": [{"type": "number"}, NUMBER_STRING]}
    if tp is str:
        return {"type": "string"}
    if tp is dict or origin is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(tp))}
    if tp is list or origin is list:
        args = typing.get_args(tp)
        return {"type": "array", "items": _type_schema(args[0])} if args and args[0] is not Any else {"type": "array"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if dataclasses.is_dataclass(tp):
        return {"type": "object"}
    return {}


def _jsonable(value):
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _field_schema(dtype, f) -> dict:
    schema = _type_schema(field_types(dtype)[f.name])
    if f.name in JSON_MAPPING_FIELDS:
        schema = _json_mapping(schema)
    if f.name in RANGES:
        low, low_inc, high, high_inc = RANGES[f.name]
        if low is not None:
            schema["minimum" if low_inc else "exclusiveMinimum"] = low
        if high is not None:
            schema["maximum" if high_inc else "exclusiveMaximum"] = high
    default = f.default if f.default is not dataclasses.MISSING else None
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    default = getattr(default, "value", default)
    if _jsonable(default):
        schema["default"] = default
    if f.metadata.get("help"):
        schema["description"] = f.metadata["help"].replace("%%", "%")
    return schema


def build_schema(dataclass_types) -> dict:
    properties: dict[str, Any] = {}
    for dtype in dataclass_types:
        for f in dataclasses.fields(dtype):
            if f.init and f.name not in properties:
                properties[f.name] = _field_schema(dtype, f)
    if "recipe" in properties:
        properties["recipe"]["enum"] = recipe_names() + [None]
        properties["recipe"].pop("type", None)
    if "datasets" in properties:
        properties["datasets"] = {
            "type": "array",
            "description": properties["datasets"].get("description", ""),
            "items": {
                "type": "object",
                "properties": {f.name: _field_schema(DatasetConfig, f) for f in dataclasses.fields(DatasetConfig)},
                "required": ["path"],
                "additionalProperties": False,
            },
            "default": [],
        }
    for name in MAPPING_ITEM_FIELDS & set(properties):
        entry = {
            "type": "object",
            "properties": {"name": {"type": "string"}, "kwargs": {"type": "object"}},
            "required": ["name"],
            "additionalProperties": False,
        }
        properties[name]["anyOf"] = [
            {"type": "array", "items": {"anyOf": [{"type": "string"}, entry]}},
            {"type": "null"},
        ]
        properties[name].pop("type", None)
        properties[name].pop("items", None)
    if "tools" in properties:
        properties["tools"]["anyOf"] = [{"type": "array", "items": DOTTED_PATH}, {"type": "null"}]
    if "environment_factory" in properties:  # one dotted path, or {environment name: dotted path}
        properties["environment_factory"].pop("type", None)
        properties["environment_factory"]["anyOf"] = [
            DOTTED_PATH,
            {"type": "object", "additionalProperties": DOTTED_PATH, "minProperties": 1},
            {"type": "null"},
        ]
    if "scale_rewards" in properties:
        properties["scale_rewards"]["enum"] = properties["scale_rewards"]["enum"] + [True, False]
    if "resume_from_checkpoint" in properties:  # `true`: the latest checkpoint in output_dir; `false`: no resume
        properties["resume_from_checkpoint"]["type"] = ["string", "boolean", "null"]
    properties["env"] = {
        "type": "object",
        "description": "Environment variables set (as strings) before the rest of the config is applied.",
        "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
    }
    properties.update(_launch_properties())
    for old, (new, why) in RENAMED_KEYS.items():
        if old not in properties:
            target = dict(properties.get(new, {})) if new else {}
            target.pop("default", None)
            target.update({"deprecated": True, "description": f"Deprecated: {why}."})
            if old in REMOVED_KEY_ERRORS:
                harmless = list(TRL_KEY_CHANGES[old].harmless_values)
                # the parser refuses the key, except for values that ask for what grpokit does anyway
                target.update({"enum": harmless} if harmless else {"not": {}})
            properties[old] = target
        else:
            properties[old]["deprecated"] = True
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://grpokit.dev/schema/config.json",
        "title": "grpokit GRPO training configuration",
        "description": "Keys of a YAML file passed to `grpokit train --config` (and TRL-style scripts).",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }


def _launch_properties() -> dict:
    """The launch options `grpokit train` takes from the YAML (not fields of any dataclass)."""
    from grpokit.cli.launch_presets import preset_names

    return {
        "accelerate_config": {
            "type": "string",
            "description": "grpokit train starts the processes with accelerate: a shipped preset ("
            + ", ".join(preset_names())
            + ") or an accelerate config file.",
            "examples": preset_names(),
        },
        "num_processes": {
            "type": "integer",
            "minimum": 1,
            "description": "Processes the launch starts (default: the accelerate config's num_processes).",
        },
        "main_process_port": {
            "type": "integer",
            "minimum": 1,
            "maximum": 65535,
            "description": "Port of the launch's rendezvous (default: accelerate's).",
        },
    }
