"""Field-for-field parity with TRL 1.16, against tests/data/trl_1_16_fields.json (a snapshot of TRL's dataclass
fields, generated once from TRL: TRL itself is not installed for the tests and never imported)."""

import dataclasses
import enum
import json
import math
import typing
from pathlib import Path

import pytest

import grpokit.algorithms
from grpokit.config.grpo_config import GRPOConfig
from grpokit.config.model_config import ModelConfig
from grpokit.config.script_args import (
    DatasetConfig,
    DatasetMixtureConfig,
    GRPOScriptArguments,
    ScriptArguments,
)
from grpokit.config.types import field_choices, field_types

SNAPSHOT = json.loads((Path(__file__).parents[1] / "data" / "trl_1_16_fields.json").read_text())
CLASSES = [GRPOConfig, ScriptArguments, GRPOScriptArguments, ModelConfig, DatasetConfig, DatasetMixtureConfig]

# grpokit's own fields, on top of TRL's: exactly these and no others.
EXTRAS = {
    "GRPOConfig": {
        "recipe",
        "max_prompt_length",
        "max_nonfinite_steps",
        "reward_timeout",
        "tool_timeout",
        "tool_round_timeout",
        "max_tool_result_chars",
        "max_unscorable_rounds",
        "resume_allow_changes",
        "overwrite_output_dir",
        "write_run_records",
        "progress_lines",
        "dynamic_sampling",
        "dynamic_sampling_min_reward_std",
        "dynamic_sampling_max_rounds",
        "logprobs_over_kept_tokens",
        "sampler_sequence_geometric",
        "sampler_kl_threshold",
        "sampler_kl_estimator",
        "sampler_kl_reduction",
        "sampler_token_veto",
        "routing_replay",
        # TRL's AsyncGRPOConfig's pipeline fields (TRL: a separate class), with async_grpo choosing that trainer
        "async_grpo",
        "max_staleness",
        "max_inflight_tasks",
        "queue_maxsize",
        "weight_sync_steps",
        "heartbeat_stale_after_s",
        "request_timeout",
        "weight_sync_timeout",
    },
    "ScriptArguments": set(),
    "GRPOScriptArguments": {"dataset_prompt_column", "system_prompt", "tools", "environment_factory"},
    "ModelConfig": set(),
    "DatasetConfig": set(),
    "DatasetMixtureConfig": set(),
}
# open-r1's fields on top of TRL's (its src/open_r1/configs.py), with open-r1's defaults except where noted: each is
# implemented or refused when set (grpokit/config/support.py). `system_prompt` and `dataset_prompt_column` are above.
OPENR1_DEFAULTS = {
    "GRPOConfig": {
        "chat_template": None,
        "wandb_entity": None,
        "wandb_project": None,
        "wandb_run_group": None,
        "callbacks": [],
        "benchmarks": [],
        "hub_model_revision": "main",
        "overwrite_hub_revision": False,
        "push_to_hub_revision": False,
    },
    "GRPOScriptArguments": {
        "cosine_min_value_wrong": 0.0,
        "cosine_max_value_wrong": -0.5,
        "cosine_min_value_correct": 0.5,
        "cosine_max_value_correct": 1.0,
        "cosine_max_len": 1000,
        "repetition_n_grams": 3,
        "repetition_max_penalty": -1.0,
        "max_completion_len": None,  # open-r1: 16384; unset follows max_completion_length
        "soft_punish_cache": None,  # open-r1: 4096; unset is a quarter of max_completion_len
        "code_language": "python",
        "code_eval_test_batch_size": 1,
        "code_eval_scoring_mode": "weighted_sum",
        "parallel_code_exec_per_proc": 2,
        "code_provider": "local",  # open-r1: "e2b"; grpokit runs code locally
        "ioi_provider": "piston",
        "e2b_router_url": None,
        "morph_router_url": None,
        "dataset_mixture": None,
    },
}


def test_snapshot_is_trl_1_16():
    assert SNAPSHOT["trl_version"] == "1.16.0"
    assert {cls.__name__ for cls in CLASSES} <= set(SNAPSHOT["classes"])


def declared_default(f: dataclasses.Field):
    """The default declared on the dataclass field (not the value after __post_init__)."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "<required>"
    return value.value if isinstance(value, enum.Enum) else value


def same(ours, theirs) -> bool:
    if isinstance(ours, float) and isinstance(theirs, (int, float)) and not isinstance(theirs, bool):
        return math.isclose(ours, theirs, rel_tol=1e-12) and type(ours) is type(theirs)
    return ours == theirs and type(ours) is type(theirs)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_field_names(cls):
    ours = {f.name for f in dataclasses.fields(cls)}
    theirs = set(SNAPSHOT["classes"][cls.__name__])
    assert theirs - ours == set(), f"TRL fields missing from {cls.__name__}"
    openr1 = set(OPENR1_DEFAULTS.get(cls.__name__, {}))
    assert ours - theirs == EXTRAS[cls.__name__] | openr1, f"{cls.__name__} has fields TRL does not have"


@pytest.mark.parametrize("cls", [GRPOConfig, GRPOScriptArguments], ids=lambda c: c.__name__)
def test_openr1_field_defaults(cls):
    declared = {f.name: declared_default(f) for f in dataclasses.fields(cls)}
    expected = OPENR1_DEFAULTS[cls.__name__]
    assert {name: declared[name] for name in expected} == expected


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_field_defaults(cls):
    theirs = SNAPSHOT["classes"][cls.__name__]
    differences = {
        f.name: (declared_default(f), theirs[f.name]["default"])
        for f in dataclasses.fields(cls)
        if f.name in theirs and not same(declared_default(f), theirs[f.name]["default"])
    }
    assert differences == {}


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_an_init_argument(cls):
    # TRL's fields are all constructor arguments (and so YAML keys and flags).
    assert [f.name for f in dataclasses.fields(cls) if not f.init] == []


def test_script_arguments_hierarchy():
    assert issubclass(GRPOScriptArguments, ScriptArguments)
    # TRL's GRPOScriptArguments adds exactly the reward fields to ScriptArguments.
    added = set(SNAPSHOT["classes"]["GRPOScriptArguments"]) - set(SNAPSHOT["classes"]["ScriptArguments"])
    assert added == {"reward_funcs", "reward_model_name_or_path"}


def test_extra_defaults_change_nothing():
    """Our extra fields default to 'off', so a TRL config resolves the same with or without them."""
    defaults = {f.name: declared_default(f) for f in dataclasses.fields(GRPOConfig)}
    assert defaults["recipe"] is None and defaults["max_prompt_length"] is None
    script = {f.name: declared_default(f) for f in dataclasses.fields(GRPOScriptArguments)}
    assert script["dataset_prompt_column"] == "prompt" and script["system_prompt"] is None


def test_algorithms_module_exports_the_choice_tuples():
    text = (Path(grpokit.algorithms.__file__)).read_text()
    for name in ("LOSS_TYPES", "SCALE_REWARDS"):
        assert name in grpokit.algorithms.__all__
        assert name in text


@pytest.mark.parametrize(
    "field_name, choices",
    [
        ("loss_type", grpokit.algorithms.LOSS_TYPES),
        ("scale_rewards", grpokit.algorithms.SCALE_REWARDS),
        ("importance_sampling_level", grpokit.algorithms.IMPORTANCE_SAMPLING_LEVELS),
        ("multi_objective_aggregation", grpokit.algorithms.MULTI_OBJECTIVE_AGGREGATIONS),
    ],
)
def test_config_choices_match_algorithms(field_name, choices):
    tp = field_types(GRPOConfig)[field_name]
    assert typing.get_origin(tp) is typing.Literal
    assert tuple(typing.get_args(tp)) == tuple(choices)
    assert tuple(field_choices(tp)) == tuple(choices)
    # And TRL's default is one of them.
    assert SNAPSHOT["classes"]["GRPOConfig"][field_name]["default"] in choices
