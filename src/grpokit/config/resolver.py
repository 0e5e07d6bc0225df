"""The strict, layered resolution of every configuration dataclass at once, without transformers or torch: the engine
under `TrlParser` (`parser.py`, TRL's API on transformers' HfArgumentParser) and under `grpokit config ...`, which
resolves the same way over a light GRPOConfig built from the field table (`light.py`).

Layers, lowest to highest: dataclass defaults -> recipe -> YAML files (`--config`, later files win) -> command-line
flags. Every value, whatever its layer, is coerced by its field's type (`types.coerce`), every rule is checked
(`rules`), and every problem is reported at once before any dataclass is built. Each resolved value remembers where
it came from (`Resolution.sources`).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import sys
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any

from grpokit.launch import under_launcher

from .accelerate_default import default_config_processes
from .agents import agent_path_problems
from .migrations import RENAMED_KEYS, changed_default_notes, legacy_scale_rewards, removed_key_is_error
from .recipes import load_recipe
from .redaction import is_secret_env, is_secret_field, register
from .rules import (
    ConfigError,
    Problem,
    check_fields,
    check_geometry,
    num_processes_from_env,
    process_count_note,
    quantization_warnings,
)
from .script_args import DatasetConfig, GRPOScriptArguments
from .suggest import closest
from .types import MAPPING_ITEM_FIELDS, CoercionError, coerce, field_types
from .yaml_io import load_yaml_file

# Fields whose final value is computed while the dataclasses are built; shown with source "derived" when it differs.
DERIVED_FIELDS = (
    "steps_per_generation",
    "generation_batch_size",
    "pad_to_multiple_of",
    "output_dir",
    "do_eval",
    "eval_steps",
    "lora_target_modules",
)

RESERVED_KEYS = ("config", "recipe", "env")


class LaunchOptions(typing.Protocol):
    """What a command that launches processes hands `TrlParser.resolve`: the names of its launch options (flags and
    YAML keys beside the fields, e.g. `grpokit train`'s `accelerate_config`, `num_processes`, `main_process_port`) and
    how to check them. The parser takes them out of the command line and the YAML files and checks the batch geometry
    for the processes the request starts."""

    names: tuple[str, ...]

    def request(self, given: dict[str, tuple[Any, str]]) -> tuple[Any, list[Problem]]:
        """{name: (value, source)} -> (request or None, problems). A request has `processes` (how many it starts),
        `processes_given` (whether a count was asked for, not defaulted) and `processes_how()` (where it comes from)."""


def take_flags(tokens, names) -> tuple[dict[str, tuple[Any, str]], list[str], list[Problem]]:
    """Take the flags `names` (`--name value`, `--name=value`, hyphens allowed) out of command-line tokens:
    ({name: (value, "cli")}, the other tokens, problems)."""
    found, rest, problems = {}, [], []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, inline = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        name = name.replace("-", "_")
        if name not in names:
            rest.append(token)
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value, i = tokens[i + 1], i + 2
        else:
            problems.append(Problem(f"--{name}", "expects a value", source="cli"))
            i += 1
            continue
        found[name] = (value, "cli")
    return found, rest, problems


def pop_keys(yaml_layers, names) -> dict[str, tuple[Any, str]]:
    """Take the keys `names` out of YAML layers ((path, data, key lines), later files win): {name: (value, source)}."""
    found = {}
    for path, data, lines in yaml_layers:
        for name in names:
            if name in data:
                found[name] = (data.pop(name), f"yaml:{path}:{lines.get(name, '?')}")
    return found


@dataclass
class Resolution:
    """The outcome of parsing: instances, the flat resolved values with their sources, and what to tell the user."""

    instances: list
    values: dict[str, Any]
    sources: dict[str, str]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    remaining: list[str] = field(default_factory=list)
    # The launch request (`resolve(..., launch_options=...)`): what `LaunchOptions.request` returned, or None.
    launch: Any = None
    # The processes the batch geometry was checked and derived for, and where that number comes from.
    processes: int = 1
    processes_how: str = "WORLD_SIZE of the launch (accelerate launch sets it); 1 otherwise"
    # The variables the YAML files' `env:` sections set: {name: (value as set, source)}, the later file winning.
    env: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Fields left unset whose TRL default changed meaning over the versions (`grpokit config show` lists them).
    default_notes: list[str] = field(default_factory=list)


class FullPathNeeded(Exception):  # noqa: N818 - a signal, not an error of the configuration
    """Raised by the light GRPOConfig (`light.py`) when it cannot judge a configuration without transformers and
    torch; the caller resolves it again with `TrlParser`. The message says why."""


def is_grpo_config(dtype) -> bool:
    """Whether `dtype` is grpokit's GRPOConfig, a subclass of it, or the light GRPOConfig of the field table."""
    return isinstance(dtype, type) and any(
        c.__name__ == "GRPOConfig" and c.__module__.startswith("grpokit.") for c in dtype.__mro__
    )


class Resolver:
    """Resolve `dataclass_types` from YAML files, a recipe and command-line flags (see the module's docstring).
    `TrlParser` is one, on transformers' HfArgumentParser; `grpokit config ...` use one over the light GRPOConfig."""

    # Whether resolving imports the modules of dotted reward paths and calls reward factories. Off: a configuration
    # runs no user code while it is checked (`grpokit config ...`); training imports them when it starts.
    import_rewards: bool = False

    def __init__(self, dataclass_types):
        self.dataclass_types = list(dataclass_types)
        self.resolution: Resolution | None = None

    # ---- Resolution ----

    def resolve(
        self,
        args=None,
        *,
        allow_remaining=False,
        launch_options: LaunchOptions | None = None,
        planning=False,
        geometry_notes=False,
    ) -> Resolution:
        """Resolve every layer into instances; raise ConfigError with every problem found.

        Stages: read the YAML files, apply their `env:` sections, stack the layers (recipe, YAML, command line),
        migrate renamed keys, coerce every value by its field's type, check the rules, build the dataclasses.

        With `launch_options` (the grpokit command line hands its own), the options it names (flags or YAML keys) are
        taken out and checked by it (`Resolution.launch`), and the batch geometry is checked and derived for the
        processes they ask for (unless this process runs under a launcher: then WORLD_SIZE says how many there are).

        With `planning=True` (`grpokit config validate|show|plan`: nothing runs), the batch geometry is checked at the
        count training will use: num_processes (flag or YAML key), the accelerate config's, WORLD_SIZE, else the
        num_processes of the user's accelerate default config file (what `accelerate launch` starts), else 1; a rule
        broken there is an error, as in training. Only with `geometry_notes=True` (`--geometry-notes`), and only when
        no count is given by any of those, is a problem that the process count alone causes a note naming the counts
        at which the geometry holds. Planning also leaves this process's environment as it
        found it: the YAML's `env:` sections apply while the configuration is checked (transformers and the rules
        read the environment) and are undone afterwards, so checking a config never sets `PATH` or `LD_PRELOAD` here.
        """
        args = list(sys.argv[1:] if args is None else args)
        if any(a in ("-h", "--help") for a in args) and hasattr(self, "print_help"):
            self.print_help()
            sys.exit(0)
        if not planning:
            return self._resolve(args, allow_remaining, launch_options, planning)
        saved = dict(os.environ)
        try:
            return self._resolve(args, allow_remaining, launch_options, planning, geometry_notes)
        finally:
            _restore_environment(saved)

    def _resolve(self, args, allow_remaining, launch_options, planning, geometry_notes=False) -> Resolution:
        configs, recipe_flag, field_tokens = _split_meta_args(args)
        owners = self._owners()
        report = _Report()
        launch_given, launch_names = {}, tuple(launch_options.names) if launch_options else ()
        if launch_options:
            launch_given, field_tokens, flag_problems = take_flags(field_tokens, launch_names)
            report.problems += flag_problems
        yaml_layers = _read_yaml_files(configs, report)
        _apply_env_sections(yaml_layers, report)
        launch, processes, processes_how = None, num_processes_from_env(), Resolution.processes_how
        processes_given = "WORLD_SIZE" in os.environ
        if launch_options:
            launch, launch_problems = launch_options.request({**pop_keys(yaml_layers, launch_names), **launch_given})
            report.problems += launch_problems
            if launch is not None and not under_launcher():  # a launched process counts its own (WORLD_SIZE)
                processes, processes_how = launch.processes, launch.processes_how()
                processes_given = launch.processes_given
        if planning and not processes_given and (launch is None or launch.config is None):
            # what `accelerate launch` without --config_file starts: the user's default config file
            found = default_config_processes()
            if found is not None:
                processes, processes_how, processes_given = (
                    found[0],
                    f"num_processes of the accelerate default config {found[1]}",
                    True,
                )
        layers = _recipe_layers(yaml_layers, recipe_flag, owners, report)
        layers[1:1] = [
            (lambda key, p=path, ln=lines: f"yaml:{p}:{ln.get(key, '?')}", data) for path, data, lines in yaml_layers
        ]  # after the recipe, before the command line
        cli_values, cli_problems, cli_remaining, cli_warnings = self._cli_mapping(
            field_tokens, owners, allow_remaining, launch_names
        )
        report.problems += cli_problems
        report.warnings += cli_warnings
        report.remaining += cli_remaining
        layers.insert(1 + len(yaml_layers), (lambda key: "cli", cli_values))
        raw = _merge_layers(layers, owners, allow_remaining, report, launch_names)

        values, sources = self._field_defaults()
        _coerce_into(raw, owners, values, sources, report)
        register(*(value for key, value in values.items() if is_secret_field(key)))  # redacted from logs from now on
        problems = self._rules(values, processes)
        report.warnings += quantization_warnings(values)
        noted = [p for p in problems if p.processes] if planning and geometry_notes and not processes_given else []
        report.problems += [p for p in problems if p not in noted]
        report.raise_if_any(sources)
        # derived for the processes checked, not for this one
        instances = self._instantiate(values, sources, report, processes, noted=bool(noted))
        report.raise_if_any(sources)

        shown = _with_derived(instances, values, sources)
        resolution = Resolution(
            instances,
            {k: plain(v) for k, v in shown.items()},
            sources,
            report.warnings,
            [process_count_note(_with_source(p, sources), processes) for p in noted]
            + machine_notes(shown, self._grpo_defaults()),
            report.remaining,
            launch,
            processes,
            processes_how,
            report.env,
            changed_default_notes(shown, sources),
        )
        self.resolution = resolution
        return resolution

    def _instantiate(self, values, sources, report, processes: int, *, noted: bool) -> list:
        """Build each dataclass from the resolved values. Every field is passed explicitly, so GRPOConfig's own
        recipe filling (for Python callers) finds nothing left to fill: the recipe layer is already in `values`. A
        GRPOConfig derives its batch geometry for `processes` (`GRPOConfig.for_processes`)."""
        instances = []
        for dtype in self.dataclass_types:
            kwargs = {f.name: values[f.name] for f in dataclasses.fields(dtype) if f.init and f.name in values}
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", FutureWarning)
                    if is_grpo_config(dtype):
                        instances.append(dtype.for_processes(processes, noted=noted, **kwargs))
                    else:
                        instances.append(dtype(**kwargs))
                # transformers' deprecation warnings (e.g. gradient_checkpointing_kwargs) become one warning line each,
                # with the source of the field they name, instead of a raw Python warning with a file and line
                for warning in caught:
                    if issubclass(warning.category, (FutureWarning, DeprecationWarning)):
                        text = " ".join(str(warning.message).split())
                        named = [n for n in kwargs if sources.get(n, "default") != "default" and f"`{n}`" in text]
                        where = f"{named[0]} ({sources[named[0]]})" if named else dtype.__name__
                        report.warnings.append(f"{where}: {text}")
                    else:
                        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
            except ConfigError as exc:
                report.problems += exc.problems
            except FullPathNeeded:
                raise
            except Exception as exc:  # transformers' own checks: ValueError, or e.g. OSError for a JSON path
                message = " ".join(str(exc).split())
                if not isinstance(exc, (ValueError, TypeError)):
                    message = f"{type(exc).__name__}: {message}"
                report.problems.append(_blame(dtype, message, values, sources))
        return instances

    # ---- helpers ----

    def _grpo_defaults(self) -> dict[str, Any]:
        """The defaults of the GRPOConfig among the types ({} without one: then no vLLM field is resolved either)."""
        dtype = next((t for t in self.dataclass_types if is_grpo_config(t)), None)
        return {f.name: f.default for f in dataclasses.fields(dtype)} if dtype is not None else {}

    def _owners(self) -> dict[str, tuple[type, dataclasses.Field]]:
        owners = {}
        for dtype in self.dataclass_types:
            for f in dataclasses.fields(dtype):
                if f.init:
                    owners.setdefault(f.name, (dtype, f))
        return owners

    def _field_defaults(self) -> tuple[dict[str, Any], dict[str, str]]:
        values, sources = {}, {}
        for dtype in self.dataclass_types:
            for f in dataclasses.fields(dtype):
                if not f.init or f.name in values:
                    continue
                if f.default is not dataclasses.MISSING:
                    values[f.name] = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    values[f.name] = f.default_factory()
                else:
                    continue
                sources[f.name] = "default"
        return values, sources

    def _cli_mapping(self, tokens, owners, allow_remaining, extra_names=()):
        """Command-line tokens -> {field: value or list of strings}, problems, remaining strings, warnings (a
        scalar flag given more than once). `extra_names` are other flags this command line knows (offered by "did you
        mean")."""
        values, problems, remaining, warnings_ = {}, [], [], []
        i = 0
        while i < len(tokens):
            token = tokens[i]
            j = i + 1
            while j < len(tokens) and not tokens[j].startswith("--"):
                j += 1
            if not token.startswith("--"):
                (
                    remaining.extend(tokens[i:j])
                    if allow_remaining
                    else problems.append(
                        Problem("arguments", f"unexpected value {token!r} (values follow a --flag)", source="cli")
                    )
                )
                i = j
                continue
            name, _, inline = token[2:].partition("=")
            given = ([inline] if _ else []) + tokens[i + 1 : j]
            name = name.replace("-", "_")
            negated = False
            if (
                name not in owners
                and name not in RENAMED_KEYS
                and name.startswith("no_")
                and name[3:] in owners
                and _is_bool(field_types(owners[name[3:]][0])[name[3:]])
            ):
                name, negated = name[3:], True
            if name not in owners and name not in RENAMED_KEYS:
                if allow_remaining:
                    remaining.extend(tokens[i:j])
                else:
                    near = closest(name, list(owners) + ["config", "recipe", *extra_names])
                    problems.append(
                        Problem(
                            f"--{name}",
                            "unknown argument",
                            hint=f"did you mean --{near}?" if near else None,
                            source="cli",
                        )
                    )
                i = j
                continue
            target = name if name in owners else RENAMED_KEYS.get(name, (None,))[0]  # a renamed flag: the new type
            tp = field_types(owners[target][0])[target] if target in owners else None
            if negated:
                if given:
                    problems.append(Problem(f"--no_{name}", "takes no value", " ".join(given), source="cli"))
                values[name] = False
            elif _is_list(tp):
                if not given:
                    problems.append(Problem(f"--{name}", "expects at least one value", source="cli"))
                # A repeated list flag extends the list: `--reward_funcs a --reward_funcs b` is `--reward_funcs a b`.
                values[name] = values[name] + given if isinstance(values.get(name), list) else given
            elif not given:
                if tp is not None and _is_bool(tp):
                    values[name] = True
                else:
                    problems.append(Problem(f"--{name}", "expects a value", source="cli"))
            elif len(given) > 1:
                problems.append(
                    Problem(f"--{name}", f"expects one value, got {len(given)}", " ".join(given), source="cli")
                )
            else:
                if name in values and values[name] != given[0]:  # argparse's rule: the last one wins, said aloud
                    warnings_.append(f"--{name} is given more than once; the last value ({given[0]}) is used")
                values[name] = given[0]
            i = j
        return values, problems, remaining, warnings_

    def _rules(self, values, processes) -> list[Problem]:
        defaults, _ = self._field_defaults()
        problems = check_fields(values, defaults)
        if any(is_grpo_config(t) for t in self.dataclass_types):
            _, geometry = check_geometry(values, processes)
            problems += geometry
            if any(issubclass(t, GRPOScriptArguments) for t in self.dataclass_types):
                problems += reward_problems(values, import_code=self.import_rewards)
                problems += agent_path_problems(values)  # tools, environment_factory: found, never imported here
        return problems


@dataclass
class _Report:
    """What the stages of a resolution found: problems (all reported together), warnings, unknown arguments."""

    problems: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    remaining: list = field(default_factory=list)
    env: dict = field(default_factory=dict)  # {name: (value, source)} of the `env:` sections

    def raise_if_any(self, sources) -> None:
        if self.problems:
            raise ConfigError(in_file_order(_dedupe([_with_source(p, sources) for p in self.problems])))


def _read_yaml_files(paths, report) -> list[tuple[str, dict, dict]]:
    """(path, top-level mapping, key lines) of each readable YAML file; problems for the others."""
    layers = []
    for path in paths:
        try:
            data, lines = load_yaml_file(path)
        except ConfigError as exc:
            report.problems += exc.problems
            continue
        layers.append((path, data, lines))
    return layers


def _restore_environment(saved: dict[str, str]) -> None:
    """Put os.environ back to `saved`: variables set since removed, changed ones reset."""
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _apply_env_sections(yaml_layers, report) -> None:
    """Set the variables of every `env:` section (as strings) before anything else is applied."""
    for path, data, lines in yaml_layers:
        env = data.pop("env", None)
        if env is None:
            continue
        source = f"yaml:{path}:{lines['env']}"
        if not isinstance(env, dict):
            report.problems.append(Problem("env", "must be a mapping of VARIABLE: value", env, source=source))
            continue
        for key, value in env.items():
            source = f"yaml:{path}:{lines.get(('env', key), lines['env'])}"  # each key on its own line
            if isinstance(value, (dict, list)) or not isinstance(key, str):
                what = "must be a VARIABLE: value pair with a plain value (a string, number or boolean)"
                report.problems.append(Problem(f"env.{key}", what, value, source=source))
                continue
            text = str(value).lower() if isinstance(value, bool) else str(value)
            if not key or "=" in key or "\0" in key:
                what = "is not a variable name (empty, or holding '=' or a NUL byte)"
                report.problems.append(Problem(f"env.{key!r}", what, source=source))
                continue
            if "\0" in text:
                report.problems.append(Problem(f"env.{key}", "holds a NUL byte, which no variable can", source=source))
                continue
            os.environ[key] = "" if value is None else text
            report.env[key] = (os.environ[key], source)
            if is_secret_env(key):
                register(os.environ[key])


def _recipe_layers(yaml_layers, recipe_flag, owners, report) -> list:
    """[recipe layer, recipe-name layer]: the recipe's values lowest, the `recipe` key itself with its source last.
    The command line's --recipe wins over a YAML `recipe:`, a later file over an earlier one."""
    name, source = None, None
    for path, data, lines in yaml_layers:
        if data.get("recipe") is not None:
            name, source = data["recipe"], f"yaml:{path}:{lines['recipe']}"
    if recipe_flag is not None:
        name, source = recipe_flag, "cli"
    values_layer, name_layer = (lambda key: "default", {}), (lambda key: source, {})
    if name is not None and not isinstance(name, str):
        if "recipe" not in owners:  # otherwise the type check of the `recipe` field reports it
            report.problems.append(Problem("recipe", "must be a recipe name (a string)", name, source=source))
        return [values_layer, name_layer]
    if name is not None:
        try:
            # A recipe may set keys of dataclasses this parser was not given (e.g. reward_funcs): those are skipped.
            values = {k: v for k, v in load_recipe(name).items() if k in owners}
            values_layer = (lambda key: f"recipe:{name}", values)
        except ConfigError as exc:
            report.problems += [dataclasses.replace(p, source=source) for p in exc.problems]
        if "recipe" in owners:
            name_layer = (lambda key: source, {"recipe": name})
    return [values_layer, name_layer]


def _merge_layers(layers, owners, allow_remaining, report, extra_names=()) -> dict[str, tuple[Any, str]]:
    """{field: (raw value, source)} from the layers, lowest first; renamed keys migrated, unknown keys reported
    (`extra_names`: other keys the caller knows, offered by "did you mean")."""
    raw: dict[str, tuple[Any, str]] = {}
    for source_of, mapping in layers:
        for key, value in mapping.items():
            key, value, source = _migrate(key, value, source_of(key), report)
            if key is None:
                continue
            if key not in owners:
                if allow_remaining and source != "cli":
                    report.remaining += [f"--{key}", str(value)]
                    continue
                near = closest(key, list(owners) + ["env", "recipe", *extra_names])
                hint = f"did you mean {near!r}?" if near else None
                report.problems.append(Problem(key, "unknown key", hint=hint, source=source))
                continue
            raw[key] = (value, source)
    return raw


def _migrate(key, value, source, report):
    """(key, value, source) after the migrations table; key None when the key is dropped."""
    if key in RENAMED_KEYS:
        new, why = RENAMED_KEYS[key]
        if removed_key_is_error(key, value):
            report.problems.append(Problem(key, why, value, source=source))
            return None, value, source
        if new is None:
            report.warnings.append(f"{key} ({source}) is {why}")
            return None, value, source
        report.warnings.append(f"{key} ({source}) is deprecated, {why}: use {new}")
        if key == "warmup_ratio" and (_as_number(value) or 0) >= 1:
            what = "must be < 1 to carry over to warmup_steps (where 1 or more is a number of steps)"
            report.problems.append(Problem(key, what, value, "set warmup_steps to a number of steps", source=source))
            return None, value, source
        key, source = new, f"migrated:{key}"
    if key == "scale_rewards" and legacy_scale_rewards(value) is not None:
        new_value = legacy_scale_rewards(value)
        report.warnings.append(f"scale_rewards: {value} ({source}) is a legacy spelling of {new_value!r}")
        value = new_value
    return key, value, source


def _coerce_into(raw, owners, values, sources, report) -> None:
    """Coerce each raw value by its field's type into `values`, recording its source."""
    for key, (value, source) in raw.items():
        dtype, f = owners[key]
        sources[key] = source
        try:
            if key == "datasets":
                values[key] = _coerce_datasets(value)
            elif key == "resume_from_checkpoint" and isinstance(value, bool):
                # `resume_from_checkpoint: true` in YAML, as `--resume_from_checkpoint true` on the command line:
                # the latest checkpoint in output_dir (see grpokit.checkpoints); `false` means no resume.
                values[key] = "true" if value else None
            else:
                values[key] = coerce(value, field_types(dtype)[key], mapping_items=f.name in MAPPING_ITEM_FIELDS)
        except CoercionError as exc:
            hint = f"did you mean {exc.suggestion!r}?" if exc.suggestion is not None else None
            report.problems.append(Problem(key, str(exc), hint=hint, source=source))
            values.pop(key, None)


def _with_derived(instances, values, sources) -> dict:
    """The values to show: those the dataclasses derive (DERIVED_FIELDS) are read back from the instances."""
    shown = dict(values)
    for instance in instances:
        for name in DERIVED_FIELDS:
            if hasattr(instance, name) and name in shown:
                final = plain(getattr(instance, name))
                if final != plain(shown[name]):
                    shown[name] = final
                    # A value the user gave and the dataclass normalised (['all-linear'] -> 'all-linear',
                    # 'auto' -> null) keeps its source, so that `config show --format yaml` still writes it.
                    if sources.get(name, "default") == "default":
                        sources[name] = "derived"
    return shown


# open-r1's reward fields (GRPOScriptArguments) -> the parameter of the built-in reward factories they set
# (`cosine`, TRL's `get_cosine_scaled_reward`, `repetition_penalty`).
OPENR1_REWARD_PARAMETERS = {
    "cosine_min_value_wrong": "min_value_wrong",
    "cosine_max_value_wrong": "max_value_wrong",
    "cosine_min_value_correct": "min_value_correct",
    "cosine_max_value_correct": "max_value_correct",
    "cosine_max_len": "max_len",
    "repetition_n_grams": "ngram_size",
    "repetition_max_penalty": "max_penalty",
}
# open-r1's code-execution fields, offered to the code reward factories under their own names.
OPENR1_CODE_FIELDS = (
    "code_language",
    "code_eval_test_batch_size",
    "code_eval_scoring_mode",
    "parallel_code_exec_per_proc",
    "code_provider",
    "ioi_provider",
    "e2b_router_url",
    "morph_router_url",
)


def reward_defaults(values) -> dict:
    """Config values offered to reward factories that take parameters of these names (a `{name, kwargs}` entry's
    own kwargs win): open-r1's reward fields under the factories' parameter names, its code fields as they are, and
    the overlong punishment's window. That window is `max_completion_len` / `soft_punish_cache` when set, else
    max_completion_length and its last quarter (as in DAPO/open-r1)."""
    offered = {param: values[name] for name, param in OPENR1_REWARD_PARAMETERS.items() if name in values}
    offered.update({name: values[name] for name in OPENR1_CODE_FIELDS if name in values})
    max_len = values.get("max_completion_len") or values.get("max_completion_length")
    cache = values.get("soft_punish_cache")
    if cache is None:
        cache = max(1, max_len // 4) if max_len else None
    return {**offered, "max_completion_len": max_len, "soft_punish_cache": cache}


def reward_problems(values, *, import_code: bool = False) -> list[Problem]:
    """Across dataclasses: every reward resolves, and reward_weights has one weight per reward. Without
    `import_code`, dotted reward paths are checked without importing them: a configuration runs no user code until
    training starts (or `grpokit config validate --import-rewards`)."""
    problems = []
    funcs = values.get("reward_funcs") or []
    try:
        from grpokit.rewards import check_reward_spec
    except ImportError:  # pragma: no cover - the rewards package is part of grpokit
        check_reward_spec = None
    if check_reward_spec is not None:
        for i, spec in enumerate(funcs):
            message = check_reward_spec(spec, defaults=reward_defaults(values), import_code=import_code)
            if message:
                problems.append(Problem("reward_funcs", f"entry {i}: {message}"))
    weights = values.get("reward_weights")
    expected = len(funcs) + (1 if values.get("reward_model_name_or_path") else 0)
    if weights is not None and len(weights) != expected:
        what = (
            "1 reward model + " if values.get("reward_model_name_or_path") else ""
        ) + f"{len(funcs)} reward function(s)"
        problems.append(
            Problem(
                "reward_weights",
                f"has {len(weights)} weight(s) but there are {what}",
                weights,
                f"give {expected} weight(s): the reward model's first (when set), then one per function, in order",
            )
        )
    return problems


def _blame(dtype, message: str, values, sources) -> Problem:
    """A problem raised while building `dtype` (by transformers' own checks), pinned on the field the user set that
    it names (`Unknown fsdp option`), or whose value it quotes (a missing JSON file); on the class otherwise."""
    given = [f.name for f in dataclasses.fields(dtype) if f.init and sources.get(f.name, "default") != "default"]
    by_name = [n for n in given if re.search(rf"\b{re.escape(n)}\b", message)]
    by_value = [n for n in given if isinstance(values.get(n), str) and len(values[n]) >= 3 and values[n] in message]
    # Failing that, the only field of this class that was set (e.g. `deepspeed: 5` failing inside accelerate with
    # "'int' object has no attribute 'get'", a message that names neither the field nor its value).
    name = next(iter(by_name + by_value + (given if len(given) == 1 else [])), None)
    if name is None:
        return Problem(dtype.__name__, message)
    return Problem(name, f"{dtype.__name__}: {message}", values.get(name), source=sources.get(name))


def _with_source(problem: Problem, sources) -> Problem:
    if problem.source is None:
        return dataclasses.replace(problem, source=sources.get(problem.field))
    return problem


def in_file_order(problems: list) -> list:
    """Problems located in YAML files first, file by file (in the order the files were given) and line by line; then
    the others (command line, environment, defaults, several fields at once) in the order they were found.

    >>> [p.field for p in in_file_order([Problem("a", "", source="yaml:r.yaml:7"), Problem("b", "", source="cli"),
    ...                                  Problem("c", "", source="yaml:r.yaml:3"), Problem("d", "", source="yaml:s.yaml:1")])]
    ['c', 'a', 'd', 'b']
    """
    files: dict[str, int] = {}

    def key(indexed):
        index, problem = indexed
        place = re.fullmatch(r"yaml:(.*):(\d+)", problem.source or "")
        if place is None:
            return (1, 0, 0, index)
        return (0, files.setdefault(place.group(1), len(files)), int(place.group(2)), index)

    return [p for _, p in sorted(enumerate(problems), key=key)]


def _dedupe(problems):
    seen, out = set(), []
    for p in problems:
        if p.line() not in seen:
            seen.add(p.line())
            out.append(p)
    return out


def _split_meta_args(args):
    """Pull `--config F` (repeatable) and `--recipe NAME` out of the argument list."""
    configs, recipe, rest = [], None, []
    i = 0
    while i < len(args):
        token = args[i]
        for flag in ("--config", "--recipe"):
            if token == flag or token.startswith(flag + "="):
                if token == flag:
                    if i + 1 >= len(args) or args[i + 1].startswith("--"):
                        raise ConfigError([Problem(flag, "expects a value", source="cli")])
                    value, i = args[i + 1], i + 2
                else:
                    value, i = token.split("=", 1)[1], i + 1
                if flag == "--config":
                    configs.append(value)
                else:
                    recipe = value
                break
        else:
            rest.append(token)
            i += 1
    return configs, recipe, rest


def _is_list(tp) -> bool:
    from .types import _union_args, strip_optional

    inner, _ = strip_optional(tp)
    return any((typing.get_origin(m) or m) is list for m in _union_args(inner) or (inner,))


def _as_number(value) -> float | None:
    """`value` as a number when it is one (or a command-line string of one), else None."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _is_bool(tp) -> bool:
    from .types import strip_optional

    return strip_optional(tp)[0] is bool


def _coerce_datasets(value):
    """`datasets:` of a mixture: a list of mappings, each checked against DatasetConfig's fields."""
    if not isinstance(value, list):
        raise CoercionError("must be a list of dataset entries (mappings with a `path`)")
    names = {f.name: f for f in dataclasses.fields(DatasetConfig)}
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise CoercionError(f"entry {i} must be a mapping with a `path`, not {entry!r}")
        for key in entry:
            if key not in names:
                near = closest(str(key), names)
                raise CoercionError(f"entry {i}: unknown key {key!r}", near)
        if "path" not in entry:
            raise CoercionError(f"entry {i} has no `path`")
        item = {}
        for key, v in entry.items():
            try:
                item[key] = coerce(v, field_types(DatasetConfig)[key])
            except CoercionError as exc:
                raise CoercionError(f"entry {i}, {key}: {exc}") from None
        fraction = item.get("fraction")
        if fraction is not None and not 0 < fraction <= 1:
            raise CoercionError(f"entry {i}, fraction must be > 0 and <= 1, got {fraction}")
        out.append(item)
    return out


def plain(value):
    """A JSON/YAML-friendly form of a resolved value (enums by value, dataclasses as mappings)."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def machine_notes(values, defaults) -> list[str]:
    """What depends on this machine rather than on the configuration (notes here, errors when training starts), and
    vLLM fields of the other vLLM mode, which have no effect. `defaults`: GRPOConfig's."""
    from .precision import hardware_notes
    from .rules import vllm_mode_warnings

    return hardware_notes(values) + vllm_mode_warnings(values, defaults)
