"""open-r1's config fields (each implemented or refused when set), TRL's renamed and removed GRPO keys, defaults
whose meaning changed, and the schema's mapping and number-string rules."""

import math
import os

import jsonschema
import pytest

from grpokit.cli.schema import build_schema
from grpokit.config.migrations import CHANGED_DEFAULTS, TRL_KEY_CHANGES
from grpokit.config.parser import DEFAULT_TYPES, TrlParser, reward_defaults
from grpokit.config.rules import ConfigError
from grpokit.config.support import unsupported_settings
from grpokit.rewards import resolve_reward


def resolve(*args):
    return TrlParser().resolve(list(args))


# ---- TRL's renamed and removed keys: one row each, with the line it must produce


@pytest.mark.parametrize(
    "key, value, new_field, new_value, line",
    [
        (
            "vllm_max_model_len",
            "2048",
            "vllm_max_model_length",
            2048,
            "vllm_max_model_len ({src}) is deprecated, renamed to vllm_max_model_length in TRL 0.18: use "
            "vllm_max_model_length",
        ),
        (
            "vllm_guided_decoding_regex",
            "'a+'",
            "vllm_structured_outputs_regex",
            "a+",
            "vllm_guided_decoding_regex ({src}) is deprecated, renamed to vllm_structured_outputs_regex in TRL 0.27: "
            "use vllm_structured_outputs_regex",
        ),
        (
            "use_liger_loss",
            "false",
            "use_liger_kernel",
            False,
            "use_liger_loss ({src}) is deprecated, renamed to use_liger_kernel in TRL 0.22: use use_liger_kernel",
        ),
        (
            "wandb_log_unique_prompts",
            "true",
            "log_unique_prompts",
            True,
            "wandb_log_unique_prompts ({src}) is deprecated, renamed to log_unique_prompts in TRL 0.26: use "
            "log_unique_prompts",
        ),
    ],
)
def test_renamed_trl_key_is_migrated_with_one_warning(write, key, value, new_field, new_value, line):
    path = write("old.yaml", f"{key}: {value}\n")
    r = resolve("--config", path)
    assert r.values[new_field] == new_value and r.sources[new_field] == f"migrated:{key}"
    assert line.format(src=f"yaml:{path}:1") in r.warnings


@pytest.mark.parametrize(
    "key, line",
    [
        (
            "vllm_dtype",
            "vllm_dtype ({src}) is removed in TRL 0.18: vLLM runs in the model's dtype (dtype / model_init_kwargs); "
            "its value is ignored",
        ),
        (
            "vllm_enable_prefix_caching",
            "vllm_enable_prefix_caching ({src}) is removed in TRL 0.18: vLLM's prefix caching stays at its default "
            "(on); its value is ignored",
        ),
    ],
)
def test_harmless_removed_key_is_a_warning(write, key, line):
    path = write("old.yaml", f"{key}: half\nbeta: 0.0\n")
    r = resolve("--config", path)
    assert key not in r.values
    assert line.format(src=f"yaml:{path}:1") in r.warnings


def test_removed_vllm_device_is_an_error_naming_the_version(write):
    path = write(
        "old.yaml", "use_vllm: true\nvllm_device: cuda:1\n"
    )  # `auto` is only a warning (test_openr1_codeforces)
    with pytest.raises(ConfigError) as exc:
        resolve("--config", path)
    assert [p.line() for p in exc.value.problems] == [
        f"vllm_device='cuda:1' (yaml:{path}:2): removed in TRL 0.18: vLLM's device is chosen for you (as `auto` "
        "asked): each training process's own (vllm_mode: colocate) or a separate server's (vllm_mode: server, "
        "started with `grpokit vllm-serve` on the GPUs you choose); delete the key"
    ]
    assert "did you mean" not in str(exc.value)


def test_renamed_trl_keys_on_the_command_line():
    r = resolve("--vllm_max_model_len", "1024", "--use_liger_loss")  # a bare flag: the new field is a bool
    assert r.values["vllm_max_model_length"] == 1024 and r.values["use_liger_kernel"] is True
    with pytest.raises(ConfigError, match="vllm_device='1' \\(cli\\): removed in TRL 0.18"):
        resolve("--vllm_device", "1")


def test_every_table_row_is_a_renamed_or_removed_key():
    fields = {f for t in DEFAULT_TYPES for f in t.__dataclass_fields__}
    for old, change in TRL_KEY_CHANGES.items():
        assert old not in fields, old  # a key TRL still has (or grpokit keeps) is no migration
        assert change.new is None or change.new in fields, old
        assert change.version and change.action


# ---- defaults whose meaning changed


def test_changed_defaults_are_noted_when_left_unset(write):
    notes = resolve().default_notes
    assert [n for n in notes if n.startswith("beta is unset: 0.0")]
    assert [n for n in notes if n.startswith("loss_type is unset: 'dapo'")]
    assert not [n for n in notes if n.startswith("vllm_mode is unset")]  # only matters with use_vllm
    with_vllm = resolve("--config", write("v.yaml", "use_vllm: true\n")).default_notes
    assert [n for n in with_vllm if n.startswith("vllm_mode is unset: 'colocate'")]
    explicit = resolve(
        "--config", write("e.yaml", "beta: 0.0\nloss_type: dapo\nuse_vllm: true\nvllm_mode: colocate\n")
    )
    assert not [
        n for n in explicit.default_notes if any(n.startswith(f"{name} is unset") for name in CHANGED_DEFAULTS)
    ]


def test_config_show_prints_the_changed_default_notes(cli, write):
    result = cli("config", "show", "--config", write("c.yaml", "loss_type: grpo\n"))
    assert result.code == 0, result.err
    assert "note: beta is unset: 0.0 (no KL term, no reference model)" in result.err
    assert "note: loss_type is unset" not in result.err
    validated = cli("config", "validate", "--config", write("d.yaml", "loss_type: grpo\n"))
    assert validated.code == 0 and "beta is unset" not in validated.err  # show lists them; validate stays quiet


# ---- open-r1's fields


def test_openr1_hub_and_cluster_fields_are_refused_when_set(write):
    path = write(
        "r1.yaml",
        "callbacks: [push_to_hub_revision]\nbenchmarks: [aime24]\nhub_model_revision: v1\n"
        "overwrite_hub_revision: true\npush_to_hub_revision: true\n"
        "dataset_mixture: {datasets: [{id: a/b, weight: 0.5}]}\n",
    )
    lines = unsupported_settings(*resolve("--config", path).instances)
    assert [line.split("=")[0] for line in lines] == [
        "dataset_mixture",
        "callbacks",
        "benchmarks",
        "hub_model_revision",
        "overwrite_hub_revision",
        "push_to_hub_revision",
    ]
    assert "callbacks=['push_to_hub_revision']: open-r1's callbacks need its Hub tooling" in lines[1]
    assert unsupported_settings(*resolve().instances) == []  # their defaults are fine


def test_openr1_fields_at_their_defaults_resolve_quietly(write):
    r = resolve("--config", write("r1.yaml", "hub_model_revision: main\ncallbacks: []\ncode_provider: local\n"))
    assert unsupported_settings(*r.instances) == []
    with pytest.raises(ConfigError, match="code_provider"):
        resolve("--code_provider", "e2bb")


def test_cosine_max_len_from_yaml_reaches_the_cosine_reward(write):
    texts, solution = [r"\boxed{2}", r"\boxed{3}"], ["$2$", "$2$"]  # 9 characters each; the first is right
    values = resolve("--config", write("c.yaml", "cosine_max_len: 10\n")).values
    reward = resolve_reward("cosine", defaults=reward_defaults(values))
    # p = 9/10; 1 + cos(0.9 pi) = 0.0489435. Correct: 0.5 + 0.5 * (1.0 - 0.5) * 0.0489435 = 0.5122359;
    # wrong (open-r1's defaults 0.0 -> -0.5): -0.5 + 0.5 * (0.0 + 0.5) * 0.0489435 = -0.4877641.
    assert reward(texts, solution=solution) == pytest.approx([0.5122359, -0.4877641], abs=1e-6)
    default = resolve_reward("cosine", defaults=reward_defaults(resolve().values))
    # p = 9/1000: correct 0.5 + 0.25 * (1 + cos(0.009 pi)) = 0.9999; wrong -0.5 + 0.25 * 1.9996 = -0.0001.
    assert default(texts, solution=solution) == pytest.approx([0.99990, -0.00010], abs=1e-5)
    # A reward's own kwargs win over the config.
    own = resolve_reward({"name": "cosine", "kwargs": {"max_len": 1000}}, defaults=reward_defaults(values))
    assert own(texts, solution=solution) == pytest.approx(default(texts, solution=solution))


def test_repetition_fields_reach_the_repetition_penalty(write):
    values = resolve("--config", write("c.yaml", "repetition_n_grams: 2\nrepetition_max_penalty: -2.0\n")).values
    reward = resolve_reward("repetition_penalty", defaults=reward_defaults(values))
    # bigrams of "a b a b a": ab ba ab ba -> 1 - 2/4 repeated, times -2.0.
    assert reward(["a b a b a", "one two three"]) == [-1.0, 0.0]


@pytest.mark.parametrize(
    "yaml_text, window",
    [
        ("max_completion_length: 100\n", (100, 25)),  # unset: follows max_completion_length, a quarter of it
        ("max_completion_length: 100\nmax_completion_len: 40\n", (40, 10)),  # open-r1's field wins
        ("max_completion_len: 40\nsoft_punish_cache: 8\n", (40, 8)),
        (
            "max_completion_length: 100\nreward_funcs: [{name: soft_overlong_punishment, kwargs: {soft_punish_cache: 4}}]\n",
            (100, 4),
        ),
    ],
)
def test_overlong_window_precedence(write, yaml_text, window):
    r = resolve("--config", write("c.yaml", yaml_text))
    spec = (r.values["reward_funcs"] or ["soft_overlong_punishment"])[0]
    reward = resolve_reward(spec, defaults=reward_defaults(r.values))
    assert (reward.params["max_completion_len"], reward.params["soft_punish_cache"]) == window


def test_code_fields_are_offered_under_their_own_names():
    offered = reward_defaults(resolve("--code_provider", "local", "--code_language", "cpp").values)
    assert offered["code_provider"] == "local" and offered["code_language"] == "cpp"
    assert offered["code_eval_scoring_mode"] == "weighted_sum" and offered["parallel_code_exec_per_proc"] == 2
    assert offered["e2b_router_url"] is None and offered["ioi_provider"] == "piston"


def test_grpokit_train_resolves_rewards_with_the_script_fields(write):
    from grpokit.cli.train import _resolve_rewards

    script_args, training_args, _, _ = resolve("--config", write("c.yaml", "cosine_max_len: 10\n")).instances
    script_args.reward_funcs = ["cosine"]
    (reward,) = _resolve_rewards(script_args, training_args)
    assert reward.params["max_len"] == 10 and reward.params["min_value_wrong"] == 0.0


def test_chat_template_and_wandb_fields_at_training_start(tiny_model_dir, tmp_path, monkeypatch):
    from datasets import Dataset

    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.generation.tokens import encode_prompts

    for name in ("WANDB_ENTITY", "WANDB_PROJECT", "WANDB_RUN_GROUP"):
        monkeypatch.delenv(name, raising=False)
    template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        chat_template=template,
        wandb_project="grpokit-tests",
        wandb_run_group="g1",
    )
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "hi"}]] * 2})
    trainer = GRPOTrainer(
        tiny_model_dir, lambda completions, **kw: [0.0] * len(completions), args=args, train_dataset=dataset
    )
    tokenizer = trainer.processing_class
    assert tokenizer.chat_template == template
    prompt = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]]
    (ids,) = encode_prompts(tokenizer, prompt)
    assert ids == tokenizer("[system]be brief[user]hi>", add_special_tokens=False)["input_ids"]
    assert os.environ["WANDB_PROJECT"] == "grpokit-tests" and os.environ["WANDB_RUN_GROUP"] == "g1"
    assert "WANDB_ENTITY" not in os.environ  # only the fields that are set


# ---- schema


@pytest.fixture(scope="module")
def validator():
    return jsonschema.Draft202012Validator(build_schema(DEFAULT_TYPES))


@pytest.mark.parametrize(
    "data, valid",
    [
        ({"generation_kwargs": "foo"}, False),  # a plain string is not a mapping
        ({"model_init_kwargs": "bfloat16"}, False),
        ({"dataset_mixture": "a/b"}, False),
        ({"generation_kwargs": '{"min_new_tokens": 4}'}, True),  # JSON, as the command line writes it
        ({"model_init_kwargs": {"dtype": "bfloat16"}}, True),
        ({"learning_rate": "5e-7"}, True),  # YAML 1.1 reads 5e-7 as a string; the parser takes it
        ({"beta": "1e-3", "min_p": "0.05", "top_p": 1}, True),
        ({"learning_rate": "fast"}, False),
        ({"vllm_device": "auto"}, True),  # removed, but "auto" is what grpokit does: a warning
        ({"vllm_device": "cuda:1"}, False),  # removed: the parser refuses any other value
        ({"vllm_dtype": "half", "use_liger_loss": True}, True),  # a warning only, or migrated
        ({"cosine_max_len": 10, "code_provider": "local", "callbacks": []}, True),
        ({"code_provider": "e2bb"}, False),
    ],
    ids=str,
)
def test_schema_mapping_and_number_strings(validator, data, valid):
    assert (list(validator.iter_errors(data)) == []) is valid


def test_number_strings_the_schema_accepts_are_numbers_to_the_parser(validator, write):
    r = resolve("--config", write("n.yaml", "learning_rate: 5e-7\nbeta: 1e-3\n"))
    assert math.isclose(r.values["learning_rate"], 5e-7) and math.isclose(r.values["beta"], 1e-3)
