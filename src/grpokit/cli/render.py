"""Rendering a resolution: table, JSON and re-runnable YAML (with provenance comments; `grpokit.records.resolved`,
the writer of resolved_config.yaml)."""

from __future__ import annotations

import json

from grpokit.config.redaction import REDACTED, is_secret_env, shown_value
from grpokit.records.resolved import as_yaml, env_of  # the YAML form is resolved_config.yaml's writer

__all__ = ["as_json", "as_table", "as_yaml"]


def as_json(resolution) -> str:
    """{field: {value, source}}, then {"env.NAME": {value, source}} for each variable of an `env:` section; secret
    values (`redaction`) shown as "<redacted>"."""
    shown = {
        k: {"value": shown_value(k, v), "source": resolution.sources.get(k, "default")}
        for k, v in resolution.values.items()
    }
    for name, (value, source) in _env(resolution).items():
        shown[f"env.{name}"] = {"value": REDACTED if is_secret_env(name) else value, "source": source}
    return json.dumps(shown, indent=2, default=str)


def as_table(resolution, *, show_all: bool = False) -> str:
    rows = [
        (k, json.dumps(shown_value(k, v), default=str), resolution.sources.get(k, "default"))
        for k, v in resolution.values.items()
        if show_all or resolution.sources.get(k, "default") != "default"
    ]
    rows += [
        (f"env.{name}", json.dumps(REDACTED if is_secret_env(name) else value), source)
        for name, (value, source) in _env(resolution).items()
    ]
    if not rows:
        return "(every value is its default; --all lists them)"
    w0 = max(len(r[0]) for r in rows + [("field", "", "")])
    w1 = min(60, max(len(r[1]) for r in rows + [("", "value", "")]))
    lines = [f"{'field':<{w0}}  {'value':<{w1}}  source", f"{'-' * w0}  {'-' * w1}  {'-' * 6}"]
    lines += [f"{k:<{w0}}  {v:<{w1}}  {s}" for k, v, s in rows]
    return "\n".join(lines)


def _env(resolution) -> dict:
    return env_of(resolution)
