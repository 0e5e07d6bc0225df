"""`grpokit rewards [show NAME]`: the built-in rewards, read from the registry (`grpokit.rewards.registry`).

Nothing here keeps a copy of the list: the names are the registry's, what a reward scores is the first paragraph of
its docstring, its kwargs are what the registry accepts in a `{name, kwargs}` entry (with the signature's defaults),
and the extra it needs comes from the registry's sets of math and sandbox rewards. The registry imports neither
torch nor transformers, so this answers without loading them.
"""

from __future__ import annotations

import inspect
import shutil
import textwrap
from typing import Any

# Parameters that carry a dataset column of that name (the trainer passes the columns as keywords), not a setting.
COLUMN_PARAMETERS = frozenset({"solution"})

SANDBOX_NEEDS = "the local code sandbox (Linux with bubblewrap: apt-get install bubblewrap)"

USE_LINE = "use one: reward_funcs: [NAME, ...] in YAML (--reward_funcs NAME ...), or {name: NAME, kwargs: {...}}"
# The defaults above are the functions'; under `grpokit train` the config offers its own (`reward_defaults` in
# grpokit.config.parser, not imported here: it loads transformers).
CONFIG_NOTE = (
    "Under grpokit train the config's fields are offered to the factories (an entry's own kwargs win): open-r1's "
    "cosine_* fields to cosine (cosine_max_len as max_len; e.g. cosine_min_value_wrong is 0.0), repetition_n_grams "
    "and repetition_max_penalty to repetition_penalty, the code fields (code_provider, ioi_provider, ...) under "
    "their own names, and the overlong window from max_completion_length; grpokit config show --all lists them."
)


def _registry():
    from grpokit.rewards import registry

    return registry


def reward_function(name: str):
    """The registry's callable for `name` (a reward function or a factory)."""
    registry = _registry()
    return registry.REWARD_FACTORIES.get(name) or registry.REWARD_FUNCS[name]


def kind(name: str) -> str:
    return "factory (called with its kwargs)" if name in _registry().REWARD_FACTORIES else "reward function"


def description(name: str) -> list[str]:
    """The docstring's paragraphs before its examples (`>>>`), each as one whitespace-collapsed string."""
    doc = inspect.getdoc(reward_function(name)) or ""
    doc = doc.split("\n>>>", 1)[0]
    return [" ".join(para.split()) for para in doc.split("\n\n") if para.strip()]


def summary(name: str) -> str:
    """What `name` scores: its docstring's first paragraph."""
    paragraphs = description(name)
    return paragraphs[0] if paragraphs else ""


def default_text(value: Any) -> str:
    return "required" if value is inspect.Parameter.empty else repr(value)


def kwargs_of(name: str) -> dict[str, str]:
    """{kwarg: its default as text} a `{name, kwargs}` entry may set (dataset-column parameters left out)."""
    accepted = _registry().reward_kwargs(name)
    return {k: default_text(v) for k, v in accepted.items() if k not in COLUMN_PARAMETERS}


def columns_of(name: str) -> list[str]:
    return [k for k in _registry().reward_kwargs(name) if k in COLUMN_PARAMETERS]


def needs(name: str) -> str | None:
    """The extra `name` needs beyond grpokit's own dependencies, or None."""
    registry = _registry()
    if name in registry.MATH_REWARD_NAMES:
        from grpokit.rewards import MATH_INSTALL_HINT

        return f"math-verify ({MATH_INSTALL_HINT})"
    if name in registry.SANDBOX_REWARD_NAMES:
        return SANDBOX_NEEDS
    return None


def _details(name: str) -> str:
    """The kwargs / column / needs line of the list."""
    parts = []
    kwargs = kwargs_of(name)
    parts.append("kwargs: " + (", ".join(f"{k}={v}" for k, v in kwargs.items()) if kwargs else "none"))
    if columns_of(name):
        parts.append("reads column: " + ", ".join(columns_of(name)))
    extra = needs(name)
    if extra:
        parts.append(f"needs: {extra}")
    return "; ".join(parts)


def _width() -> int:
    return max(70, min(shutil.get_terminal_size((119, 24)).columns, 119))


def list_text() -> str:
    """Every built-in reward: its name, what it scores, then its kwargs and what it needs, indented under it."""
    registry = _registry()
    names = registry.reward_names()
    width = _width()
    column = max(len(n) for n in names) + 2
    lines = []
    for name in names:
        body = textwrap.wrap(summary(name), width - column) or [""]
        body += textwrap.wrap(_details(name), width - column, break_on_hyphens=False)
        lines.append(f"{name:<{column}}{body[0]}")
        lines += [" " * column + line for line in body[1:]]
    refused = ", ".join(sorted(registry.REFUSED_REWARDS))
    lines += [
        "",
        *textwrap.wrap(f"refused by design: {refused} (grpokit rewards show NAME says why).", width),
        *textwrap.wrap(USE_LINE + "; grpokit rewards show NAME for one.", width),
        *textwrap.wrap(CONFIG_NOTE, width),
    ]
    return "\n".join(lines)


def show_text(name: str) -> str:
    """One reward in full: kind, description, each kwarg with its default, the column it reads, what it needs."""
    width = _width()
    lines = [f"{name}: {kind(name)}", ""]
    for para in description(name):
        lines += textwrap.wrap(para, width, initial_indent="  ", subsequent_indent="  ") + [""]
    kwargs = kwargs_of(name)
    lines.append("kwargs:" if kwargs else "kwargs: none")
    column = max((len(k) for k in kwargs), default=0) + 4
    lines += [f"  {k:<{column - 2}}{v}" for k, v in kwargs.items()]
    if columns_of(name):
        lines.append("reads column: " + ", ".join(columns_of(name)))
    lines.append(f"needs: {needs(name) or 'nothing beyond grpokit'}")
    example = next(iter(kwargs), None)
    entry = f"{{name: {name}, kwargs: {{{example}: ...}}}}" if example else name
    lines += ["", f"use it: reward_funcs: [{entry}]"]
    return "\n".join(lines)


def unknown_line(name: str) -> str:
    """The one error line for a name that is not a built-in: the refusal's reason, or the nearest name."""
    from grpokit.config.suggest import closest

    registry = _registry()
    if name in registry.REFUSED_REWARDS:
        return f"reward {name!r}: {registry.REFUSED_REWARDS[name]}"
    near = closest(name, registry.reward_names())
    hint = f"; did you mean {near!r}?" if near else "; grpokit rewards lists them"
    return f"unknown reward {name!r}{hint}"
