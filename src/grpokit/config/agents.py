"""The agent fields of a configuration: `tools` and `environment_factory` (GRPOScriptArguments), dotted paths of the
user's code that `grpokit train` hands to `GRPOTrainer(tools=..., environment_factory=...)`.

Checking a configuration runs none of that code: the paths are checked by their spelling and by finding their modules'
files, and, for a plain .py module, by reading it (`grpokit.rewards.registry.check_dotted_path`). Training imports
them (`import_agent_arguments`) after every check passed.
"""

from __future__ import annotations

from typing import Any

from .rules import Problem


def agent_path_problems(values: dict[str, Any]) -> list[Problem]:
    """One problem per dotted path of `tools` / `environment_factory` that cannot be found, without importing it."""
    from grpokit.rewards.registry import check_dotted_path

    problems = []
    for i, path in enumerate(values.get("tools") or []):
        message = check_dotted_path(path)
        if message:
            problems.append(Problem("tools", f"entry {i}: {message}"))
    factory = values.get("environment_factory")
    if isinstance(factory, dict):
        if not factory:
            hint = "give {environment name: dotted path}, or one dotted path, or leave it unset"
            problems.append(Problem("environment_factory", "is an empty mapping: it names no environment", {}, hint))
        for name, path in factory.items():
            if not isinstance(name, str) or not name:
                what = f"key {name!r} is not an environment name (a non-empty string, the rows' `environment` value)"
                problems.append(Problem("environment_factory", what))
                continue
            message = check_dotted_path(path)
            if message:
                problems.append(Problem("environment_factory", f"entry {name!r}: {message}"))
    elif factory is not None:
        message = check_dotted_path(factory)
        if message:
            problems.append(Problem("environment_factory", message))
    return problems


# grpokit's caps on tool calls, refused when set without tools (their defaults are always there, and mean nothing then)
_TOOL_CAPS = {
    "tool_round_timeout": "caps the time of a round of tool calls",
    "max_tool_result_chars": "caps the length of a tool result",
}


def tool_loop_problems(values: dict[str, Any], sources: dict[str, str] | None = None) -> list[str]:
    """`max_tool_calling_iterations` set, or `tool_round_timeout` / `max_tool_result_chars` set explicitly, with
    neither `tools` nor `environment_factory`: a cap on a loop that never runs. Checked by `grpokit config validate`
    and `grpokit train`, not by the parser or GRPOTrainer: a Python script may pass its tools to GRPOTrainer itself."""
    if values.get("tools") or values.get("environment_factory"):
        return []
    sources = sources or {}
    problems = []
    cap = values.get("max_tool_calling_iterations")
    if cap is not None:
        problems.append(
            Problem(
                "max_tool_calling_iterations",
                "caps the tool-calling loop and has no effect without tools",
                cap,
                "set tools or environment_factory, or remove it",
                source=sources.get("max_tool_calling_iterations"),
            )
        )
    for name, what in _TOOL_CAPS.items():
        if sources.get(name, "default") not in ("default", "derived"):
            problems.append(
                Problem(
                    name,
                    f"{what} and has no effect without tools",
                    values.get(name),
                    "set tools or environment_factory, or remove it",
                    source=sources.get(name),
                )
            )
    return [problem.line() for problem in problems]


def import_agent_arguments(tools, environment_factory) -> dict[str, Any]:
    """`GRPOTrainer`'s `tools` / `environment_factory` arguments imported from their dotted paths: only those set.
    ValueError with a one-line message naming the field, the entry and what failed."""
    from grpokit.rewards.registry import import_dotted

    arguments: dict[str, Any] = {}
    if tools:
        imported = []
        for i, path in enumerate(tools):
            try:
                imported.append(import_dotted(path, what="", colon=True))
            except ValueError as exc:
                raise ValueError(f"tools: entry {i}: {' '.join(str(exc).split())}") from exc
        arguments["tools"] = imported
    if isinstance(environment_factory, dict):
        factories = {}
        for name, path in environment_factory.items():
            try:
                factories[name] = import_dotted(path, what="", colon=True)
            except ValueError as exc:
                raise ValueError(f"environment_factory: entry {name!r}: {' '.join(str(exc).split())}") from exc
        arguments["environment_factory"] = factories
    elif environment_factory:
        try:
            arguments["environment_factory"] = import_dotted(environment_factory, what="", colon=True)
        except ValueError as exc:
            raise ValueError(f"environment_factory: {' '.join(str(exc).split())}") from exc
    return arguments
