"""grpokit's sampler corrections (geometric sequence weights, KL rejection, token veto) are validated with the rest
of the configuration: each needs the importance-sampling correction and the sampler's log-probabilities."""

import pytest

from grpokit import GRPOConfig


def _config(tmp_path, **kwargs):
    return GRPOConfig(output_dir=str(tmp_path), report_to="none", **kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sampler_kl_threshold": 0.1}, r"sampler_kl_threshold=0.1: needs the importance-sampling correction"),
        ({"sampler_token_veto": 1e-4}, r"sampler_token_veto=0.0001: needs the importance-sampling correction"),
        (
            {"use_vllm": True, "vllm_importance_sampling_correction": False, "sampler_sequence_geometric": True},
            r"sampler_sequence_geometric=True: needs the importance-sampling correction",
        ),
        (
            {"use_vllm": True, "vllm_importance_sampling_mode": "token_mask", "sampler_sequence_geometric": True},
            r"sampler_sequence_geometric=True: applies to the sequence modes; vllm_importance_sampling_mode is "
            r"token_mask",
        ),
        (
            {"use_vllm": True, "sampler_kl_estimator": "k1"},
            r"sampler_kl_estimator='?k1'?: has no effect without sampler_kl_threshold",
        ),
        ({"use_vllm": True, "sampler_kl_threshold": 0.0}, r"sampler_kl_threshold=0.0: must be > 0"),
        ({"use_vllm": True, "sampler_token_veto": 1.0}, r"sampler_token_veto=1.0: must be > 0 and < 1"),
    ],
)
def test_refused_with_one_line_naming_the_field(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **kwargs)


def test_accepted_where_the_sampler_gives_log_probabilities(tmp_path):
    config = _config(
        tmp_path,
        use_vllm=True,
        sampler_sequence_geometric=True,
        vllm_importance_sampling_clip_min=0.999,
        vllm_importance_sampling_clip_max=1.001,
        sampler_kl_threshold=0.05,
        sampler_kl_estimator="k1",
        sampler_kl_reduction="max",
        sampler_token_veto=1e-4,
    )
    assert config.sampler_kl_threshold == 0.05 and config.sampler_sequence_geometric
    assert _config(tmp_path, async_grpo=True, sampler_token_veto=1e-3).sampler_token_veto == 1e-3
