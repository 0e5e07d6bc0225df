"""Sphinx extension: the API reference of a configuration dataclass lists its fields with their help.

grpokit's dataclasses (GRPOConfig, ScriptArguments, ...) describe each field only in its `help` metadata, which
autodoc does not read: a class rendered as `GRPOConfig(**fields)` showed no field at all. This hook appends, to the
docstring autodoc renders for a dataclass, one parameter entry per field it declares or overrides (with its default),
from that help, in declaration order; fields inherited unchanged from transformers' `TrainingArguments` are left to
its documentation and to the configuration reference.
"""

import dataclasses

_SKIP_OWNERS = ("transformers.",)


def _own_fields(cls) -> list:
    own = []
    for f in dataclasses.fields(cls):
        if not f.init or not f.metadata.get("help"):
            continue
        owner = next((c for c in cls.__mro__ if f.name in c.__dict__.get("__annotations__", {})), cls)
        if owner.__module__.startswith(_SKIP_OWNERS):
            continue
        own.append(f)
    return own


def _default(f) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return repr(f.default_factory())
    return "required"


def _escape(text: str) -> str:
    text = " ".join(str(text).split())
    for mark in ("\\", "*", "|", "_", "`"):  # reST markup in plain help text: literal characters
        text = text.replace(mark, "\\" + mark)
    return text


def add_field_help(app, what, name, obj, options, lines) -> None:
    if what != "class" or not dataclasses.is_dataclass(obj):
        return
    fields = _own_fields(obj)
    if not fields:
        return
    lines += ["", f"**Fields** ({len(fields)}; every field with its type: the configuration reference)", ""]
    for f in fields:
        lines.append(f"- ``{f.name}`` (default ``{_default(f)}``): {_escape(f.metadata['help'])}")
    lines.append("")


def setup(app):
    app.connect("autodoc-process-docstring", add_field_help, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
