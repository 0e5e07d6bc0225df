"""The light path: `grpokit config validate|show|diff|plan`, `grpokit --help`, `--version`, `recipes` and `rewards`
import neither torch nor transformers nor peft, and the light GRPOConfig (built from the field table) resolves every
configuration exactly as the real one does: the same values, sources, warnings, notes and errors. What it cannot judge
alone goes down the full path, with the same answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grpokit.cli.launch_presets import LAUNCH
from grpokit.config.light import PORTED, full_path_reason, light_grpo_config, light_resolver
from grpokit.config.parser import TrlParser
from grpokit.config.resolver import FullPathNeeded
from grpokit.config.rules import ConfigError
from grpokit.config.support import unsupported_settings

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "src" / "grpokit" / "cli" / "demo.yaml")
HEAVY = ("torch", "transformers", "peft", "accelerate")


def test_the_config_commands_import_no_torch_transformers_or_peft(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text("recipe: dapo\nnum_generations: 4\nper_device_train_batch_size: 4\nbf16: null\n")
    commands = [
        ["config", "validate", "--config", DEMO],
        ["config", "validate", "--config", DEMO, "--num_generations", "3"],  # an error: exit 2
        ["config", "show", "--config", DEMO, "--format", "json"],
        ["config", "show", "--config", str(other), "--format", "yaml"],
        ["config", "diff", DEMO, str(other)],
        ["config", "plan", "--config", str(other), "--num_processes", "4"],
        ["--help"],
        ["--version"],
        ["recipes"],
        ["recipes", "show", "dapo"],
        ["rewards"],
        ["rewards", "show", "accuracy"],
        ["config", "schema"],
        ["train", "--help"],
    ]
    script = textwrap.dedent(
        f"""
        import contextlib, io, json, sys
        from grpokit.cli.commands import _main
        found = []
        for args in {commands!r}:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
                code = _main(args)
            heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
            found.append([" ".join(args[:2]), code, heavy])
        print(json.dumps(found))
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env.pop("WORLD_SIZE", None)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert [code for _, code, _ in found] == [0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert [(name, heavy) for name, _, heavy in found if heavy] == []


def _outcome(parser, args):
    try:
        r = parser.resolve(list(args), launch_options=LAUNCH, planning=True)
    except ConfigError as exc:
        return {"errors": [p.line() for p in exc.problems]}
    return {
        "values": json.loads(json.dumps(r.values, default=str)),
        "sources": r.sources,
        "warnings": r.warnings,
        "notes": r.notes,
        "default_notes": r.default_notes,
        "processes": (r.processes, r.processes_how),
        "env": r.env,
        "refused": unsupported_settings(*r.instances),
    }


def _light(args):
    return _outcome(light_resolver(), args)


def _full(args):
    return _outcome(TrlParser(), args)


EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
RECIPES = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "sapo", "deepseek_r1"]

# Each is resolved by both GRPOConfigs; the comments say what the real one does with it.
CASES = [
    ["--config", DEMO],
    *[["--config", path] for path in EXAMPLES],
    *[["--recipe", name] for name in RECIPES],
    [],
    ["--output_dir", "~/runs/x"],  # TrainingArguments expands ~
    ["--eval_strategy", "steps"],  # eval_steps from logging_steps, do_eval on
    ["--eval_strategy", "epoch", "--per_device_eval_batch_size", "8"],
    ["--eval_strategy", "steps", "--logging_steps", "0"],  # its first error: no eval_steps and no logging_steps
    ["--logging_steps", "0"],
    ["--logging_steps", "2.5"],
    ["--logging_steps", "0.5"],
    ["--save_strategy", "steps", "--save_steps", "2.5"],
    ["--eval_strategy", "steps", "--eval_steps", "7.5"],
    ["--load_best_model_at_end", "true", "--eval_strategy", "steps", "--save_strategy", "epoch"],
    ["--load_best_model_at_end", "true", "--eval_strategy", "steps", "--eval_steps", "7", "--save_steps", "20"],
    ["--load_best_model_at_end", "true", "--eval_strategy", "steps", "--eval_steps", "0.3", "--save_steps", "20"],
    ["--load_best_model_at_end", "true", "--eval_strategy", "steps", "--eval_steps", "0.3", "--save_steps", "0.5"],
    ["--load_best_model_at_end", "true", "--eval_strategy", "steps", "--eval_steps", "0.2", "--save_steps", "0.4"],
    ["--load_best_model_at_end", "true", "--save_strategy", "best", "--eval_strategy", "steps"],
    ["--lr_scheduler_type", "reduce_lr_on_plateau"],
    ["--lr_scheduler_type", "greedy", "--eval_strategy", "epoch"],
    ["--lr_scheduler_type", "cosinee"],
    ["--warmup_steps", "-1"],
    ["--dataloader_prefetch_factor", "2"],
    ["--dataloader_prefetch_factor", "2", "--dataloader_num_workers", "2"],
    ["--torch_empty_cache_steps", "0"],
    ["--torch_empty_cache_steps", "4"],
    ["--pad_to_multiple_of", "64"],
    ["--pad_to_multiple_of", "null"],
    ["--report_to", "none"],
    ["--report_to", "all"],
    ["--report_to", "wandbb"],
    ["--optim", "adamw_torch"],
    ["--optim", "adamw_torc"],
    ["--bf16", "true", "--use_cpu", "true"],
    ["--bf16", "true"],
    ["--tf32", "true"],
    ["--use_cpu", "true", "--disable_tqdm", "false", "--dataloader_pin_memory", "false"],
    ["--gradient_checkpointing", "false"],
    ["--lr_scheduler_kwargs", '{"num_cycles": 2}'],
    ["--num_generations", "3"],
    ["--num_generations", "14", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "4"],
    ["--num_generations", "4", "--per_device_train_batch_size", "4", "--num_processes", "3"],
    ["--generation_batch_size", "24", "--steps_per_generation", "2"],
    ["--use_vllm", "true", "--vllm_tensor_parallel_size", "2", "--num_processes", "3"],
    ["--vllm_server_port", "8001"],
    ["--torch_dtype", "bfloat16", "--evaluation_strategy", "no"],  # migrated keys
    ["--use_transformers_paged", "true"],
    ["--parallelism_config", "5"],
    ["--num_generation", "8"],
    ["--top_p", "1.5", "--num_generations", "8.5"],
    ["--hub_token", "hf_abcdefghijklmnopqrstuvwxyz0123456789"],
    ["--push_to_hub_revision", "true", "--callbacks", "x"],
    ["--max_steps", "10", "--seed", "3", "--learning_rate", "3e-6", "--lr_scheduler_type", "constant"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a)[:60] or "defaults")
def test_the_light_config_resolves_as_the_real_one(args, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("OPEN_R1_EXAMPLE_PATH", str(tmp_path))
    light = _light(args)
    assert light == _full(args)


FALLBACKS = [
    (["--deepspeed", "ds.json"], "deepspeed is set"),
    (["--fsdp", "full_shard"], "fsdp is set"),
    (["--accelerator_config", '{"split_batches": true}'], "accelerator_config is set"),
    (["--debug", "underflow_overflow"], "debug is set"),
    (["--fp16", "true"], "fp16 is set"),
    (["--torch_compile", "true"], "torch_compile is set"),
    (["--gradient_checkpointing_kwargs", '{"use_reentrant": false}'], "gradient_checkpointing_kwargs is set"),
    (["--report_to", "tensorboard"], "report_to names tensorboard"),
    (["--resume_from_checkpoint", "somewhere"], "resume_from_checkpoint is set"),
]


@pytest.mark.parametrize("args, reason", FALLBACKS, ids=lambda a: str(a)[:40])
def test_what_the_light_path_cannot_judge_takes_the_full_path(args, reason, cli):
    with pytest.raises(FullPathNeeded, match=reason):
        light_resolver().resolve(args, launch_options=LAUNCH, planning=True)
    full = _full(args)
    result = cli("config", "show", "--format", "json", *args)  # the command answers as the full path does
    if "errors" in full:
        assert result.errors == [f"error: {line}" for line in full["errors"]]
    else:
        shown = json.loads(result.out)
        assert {k: shown[k]["source"] for k in full["sources"]} == full["sources"]


def test_a_launchers_variables_take_the_full_path(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(FullPathNeeded, match="accelerate's variables"):
        light_resolver().resolve([], planning=True)


def test_a_field_transformers_reads_when_built_is_ported_or_takes_the_full_path():
    from grpokit.config.field_data import TABLE

    config = light_grpo_config()()
    assert full_path_reason(config) is None  # the defaults are judged on the light path
    unported = sorted(set(TABLE["post_init_fields"]) - PORTED)
    assert unported == [
        "accelerator_config",
        "activation_checkpointing_kwargs",
        "ddp_backend",
        "ddp_timeout",
        "debug",
        "deepspeed",
        "fp16",
        "fp16_full_eval",
        "fsdp",
        "fsdp_config",
        "gradient_checkpointing_kwargs",
        "torch_compile",
        "torch_compile_backend",
        "torch_compile_mode",
    ]


def test_the_schema_and_the_help_are_those_of_the_real_classes(monkeypatch):
    from grpokit.cli import help as help_module
    from grpokit.cli.schema import build_schema
    from grpokit.config import light
    from grpokit.config.light import light_types
    from grpokit.config.parser import DEFAULT_TYPES

    assert build_schema(light_types()) == build_schema(DEFAULT_TYPES)
    shown = (help_module.train_help(), help_module.train_help(full=True))
    monkeypatch.setattr(light, "light_types", lambda: DEFAULT_TYPES)  # train_fields() from the real classes
    assert (help_module.train_help(), help_module.train_help(full=True)) == shown


def test_the_torch_build_is_read_without_importing_torch(tmp_path, monkeypatch):
    """A CPU-only torch (torch.version.cuda and .hip None) has no GPU to ask about: the machine notes need no torch
    import; a CUDA or ROCm build is asked (torch is imported then, not transformers)."""
    import importlib.machinery

    from grpokit.config import precision

    package = tmp_path / "torch"
    package.mkdir()
    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(precision.importlib.util, "find_spec", lambda name: spec if name == "torch" else None)
    for text, cpu_only in [
        ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", True),
        ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", False),
        ("cuda: Optional[str] = None\nhip: Optional[str] = '6.3.42131'\n", False),
        ("cuda = None\n", False),  # hip not said: not known to be CPU-only
    ]:
        (package / "version.py").write_text(text)
        assert precision.cpu_only_torch.__wrapped__() is cpu_only, text
