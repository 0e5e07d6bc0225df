"""Recipes in the shape of open-r1's GRPO recipes (tests/data/openr1_style/, written for these tests): each validates
at the process count open-r1 launches it with, refuses only the keys grpokit refuses by design, and two of them train
on a tiny local model with their rewards."""

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpokit.cli.launch_presets import LAUNCH
from grpokit.config.parser import TrlParser, reward_defaults
from grpokit.config.support import NOT_IMPLEMENTED
from grpokit.rewards import resolve_reward

RECIPES = Path(__file__).resolve().parents[1] / "data" / "openr1_style"

# open-r1's README launches every GRPO recipe on a node of 8 GPUs, one of them kept for the vLLM server:
# `accelerate launch --config_file recipes/accelerate_configs/zero2.yaml --num_processes=7 src/open_r1/grpo.py ...`
OPENR1_PROCESSES = {
    "math_demo.yaml": 7,
    "code_demo.yaml": 7,
    "ioi_demo.yaml": 7,
    "simple_rl_shaping.yaml": 7,
    "hub_cluster.yaml": 7,
}
# The keys open-r1 has and grpokit accepts but refuses when set: they drive open-r1's Hub and Slurm tooling.
REFUSED = {
    "hub_cluster.yaml": {
        "callbacks",
        "benchmarks",
        "hub_model_revision",
        "push_to_hub_revision",
        "overwrite_hub_revision",
    },
}
# Recipes whose batch geometry holds at 7 processes but not at 1 (groups of 14 or 7 completions).
ONLY_AT_SEVEN = ["code_demo.yaml", "ioi_demo.yaml", "simple_rl_shaping.yaml"]

# Every key of open-r1's five GRPO recipes (the demo, code, IOI, SimpleRL and Codeforces recipes, with the distilled
# model's chat template), and the open-r1 fields and rewards of the shaping and code rewards they use.
OPENR1_KEYS = {
    # model
    "model_name_or_path",
    "model_revision",
    "torch_dtype",
    "attn_implementation",
    # data
    "dataset_name",
    "dataset_config",
    "dataset_prompt_column",
    "system_prompt",
    "chat_template",
    # launch
    "num_processes",
    # generation and vLLM
    "max_prompt_length",
    "max_completion_length",
    "num_generations",
    "temperature",
    "use_vllm",
    "vllm_mode",
    "vllm_gpu_memory_utilization",
    # rewards and their open-r1 fields
    "reward_funcs",
    "reward_weights",
    "cosine_min_value_wrong",
    "cosine_max_value_wrong",
    "cosine_min_value_correct",
    "cosine_max_value_correct",
    "cosine_max_len",
    "repetition_n_grams",
    "repetition_max_penalty",
    "code_language",
    "code_provider",
    "ioi_provider",
    "e2b_router_url",
    "parallel_code_exec_per_proc",
    "code_eval_test_batch_size",
    # loss
    "beta",
    "loss_type",
    "scale_rewards",
    "mask_truncated_completions",
    # training
    "bf16",
    "do_eval",
    "eval_strategy",
    "eval_steps",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_ratio",
    "max_grad_norm",
    "max_steps",
    "num_train_epochs",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "seed",
    # logging, saving, Hub
    "log_completions",
    "log_level",
    "logging_first_step",
    "logging_steps",
    "logging_strategy",
    "report_to",
    "wandb_entity",
    "wandb_project",
    "wandb_run_group",
    "output_dir",
    "overwrite_output_dir",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "push_to_hub",
    "hub_model_id",
    "hub_strategy",
    "hub_model_revision",
    "push_to_hub_revision",
    "overwrite_hub_revision",
    "callbacks",
    "benchmarks",
}
OPENR1_REWARDS = {
    "accuracy",
    "format",
    "tag_count",
    "code",
    "binary_code",
    "code_format",
    "ioi_code",
    "cosine",
    "repetition_penalty",
}


def recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / name).read_text(encoding="utf-8"))


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to open a connection or resolve a host name is recorded and fails."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args[1:] if args and isinstance(args[0], socket.socket) else args)
        raise OSError("network access during a configuration check")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


def error_fields(result) -> dict[str, str]:
    """field -> its error line without the `error: ` prefix."""
    fields = {}
    for line in result.errors:
        match = re.match(r"^error: (\w+)=", line)
        assert match, line
        fields[match.group(1)] = line[len("error: ") :]
    return fields


# ---- the recipes cover open-r1's keys and rewards


def test_recipes_use_every_openr1_key_and_reward():
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == sorted(OPENR1_PROCESSES)
    keys, rewards = set(), set()
    for name in OPENR1_PROCESSES:
        data = recipe(name)
        keys |= set(data)
        rewards |= {r if isinstance(r, str) else r["name"] for r in data["reward_funcs"]}
    assert OPENR1_KEYS - keys == set()
    assert OPENR1_REWARDS - rewards == set()
    assert set().union(*REFUSED.values()) <= keys


# ---- validation at open-r1's process count


@pytest.mark.parametrize("name", sorted(OPENR1_PROCESSES))
def test_recipe_validates_at_openr1_process_count(cli, no_network, name):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # tests/conftest.py; hub-id model paths must not be fetched
    processes = OPENR1_PROCESSES[name]
    result = cli("config", "validate", "--config", RECIPES / name, "--num_processes", processes)
    assert no_network == []
    assert f"note: launch: {processes} process(es) (num_processes (cli))" in result.err
    assert "Traceback" not in result.err
    refused = REFUSED.get(name, set())
    if not refused:
        assert (result.code, result.out, result.errors) == (0, "ok\n", []), result.err
        return
    assert result.code == 2 and result.out == "", result.err
    fields = error_fields(result)
    assert set(fields) == refused, result.err
    for field, line in fields.items():
        assert line.endswith(f": {NOT_IMPLEMENTED[field]}"), line  # the reason `grpokit train` gives


def test_refused_lines_name_the_values(cli):
    result = cli("config", "validate", "--config", RECIPES / "hub_cluster.yaml", "--num_processes", 7)
    fields = error_fields(result)
    assert fields["callbacks"].startswith("callbacks=['push_to_hub_revision']: open-r1's callbacks need")
    assert fields["benchmarks"].startswith("benchmarks=['lcb_v4', 'aime24']: ")
    assert fields["hub_model_revision"] == (
        "hub_model_revision='v02.01': pushes to a Hub branch are not supported (runs are offline-first)"
    )
    assert fields["push_to_hub_revision"].startswith("push_to_hub_revision=True: ")


def test_recipe_without_refused_keys_validates(cli, no_network, write):
    # The same recipe with the refused keys taken out (what a user migrating from open-r1 does) is fine.
    data = {k: v for k, v in recipe("hub_cluster.yaml").items() if k not in REFUSED["hub_cluster.yaml"]}
    path = write("hub_cluster_local.yaml", yaml.safe_dump(data, sort_keys=False))
    result = cli("config", "validate", "--config", path, "--num_processes", 7)
    assert no_network == []
    assert (result.code, result.out, result.errors) == (0, "ok\n", []), result.err


@pytest.mark.parametrize("name", ONLY_AT_SEVEN)
def test_without_process_count_a_note_names_seven(cli, name):
    # without a count, and asked for notes (--geometry-notes): the note; without the flag it is an error at 1 (below)
    result = cli("config", "validate", "--config", RECIPES / name, "--geometry-notes")
    assert (result.code, result.out, result.errors) == (0, "ok\n", []), result.err
    notes = [line for line in result.err.splitlines() if line.startswith("note: no process count given")]
    assert len(notes) == 1, result.err
    assert f"num_generations={recipe(name)['num_generations']} " in notes[0]
    assert "the batch geometry holds at 7, 14 or 21 processes" in notes[0]
    # One process is what the note says: the rule it names does fail there.
    at_one = cli("config", "validate", "--config", RECIPES / name, "--num_processes", 1)
    assert at_one.code == 2 and any(e.startswith("error: num_generations=") for e in at_one.errors), at_one.err


def test_recipe_valid_at_any_count_has_no_note(cli):
    result = cli("config", "validate", "--config", RECIPES / "math_demo.yaml")
    assert result.out == "ok\n" and "note: no process count given" not in result.err


# ---- two recipes train a few steps on a tiny local model with their own rewards


def run_grpokit(*args, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(
        [sys.executable, "-m", "grpokit", *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout
    )


def local_recipe(tmp_path, name: str) -> Path:
    """The recipe without the keys grpokit refuses (none in the two trained here, kept for the shape)."""
    data = {k: v for k, v in recipe(name).items() if k not in REFUSED.get(name, set())}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# Size and hardware settings of a CPU run; everything else (rewards, prompts, schedule) is the recipe's.
CPU_OVERRIDES = {
    "max_steps": 2,
    "num_generations": 2,
    "gradient_accumulation_steps": 1,
    "max_completion_length": 8,
    "logging_steps": 1,
    "use_vllm": "false",
    "bf16": "false",
    "dtype": "float32",
    "attn_implementation": "eager",
    "gradient_checkpointing": "false",
    "report_to": "none",
    "push_to_hub": "false",
    "save_strategy": "no",
}


def train_small(tmp_path, model_dir, config: Path, data: Path, per_device: int):
    overrides = {
        **CPU_OVERRIDES,
        "model_name_or_path": model_dir,
        "dataset_name": data,
        "per_device_train_batch_size": per_device,
        "output_dir": tmp_path / "run",
    }
    flags = [arg for key, value in overrides.items() for arg in (f"--{key}", value)]
    return run_grpokit("train", "--config", config, *flags)


def train_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward" in r]


def test_math_recipe_trains_with_its_rewards(tmp_path, tiny_model_dir):
    config = local_recipe(tmp_path, "math_demo.yaml")
    column = recipe("math_demo.yaml")["dataset_prompt_column"]
    rows = [{column: f"What is {i} times 3?", "solution": f"${3 * i}$"} for i in range(8)]
    data = write_jsonl(tmp_path / "math.jsonl", rows)
    result = train_small(tmp_path, tiny_model_dir, config, data, per_device=4)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = train_rows(tmp_path / "run")
    assert [r["step"] for r in steps] == [1, 2]
    for name in ("accuracy", "format", "tag_count"):
        for row in steps:
            value = row[f"rewards/{name}/mean"]
            assert isinstance(value, float) and 0.0 <= value <= 1.0, (name, value)


CODE_ROW = {
    "language": "python",
    "test_cases": [
        {"input": "3 4\n", "output": "7\n"},
        {"input": "10 -2\n", "output": "8\n"},
        {"input": "0 0\n", "output": "0\n"},
    ],
}
CORRECT_COMPLETION = (
    "<think>\nRead the two numbers and add them.\n</think>\n<answer>\n"
    "```python\na, b = map(int, input().split())\nprint(a + b)\n```\n</answer>"
)


def test_code_recipe_trains_with_its_rewards(tmp_path, tiny_model_dir):
    config = local_recipe(tmp_path, "code_demo.yaml")
    column = recipe("code_demo.yaml")["dataset_prompt_column"]
    rows = [
        {column: f"Problem {i}: read two integers, print their sum.", "verification_info": CODE_ROW} for i in range(4)
    ]
    data = write_jsonl(tmp_path / "code.jsonl", rows)
    result = train_small(tmp_path, tiny_model_dir, config, data, per_device=2)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = train_rows(tmp_path / "run")
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        for name in ("code", "code_format"):
            value = row[f"rewards/{name}/mean"]
            # a number: the reward was called on rows with tests (None everywhere would leave no number)
            assert isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= 1.0, (name, value)


def test_code_recipe_rewards_score_a_correct_completion_of_its_row(tmp_path):
    # The rewards as the recipe builds them (its code_provider, code_language, parallel_code_exec_per_proc ...), on
    # the dataset row of the training test: the program really runs in the sandbox and passes every test.
    argv = ["--config", str(RECIPES / "code_demo.yaml"), "--num_processes", "7"]
    values = TrlParser().resolve(argv, launch_options=LAUNCH).values
    code = resolve_reward("code", defaults=reward_defaults(values))
    code_format = resolve_reward("code_format", defaults=reward_defaults(values))
    wrong = CORRECT_COMPLETION.replace("a + b", "a - b")
    assert code(completions=[CORRECT_COMPLETION, wrong], verification_info=[CODE_ROW, CODE_ROW]) == [
        1.0,
        pytest.approx(1 / 3),  # only 0 0 -> 0 passes
    ]
    assert code_format(completions=[CORRECT_COMPLETION, "```python\nprint(1)\n```"]) == [1.0, 0.0]


def test_the_docs_list_every_field_grpokit_refuses_as_not_supported_yet():
    """The documentation's "Not supported yet" table (Moving from TRL) names exactly the fields of
    `config/support.py`'s table."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "moving-from-trl.md").read_text()
    section = readme.split("\n## Not supported yet\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = {name for cell in rows for name in re.findall(r"`([a-z_0-9]+)`", cell)}
    assert listed == set(NOT_IMPLEMENTED)
