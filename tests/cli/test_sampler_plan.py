"""`grpokit config plan`'s "sampler and learner" section: truncated sampling, the correction, rejections, replay."""

from grpokit.cli.plan import sampler_plan


def rows(**values):
    out = sampler_plan(values)
    return None if out is None else {name: (value, how) for name, value, how in out}


def test_nothing_to_reconcile_no_section():
    assert rows() is None
    assert rows(top_p=1.0, top_k=0) is None


def test_truncation_is_scored_over_the_kept_set_unless_turned_off():
    value, how = rows(top_p=0.9, min_p=0.05)["truncated sampling"]
    assert value == "top_p 0.9, min_p 0.05" and "scored over the tokens these keep" in how
    value, how = rows(top_p=1.0, generation_kwargs={"top_k": 20})["truncated sampling"]
    assert value == "top_k 20"  # generation_kwargs win, as the backends take them
    assert "as TRL" in rows(top_k=5, logprobs_over_kept_tokens=False)["truncated sampling"][1]


def test_the_correction_and_its_rejections():
    plan = rows(
        use_vllm=True,
        vllm_importance_sampling_mode="sequence_mask",
        vllm_importance_sampling_clip_min=0.5,
        vllm_importance_sampling_clip_max=2.0,
        sampler_sequence_geometric=True,
        sampler_kl_threshold=0.05,
        sampler_kl_reduction="max",
        sampler_token_veto=0.001,
    )
    assert plan["correction"] == (
        "sequence_mask",
        "weights learner / sampler zeroed outside [0.5, 2.0], a sequence's the geometric mean of its tokens'",
    )
    assert plan["KL rejection"] == ("> 0.05", "a sequence's k3 estimate, max over its tokens")
    assert plan["token veto"][0] == "< 0.001"
    assert rows(use_vllm=True)["correction"] == ("sequence_mask", "weights learner / sampler zeroed outside [-, 3.0]")
    assert rows(async_grpo=True, vllm_importance_sampling_correction=False)["correction"] == (
        "off",
        "off: sampler/* metrics only",
    )
    assert rows(routing_replay=True)["routing replay"][0] == "on"
