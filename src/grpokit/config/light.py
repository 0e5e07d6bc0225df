"""The light path: a configuration resolved without transformers, peft or torch, for `grpokit config validate|show|
diff|plan` (a second instead of several).

GRPOConfig is a `transformers.TrainingArguments` subclass; importing it costs the whole transformers and torch stack.
Here a light GRPOConfig is built from the field table (`field_data.py`, generated from the real classes by
`field_table.py` and tested equal to them): the same fields, types, defaults and help, so the resolver coerces and
checks exactly as it does for the real class. What the real class does when it is built is done here too:
grpokit's own checks (the same `rules` functions) and the value checks of TrainingArguments' `__post_init__`
(ported below, and compared with the real class by tests/config/test_light_path.py).

What this path cannot judge without transformers or torch sends the command down the full path (`FullPathNeeded`,
with the reason): a TrainingArguments field whose `__post_init__` handling is not ported set to a non-default value
(deepspeed, fsdp, fsdp_config, accelerator_config, debug, ddp_backend, ddp_timeout, torch_compile*, fp16,
fp16_full_eval, gradient/activation_checkpointing_kwargs, and any field a future transformers reads there), a
launched process or accelerate's variables in the environment, a `report_to` integration (whether it is installed
is transformers' call), `resume_from_checkpoint` (the checkpoint is read with torch), and a machine with torch_xla
or torch_neuronx (the device decides the padding).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib.util
import os
from typing import Any, Literal, Union

from .field_data import TABLE
from .resolver import FullPathNeeded
from .rules import derive_batch_geometry

# TrainingArguments fields that `__post_init__` reads and that `_light_post_init` below handles as it does (or that
# it only normalises on the instance, which the resolved values never read back). Every other field it reads
# (TABLE["post_init_fields"]) set to a non-default value takes the full path.
PORTED = frozenset(
    {
        "output_dir",
        "do_eval",
        "eval_steps",
        "eval_strategy",
        "logging_strategy",
        "logging_steps",
        "save_strategy",
        "save_steps",
        "hub_strategy",
        "lr_scheduler_type",
        "lr_scheduler_kwargs",
        "optim",
        "load_best_model_at_end",
        "metric_for_best_model",
        "greater_is_better",
        "report_to",
        "warmup_steps",
        "dataloader_num_workers",
        "dataloader_prefetch_factor",
        "dataloader_pin_memory",
        "dataloader_multiprocessing_context",
        "torch_empty_cache_steps",
        "disable_tqdm",
        "include_num_input_tokens_seen",
        "use_cpu",
        "gradient_checkpointing",
        "activation_checkpointing",
        # held back by GRPOConfig while TrainingArguments' __post_init__ runs (see grpo_config.py, precision.py)
        "bf16",
        "bf16_full_eval",
        "tf32",
    }
)


def _decode(encoded) -> Any:
    """A type hint from its plain-data form (`field_table.encode_type`)."""
    kind = encoded[0]
    if kind in ("bool", "int", "float", "str"):
        return {"bool": bool, "int": int, "float": float, "str": str}[kind]
    if kind == "none":
        return type(None)
    if kind == "any":
        return Any
    if kind == "dict":
        return dict if len(encoded) == 1 else dict[_decode(encoded[1]), _decode(encoded[2])]
    if kind == "list":
        return list[_decode(encoded[1])]
    if kind == "literal":
        return Literal[tuple(encoded[1])]
    if kind == "union":
        return Union[tuple(_decode(e) for e in encoded[1])]  # noqa: UP007
    if kind == "enum":
        return _enum(encoded[1], tuple((name, value) for name, value in encoded[2]))
    if kind == "class":
        return _opaque(encoded[1], encoded[2])
    raise ValueError(f"unknown type in the field table: {encoded!r}")


@functools.cache
def _enum(name: str, members: tuple) -> type[enum.Enum]:
    return enum.Enum(name, list(members), module=__name__)


@functools.cache
def _opaque(name: str, is_dataclass: bool) -> type:
    """A class the light path only names (e.g. ParallelismConfig): a YAML mapping for a dataclass passes, as it does
    for the real one, whose owner builds it."""
    namespace = {"__module__": __name__}
    if is_dataclass:
        namespace["__dataclass_fields__"] = {}
    return type(name, (), namespace)


def _enum_text(name: str, value) -> str:
    """How transformers' message shows an enum field's value: `IntervalStrategy.STEPS`."""
    encoded = _field_types_encoded()[name]
    for member in encoded[1] if encoded[0] == "union" else [encoded]:
        if member[0] == "enum":
            for member_name, member_value in member[2]:
                if member_value == value:
                    return f"{member[1]}.{member_name}"
    return str(value)


@functools.cache
def _field_types_encoded() -> dict:
    return {f["name"]: f["type"] for f in TABLE["fields"]}


@functools.cache
def light_grpo_config() -> type:
    """GRPOConfig as a plain dataclass built from the field table, with `for_processes` as the real one has."""
    specs = []
    for entry in TABLE["fields"]:
        metadata = {"help": entry["help"], "owner": entry["owner"]}
        if "default" in entry:
            value = entry["default"]
            default = (
                dataclasses.field(default_factory=functools.partial(_copy, value), metadata=metadata)
                if isinstance(value, (list, dict))
                else dataclasses.field(default=value, metadata=metadata)
            )
        else:
            value = entry["default_factory"]
            default = dataclasses.field(default_factory=functools.partial(_copy, value), metadata=metadata)
        if not entry["init"]:
            default.init = False
        specs.append((entry["name"], _decode(entry["type"]), default))
    cls = dataclasses.make_dataclass("GRPOConfig", specs, namespace={"for_processes": classmethod(_for_processes)})
    cls.__module__ = __name__
    return cls


def _copy(value):
    import copy

    return copy.deepcopy(value)


def _for_processes(cls, processes: int, *, noted: bool = False, **kwargs):
    """The light GRPOConfig of `kwargs`, derived for `processes` (the real `GRPOConfig.for_processes`)."""
    config = cls(**kwargs)
    reason = full_path_reason(config)
    if reason:
        raise FullPathNeeded(reason)
    _light_post_init(config)
    if config.pad_to_multiple_of == "auto":
        config.pad_to_multiple_of = None  # 128 on AWS Neuron only, which takes the full path
    derived = derive_batch_geometry(vars(config), num_processes=processes, noted=noted)
    for name, value in derived.items():
        setattr(config, name, value)
    return config


def full_path_reason(config) -> str | None:
    """Why `config` cannot be judged without transformers and torch, or None."""
    defaults = {f.name: f.default for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING}
    for name in TABLE["post_init_fields"]:
        if name not in PORTED and name in defaults and getattr(config, name) != defaults[name]:
            return f"{name} is set (TrainingArguments' own handling of it)"
    from grpokit.launch import under_launcher

    if under_launcher() or any(k.startswith("ACCELERATE_") for k in os.environ):
        return "a launcher's or accelerate's variables are set"
    from .rules import report_to_names

    named = [n for n in report_to_names(config.report_to) if n in TABLE["integrations"]]
    if named:
        return f"report_to names {named[0]} (whether it is installed is transformers' call)"
    if config.resume_from_checkpoint is not None:
        return "resume_from_checkpoint is set (the checkpoint is read with torch)"
    if any(importlib.util.find_spec(m) is not None for m in ("torch_xla", "torch_neuronx")):
        return "torch_xla or torch_neuronx is installed (the device decides)"
    return None


def _light_post_init(config) -> None:
    """TrainingArguments.__post_init__ for the fields in PORTED: the values it derives that the resolution shows
    (output_dir, do_eval, eval_steps) and the errors it raises, with its messages, in its order."""
    if config.output_dir is None:
        config.output_dir = "trainer_output"
    config.output_dir = os.path.expanduser(config.output_dir)
    if config.do_eval is False and config.eval_strategy != "no":
        config.do_eval = True
    if config.eval_strategy == "steps" and (config.eval_steps is None or config.eval_steps == 0):
        if config.logging_steps > 0:
            config.eval_steps = config.logging_steps
        else:
            raise ValueError(
                f"evaluation strategy {_enum_text('eval_strategy', 'steps')} requires either non-zero --eval_steps or"
                " --logging_steps"
            )
    _validate_args(config)


def _validate_args(config) -> None:
    """TrainingArguments._validate_args for the PORTED fields (bf16 is held back by GRPOConfig, so its checks never
    fire there: fp16 together with bf16 is grpokit's own rule)."""
    steps = config.torch_empty_cache_steps
    if steps is not None and not (isinstance(steps, int) and steps > 0):
        raise ValueError(f"`torch_empty_cache_steps` must be an integer bigger than 0, got {steps}.")
    logging_strategy = _enum_text("logging_strategy", config.logging_strategy)
    if config.logging_strategy == "steps" and config.logging_steps == 0:
        raise ValueError(f"logging strategy {logging_strategy} requires non-zero --logging_steps")
    if config.logging_strategy == "steps" and config.logging_steps > 1:
        if config.logging_steps != int(config.logging_steps):
            raise ValueError(f"--logging_steps must be an integer if bigger than 1: {config.logging_steps}")
        config.logging_steps = int(config.logging_steps)
    if config.eval_strategy == "steps" and config.eval_steps > 1:
        if config.eval_steps != int(config.eval_steps):
            raise ValueError(f"--eval_steps must be an integer if bigger than 1: {config.eval_steps}")
        config.eval_steps = int(config.eval_steps)
    if config.save_strategy == "steps" and config.save_steps > 1:
        if config.save_steps != int(config.save_steps):
            raise ValueError(f"--save_steps must be an integer if bigger than 1: {config.save_steps}")
        config.save_steps = int(config.save_steps)
    if config.load_best_model_at_end and config.save_strategy != "best":
        if config.eval_strategy != config.save_strategy:
            raise ValueError(
                "--load_best_model_at_end requires the save and eval strategy to match, except when "
                '--save_strategy="best", but found\n- Evaluation '
                f"strategy: {_enum_text('eval_strategy', config.eval_strategy)}\n- Save strategy: "
                f"{_enum_text('save_strategy', config.save_strategy)}"
            )
        save, evaluate = config.save_steps, config.eval_steps
        if config.eval_strategy == "steps" and save % evaluate != 0:
            if evaluate < 1 or save < 1:
                if not (evaluate < 1 and save < 1):
                    raise ValueError(
                        "--load_best_model_at_end requires the saving steps to be a multiple of the evaluation "
                        "steps, which cannot get guaranteed when mixing ratio and absolute steps for save_steps "
                        f"{save} and eval_steps {evaluate}."
                    )
                if (save * 1_000_000) % (evaluate * 1_000_000) != 0:
                    raise ValueError(
                        "--load_best_model_at_end requires the saving steps to be a multiple of the evaluation "
                        f"steps, but found {save}, which is not a multiple of {evaluate}."
                    )
            else:
                raise ValueError(
                    "--load_best_model_at_end requires the saving steps to be a round multiple of the evaluation "
                    f"steps, but found {save}, which is not a round multiple of {evaluate}."
                )
    if config.lr_scheduler_type == "reduce_lr_on_plateau" and config.eval_strategy == "no":
        raise ValueError("lr_scheduler_type reduce_lr_on_plateau requires an eval strategy")
    if config.lr_scheduler_type == "greedy" and config.eval_strategy == "no":
        raise ValueError("lr_scheduler_type greedy requires an eval strategy")
    if config.warmup_steps < 0:
        raise ValueError(f"Got warmup_steps = {config.warmup_steps}, Expected value warmup_steps >= 0")
    if config.dataloader_num_workers == 0 and config.dataloader_prefetch_factor is not None:
        raise ValueError(
            "--dataloader_prefetch_factor can only be set when data is loaded in a different process, i.e."
            " when --dataloader_num_workers > 0."
        )


@functools.cache
def light_types() -> tuple:
    """The default dataclasses of `grpokit config`, GRPOConfig the light one (the others need no transformers)."""
    from .model_config import ModelConfig
    from .script_args import DatasetMixtureConfig, GRPOScriptArguments

    return (GRPOScriptArguments, light_grpo_config(), ModelConfig, DatasetMixtureConfig)


def light_resolver():
    """A resolver of the default dataclasses on the light path."""
    from .resolver import Resolver

    return Resolver(light_types())
