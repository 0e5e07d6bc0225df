"""The layered parser: defaults -> recipe -> YAML files (later wins) -> flags, with the source of every value;
`env:`, migrations, TRL's `parse_args_and_config` API, coercion of YAML values, and the dataclasses in Python."""

import dataclasses
import os

import pytest

from grpokit.config import resolver as resolver_module  # the resolution itself (TrlParser is one)
from grpokit.config.grpo_config import GRPOConfig
from grpokit.config.model_config import ModelConfig
from grpokit.config.parser import TrlParser
from grpokit.config.precision import bf16_supported
from grpokit.config.recipes import load_recipe, recipe_names
from grpokit.config.rules import ConfigError
from grpokit.config.script_args import DatasetMixtureConfig, GRPOScriptArguments, ScriptArguments


def resolve(*args):
    return TrlParser().resolve([str(a) for a in args])


def problems_of(*args):
    with pytest.raises(ConfigError) as excinfo:
        resolve(*args)
    return excinfo.value.problems


# ---- layering and provenance


@pytest.fixture
def layered(write):
    a = write(
        "a.yaml",
        "recipe: dapo\n"  # 1
        "epsilon_high: 0.3\n"  # 2: over the recipe's 0.28
        "beta: 0.01\n"  # 3: replaced by b.yaml
        "learning_rate: 1.0e-5\n"  # 4
        "per_device_train_batch_size: 4\n",  # 5
    )
    b = write(
        "b.yaml",
        "# later files win\n"  # 1
        "beta: 0.02\n"  # 2
        "\n"  # 3
        "temperature: 0.8\n"  # 4: replaced by the flag
        "torch_dtype: bfloat16\n"  # 5: migrated to dtype
        "num_generations: 4\n",  # 6
    )
    return a, b, resolve("--config", a, "--config", b, "--temperature", "0.9", "--top_k", "50")


def test_layers_values(layered):
    _, _, r = layered
    v = r.values
    assert v["loss_type"] == "dapo" and v["mask_truncated_completions"] is True  # recipe
    assert v["epsilon_high"] == 0.3  # yaml over recipe
    assert v["beta"] == 0.02  # later yaml over earlier yaml
    assert v["learning_rate"] == 1e-05
    assert v["temperature"] == 0.9 and v["top_k"] == 50  # flags over yaml
    assert v["dtype"] == "bfloat16"
    assert v["top_p"] == 1.0 and v["scale_rewards"] == "group"  # defaults
    # derived: per_device 4 x 1 process x steps_per_generation (= gradient_accumulation_steps, 1)
    assert v["generation_batch_size"] == 4 and v["steps_per_generation"] == 1


def test_layers_sources_with_exact_lines(layered):
    a, b, r = layered
    expected = {
        "recipe": f"yaml:{a}:1",
        "loss_type": "recipe:dapo",
        "epsilon": "recipe:dapo",
        "mask_truncated_completions": "recipe:dapo",
        "epsilon_high": f"yaml:{a}:2",
        "beta": f"yaml:{b}:2",
        "learning_rate": f"yaml:{a}:4",
        "per_device_train_batch_size": f"yaml:{a}:5",
        "temperature": "cli",
        "top_k": "cli",
        "dtype": "migrated:torch_dtype",
        "num_generations": f"yaml:{b}:6",
        "generation_batch_size": "derived",
        "steps_per_generation": "derived",
        "output_dir": "derived",
        "top_p": "default",
        "scale_rewards": "default",
        "model_name_or_path": "default",
    }
    assert {k: r.sources[k] for k in expected} == expected
    assert set(r.sources) == set(r.values)
    assert any("torch_dtype" in w and f"yaml:{b}:5" in w for w in r.warnings)


def test_recipe_flag_replaces_the_files_recipe(write):
    a = write("a.yaml", "recipe: dapo\nepsilon_high: 0.5\n")
    r = resolve("--config", a, "--recipe", "gspo")
    assert r.values["recipe"] == "gspo" and r.sources["recipe"] == "cli"
    assert r.values["importance_sampling_level"] == "sequence"
    assert r.sources["importance_sampling_level"] == "recipe:gspo"
    assert r.values["epsilon_high"] == 0.5 and r.sources["epsilon_high"] == f"yaml:{a}:2"
    # dapo's own keys are gone with it
    assert r.values["mask_truncated_completions"] is False and r.sources["mask_truncated_completions"] == "default"


def test_later_file_recipe_wins(write):
    a = write("a.yaml", "recipe: dapo\n")
    b = write("b.yaml", "beta: 0.0\nrecipe: dr_grpo\n")
    r = resolve("--config", a, "--config", b)
    assert r.values["recipe"] == "dr_grpo" and r.sources["recipe"] == f"yaml:{b}:2"
    assert r.values["loss_type"] == "dr_grpo" and r.sources["loss_type"] == "recipe:dr_grpo"


def test_recipe_keys_of_other_dataclasses(write):
    # deepseek_r1 sets reward_funcs, a GRPOScriptArguments field: it is layered like any other key.
    r = resolve("--recipe", "deepseek_r1")
    assert r.values["reward_funcs"] == ["accuracy", "format"] and r.sources["reward_funcs"] == "recipe:deepseek_r1"
    assert r.values["learning_rate"] == 3e-06


def test_cli_inline_values_and_negated_booleans():
    r = resolve("--beta=0.1", "--no_gradient_checkpointing", "--bf16", "--max-completion-length", "64")
    assert r.values["beta"] == 0.1
    assert r.values["gradient_checkpointing"] is False
    assert r.values["bf16"] is True
    assert r.values["max_completion_length"] == 64
    assert {r.sources[k] for k in ("beta", "gradient_checkpointing", "bf16", "max_completion_length")} == {"cli"}


def test_cli_list_values():
    r = resolve("--reward_funcs", "format", "tag_count", "--reward_weights", "1", "0.5")
    assert r.values["reward_funcs"] == ["format", "tag_count"]
    assert r.values["reward_weights"] == [1.0, 0.5]


def test_yaml_merge_keys_keep_their_lines(write):
    path = write("merge.yaml", "<<: {beta: 0.1, temperature: 0.7}\ntemperature: 0.9\n")
    r = resolve("--config", path)
    assert r.values["beta"] == 0.1 and r.sources["beta"] == f"yaml:{path}:1"
    assert r.values["temperature"] == 0.9 and r.sources["temperature"] == f"yaml:{path}:2"


def test_normalised_user_value_keeps_its_source(write):
    # ModelConfig turns a one-item list into peft's string form: the value is the user's, not derived.
    path = write("lora.yaml", "use_peft: true\nlora_target_modules: [all-linear]\n")
    r = resolve("--config", path)
    assert r.values["lora_target_modules"] == "all-linear"
    assert r.sources["lora_target_modules"] == f"yaml:{path}:2"


# ---- env:


ENV_NAMES = ("GRPOKIT_T_INT", "GRPOKIT_T_BOOL", "GRPOKIT_T_FLOAT", "GRPOKIT_T_STR", "GRPOKIT_T_NULL", "GRPOKIT_T_LATE")


def test_env_sets_variables_as_strings(write, clean_env):
    clean_env(*ENV_NAMES)
    a = write(
        "a.yaml",
        "env:\n  GRPOKIT_T_INT: 3\n  GRPOKIT_T_BOOL: true\n  GRPOKIT_T_FLOAT: 0.5\n  GRPOKIT_T_STR: hello\n"
        "  GRPOKIT_T_NULL: null\n  GRPOKIT_T_LATE: first\nbeta: 0.1\n",
    )
    b = write("b.yaml", "env:\n  GRPOKIT_T_LATE: second\n")
    r = resolve("--config", a, "--config", b)
    assert {n: os.environ[n] for n in ENV_NAMES} == {
        "GRPOKIT_T_INT": "3",
        "GRPOKIT_T_BOOL": "true",
        "GRPOKIT_T_FLOAT": "0.5",
        "GRPOKIT_T_STR": "hello",
        "GRPOKIT_T_NULL": "",
        "GRPOKIT_T_LATE": "second",  # later file wins
    }
    assert "env" not in r.values  # not a field: nothing to show or write back
    assert r.values["beta"] == 0.1


def test_env_is_applied_before_the_rest(write, clean_env, monkeypatch):
    """The variables are set before the recipe is loaded and before any rule is checked."""
    clean_env("GRPOKIT_T_ORDER")
    seen = {}
    original_load_recipe, original_check_geometry = resolver_module.load_recipe, resolver_module.check_geometry

    def load_recipe_spy(name):
        seen["recipe"] = os.environ.get("GRPOKIT_T_ORDER")
        return original_load_recipe(name)

    def check_geometry_spy(values, num_processes):
        seen["rules"] = os.environ.get("GRPOKIT_T_ORDER")
        return original_check_geometry(values, num_processes)

    monkeypatch.setattr(resolver_module, "load_recipe", load_recipe_spy)
    monkeypatch.setattr(resolver_module, "check_geometry", check_geometry_spy)
    path = write("env.yaml", "recipe: grpo\nenv:\n  GRPOKIT_T_ORDER: set\n")
    resolve("--config", path)
    assert seen == {"recipe": "set", "rules": "set"}


def test_clean_env_fixture_restores(clean_env):
    # The fixture above leaves nothing behind: a variable set by a config in one test is unset in the next.
    assert "GRPOKIT_T_ORDER" not in os.environ and "GRPOKIT_T_LATE" not in os.environ


# ---- migrations


@pytest.mark.parametrize(
    "yaml_text, field_name, value, source, warning",
    [
        ("torch_dtype: bfloat16\n", "dtype", "bfloat16", "migrated:torch_dtype", "renamed to dtype"),
        ("evaluation_strategy: steps\n", "eval_strategy", "steps", "migrated:evaluation_strategy", "eval_strategy"),
        (
            "use_transformers_paged: true\n",
            "use_transformers_continuous_batching",
            True,
            "migrated:use_transformers_paged",
            "use_transformers_continuous_batching",
        ),
        (
            "vllm_importance_sampling_cap: 2.5\n",
            "vllm_importance_sampling_clip_max",
            2.5,
            "migrated:vllm_importance_sampling_cap",
            "vllm_importance_sampling_clip_max",
        ),
        ("warmup_ratio: 0.1\n", "warmup_steps", 0.1, "migrated:warmup_ratio", "fraction of the training steps"),
    ],
)
def test_renamed_keys(write, yaml_text, field_name, value, source, warning):
    path = write("old.yaml", yaml_text)
    r = resolve("--config", path)
    assert r.values[field_name] == value and r.sources[field_name] == source
    old = yaml_text.split(":")[0]
    assert [w for w in r.warnings if w.startswith(f"{old} (yaml:{path}:1) is deprecated") and warning in w]


def test_renamed_key_on_the_command_line():
    r = resolve("--torch_dtype", "float16")
    assert r.values["dtype"] == "float16" and r.sources["dtype"] == "migrated:torch_dtype"
    assert any(w.startswith("torch_dtype (cli) is deprecated") for w in r.warnings)


def test_overwrite_output_dir_is_a_field_again(write):
    # transformers 5 dropped it; grpokit gives it back its meaning (a fresh run may replace a previous one)
    path = write("old.yaml", "overwrite_output_dir: true\noutput_dir: out\n")
    r = resolve("--config", path)
    assert r.values["overwrite_output_dir"] is True and r.sources["overwrite_output_dir"] == f"yaml:{path}:1"
    assert not [w for w in r.warnings if "overwrite_output_dir" in w]


@pytest.mark.parametrize(
    "spelling, meaning", [("true", "group"), ("false", "none"), ("'True'", "group"), ("no", "none")]
)
def test_legacy_scale_rewards(write, spelling, meaning):
    path = write("old.yaml", f"scale_rewards: {spelling}\n")
    r = resolve("--config", path)
    assert r.values["scale_rewards"] == meaning
    assert r.sources["scale_rewards"] == f"yaml:{path}:1"
    assert [w for w in r.warnings if "legacy spelling" in w and repr(meaning) in w]


def test_legacy_scale_rewards_flag():
    assert resolve("--scale_rewards", "false").values["scale_rewards"] == "none"


def test_deprecated_fields_in_python():
    with pytest.warns(FutureWarning) as record:
        config = GRPOConfig(use_transformers_paged=True, vllm_importance_sampling_cap=2.0, scale_rewards=False)
    messages = sorted(str(w.message).split(" ")[0] for w in record)
    assert messages == ["use_transformers_paged", "vllm_importance_sampling_cap"]
    assert config.use_transformers_continuous_batching is True and config.use_transformers_paged is False
    assert config.vllm_importance_sampling_clip_max == 2.0 and config.vllm_importance_sampling_cap is None
    assert config.scale_rewards == "none"


# ---- TRL's API


def test_parse_args_and_config_returns_instances(write):
    path = write("trl.yaml", "model_name_or_path: my/model\ndataset_name: my/data\nlearning_rate: 1.0e-5\n")
    parser = TrlParser([GRPOScriptArguments, GRPOConfig, ModelConfig])
    script_args, training_args, model_args = parser.parse_args_and_config(["--config", path, "--beta", "0.04"])
    assert type(script_args) is GRPOScriptArguments and script_args.dataset_name == "my/data"
    assert type(training_args) is GRPOConfig and training_args.learning_rate == 1e-5 and training_args.beta == 0.04
    assert type(model_args) is ModelConfig and model_args.model_name_or_path == "my/model"
    assert training_args.generation_batch_size == 8 and training_args.steps_per_generation == 1


def test_parse_args_and_config_default_types():
    instances = TrlParser().parse_args_and_config([])
    assert [type(i) for i in instances] == [GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig]


def test_parse_args_and_config_single_dataclass():
    parser = TrlParser(GRPOConfig)
    (config,) = parser.parse_args_and_config(["--num_generations", "4"])
    assert config.num_generations == 4


def test_return_remaining_strings(write):
    path = write("mixed.yaml", "beta: 0.1\nmy_script_option: 3\n")
    parser = TrlParser([ScriptArguments, GRPOConfig])
    script_args, config, remaining = parser.parse_args_and_config(
        ["--config", path, "--extra_flag", "x", "--num_generations", "4"], return_remaining_strings=True
    )
    assert config.beta == 0.1 and config.num_generations == 4
    pairs = {tuple(remaining[i : i + 2]) for i in range(0, len(remaining), 2)}
    assert len(remaining) == 4 and pairs == {("--my_script_option", "3"), ("--extra_flag", "x")}


@pytest.mark.parametrize("fail_with_unknown_args", [True, False])
def test_unknown_arguments_exit_2(capsys, fail_with_unknown_args):
    parser = TrlParser([GRPOScriptArguments, GRPOConfig, ModelConfig])
    with pytest.raises(SystemExit) as excinfo:
        parser.parse_args_and_config(["--lerning_rate", "1e-5"], fail_with_unknown_args=fail_with_unknown_args)
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: --lerning_rate (cli): unknown argument; did you mean --learning_rate?\n"


def test_keys_of_dataclasses_the_parser_was_not_given(capsys, write):
    path = write("trl.yaml", "dataset_name: my/data\n")
    with pytest.raises(SystemExit):
        TrlParser([GRPOConfig]).parse_args_and_config(["--config", path])
    assert f"dataset_name (yaml:{path}:1): unknown key" in capsys.readouterr().err


# ---- YAML values are coerced like command-line strings


@pytest.mark.parametrize(
    "yaml_text, field_name, value",
    [
        ("learning_rate: 1e-6\n", "learning_rate", 1e-06),  # a string in YAML 1.1 (no dot): still a float
        ("learning_rate: 1.0e-6\n", "learning_rate", 1e-06),
        ("num_generations: '8'\n", "num_generations", 8),
        ("max_completion_length: ' 256 '\n", "max_completion_length", 256),
        ("beta: '0.04'\n", "beta", 0.04),
        ("beta: 0\n", "beta", 0.0),
        ("gradient_checkpointing: 'false'\n", "gradient_checkpointing", False),
        ("dataset_name: 2024\n", "dataset_name", "2024"),
        ("reward_funcs: format\n", "reward_funcs", ["format"]),
        ("lr_scheduler_kwargs: '{\"min_lr_rate\": 0.1}'\n", "lr_scheduler_kwargs", {"min_lr_rate": 0.1}),
        ("pad_to_multiple_of: '64'\n", "pad_to_multiple_of", 64),
    ],
)
def test_yaml_values_are_coerced(write, yaml_text, field_name, value):
    r = resolve("--config", write("c.yaml", yaml_text))
    assert r.values[field_name] == value and type(r.values[field_name]) is type(value)


def test_yaml_and_flag_resolve_alike(write):
    from_yaml = resolve("--config", write("c.yaml", "learning_rate: 1e-6\nnum_generations: '4'\n")).values
    from_flags = resolve("--learning_rate", "1e-6", "--num_generations", "4").values
    assert from_yaml == from_flags


@pytest.mark.parametrize(
    "flag, text, value",
    [
        ("--generation_kwargs", '{"max_new_tokens": 32, "min_p": 0.1}', {"max_new_tokens": 32, "min_p": 0.1}),
        ("--chat_template_kwargs", '{"enable_thinking": false}', {"enable_thinking": False}),
        ("--model_init_kwargs", '{"dtype": "bfloat16"}', {"dtype": "bfloat16"}),
        ("--lr_scheduler_kwargs", '{"min_lr_rate": 0.1}', {"min_lr_rate": 0.1}),
    ],
)
def test_mapping_flags_take_json(flag, text, value):
    r = TrlParser([GRPOConfig]).resolve([flag, text])
    assert r.values[flag[2:]] == value
    assert getattr(r.instances[0], flag[2:]) == value


def test_union_fields_pick_the_right_member():
    r = resolve("--pad_to_multiple_of", "64", "--trackio_static_space_id", "me/dashboard")
    assert r.values["pad_to_multiple_of"] == 64
    assert r.values["trackio_static_space_id"] == "me/dashboard"
    assert resolve("--trackio_static_space_id", "false").values["trackio_static_space_id"] is False


# ---- the dataclasses in Python: the same rules, the same messages


def lines_without_source(problems):
    return [dataclasses.replace(p, source=None).line() for p in problems]


@pytest.mark.parametrize(
    "kwargs, args",
    [
        ({"num_generations": 1}, ["--num_generations", "1"]),
        ({"temperature": 0.0}, ["--temperature", "0"]),
        ({"top_p": 1.5}, ["--top_p", "1.5"]),
        ({"delta": 1.0}, ["--delta", "1"]),
        ({"vllm_server_port": 70000}, ["--vllm_server_port", "70000"]),
        ({"loss_type": "dapoo"}, ["--loss_type", "dapoo"]),
        ({"beta": -1.0, "epsilon": -0.2}, ["--beta", "-1", "--epsilon", "-0.2"]),
        (
            {"entropy_coef_min": 0.5, "entropy_coef_max": 0.1},
            ["--entropy_coef_min", "0.5", "--entropy_coef_max", "0.1"],
        ),
        ({"generation_kwargs": "top_k=5"}, ["--generation_kwargs", "top_k=5"]),
        ({"auto_find_batch_size": True}, ["--auto_find_batch_size"]),
        ({"fp16": True, "bf16": True}, ["--fp16", "--bf16"]),
        (
            {"per_device_train_batch_size": 3, "num_generations": 4},
            ["--per_device_train_batch_size", "3", "--num_generations", "4"],
        ),
        (
            {"per_device_train_batch_size": 4, "generation_batch_size": 10},
            ["--per_device_train_batch_size", "4", "--generation_batch_size", "10"],
        ),
    ],
)
def test_grpo_config_raises_the_parsers_message(kwargs, args):
    with pytest.raises(ValueError) as excinfo:
        GRPOConfig(**kwargs)
    assert isinstance(excinfo.value, ConfigError)
    parser_problems = problems_of(*args)
    assert str(excinfo.value) == "\n".join(lines_without_source(parser_problems))
    assert lines_without_source(excinfo.value.problems) == lines_without_source(parser_problems)


def test_grpo_config_type_error_message_matches_yaml(write):
    with pytest.raises(ValueError) as excinfo:
        GRPOConfig(num_generations=8.5)
    parser_problems = problems_of("--config", write("c.yaml", "num_generations: 8.5\n"))
    assert str(excinfo.value) == "num_generations: 8.5 is not an integer; did you mean 8?"
    assert lines_without_source(parser_problems) == [str(excinfo.value)]


def test_model_config_raises_the_parsers_message():
    with pytest.raises(ValueError) as excinfo:
        ModelConfig(lora_dropout=1.0, dtype="bf16")
    assert str(excinfo.value) == "\n".join(
        lines_without_source(problems_of("--lora_dropout", "1.0", "--dtype", "bf16"))
    )


def test_grpo_config_coerces_like_the_parser():
    config = GRPOConfig(num_generations="4", learning_rate="1e-6", gradient_checkpointing="false")
    assert config.num_generations == 4 and config.learning_rate == 1e-6 and config.gradient_checkpointing is False


def test_bf16_validates_on_any_machine(cli):
    """The configuration is judged, not the machine: bf16 on a CPU-only machine is valid, with a note."""
    r = resolve("--bf16", "true")
    assert r.values["bf16"] is True
    assert GRPOConfig(bf16=True).bf16 is True
    result = cli("config", "validate", "--bf16", "true")
    assert result.code == 0 and result.out == "ok\n"
    if not bf16_supported():
        assert any("bf16" in note for note in r.notes)
        assert "note: on this machine bf16=True" in result.err
    else:
        assert not any("bf16=True" in note for note in r.notes)


def test_unset_bf16_note():
    r = resolve()
    assert r.values["bf16"] is None
    if not bf16_supported():
        assert any("bf16 is unset" in note for note in r.notes)


# ---- recipes in Python


def test_grpo_config_recipe_fills_fields_left_at_default():
    config = GRPOConfig(recipe="dapo", epsilon_high=0.3)
    assert config.loss_type == "dapo" and config.mask_truncated_completions is True and config.beta == 0.0
    assert config.epsilon_high == 0.3  # given explicitly: kept
    assert config.recipe == "dapo"


@pytest.mark.parametrize("name", recipe_names())
def test_grpo_config_recipe_matches_the_parser(name):
    config = GRPOConfig(recipe=name)
    resolved = resolve("--recipe", name).values
    for key in load_recipe(name):
        if hasattr(config, key):
            assert getattr(config, key) == resolved[key], key


def test_grpo_config_unknown_recipe():
    with pytest.raises(ValueError, match="did you mean 'dapo'"):
        GRPOConfig(recipe="dapoo")


def test_recipe_does_not_apply_twice_through_the_parser():
    # Through the parser the layers are already applied: a flag over the recipe must survive building GRPOConfig.
    (config,) = TrlParser(GRPOConfig).parse_args_and_config(["--recipe", "dapo", "--epsilon_high", "0.28001"])
    assert config.epsilon_high == 0.28001 and config.loss_type == "dapo"
    (config,) = TrlParser(GRPOConfig).parse_args_and_config(["--recipe", "dapo", "--loss_type", "grpo"])
    assert config.loss_type == "grpo"


def test_repeated_list_flag_extends_the_list():
    from grpokit.config.parser import TrlParser

    resolution = TrlParser().resolve(["--reward_funcs", "format", "--reward_funcs", "tag_count", "length"])
    assert resolution.values["reward_funcs"] == ["format", "tag_count", "length"]
    assert resolution.sources["reward_funcs"] == "cli"


def test_repeated_scalar_flag_keeps_the_last_value_with_a_warning():
    from grpokit.config.parser import TrlParser

    resolution = TrlParser().resolve(["--learning_rate", "1e-5", "--learning_rate", "2e-6"])
    assert resolution.values["learning_rate"] == 2e-6
    assert "--learning_rate is given more than once; the last value (2e-6) is used" in resolution.warnings
    same = TrlParser().resolve(["--output_dir", "x", "--output_dir", "x"])  # the same value twice: nothing to say
    assert not [w for w in same.warnings if "more than once" in w]


def test_transformers_deprecation_warnings_become_one_line_with_the_source(tmp_path, recwarn):
    from grpokit.config.parser import TrlParser

    path = tmp_path / "gc.yaml"
    path.write_text("gradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: false\n")
    resolution = TrlParser().resolve(["--config", str(path)])
    lines = [w for w in resolution.warnings if w.startswith("gradient_checkpointing_kwargs")]
    if not lines:
        pytest.skip("this transformers does not deprecate gradient_checkpointing_kwargs")
    assert lines[0].startswith(f"gradient_checkpointing_kwargs (yaml:{path}:2): `gradient_checkpointing_kwargs` is")
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]  # no raw Python warning besides
