"""Registry of built-in rewards and resolution of reward specs (name, dotted path, or {"name", "kwargs"} mapping)."""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from . import code_rewards as _code
from . import openr1_rewards as _openr1
from . import trl_rewards as _trl
from ._common import TRAINER_CALL_KWARGS

RewardFunc = Callable[..., list]

REWARD_FUNCS: dict[str, RewardFunc] = {
    # TRL names
    "accuracy_reward": _trl.accuracy_reward,
    "reasoning_accuracy_reward": _trl.reasoning_accuracy_reward,
    "think_format_reward": _trl.think_format_reward,
    # open-r1 names
    "accuracy": _openr1.accuracy,
    "format": _openr1.format_reward,
    "tag_count": _openr1.tag_count,
    "reasoning_steps": _openr1.reasoning_steps,
    "length": _openr1.length,
}

REWARD_FACTORIES: dict[str, Callable[..., RewardFunc]] = {
    # open-r1 names (keyword-only parameters, open-r1's defaults)
    "cosine": _openr1.cosine,
    "repetition_penalty": _openr1.repetition_penalty,
    "soft_overlong_punishment": _openr1.soft_overlong_punishment,
    # open-r1's code rewards, run in the local sandbox (grpokit.rewards.sandbox)
    "code": _code.code,
    "binary_code": _code.binary_code,
    "code_format": _code.code_format,
    "ioi_code": _code.ioi_code,
    # TRL names
    "get_soft_overlong_punishment": _trl.get_soft_overlong_punishment,
    "get_cosine_scaled_reward": _trl.get_cosine_scaled_reward,
    "get_repetition_penalty_reward": _trl.get_repetition_penalty_reward,
}

# Built-ins that check answers with math-verify (the optional `grpokit[math]` extra).
MATH_REWARD_NAMES = frozenset(
    {"accuracy_reward", "reasoning_accuracy_reward", "accuracy", "length", "cosine", "get_cosine_scaled_reward"}
)

# Built-ins that run the completion's program in the local sandbox (bubblewrap; see grpokit.rewards.sandbox).
SANDBOX_REWARD_NAMES = frozenset({"code", "binary_code", "ioi_code"})

# open-r1 rewards grpokit refuses by design: name -> why (one line, in place of "unknown reward name").
REFUSED_REWARDS: dict[str, str] = {
    "cf_code": "open-r1's Codeforces reward is not available by design: Codeforces problems are judged by their "
    "checker programs, which run only on open-r1's remote Piston/Morph graders (grpokit runs code locally and "
    "offline); binary_code (pass/fail) or code (pass fraction) score stdin/stdout tests in the local sandbox",
}

_SPEC_KEYS = ("name", "kwargs")


def reward_names() -> list[str]:
    """All built-in reward names (plain functions and factories), sorted."""
    return sorted({*REWARD_FUNCS, *REWARD_FACTORIES})


def reward_kwargs(name: str) -> dict[str, Any]:
    """{kwarg: default} that the built-in `name` accepts in a `{"name": ..., "kwargs": {...}}` spec, in signature order;
    `inspect.Parameter.empty` marks a required one. The same rule as resolution's (`_parameters`)."""
    factory = name in REWARD_FACTORIES
    fn = REWARD_FACTORIES[name] if factory else REWARD_FUNCS[name]
    accepted, _ = _parameters(fn, factory=factory, strict=True)
    params = inspect.signature(fn).parameters
    return {p: params[p].default for p in (accepted or [])}


def _did_you_mean(word: str, candidates: Any) -> str:
    candidates = list(candidates)
    by_lower = {c.lower(): c for c in candidates}
    match = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[match[0]]!r}?" if match else ""


def _label(spec: Any) -> str:
    if isinstance(spec, str):
        return repr(spec)
    if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
        return repr(spec["name"])
    text = repr(spec)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------------------- dotted paths


def _split_path(path: str, *, colon: bool) -> tuple[list[str], list[str]] | None:
    """(module parts, attribute parts) of `package.module:attr[.attr...]` (module given, with `colon`), or (all the
    parts, []) of `package.module.attr[.attr...]` (where the module ends is found by looking); None when malformed."""
    if colon and ":" in path:
        module, _, attrs = path.partition(":")
        module_parts, attr_parts = module.split("."), attrs.split(".")
        if all(part.isidentifier() for part in module_parts + attr_parts):
            return module_parts, attr_parts
        return None
    parts = path.split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        return None
    return parts, []


def _path_spelling(colon: bool) -> str:
    return "'package.module.function' or 'package.module:function'" if colon else "'package.module.function'"


def import_dotted(path: str, *, what: str = "reward", colon: bool = False) -> Any:
    """Import the callable at `package.module.attr[.attr...]` (or, with `colon`, `package.module:attr[.attr...]`);
    ValueError naming the part that failed, its message starting with `what` and the path."""
    label = f"{what} {path!r}" if what else repr(path)
    split = _split_path(path, colon=colon) if isinstance(path, str) else None
    if split is None:
        raise ValueError(f"{label}: not a valid dotted path {_path_spelling(colon)}")
    parts, attrs = split
    module, n_module = None, 0
    # With the module given (`module:attr`) only it is tried; otherwise the longest importable module prefix first.
    candidates = [len(parts)] if attrs else range(len(parts) - 1, 0, -1)
    parts = parts + attrs
    for n in candidates:
        name = ".".join(parts[:n])
        try:
            module, n_module = importlib.import_module(name), n
            break
        except ModuleNotFoundError as e:
            if not attrs and e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue  # this prefix is not a module; the rest may be attributes of a shorter one
            if attrs and e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                raise ValueError(f"{label}: cannot import module {name!r} (no module named {e.name!r})") from e
            raise ValueError(f"{label}: importing module {name!r} failed: {type(e).__name__}: {e}") from e
        except Exception as e:
            raise ValueError(f"{label}: importing module {name!r} failed: {type(e).__name__}: {e}") from e
    if module is None:
        raise ValueError(f"{label}: cannot import module {parts[0]!r} (no module named {parts[0]!r})")
    obj = module
    for i in range(n_module, len(parts)):
        owner = ".".join(parts[:i])
        if not hasattr(obj, parts[i]):
            public = [a for a in dir(obj) if not a.startswith("_")]
            kind = "module" if inspect.ismodule(obj) else "object"
            raise ValueError(
                f"{label}: {kind} {owner!r} has no attribute {parts[i]!r}{_did_you_mean(parts[i], public)}"
            )
        obj = getattr(obj, parts[i])
    if not callable(obj):
        raise ValueError(f"{label}: {type(obj).__name__} object is not callable")
    return obj


def _import_dotted(path: str) -> Any:
    """Import `package.module.attr[.attr...]`; ValueError naming the part that failed."""
    return import_dotted(path, what="reward")


def _is_reward_function(obj: Any) -> bool:
    """Whether a user callable is a reward function (vs. a factory): it takes `**kwargs` or a trainer call argument."""
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is p.VAR_KEYWORD or p.name in {"prompts", "completions", "completion_ids"} for p in params)


# ---------------------------------------------------------------------------------------------------- parameters


def _parameters(fn: Callable, *, factory: bool, strict: bool) -> tuple[list[str] | None, list[str]]:
    """(keyword names `fn` accepts, or None for any; required names) for binding spec kwargs.

    Factories accept all their keyword-passable parameters; reward functions only those with a default that the
    trainer does not pass itself. `strict=False` lets a `**kwargs` reward function take any other name.
    """
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None, []
    keywordable = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    if factory:
        return (None if has_var_kw else [p.name for p in keywordable]), [
            p.name for p in keywordable if p.default is p.empty
        ]
    if has_var_kw and not strict:
        return None, []
    return [p.name for p in keywordable if p.default is not p.empty and p.name not in TRAINER_CALL_KWARGS], []


def _check_kwargs(label: str, kwargs: Mapping, accepted: list[str] | None) -> None:
    for key in kwargs:
        if not isinstance(key, str):
            raise ValueError(f"reward {label}: kwargs keys must be strings, got {key!r}")
        if key in TRAINER_CALL_KWARGS:
            raise ValueError(f"reward {label}: cannot set {key!r}, the trainer passes it on every call")
        if accepted is not None and key not in accepted:
            allowed = ", ".join(accepted) if accepted else "none"
            raise ValueError(
                f"reward {label}: unknown kwarg {key!r}{_did_you_mean(key, accepted)} (accepted: {allowed})"
            )


def _named(fn: Any, name: str, label: str) -> RewardFunc:
    """Make sure the reward has a `__name__` (metric names are `rewards/<name>/mean`)."""
    if not callable(fn):
        raise ValueError(f"reward {label}: the factory returned {type(fn).__name__}, not a callable")
    if isinstance(getattr(fn, "__name__", None), str):
        return fn
    try:
        fn.__name__ = name
    except (AttributeError, TypeError) as e:
        raise ValueError(f"reward {label}: the reward callable has no __name__ and none can be set") from e
    return fn


def _bind(fn: Callable, kwargs: Mapping) -> RewardFunc:
    if not kwargs:
        return fn
    bound = functools.partial(fn, **kwargs)
    functools.update_wrapper(bound, fn)  # keeps __name__ / __doc__; partials of module functions stay picklable
    return bound


def _call_factory(factory: Callable, label: str, name: str, kwargs: Mapping, defaults: Mapping) -> RewardFunc:
    accepted, required = _parameters(factory, factory=True, strict=True)
    _check_kwargs(label, kwargs, accepted)
    offered = {k: v for k, v in defaults.items() if accepted is not None and k in accepted and k not in kwargs}
    arguments = {**offered, **kwargs}
    missing = [p for p in required if p not in arguments]
    if missing:
        raise ValueError(
            f"reward {label}: missing required kwarg(s) {', '.join(missing)}; "
            f"give them as {{'name': {name!r}, 'kwargs': {{...}}}}"
        )
    try:
        reward = factory(**arguments)
    except TypeError as e:
        raise ValueError(f"reward {label}: bad kwargs: {e}") from e
    return _named(reward, name.rsplit(".", 1)[-1], label)


# ---------------------------------------------------------------------------------------------------- resolution


def resolve_reward(spec: Any, *, defaults: Mapping[str, Any] | None = None) -> RewardFunc:
    """Turn a reward spec into a reward function `fn(prompts=..., completions=..., **kwargs) -> list[float | None]`.

    `spec` is one of:
      - a built-in name (`reward_names()`); a factory is called with its defaults (plus `defaults`);
      - a dotted path `package.module.function` to a reward function, imported;
      - a mapping `{"name": <built-in name or dotted path>, "kwargs": {...}}`: a factory (built-in, or a dotted
        callable that takes neither `**kwargs` nor `prompts`/`completions`/`completion_ids`) is called with the
        kwargs; a reward function gets them bound with `functools.partial`;
      - a callable, returned as is.

    `defaults` are config-derived values offered to factories having a parameter of that name, unless the spec's
    kwargs set it (e.g. `{"max_completion_len": 512}` for the soft overlong punishment).
    The result always has a `__name__`. Bad specs raise `ValueError` with a one-line message.

    >>> resolve_reward("format").__name__
    'format'
    >>> resolve_reward({"name": "soft_overlong_punishment", "kwargs": {"soft_punish_cache": 2}},
    ...                defaults={"max_completion_len": 4})(completion_ids=[[0] * 2, [0] * 3])
    [0.0, -0.5]
    """
    if defaults is None:
        defaults = {}
    elif not isinstance(defaults, Mapping):
        raise ValueError(f"resolve_reward: `defaults` must be a mapping, got {type(defaults).__name__}")
    label = _label(spec)

    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in _SPEC_KEYS]
        if unknown:
            raise ValueError(
                f"reward {label}: unknown key {unknown[0]!r}{_did_you_mean(str(unknown[0]), _SPEC_KEYS)} "
                "(a reward mapping has 'name' and 'kwargs')"
            )
        name = spec.get("name")
        kwargs = spec.get("kwargs")
        if not isinstance(name, str) or not name:
            raise ValueError(f"reward {label}: a reward mapping needs a 'name' string, got {name!r}")
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, Mapping):
            raise ValueError(f"reward {label}: 'kwargs' must be a mapping, got {type(kwargs).__name__}")
        return _resolve_name(name, label, dict(kwargs), defaults, from_mapping=True)

    if isinstance(spec, str):
        return _resolve_name(spec, label, {}, defaults, from_mapping=False)

    if callable(spec):
        if isinstance(spec, functools.partial) and not hasattr(spec, "__name__"):
            inner = spec.func
            while isinstance(inner, functools.partial):
                inner = inner.func
            named = functools.partial(spec.func, *spec.args, **spec.keywords)
            named.__name__ = getattr(inner, "__name__", type(inner).__name__)
            return named
        return _named(spec, type(spec).__name__, label)

    raise ValueError(
        f"reward {label}: a reward spec is a name, a dotted path, a {{'name': ..., 'kwargs': ...}} mapping or a "
        f"callable, got {type(spec).__name__}"
    )


def _resolve_name(name: str, label: str, kwargs: dict, defaults: Mapping, *, from_mapping: bool) -> RewardFunc:
    if name in REWARD_FUNCS:
        fn = REWARD_FUNCS[name]
        accepted, _ = _parameters(fn, factory=False, strict=True)
        _check_kwargs(label, kwargs, accepted)
        return _bind(fn, kwargs)
    if name in REWARD_FACTORIES:
        return _call_factory(REWARD_FACTORIES[name], label, name, kwargs, defaults)
    if name in REFUSED_REWARDS:
        raise ValueError(f"reward {label}: {REFUSED_REWARDS[name]}")
    if "." not in name:
        hint = _did_you_mean(name, reward_names())
        if not hint:
            hint = f"; built-ins: {', '.join(reward_names())}; or give a dotted path 'package.module.function'"
        raise ValueError(f"reward {label}: unknown reward name{hint}")
    obj = _import_dotted(name)
    if from_mapping and not _is_reward_function(obj):
        return _call_factory(obj, label, name, kwargs, defaults)
    accepted, _ = _parameters(obj, factory=False, strict=False)
    _check_kwargs(label, kwargs, accepted)
    return _named(_bind(obj, kwargs), name.rsplit(".", 1)[-1], label)


def working_directory_first() -> None:
    """Put the working directory first on `sys.path`, where dotted reward paths are looked up: the same under
    `python -m grpokit` (which does it already) and the `grpokit` console script (which would not)."""
    cwd = os.getcwd()
    if sys.path[:1] != [cwd]:
        sys.path[:] = [cwd] + [p for p in sys.path if p not in (cwd, "")]


def _find_module_without_import(name: str) -> bool:
    """Whether the top-level module `name` can be found (working directory first, then `sys.path`), without running
    any of its code: module finders only look for files."""
    return _module_spec(name) is not None  # a top-level name: no parent package gets imported


def _module_spec(name: str, parent: Any = None) -> Any:
    """The spec of module `name` found without running any code: a top-level name in the working directory first,
    then by the import system's finders (a top-level name imports no package); a submodule in its parent package's
    folders (`parent`, the parent's spec), so that the parent package is not imported either. None when not found."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__spec__", None) or importlib.machinery.ModuleSpec(name, None)
    try:
        if parent is None:
            spec = _find_in(name, [os.getcwd()])
            return spec if spec is not None else importlib.util.find_spec(name)
        loaded = sys.modules.get(parent.name)
        locations = getattr(loaded, "__path__", None) if loaded is not None else parent.submodule_search_locations
        return None if locations is None else _find_in(name, list(locations))
    except (ImportError, ValueError):
        return None
    except Exception:  # noqa: BLE001 - a finder that fails: the module cannot be judged here, training will say
        return importlib.machinery.ModuleSpec(name, None)


def _find_in(name: str, locations: list) -> Any:
    """The spec of module `name` in the folders `locations`, by their path finders (what `PathFinder` does, without
    the bookkeeping of namespace packages, which needs the parent package imported); None when not there."""
    portions = []
    for entry in locations:
        finder = sys.path_importer_cache.get(entry)
        for hook in sys.path_hooks if finder is None else ():
            try:
                finder = hook(entry)
                break
            except ImportError:
                continue
        spec = finder.find_spec(name) if finder is not None and hasattr(finder, "find_spec") else None
        if spec is None:
            continue
        if spec.loader is not None:
            return spec
        portions += list(spec.submodule_search_locations or [])  # a portion of a namespace package
    if not portions:
        return None
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def _bound_names(body: list, names: set[str]) -> bool:
    """Add the names that the statements `body` bind at module level (definitions, imports, assignments, also inside
    if/try/with/for blocks) to `names`; False when they cannot be known by reading (`from x import *`, a module
    `__getattr__`, `match`)."""
    import ast

    def targets(node):
        names.update(sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name))

    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return False
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return False
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                targets(target)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets(node.target)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try)) or (
            type(node).__name__ == "TryStar"
        ):
            if isinstance(node, (ast.For, ast.AsyncFor)):
                targets(node.target)
            for item in getattr(node, "items", []):
                if item.optional_vars is not None:
                    targets(item.optional_vars)
            blocks = [getattr(node, key, []) for key in ("body", "orelse", "finalbody")]
            for handler in getattr(node, "handlers", []):
                if handler.name:
                    names.add(handler.name)
                blocks.append(handler.body)
            if not all(_bound_names(block, names) for block in blocks):
                return False
        elif isinstance(node, ast.Match):
            return False
    return True


def _top_level_names(spec: Any) -> set[str] | str | None:
    """The names a plain .py module binds at its top level, read with `ast` (nothing runs); a message when the file
    does not parse; None when that cannot be told (no source file, names made at run time)."""
    import ast
    import tokenize

    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str) or not origin.endswith(".py") or not os.path.isfile(origin):
        return None
    try:
        with tokenize.open(origin) as fh:
            tree = ast.parse(fh.read(), filename=origin)
    except SyntaxError as e:
        return f"module {spec.name!r} does not parse ({origin}:{e.lineno}: {e.msg})"
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    names: set[str] = set()
    if not _bound_names(tree.body, names):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        # `globals()[...] = ...`, `setattr(module, ...)`, `exec(...)`: names made at run time
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _RUNTIME_BINDERS:
            return None
    return names


_RUNTIME_BINDERS = frozenset({"globals", "vars", "setattr", "exec", "eval", "__import__"})


def check_dotted_path(path: Any, *, what: str = "", colon: bool = True) -> str | None:
    """None if the callable at `path` (`package.module.function`, or with `colon` `package.module:function`) can be
    found without running any code, else a one-line message starting with `what` and the path.

    Checked: the spelling; the modules, found by their files (the top-level one in the working directory first, then
    on `sys.path`; no package is imported to find its submodules); and, for a plain .py module, that it binds the name
    at its top level (read with `ast`), with "did you mean". What only running the code tells (an import that fails,
    a name made at run time, a callable) is left to `import_dotted`, when training starts.
    """
    label = f"{what} {path!r}" if what else repr(path)
    if not isinstance(path, str):
        return f"{label}: a dotted path is a string {_path_spelling(colon)}, not {type(path).__name__}"
    split = _split_path(path, colon=colon)
    if split is None:
        return f"{label}: not a valid dotted path {_path_spelling(colon)}"
    parts, attrs = split
    spec = _module_spec(parts[0])
    if spec is None:
        hint = _did_you_mean(parts[0], _working_directory_modules())
        return f"{label}: no module named {parts[0]!r} in the working directory or on sys.path{hint}"
    n = 1
    # The module's end: given (`module:attr`), every part must be found; else the longest prefix of modules found,
    # as `import_dotted` imports it, leaving at least one attribute.
    while n < (len(parts) if attrs else len(parts) - 1):
        child = _module_spec(".".join(parts[: n + 1]), spec)
        if child is None:
            break
        spec, n = child, n + 1
    if attrs and n < len(parts):
        return f"{label}: no module named {'.'.join(parts[: n + 1])!r}{_submodule_hint(parts[n], spec)}"
    name, module = (parts + attrs)[n], ".".join(parts[:n])
    if getattr(spec, "origin", None) is None and getattr(spec, "submodule_search_locations", None):
        # a namespace package (a folder without __init__.py) binds nothing but its modules, and that one is not there
        return f"{label}: no module named {module + '.' + name!r}{_submodule_hint(name, spec)}"
    defined = _top_level_names(spec)
    if isinstance(defined, str):
        return f"{label}: {defined}"
    if defined is None or name in defined:
        return None
    public = sorted({d for d in defined if not d.startswith("_")} | set(_submodules(spec)))
    hint = _did_you_mean(name, public)
    return f"{label}: module {module!r} ({spec.origin}) defines no {name!r} at its top level{hint}"


def _submodules(parent: Any) -> list[str]:
    """The names of the modules in the folders of the package `parent`, by their files (nothing is imported)."""
    found = []
    for folder in list(getattr(parent, "submodule_search_locations", None) or []):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            stem = entry.split(".", 1)[0]
            if stem.isidentifier() and (
                entry.endswith(tuple(importlib.machinery.all_suffixes())) or os.path.isdir(os.path.join(folder, entry))
            ):
                found.append(stem)
    return sorted(set(found) - {"__init__", "__pycache__"})


def _working_directory_modules() -> list[str]:
    """The modules in the working directory (where a user's own reward and tool files are), by their files."""
    return _submodules(SimpleNamespace(submodule_search_locations=[os.getcwd()]))


def _submodule_hint(name: str, parent: Any) -> str:
    """ "; did you mean 'NEAR'?" among the modules of the package `parent`, or ""."""
    return _did_you_mean(name, _submodules(parent))


def _check_without_import(spec: Any, defaults: Mapping[str, Any]) -> str | None:
    """`check_reward_spec` without running user code: built-in names resolve in full (their code is grpokit's); a
    dotted path is checked for its syntax and for its top-level module being findable, never imported or called."""
    name = spec.get("name") if isinstance(spec, Mapping) else spec
    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in _SPEC_KEYS]
        kwargs = spec.get("kwargs")
        if unknown or not isinstance(name, str) or not name or not isinstance(kwargs, (Mapping, type(None))):
            return check_reward_spec(spec, defaults=defaults, import_code=True)  # shape errors only: nothing to import
    if not isinstance(name, str) or "." not in name:
        return check_reward_spec(spec, defaults=defaults, import_code=True)  # built-in name, or not a name at all
    parts = name.split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        return f"reward {_label(spec)}: not a valid dotted path 'package.module.function'"
    if not _find_module_without_import(parts[0]):
        hint = _did_you_mean(parts[-1], reward_names())
        return f"reward {_label(spec)}: no module named {parts[0]!r} in the working directory or on sys.path{hint}"
    return None


def check_reward_spec(spec: Any, *, defaults: Mapping[str, Any] | None = None, import_code: bool = True) -> str | None:
    """None if `spec` resolves (see `resolve_reward`), else a one-line message naming the spec and what is wrong.

    `import_code=False` runs no user code (what `grpokit config ...` does): a dotted path is only checked for its
    syntax and that its top-level module exists; importing it and calling factories is left to training.

    >>> check_reward_spec("acuracy")
    "reward 'acuracy': unknown reward name; did you mean 'accuracy'?"
    >>> check_reward_spec({"name": "cosine", "kwargs": {"max_lenght": 100}}) is not None
    True
    """
    if not import_code:
        return _check_without_import(spec, defaults or {})
    try:
        resolve_reward(spec, defaults=defaults)
    except Exception as e:
        message = str(e) if isinstance(e, ValueError) else f"reward {_label(spec)}: {type(e).__name__}: {e}"
        return " ".join(message.split())
    return None
