"""Launch presets: accelerate config files shipped with grpokit (`grpokit accelerate-configs`), and the launch that
`grpokit train --accelerate_config NAME|FILE [--num_processes N]` starts instead of training in this process.

The launch options (`accelerate_config`, `num_processes`, `main_process_port`) are given as flags or as keys of a
`--config` YAML file, next to the training fields. They belong to the launcher, not to any dataclass: the parser takes
them out (`TrlParser.resolve(..., launch_options=LAUNCH)`) before resolving the fields, and `launch_request` checks them. The
training configuration is checked once, in the launching process, before any process starts; the processes started
get the same arguments without the launch flags (and, reading a YAML that names a config, see that they run under a
launcher), so they never launch again.

What accelerate 1.x does with a config file (checked on a 2-core CPU machine): `distributed_type: MULTI_GPU` starts
`num_processes` processes, `MULTI_CPU` or `"NO"` start one whatever `--num_processes` says; `use_cpu: true` makes the
MULTI_GPU launch one gloo group on the CPU, but is not passed on to the processes (their `PartialState()` then runs
each alone unless `ACCELERATE_USE_CPU=true` or the training config's `use_cpu: true`), so the launch sets
`ACCELERATE_USE_CPU=true` itself for such a config.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from grpokit.config.resolver import take_flags
from grpokit.config.rules import ConfigError, Problem
from grpokit.config.suggest import closest
from grpokit.launch import LAUNCHED_ENV

LAUNCH_OPTIONS = ("accelerate_config", "num_processes", "main_process_port")


_FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


# ---- presets ----


def _preset_dir():
    return resources.files(__package__).joinpath("accelerate_configs")


def preset_names() -> list[str]:
    order = ("single_gpu", "multi_gpu", "multi_cpu", "zero1", "zero2", "zero3", "fsdp2")
    names = [p.name[: -len(".yaml")] for p in _preset_dir().iterdir() if p.name.endswith(".yaml")]
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))


def _unknown_preset(name: str, source: str | None = None) -> ConfigError:
    near = closest(name, preset_names())
    hint = f"did you mean {near!r}?" if near else "presets: " + ", ".join(preset_names())
    return ConfigError([Problem("accelerate_config", "neither a shipped preset nor a file", name, hint, source)])


def preset_path(name: str) -> str:
    if name not in preset_names():
        raise _unknown_preset(name)
    return str(_preset_dir().joinpath(f"{name}.yaml"))


def preset_text(name: str) -> str:
    if name not in preset_names():
        raise _unknown_preset(name)
    return _preset_dir().joinpath(f"{name}.yaml").read_text(encoding="utf-8")


def preset_summary(name: str) -> str:
    """The first comment line of a preset: what it does."""
    return preset_text(name).splitlines()[0].lstrip("# ").strip()


# ---- an accelerate config file ----


@dataclass
class AccelerateConfig:
    """An accelerate config file (a preset or the user's), read for what grpokit needs to know about it."""

    path: str
    preset: str | None
    data: dict

    @property
    def label(self) -> str:
        return self.preset or self.path

    @property
    def distributed_type(self) -> str:
        return str(self.data.get("distributed_type", "NO")).upper()

    @property
    def num_processes(self) -> int | None:
        value = self.data.get("num_processes")
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None

    @property
    def num_machines(self) -> int:
        value = self.data.get("num_machines")
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1

    @property
    def use_cpu(self) -> bool:
        return _true(self.data.get("use_cpu"))

    @property
    def mixed_precision(self) -> str:
        value = self.data.get("mixed_precision")
        return "no" if value in (None, False) else str(value).lower()

    @property
    def zero_stage(self) -> int | None:
        """The DeepSpeed ZeRO stage: `deepspeed_config.zero_stage`, or `zero_optimization.stage` of the JSON file
        that `deepspeed_config.deepspeed_config_file` names; None when neither says."""
        ds = self.data.get("deepspeed_config") or {}
        stage = ds.get("zero_stage")
        if stage is None and ds.get("deepspeed_config_file"):
            path = os.path.join(os.path.dirname(self.path), str(ds["deepspeed_config_file"]))
            try:
                with open(path if os.path.isfile(path) else str(ds["deepspeed_config_file"]), encoding="utf-8") as f:
                    stage = (json.load(f).get("zero_optimization") or {}).get("stage")
            except (OSError, ValueError, AttributeError):
                stage = None
        return int(stage) if isinstance(stage, (int, str)) and str(stage).isdigit() else None

    @property
    def offloaded(self) -> set[str]:
        """What DeepSpeed or FSDP keeps in CPU memory: a subset of {"optimizer", "weights"}."""
        out = set()
        ds = self.data.get("deepspeed_config") or {}
        if str(ds.get("offload_optimizer_device", "none")).lower() not in ("none", ""):
            out.add("optimizer")
        if str(ds.get("offload_param_device", "none")).lower() not in ("none", ""):
            out.add("weights")
        if _true((self.data.get("fsdp_config") or {}).get("fsdp_offload_params")):
            out |= {"optimizer", "weights"}
        return out

    @property
    def fsdp_version(self) -> int:
        version = (self.data.get("fsdp_config") or {}).get("fsdp_version", 1)
        return int(version) if str(version).isdigit() else 1

    @property
    def fsdp_strategy(self) -> str:
        """FSDP's sharding strategy by its FSDP1 name (FSDP2's `reshard_after_forward: false` keeps whole weights
        between forward and backward, like SHARD_GRAD_OP)."""
        fsdp = self.data.get("fsdp_config") or {}
        value = fsdp.get("fsdp_reshard_after_forward", fsdp.get("fsdp_sharding_strategy"))
        if value is None:
            return "FULL_SHARD"
        if isinstance(value, bool) or str(value).lower() in ("true", "false"):
            return "FULL_SHARD" if _true(value) else "SHARD_GRAD_OP"
        if str(value).isdigit() and 1 <= int(value) <= len(_FSDP_STRATEGIES):
            return _FSDP_STRATEGIES[int(value) - 1]
        return str(value).upper()


def load_accelerate_config(value, source: str | None = None) -> AccelerateConfig:
    """The config a `--accelerate_config` value names: an existing file, else a shipped preset. Raises ConfigError
    (one line) for anything accelerate would not launch with."""
    if not isinstance(value, str) or not value:
        raise ConfigError([Problem("accelerate_config", "must be a preset name or a file path", value, source=source)])
    if os.path.isfile(value):
        path, preset = value, None
    elif value in preset_names():
        path, preset = preset_path(value), value
    elif os.sep in value or value.endswith((".yaml", ".yml", ".json")):
        raise ConfigError([Problem("accelerate_config", "no such file", value, source=source)])
    else:
        raise _unknown_preset(value, source)
    try:
        import yaml

        with open(path, encoding="utf-8") as fh:
            data = json.load(fh) if path.endswith(".json") else yaml.safe_load(fh)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        what = " ".join(str(exc).split())
        raise ConfigError([Problem("accelerate_config", f"cannot read it: {what}", value, source=source)]) from None
    if not isinstance(data, dict):
        raise ConfigError(
            [Problem("accelerate_config", "is not an accelerate config (a mapping of its keys)", value, source=source)]
        )
    try:  # accelerate's own reading: unknown keys and values it does not know are errors there too
        from accelerate.commands.config.config_args import load_config_from_file

        load_config_from_file(path)
    except (ValueError, TypeError, KeyError) as exc:
        what = " ".join(str(exc).split())
        raise ConfigError(
            [Problem("accelerate_config", f"accelerate rejects it: {what}", value, source=source)]
        ) from None
    return AccelerateConfig(path, preset, data)


# ---- the launch options ----


@dataclass
class LaunchRequest:
    """The launch options of a command line and its YAML files, checked."""

    config: AccelerateConfig | None = None
    num_processes: int | None = None
    main_process_port: int | None = None
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def processes(self) -> int:
        """The processes this launch starts (the flag, else the config's num_processes, else 1)."""
        if self.num_processes is not None:
            return self.num_processes
        if self.config is not None and self.config.num_processes is not None:
            return self.config.num_processes
        return 1

    @property
    def processes_given(self) -> bool:
        """Whether a process count was asked for (the flag or the config's num_processes), not defaulted to 1."""
        return self.num_processes is not None or (self.config is not None and self.config.num_processes is not None)

    def processes_how(self) -> str:
        if self.num_processes is not None:
            return f"num_processes ({self.sources['num_processes']})"
        if self.config is not None and self.config.num_processes is not None:
            return f"num_processes of accelerate config {self.config.label}"
        return "accelerate config without num_processes: 1"


def take_launch_flags(tokens) -> tuple[dict[str, tuple[Any, str]], list[str], list[Problem]]:
    """Take `--accelerate_config X`, `--num_processes N`, `--main_process_port P` (also `--x=v`, and with hyphens)
    out of command-line tokens: ({name: (value, "cli")}, other tokens, problems)."""
    return take_flags(tokens, LAUNCH_OPTIONS)


def strip_launch_flags(tokens) -> list[str]:
    """The tokens without the launch flags: the arguments of the processes a launch starts."""
    return take_launch_flags(tokens)[1]


def launch_request(given: dict[str, tuple[Any, str]]) -> tuple[LaunchRequest | None, list[Problem]]:
    """Check the launch options (taken from the flags and YAML keys): (request or None, problems)."""
    if not given:
        return None, []
    request, problems = LaunchRequest(sources={k: s for k, (_, s) in given.items()}), []
    for name, low, high in (("num_processes", 1, None), ("main_process_port", 1, 65535)):
        if name not in given:
            continue
        value, source = given[name]
        number = _int(value)
        if number is None or number < low or (high is not None and number > high):
            what = f"must be an integer >= {low}" + (f" and <= {high}" if high else "")
            problems.append(Problem(name, what, value, source=source))
        else:
            setattr(request, name, number)
    if "accelerate_config" in given:
        value, source = given["accelerate_config"]
        try:
            request.config = load_accelerate_config(value, source)
        except ConfigError as exc:
            problems += exc.problems
    config = request.config
    if config is not None and request.processes > 1:
        if config.distributed_type == "NO":
            problems.append(
                Problem(
                    "num_processes",
                    f"accelerate config {config.label} runs one process (distributed_type NO), not "
                    f"{request.processes}",
                    request.processes,
                    "use multi_gpu (GPUs) or multi_cpu (CPU) for several",
                    request.sources.get("num_processes"),
                )
            )
        elif config.distributed_type == "MULTI_CPU":
            problems.append(
                Problem(
                    "accelerate_config",
                    f"distributed_type MULTI_CPU makes accelerate start one process, not {request.processes}",
                    config.label,
                    "write distributed_type: MULTI_GPU with use_cpu: true (as the multi_cpu preset does)",
                    request.sources.get("accelerate_config"),
                )
            )
    return request, problems


@dataclass(frozen=True)
class _LaunchOptions:
    """`grpokit train`'s launch options as `TrlParser.resolve(..., launch_options=LAUNCH)` takes them."""

    names: tuple[str, ...] = LAUNCH_OPTIONS

    def request(self, given):
        return launch_request(given)


LAUNCH = _LaunchOptions()


def machine_problems(request: LaunchRequest | None) -> list[str]:
    """What this machine cannot launch (one line each): FSDP without a CUDA GPU becomes plain DDP in accelerate."""
    if request is None or request.config is None:
        return []
    config = request.config
    if config.distributed_type == "FSDP":
        import torch

        if not torch.cuda.is_available():
            return [
                f"accelerate_config={config.label!r}: FSDP needs CUDA GPUs and this machine has none (accelerate would "
                "run DDP instead); on CPU use --accelerate_config multi_cpu"
            ]
    return []


def engine_settings(config: AccelerateConfig) -> dict:
    """The sharding engine an accelerate config asks for (`grpokit.launch.engine_problems` keywords)."""
    kind = config.distributed_type
    stage = config.zero_stage if config.zero_stage is not None else 2  # DeepSpeed's default stage
    return {
        "deepspeed_stage": stage if kind == "DEEPSPEED" else None,
        "fsdp_version": config.fsdp_version if kind == "FSDP" else None,
    }


# ---- the launch ----


def launch_command(request: LaunchRequest, child_args, mixed_precision: str | None = None) -> list[str]:
    """`python -m accelerate.commands.launch --config_file F [--num_processes N] [--main_process_port P]
    [--mixed_precision M] -m grpokit train ARGS`, ARGS without the launch flags.

    `mixed_precision`: the training config's ("no", "bf16", "fp16"). It wins over the accelerate config's, as it does
    for a single process and DDP (the Trainer builds the accelerator from the training config); DeepSpeed would
    otherwise refuse the mismatch after loading the model."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", request.config.path]
    if mixed_precision is not None:
        command += ["--mixed_precision", mixed_precision]
    if request.num_processes is not None:
        command += ["--num_processes", str(request.num_processes)]
    if request.main_process_port is not None:
        command += ["--main_process_port", str(request.main_process_port)]
    return command + ["-m", "grpokit", "train", *strip_launch_flags(child_args)]


def launch_env(request: LaunchRequest, env=None) -> dict[str, str]:
    """The launcher's environment: this one, plus ACCELERATE_USE_CPU=true for a `use_cpu: true` config (accelerate
    does not pass use_cpu on to the processes of a multi-process launch), and the mark of a grpokit launch."""
    out = dict(os.environ if env is None else env)
    if request.config is not None and request.config.use_cpu:
        out["ACCELERATE_USE_CPU"] = "true"
    out[LAUNCHED_ENV] = "1"
    return out


def run_launch(request: LaunchRequest, child_args, mixed_precision: str | None = None) -> int:
    """Start the launch and wait for it: its exit code."""
    command = launch_command(request, child_args, mixed_precision)
    print(
        f"grpokit: {request.processes} process(es) with accelerate config {request.config.label}: "
        f"{shlex.join(command)}",
        file=sys.stderr,
        flush=True,
    )
    from grpokit.cli.supervise import wait_passing_signals

    # A scheduler's SIGTERM (or a Ctrl-C sent to this process alone) reaches the launch, whose processes then save
    # and stop (see grpokit.cli.stopping).
    code = wait_passing_signals(subprocess.Popen(command, env=launch_env(request)))
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention, 128 + its number


def _int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return None


def _true(value) -> bool:
    return str(value).lower() in ("1", "true", "yes")
