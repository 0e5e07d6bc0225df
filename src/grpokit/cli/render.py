"""Rendering a resolution: table, JSON and re-runnable YAML (with provenance comments)."""

from __future__ import annotations

import json

from grpokit.config.redaction import REDACTED, env_placeholder, field_placeholder, is_secret_env, shown_value


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


def as_yaml(resolution, header: list[str] | None = None) -> str:
    """Every value that is not a default or derived, one per line with its source as a comment.

    Passed back with `--config`, the file resolves to the same values: defaults come back by themselves and derived
    values are derived again. Values are written in JSON form, which YAML reads identically. Secrets are the
    exception: a secret field (hub_token) or `env:` variable (HF_TOKEN) is written as a comment that says where the
    value must come from instead (`redaction`).
    """
    lines = [f"# {h}" for h in header or []]
    for key, value in resolution.values.items():
        source = resolution.sources.get(key, "default")
        if source in ("default", "derived"):
            continue
        if shown_value(key, value) != value:
            lines.append(f"# {key}: {field_placeholder(key)}  # {source}")
            continue
        lines.append(f"{key}: {json.dumps(value, default=str)}  # {source}")
    env = _env(resolution)
    if env:
        lines.append(f"env:  # {next(iter(env.values()))[1]}")
        for name, (value, source) in env.items():
            if is_secret_env(name):
                lines.append(f"  # {name}: {env_placeholder(name)}  # {source}")
            else:
                key = name if name.isidentifier() else json.dumps(name)
                lines.append(f"  {key}: {json.dumps(value)}  # {source}")
    derived = [k for k, s in resolution.sources.items() if s == "derived"]
    if derived:
        lines.append(
            "# derived when resolved: " + ", ".join(f"{k}={json.dumps(resolution.values[k])}" for k in derived)
        )
    return "\n".join(lines) + "\n"


def _env(resolution) -> dict:
    return getattr(resolution, "env", None) or {}
