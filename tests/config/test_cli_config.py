"""`grpokit config validate|show|plan|schema|diff` and `grpokit recipes`, run in-process through `grpokit.cli.main`."""

import contextlib
import dataclasses
import io
import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
import yaml
from _config_helpers import console_script, plan_rows

from grpokit.cli import main
from grpokit.config.migrations import DEPRECATED_FIELDS, RENAMED_KEYS
from grpokit.config.parser import DEFAULT_TYPES
from grpokit.config.recipes import load_recipe, recipe_names, recipe_summary, recipe_text

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
EXAMPLE_ENV = ("TOKENIZERS_PARALLELISM", "WANDB_PROJECT")  # set by examples/open_r1_style.yaml's env: section
FIELDS = {f.name for t in DEFAULT_TYPES for f in dataclasses.fields(t) if f.init}
SOURCE = re.compile(r"^(default|cli|derived|recipe:[a-z0-9_]+|yaml:.+:\d+|migrated:[a-z0-9_]+)$")


def show_json(cli, *args) -> dict:
    result = cli("config", "show", "--format", "json", *args)
    assert result.code == 0, result.err
    return json.loads(result.out)


# ---- show


def test_show_json_is_exactly_one_object(cli, write):
    result = cli("config", "show", "--format", "json", "--config", write("c.yaml", "beta: 0.04\n"), "--bf16", "true")
    assert result.code == 0
    decoded, end = json.JSONDecoder().raw_decode(result.out)
    assert result.out[end:].strip() == ""  # nothing after the object
    assert isinstance(decoded, dict)
    assert set(decoded) == FIELDS
    for name, entry in decoded.items():
        assert set(entry) == {"value", "source"}, name
        assert SOURCE.match(entry["source"]), (name, entry["source"])
    assert decoded["beta"]["value"] == 0.04 and decoded["bf16"] == {"value": True, "source": "cli"}
    # notes and warnings never go to stdout
    assert all(line.startswith(("note: ", "warning: ")) for line in result.err.splitlines())


def test_show_json_from_the_console_script(tmp_path):
    """The real console script prints nothing but the JSON object on stdout (libraries' chatter goes elsewhere)."""
    proc = console_script("config", "show", "--format", "json", "--recipe", "dapo", cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    data = json.loads(out)
    assert data["loss_type"] == {"value": "dapo", "source": "recipe:dapo"}
    assert set(data) == FIELDS


def test_show_table(cli, write):
    path = write("c.yaml", "beta: 0.04\n")
    result = cli("config", "show", "--config", path)
    assert result.code == 0
    lines = result.out.splitlines()
    assert lines[0].split() == ["field", "value", "source"]
    rows = {line.split()[0]: line.split()[-1] for line in lines[2:]}
    assert rows["beta"] == f"yaml:{path}:1"
    assert "top_p" not in rows  # defaults only with --all
    everything = cli("config", "show", "--all", "--config", path)
    assert len(everything.out.splitlines()) == len(FIELDS) + 2


# ---- show --format yaml round-trips


ROUND_TRIPS = {
    "recipe-and-derived": (
        "recipe: dapo\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nnum_generations: 4\n"
        "steps_per_generation: 4\n",
        [],
    ),
    "flags-and-json": (
        "beta: 0.04\n",
        [
            "--recipe",
            "gspo",
            "--generation_kwargs",
            '{"max_new_tokens": 32}',
            "--reward_funcs",
            "format",
            "tag_count",
            "--reward_weights",
            "1",
            "0.5",
            "--torch_dtype",
            "bfloat16",
        ],
    ),
    "normalised-values": (
        "use_peft: true\nlora_target_modules: [all-linear]\npad_to_multiple_of: auto\ngeneration_batch_size: 16\n"
        "per_device_train_batch_size: 4\nnum_generations: 4\noutput_dir: null\n",
        [],
    ),
    "strings-and-mixtures": (
        'system_prompt: "Think first.\\n\\tThen answer: <answer>…</answer> \\"quoted\\""\n'
        "datasets:\n  - path: a.jsonl\n    fraction: 0.5\n  - {path: b.jsonl, split: test, columns: [prompt]}\n"
        "reward_funcs:\n  - format\n  - {name: soft_overlong_punishment, kwargs: {soft_punish_cache: 4}}\n"
        "eval_strategy: steps\nscale_rewards: false\nwarmup_ratio: 0.05\nlr_scheduler_kwargs: {min_lr_rate: 0.1}\n",
        [],
    ),
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS) + [p.name for p in EXAMPLES])
def test_show_yaml_round_trip(cli, write, clean_env, name):
    clean_env(*EXAMPLE_ENV)
    if name in ROUND_TRIPS:
        text, flags = ROUND_TRIPS[name]
        args = ["--config", write("in.yaml", text), *flags]
    else:
        args = ["--config", str(next(p for p in EXAMPLES if p.name == name))]
    first = show_json(cli, *args)
    rendered = cli("config", "show", "--format", "yaml", *args)
    assert rendered.code == 0, rendered.err
    again = show_json(cli, "--config", write("resolved.yaml", rendered.out))
    assert {k: v["value"] for k, v in again.items()} == {k: v["value"] for k, v in first.items()}
    for key, entry in first.items():
        if entry["source"] in ("default", "derived"):
            assert again[key]["source"] == entry["source"], key
    # Every line of the file says where its value came from.
    for line in rendered.out.splitlines():
        assert line.startswith("#") or SOURCE.match(line.rsplit("  # ", 1)[1]), line


def test_show_yaml_names_its_sources(cli, write):
    path = write("in.yaml", "recipe: dapo\nnum_generations: 4\nper_device_train_batch_size: 4\n")
    out = cli("config", "show", "--format", "yaml", "--config", path, "--beta", "0.01").out
    assert 'loss_type: "dapo"  # recipe:dapo' in out
    assert f"num_generations: 4  # yaml:{path}:2" in out
    assert "beta: 0.01  # cli" in out
    assert "# derived when resolved:" in out and "generation_batch_size=4" in out


# ---- plan


@pytest.mark.parametrize(
    "config, expected",
    [
        (
            # the example, worked out by hand: 4 x 1 process x 4 steps = 16 completions per round, 16 / 4 = 4
            # prompts, 4 micro-steps per round / 2 per optimizer step = 2 optimizer steps: the policy moves mid-round
            "per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nnum_generations: 4\nsteps_per_generation: 4\n",
            {
                "processes": "1",
                "per_device_train_batch_size": "4",
                "gradient_accumulation_steps": "2",
                "num_generations": "4",
                "generation_batch_size": "16",
                "steps_per_generation": "4",
                "prompts_per_generation": "4",
                "completions_per_optimizer_step": "8",
                "optimizer_steps_per_generation": "2.0",
                "num_iterations": "1",
                "on_policy": "False",
            },
        ),
        (
            # steps_per_generation defaults to gradient_accumulation_steps: one optimizer step per round, on-policy
            "per_device_train_batch_size: 8\ngradient_accumulation_steps: 4\nnum_generations: 8\n",
            {
                "generation_batch_size": "32",
                "steps_per_generation": "4",
                "prompts_per_generation": "4",
                "completions_per_optimizer_step": "32",
                "optimizer_steps_per_generation": "1.0",
                "on_policy": "True",
            },
        ),
        (
            # two passes over each round: two optimizer steps per round
            "per_device_train_batch_size: 8\ngradient_accumulation_steps: 4\nnum_generations: 8\nnum_iterations: 2\n",
            {"generation_batch_size": "32", "optimizer_steps_per_generation": "2.0", "on_policy": "False"},
        ),
        (
            # generation_batch_size given: 24 / 4 = 6 micro-steps per round, 6 / 3 = 2 optimizer steps
            "per_device_train_batch_size: 4\ngradient_accumulation_steps: 3\nnum_generations: 6\n"
            "generation_batch_size: 24\n",
            {
                "steps_per_generation": "6",
                "prompts_per_generation": "4",
                "completions_per_optimizer_step": "12",
                "optimizer_steps_per_generation": "2.0",
                "on_policy": "False",
            },
        ),
    ],
)
def test_plan_geometry(cli, write, config, expected):
    result = cli("config", "plan", "--config", write("plan.yaml", config))
    assert result.code == 0, result.err
    rows = plan_rows(result.out, "batch geometry")
    assert {k: rows[k][0] for k in expected} == expected
    assert "unknown: model_name_or_path is not a local directory" in result.out


def test_plan_rejects_what_validate_rejects(cli):
    result = cli("config", "plan", "--num_generations", "3", "--num_processes", "1")  # 8 x 1 x 1: not groups of 3
    assert result.code == 2 and "num_generations=3" in result.err and result.out == ""


def plan_parameters(result) -> int:
    size, how = plan_rows(result.out, "memory per process (estimate)")["parameters"]
    return int(how.split(" weights")[0].replace(",", ""))


def test_plan_memory_for_the_tiny_model(cli, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained(tiny_model_dir).num_parameters()
    result = cli("config", "plan", "--model_name_or_path", tiny_model_dir, "--dtype", "float32")
    assert result.code == 0, result.err
    estimated = plan_parameters(result)
    assert abs(estimated - real) <= 0.01 * real, (estimated, real)
    rows = plan_rows(result.out, "memory per process (estimate)")
    kib = estimated * 4 / 1024
    assert rows["weights"][0] == f"{kib:.1f} KiB" and rows["gradients"][0] == f"{kib:.1f} KiB"
    assert rows["optimizer state"][0] == f"{2 * kib:.1f} KiB"
    assert rows["reference model"][0] == "0"  # beta = 0: no reference model
    with_ref = plan_rows(
        cli("config", "plan", "--model_name_or_path", tiny_model_dir, "--beta", "0.04", "--dtype", "bfloat16").out,
        "memory per process (estimate)",
    )
    assert with_ref["reference model"][0] == with_ref["weights"][0] == f"{kib / 2:.1f} KiB"


def _config_dirs():
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = {"vocab_size": 100, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    return {
        "llama-biases-untied": LlamaConfig(
            hidden_size=48,
            num_key_value_heads=2,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=False,
            **common,
        ),
        "qwen2-untied-mha": Qwen2Config(hidden_size=32, num_key_value_heads=4, tie_word_embeddings=False, **common),
        "qwen3-wide-heads": Qwen3Config(
            hidden_size=32, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, **common
        ),
    }


@pytest.mark.parametrize("arch", ["llama-biases-untied", "qwen2-untied-mha", "qwen3-wide-heads"])
def test_plan_parameter_count_other_architectures(cli, tmp_path, arch):
    from transformers import AutoModelForCausalLM

    config = _config_dirs()[arch]
    config.save_pretrained(tmp_path)  # the plan reads config.json only
    real = AutoModelForCausalLM.from_config(config).num_parameters()
    estimated = plan_parameters(cli("config", "plan", "--model_name_or_path", tmp_path))
    assert abs(estimated - real) <= 0.01 * real, (estimated, real)


# ---- schema


@pytest.fixture(scope="module")
def schema():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["config", "schema"]) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def validator(schema):
    return jsonschema.Draft202012Validator(schema)


def test_schema_is_valid_draft_2020_12(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["type"] == "object" and schema["additionalProperties"] is False


def test_schema_describes_every_key(schema):
    properties = schema["properties"]
    assert FIELDS <= set(properties)
    launch = {"accelerate_config", "num_processes", "main_process_port"}  # `grpokit train`'s launch options
    assert set(properties) - FIELDS == {"env"} | launch | (set(RENAMED_KEYS) - DEPRECATED_FIELDS)
    for name in FIELDS:
        assert properties[name].get("description"), name
    assert properties["num_generations"]["minimum"] == 2 and properties["num_generations"]["default"] == 8
    assert properties["top_p"]["exclusiveMinimum"] == 0 and properties["top_p"]["maximum"] == 1
    assert set(properties["loss_type"]["enum"]) == {
        "grpo",
        "dr_grpo",
        "dapo",
        "bnpo",
        "cispo",
        "sapo",
        "luspo",
        "vespo",
    }
    assert "cosine" in properties["lr_scheduler_type"]["enum"]
    assert set(properties["recipe"]["enum"]) == set(recipe_names()) | {None}
    for name in set(RENAMED_KEYS) | DEPRECATED_FIELDS:
        assert properties[name]["deprecated"] is True, name


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_schema_validates_examples(validator, path):
    assert len(EXAMPLES) >= 2
    data = yaml.safe_load(path.read_text())
    assert [e.message for e in validator.iter_errors(data)] == []


@pytest.mark.parametrize("name", recipe_names())
def test_schema_validates_recipes(validator, name):
    assert [e.message for e in validator.iter_errors(load_recipe(name))] == []


@pytest.mark.parametrize(
    "data",
    [
        {"num_generation": 8},  # unknown key
        {"num_generations": "eight"},  # wrong type
        {"num_generations": 8.5},
        {"bf16": "maybe"},
        {"num_generations": 1},  # out of range
        {"top_p": 0},
        {"vllm_server_port": 70000},
        {"loss_type": "dapoo"},  # not one of the choices
        {"recipe": "dapoo"},
        {"datasets": [{"name": "x"}]},  # no path
        {"datasets": [{"path": "x", "splt": "train"}]},
        {"datasets": [{"path": "x", "fraction": 1.5}]},
        {"reward_funcs": [{"nam": "format"}]},
        {"env": {"A": [1, 2]}},
        {"generation_kwargs": [1]},
        {"num_processes": 0},
    ],
    ids=lambda d: json.dumps(d),
)
def test_schema_rejects(validator, data):
    assert list(validator.iter_errors(data))


def test_schema_accepts_what_the_parser_accepts(validator):
    ok = {
        "recipe": "dapo",
        "env": {"A": "1", "B": True},
        "reward_funcs": ["format", {"name": "cosine", "kwargs": {"max_len": 100}}],
        "reward_weights": [1, 0.5],
        "datasets": [{"path": "a.jsonl", "fraction": 0.5}],
        "torch_dtype": "bfloat16",
        "scale_rewards": False,
        "bf16": None,
        "pad_to_multiple_of": "auto",
        "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
        "accelerate_config": "zero2",
        "num_processes": 4,
    }
    assert [e.message for e in validator.iter_errors(ok)] == []


# ---- diff


def test_diff(cli, write):
    a = write("a.yaml", "beta: 0.0\nnum_generations: 8\n")
    b = write("b.yaml", "num_generations: 8\nbeta: 0.04\nloss_type: grpo\n")
    result = cli("config", "diff", a, b)
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        f'loss_type: "dapo" (default) -> "grpo" (yaml:{b}:3)',
        f"beta: 0.0 (yaml:{a}:1) -> 0.04 (yaml:{b}:2)",
    ]


def test_diff_with_flags_and_same_files(cli, write):
    a = write("a.yaml", "beta: 0.0\n")
    b = write("b.yaml", "beta: 0.04\n")
    assert cli("config", "diff", a, a).out == "no differences\n"
    assert cli("config", "diff", a, b, "--beta", "0.1").out == "no differences\n"  # flags apply to both sides


def test_diff_of_a_bad_file(cli, write):
    a = write("a.yaml", "beta: 0.0\n")
    b = write("b.yaml", "beta: -1\n")
    result = cli("config", "diff", a, b)
    assert result.code == 2 and "beta=-1.0" in result.err and result.out == ""


# ---- recipes


def test_recipes_list(cli):
    result = cli("recipes")
    assert result.code == 0
    listed, name = {}, None  # a long summary is wrapped: its continuation lines are indented
    for line in result.out.splitlines():
        if line.startswith(" "):
            listed[name] += " " + line.strip()
        else:
            name, listed[name] = line.split(None, 1)
    assert listed == {name: recipe_summary(name) for name in recipe_names()}
    assert listed["cispo"].endswith("arXiv:2506.13585), section 3.1.")  # the whole first sentence, over two lines
    assert {"grpo", "dapo", "dr_grpo", "gspo", "cispo", "sapo", "deepseek_r1"} <= set(listed)


@pytest.mark.parametrize("name", recipe_names())
def test_recipes_show(cli, name):
    result = cli("recipes", "show", name)
    assert result.code == 0 and result.out == recipe_text(name)
    assert result.out.startswith("# ")  # each recipe cites its source first
    assert yaml.safe_load(result.out) == load_recipe(name)


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_validates(cli, name):
    result = cli("config", "validate", "--recipe", name)
    assert result.code == 0, result.err
    assert result.out == "ok\n"
    shown = show_json(cli, "--recipe", name)
    for key, value in load_recipe(name).items():
        assert shown[key]["source"] == f"recipe:{name}", key
        assert shown[key]["value"] == value, key


# ---- vLLM notes


def test_vllm_notes_name_what_has_no_effect(cli, write):
    yaml_text = "use_vllm: true\nvllm_mode: server\nvllm_gpu_memory_utilization: 0.5\nvllm_enable_sleep_mode: true\n"
    result = cli("config", "validate", "--config", write("c.yaml", yaml_text))
    assert result.code == 0, result.err
    assert (
        "vllm_gpu_memory_utilization=0.5 has no effect with vllm_mode='server': it belongs to the server "
        "(grpokit vllm-serve flags)" in result.err
    )
    assert "vllm_enable_sleep_mode=True has no effect with vllm_mode='server'" in result.err
    colocate = cli("config", "validate", "--config", write("d.yaml", "use_vllm: true\nvllm_enable_sleep_mode: true\n"))
    assert colocate.code == 0, colocate.err
    if not torch.cuda.is_available():
        assert "vllm_enable_sleep_mode=True has no effect on this machine: vLLM sleeps only on CUDA" in colocate.err
    assert "with vllm_mode" not in colocate.err  # nothing of server mode was set


def test_4bit_options_without_load_in_4bit_are_named(cli, write):
    yaml_text = "use_peft: true\nbnb_4bit_quant_type: fp4\nuse_bnb_nested_quant: true\nbnb_4bit_quant_storage: uint8\n"
    result = cli("config", "validate", "--config", write("c.yaml", yaml_text))
    assert result.code == 0, result.err
    assert [line for line in result.err.splitlines() if "load_in_4bit" in line] == [
        "warning: bnb_4bit_quant_type='fp4' has no effect without load_in_4bit: true",
        "warning: use_bnb_nested_quant=True has no effect without load_in_4bit: true",
        "warning: bnb_4bit_quant_storage='uint8' has no effect without load_in_4bit: true",
    ]
    on = cli("config", "validate", "--config", write("d.yaml", yaml_text + "load_in_4bit: true\n"))
    assert "has no effect" not in on.err


def test_vllm_fields_without_use_vllm_are_named(cli, write):
    result = cli("config", "validate", "--config", write("c.yaml", "vllm_mode: server\nvllm_server_port: 8011\n"))
    assert result.code == 0, result.err
    assert "vllm_mode='server' has no effect without use_vllm: true" in result.err
    assert "vllm_server_port=8011 has no effect without use_vllm: true" in result.err
    assert "vllm_gpu_memory_utilization" not in result.err  # left at its default: nothing to say
