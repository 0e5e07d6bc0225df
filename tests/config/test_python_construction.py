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
