"""Rendering a resolution: table, JSON and re-runnable YAML (with provenance comments)."""

from __future__ import annotations

import json


def as_json(resolution) -> str:
    return json.dumps(
        {k: {"value": v, "source": resolution.sources.get(k, "default")} for k, v in resolution.values.items()},
        indent=2,
        default=str,
    )


def as_table(resolution, *, show_all: bool = False) -> str:
    rows = [
        (k, json.dumps(v, default=str), resolution.sources.get(k, "default"))
        for k, v in resolution.values.items()
        if show_all or resolution.sources.get(k, "default") != "default"
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
    values are derived again. Values are written in JSON form, which YAML reads identically.
    """
    lines = [f"# {h}" for h in header or []]
    for key, value in resolution.values.items():
        source = resolution.sources.get(key, "default")
        if source in ("default", "derived"):
            continue
        lines.append(f"{key}: {json.dumps(value, default=str)}  # {source}")
    derived = [k for k, s in resolution.sources.items() if s == "derived"]
    if derived:
        lines.append(
            "# derived when resolved: " + ", ".join(f"{k}={json.dumps(resolution.values[k])}" for k in derived)
        )
    return "\n".join(lines) + "\n"
