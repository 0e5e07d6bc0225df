"""GRPOConfig built in Python: recipes fill only what the caller left out; non-finite and contradictory values fail."""

import pytest

from grpokit import GRPOConfig
from grpokit.config.support import unsupported_settings


def test_recipe_fills_only_fields_the_caller_did_not_pass(tmp_path):
    # grpo.yaml sets beta 0.04 and loss_type grpo; beta=0.0 passed explicitly (equal to the default) must stay.
    config = GRPOConfig(output_dir=str(tmp_path), recipe="grpo", beta=0.0)
    assert config.beta == 0.0
    assert config.loss_type == "grpo"
    assert GRPOConfig(output_dir=str(tmp_path), recipe="grpo").beta == 0.04


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": float("inf")}, "temperature=inf: must be a finite number"),
        ({"sync_ref_model": True}, "sync_ref_model=True: needs a reference model, and beta=0 loads none"),
    ],
)
def test_rejected_in_python(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(output_dir=str(tmp_path), **kwargs)


def test_streaming_and_bias_buffers_are_accepted():
    from grpokit import DatasetMixtureConfig, GRPOScriptArguments

    lines = unsupported_settings(
        GRPOScriptArguments(dataset_streaming=True, ignore_bias_buffers=True), DatasetMixtureConfig(streaming=True)
    )
    assert lines == []  # streaming: groups formed on the fly (grpokit.rollout.stream)


def test_every_problem_of_a_python_config_is_reported_at_once(tmp_path):
    """As the YAML path does: a bad learning_rate, a bad top_p and an impossible batch geometry, in one error."""
    from grpokit.config.rules import ConfigError

    with pytest.raises(ConfigError) as info:
        GRPOConfig(
            output_dir=str(tmp_path), learning_rate=-1, top_p=2.0, per_device_train_batch_size=3, num_generations=2
        )
    lines = str(info.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["learning_rate=-1.0", "top_p=2.0", "num_generations=2"]
    assert "must be divisible by num_generations = 2" in lines[2]


def test_an_unknown_keyword_is_reported_with_the_other_problems(tmp_path):
    from grpokit.config.suggest import UnknownArgumentError

    with pytest.raises(UnknownArgumentError) as info:  # a TypeError, as Python's own
        GRPOConfig(output_dir=str(tmp_path), learnig_rate=1e-5, top_p=2.0, per_device_train_batch_size=3)
    unknown, top_p, geometry = str(info.value).splitlines()
    assert (
        unknown
        == "GRPOConfig.__init__() got an unexpected keyword argument 'learnig_rate'; did you mean 'learning_rate'?"
    )
    assert top_p == "top_p=2.0: must be > 0 and <= 1; nearest valid value: 1"
    assert geometry.startswith("num_generations=8: the generation batch 3 ")  # 3 rows, groups of 8 (the default)
