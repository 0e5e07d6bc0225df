"""resolved_config.yaml: every value of a run that is not a default, one per line with its source as a comment.

One writer for both doors: `grpokit train` hands the parser's resolution (sources cli, yaml:<file>:<line>,
recipe:<name>, migrated:<old key>); `GRPOTrainer` in Python builds one from its GRPOConfig (`python_resolution`:
source `python` for each argument given to GRPOConfig(...)). `as_yaml` is also `grpokit config show --format yaml`.
Light on purpose: nothing here imports torch or transformers at import time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from types import SimpleNamespace

from grpokit.config.redaction import env_placeholder, field_placeholder, is_secret_env, shown_value
from grpokit.config.resolver import plain

PYTHON = "python"  # the source of a value given to GRPOConfig(...) in Python
# Computed from the other batch fields unless given (GRPOConfig.__post_init__).
DERIVED_FIELDS = ("steps_per_generation", "generation_batch_size")


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
    env = env_of(resolution)
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
            "# derived when resolved: "
            + ", ".join(f"{k}={json.dumps(resolution.values[k], default=str)}" for k in derived)
        )
    return "\n".join(lines) + "\n"


def env_of(resolution) -> dict:
    """The variables a resolution's YAML `env:` sections set: {name: (value, source)}; none for a Python run."""
    return getattr(resolution, "env", None) or {}


# ---------------------------------------------------------------------------------------------------- Python runs


def python_resolution(args) -> SimpleNamespace:
    """A resolution of a GRPOConfig built in Python: each field's value, with source `python` when it was an
    argument of GRPOConfig(...) other than its default, `recipe:<name>` when a recipe filled it, `derived` for the
    batch fields computed from the others, `default` otherwise (not written: a re-run gets it back by itself)."""
    explicit = getattr(args, "_explicit_fields", frozenset())
    recipe = getattr(args, "recipe", None)
    from_recipe = set()
    if recipe is not None:
        from grpokit.config.recipes import load_recipe

        from_recipe = set(load_recipe(recipe))
    values, sources = {}, {}
    for f in dataclasses.fields(args):
        if not f.init:
            continue
        values[f.name] = plain(getattr(args, f.name, None))
        if f.name in explicit and values[f.name] != plain(_default(f)):  # given as its default: nothing to write
            sources[f.name] = PYTHON
        elif f.name in from_recipe:
            sources[f.name] = f"recipe:{recipe}"
        elif f.name in DERIVED_FIELDS and values[f.name] is not None:
            sources[f.name] = "derived"
        else:
            sources[f.name] = "default"
    return SimpleNamespace(values=values, sources=sources, env={})


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


# ---------------------------------------------------------------------------------------------------- paths

# Path-valued fields: outputs are made absolute always, inputs only when they exist on disk (else a hub id or name).
_OUTPUT_PATHS = ("output_dir", "logging_dir")
_INPUT_PATHS = (
    "model_name_or_path",
    "reward_model_name_or_path",
    "dataset_name",
    "resume_from_checkpoint",
    "deepspeed",
    "fsdp_config",
)


def _absolute(value, *, must_exist: bool = True):
    """A relative path made absolute (from the current directory); anything else (a hub id, a split name, an absolute
    path, a non-string) as it is."""
    if not isinstance(value, str) or not value or os.path.isabs(os.path.expanduser(value)):
        return value
    if must_exist and not os.path.exists(value):
        return value
    return os.path.abspath(value)


def rerunnable_values(values: dict) -> dict:
    """The resolved values with their relative paths made absolute, so the resolved config runs from any directory
    (the run folder included): outputs always, inputs that exist on disk (model, dataset, eval file, mixture entries
    and their data files, checkpoint, DeepSpeed/FSDP files)."""
    values = dict(values)
    for key in _OUTPUT_PATHS:
        if key in values:
            values[key] = _absolute(values[key], must_exist=False)
    for key in _INPUT_PATHS:
        if key in values:
            values[key] = _absolute(values[key])
    from grpokit.data import is_data_file

    if is_data_file(values.get("dataset_test_split")):  # an eval file; otherwise the name of a split
        values["dataset_test_split"] = _absolute(values["dataset_test_split"])
    if isinstance(values.get("datasets"), list):
        values["datasets"] = [_absolute_entry(entry) for entry in values["datasets"]]
    return values


def _absolute_entry(entry):
    """A `datasets:` mixture entry with its local `path` absolute, and its `data_files` when they are relative to the
    current directory (a builder such as `json` as path); data_files inside a dataset folder stay relative to it."""
    if not isinstance(entry, dict):
        return entry
    entry = dict(entry)
    folder = isinstance(entry.get("path"), str) and os.path.isdir(entry["path"])
    entry["path"] = _absolute(entry.get("path"))
    files = entry.get("data_files")
    if files is not None and not folder:
        if isinstance(files, dict):
            entry["data_files"] = {
                k: [_absolute(f) for f in v] if isinstance(v, list) else _absolute(v) for k, v in files.items()
            }
        elif isinstance(files, list):
            entry["data_files"] = [_absolute(f) for f in files]
        else:
            entry["data_files"] = _absolute(files)
    return entry


# ---------------------------------------------------------------------------------------------------- the file


def write_resolved_config(resolution, output_dir: str, *, python: dict | None = None) -> str:
    """Write output_dir/resolved_config.yaml; return its path. `python`: what a Python run passed in code and the
    file cannot hold ({"model": ..., "rewards": [...]}), given for a run started from Python (its header says so)."""
    import platform

    import torch
    import transformers

    import grpokit

    path = os.path.abspath(os.path.join(output_dir, "resolved_config.yaml"))
    versions = (
        f"grpokit {grpokit.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
        f"python {platform.python_version()}"
    )
    if python is None:
        header = [
            f"resolved configuration of this run; re-run with: grpokit train --config {shlex.quote(path)}",
            versions,
            "each value is followed by its source: cli, yaml:<file>:<line>, recipe:<name>, migrated:<old key>",
            "local paths in it are absolute: it runs from any directory, the run folder included",
        ]
        if _user_reward_modules(resolution.values.get("reward_funcs")):
            header.append(f"reward functions are imported from your modules: run it from {shlex.quote(os.getcwd())}")
        if resolution.values.get("tools") or resolution.values.get("environment_factory"):
            header.append(
                f"tools and environments are imported from your modules: run it from {shlex.quote(os.getcwd())}"
            )
    else:
        rewards = ", ".join(python.get("rewards") or []) or "none"
        header = [
            "resolved configuration of this run, started from Python: GRPOTrainer(args=GRPOConfig(...))",
            versions,
            "each value is followed by its source: python (an argument of GRPOConfig(...)), recipe:<name>",
            f"given in code, not in this file: model {python.get('model') or '(an object)'}; rewards {rewards}; "
            "the datasets",
            f"re-run with: grpokit train --config {shlex.quote(path)} --model_name_or_path ... --dataset_name ... "
            "--reward_funcs ...",
        ]
    rerunnable = SimpleNamespace(
        values=rerunnable_values(resolution.values), sources=resolution.sources, env=env_of(resolution)
    )
    os.makedirs(output_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(as_yaml(rerunnable, header=header))
    return path


def _user_reward_modules(specs) -> bool:
    """Whether reward_funcs name a dotted path whose module is a file or folder of the current directory (imported
    from there, as `grpokit train` allows)."""
    for spec in specs or []:
        name = spec.get("name") if isinstance(spec, dict) else spec
        if isinstance(name, str) and "." in name:
            top = name.split(".", 1)[0]
            if os.path.exists(f"{top}.py") or os.path.isdir(top):
                return True
    return False
