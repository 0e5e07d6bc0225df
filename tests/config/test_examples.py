"""The shipped examples resolve as a TRL user and an open-r1 user expect, with the source of every value."""

import os
from pathlib import Path

import pytest
from _config_helpers import line_of

from grpokit.config.grpo_config import GRPOConfig
from grpokit.config.model_config import ModelConfig
from grpokit.config.parser import TrlParser
from grpokit.config.script_args import GRPOScriptArguments

EXAMPLES = Path(__file__).parents[2] / "examples"
TRL_STYLE = EXAMPLES / "trl_style_grpo.yaml"
OPEN_R1_STYLE = EXAMPLES / "open_r1_style.yaml"


@pytest.fixture
def open_r1_env(clean_env):
    clean_env("TOKENIZERS_PARALLELISM", "WANDB_PROJECT")


def resolve(path, *flags):
    return TrlParser().resolve(["--config", str(path), *flags])


def test_reward_names_exist():
    rewards = pytest.importorskip("grpokit.rewards")
    if not hasattr(rewards, "reward_names"):
        pytest.skip("grpokit.rewards has no registry")
    for path, names in (
        (TRL_STYLE, ["accuracy_reward", "think_format_reward"]),
        (OPEN_R1_STYLE, ["accuracy", "format", "tag_count"]),
    ):
        assert resolve(path).values["reward_funcs"] == names
        assert set(names) <= set(rewards.reward_names())


# ---- TRL style


def test_trl_style_with_trls_parser_api():
    parser = TrlParser([GRPOScriptArguments, GRPOConfig, ModelConfig])
    script_args, training_args, model_args = parser.parse_args_and_config(["--config", str(TRL_STYLE)])
    assert script_args.dataset_name == "trl-lib/DeepMath-103K" and script_args.dataset_train_split == "train"
    assert script_args.reward_funcs == ["accuracy_reward", "think_format_reward"]
    assert model_args.model_name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert model_args.dtype == "bfloat16" and model_args.attn_implementation == "sdpa"
    t = training_args
    assert t.output_dir == "runs/qwen2.5-0.5b-grpo"
    assert t.learning_rate == 1e-6 and t.lr_scheduler_type.value == "cosine" and t.num_train_epochs == 1.0
    assert (t.per_device_train_batch_size, t.gradient_accumulation_steps, t.num_generations) == (8, 4, 8)
    assert t.generation_batch_size == 32 and t.steps_per_generation == 4  # derived: 8 x 1 process x 4
    assert t.max_completion_length == 1024 and t.temperature == 1.0
    assert t.beta == 0.0 and t.loss_type == "dapo" and t.scale_rewards == "group"
    assert t.bf16 is True and t.gradient_checkpointing is True
    assert t.logging_steps == 5 and t.save_strategy.value == "steps" and t.save_steps == 100
    assert t.report_to == []  # "none", as TrainingArguments stores it
    assert t.seed == 42


def test_trl_style_provenance():
    r = resolve(TRL_STYLE)
    assert r.warnings == []  # nothing migrated: every key is a TRL 1.16 key
    given = [
        "model_name_or_path", "dtype", "attn_implementation", "dataset_name", "dataset_train_split", "reward_funcs",
        "output_dir", "learning_rate", "lr_scheduler_type", "num_train_epochs", "per_device_train_batch_size",
        "gradient_accumulation_steps", "num_generations", "max_completion_length", "temperature", "beta",
        "loss_type", "scale_rewards", "bf16", "gradient_checkpointing", "logging_steps", "save_strategy",
        "save_steps", "report_to", "seed",
    ]  # fmt: skip
    for key in given:
        assert r.sources[key] == f"yaml:{TRL_STYLE}:{line_of(TRL_STYLE, key)}", key
    assert r.sources["model_name_or_path"] == f"yaml:{TRL_STYLE}:8"  # pinned, in case line_of is ever wrong
    assert r.sources["generation_batch_size"] == "derived" and r.sources["steps_per_generation"] == "derived"
    assert r.sources["epsilon"] == "default" and r.sources["recipe"] == "default"
    non_default = {k for k, s in r.sources.items() if s != "default"}
    assert non_default == set(given) | {"generation_batch_size", "steps_per_generation", "pad_to_multiple_of"}


def test_trl_style_overrides_from_the_command_line():
    r = resolve(TRL_STYLE, "--learning_rate", "5e-7", "--num_generations", "16")
    assert r.values["learning_rate"] == 5e-7 and r.sources["learning_rate"] == "cli"
    assert r.values["generation_batch_size"] == 32  # still 8 x 4: 32 completions = 2 groups of 16


# ---- open-r1 style


def test_open_r1_style_values(open_r1_env):
    r = resolve(OPEN_R1_STYLE)
    v = r.values
    assert v["recipe"] == "dapo"
    # from the dapo recipe, not overridden by the file
    assert (v["loss_type"], v["epsilon"], v["epsilon_high"], v["beta"]) == ("dapo", 0.2, 0.28, 0.0)
    assert v["mask_truncated_completions"] is True
    # migrated spellings
    assert v["dtype"] == "bfloat16" and v["warmup_steps"] == 0.1
    assert v["overwrite_output_dir"] is True  # a grpokit field: a fresh run may replace a previous one
    # data and rewards
    assert v["dataset_name"] == "open-r1/OpenR1-Math-220k" and v["dataset_prompt_column"] == "problem"
    assert v["system_prompt"].startswith("You are a helpful AI Assistant")
    assert v["system_prompt"].endswith("<think>\n...\n</think>\n<answer>\n...\n</answer>")
    assert "  " not in v["system_prompt"]  # the folded lines join with single spaces
    assert v["reward_funcs"] == ["accuracy", "format", "tag_count"] and v["reward_weights"] == [1.0, 1.0, 0.5]
    # scheduler and geometry
    assert v["lr_scheduler_type"] == "cosine_with_min_lr" and v["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1}
    assert v["learning_rate"] == 3e-6 and v["temperature"] == 0.7 and v["max_prompt_length"] == 512
    assert v["generation_batch_size"] == 64 and v["steps_per_generation"] == 4  # 16 x 1 process x 4 = 4 groups of 16


def test_open_r1_style_env(open_r1_env):
    assert "WANDB_PROJECT" not in os.environ
    resolve(OPEN_R1_STYLE)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"  # a YAML boolean, set as the string
    assert os.environ["WANDB_PROJECT"] == "open-r1-grpo"


def test_open_r1_style_provenance(open_r1_env):
    r = resolve(OPEN_R1_STYLE)
    path = OPEN_R1_STYLE
    assert r.sources["recipe"] == f"yaml:{path}:{line_of(path, 'recipe')}" == f"yaml:{path}:5"
    for key in ("loss_type", "epsilon", "epsilon_high", "beta", "mask_truncated_completions"):
        assert r.sources[key] == "recipe:dapo", key
    assert r.sources["dtype"] == "migrated:torch_dtype"
    assert r.sources["warmup_steps"] == "migrated:warmup_ratio"
    for key in (
        "model_name_or_path", "dataset_prompt_column", "system_prompt", "reward_funcs", "reward_weights",
        "lr_scheduler_type", "lr_scheduler_kwargs", "num_generations", "max_prompt_length", "temperature", "bf16",
    ):  # fmt: skip
        assert r.sources[key] == f"yaml:{path}:{line_of(path, key)}", key
    assert r.sources["generation_batch_size"] == "derived"
    warned = sorted(w.split(" ")[0] for w in r.warnings)
    assert warned == ["torch_dtype", "warmup_ratio"]
    for old in warned:
        assert any(w.startswith(f"{old} (yaml:{path}:{line_of(path, old)})") for w in r.warnings)


def test_open_r1_style_with_trls_parser_api(open_r1_env):
    parser = TrlParser([GRPOScriptArguments, GRPOConfig, ModelConfig])
    script_args, training_args, model_args = parser.parse_args_and_config(["--config", str(OPEN_R1_STYLE)])
    assert script_args.system_prompt.startswith("You are") and script_args.dataset_prompt_column == "problem"
    assert training_args.recipe == "dapo" and training_args.loss_type == "dapo"
    assert training_args.epsilon_high == 0.28 and training_args.warmup_steps == 0.1
    assert training_args.lr_scheduler_kwargs == {"min_lr_rate": 0.1}
    assert model_args.dtype == "bfloat16"


def test_examples_validate_from_the_cli(cli, open_r1_env):
    for path in (TRL_STYLE, OPEN_R1_STYLE):
        result = cli("config", "validate", "--config", path)
        assert result.code == 0 and result.out == "ok\n", result.err
