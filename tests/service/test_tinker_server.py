"""The Tinker server driven through the real `tinker` SDK: every call a training client, a sampling client and the
cookbook make, and the errors a bad request gets (one line, the SDK's own exception, the server still serving)."""

import math

import pytest
import torch

T = 120  # seconds any one SDK call may take before the test fails instead of hanging


def _datum(tokens, weights=None):
    from tinker import types

    inputs = {"target_tokens": tokens[1:], "weights": weights or [1.0] * (len(tokens) - 1)}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def _reference_logps(model_dir, tokens):
    """log p(tokens[t+1] | tokens[:t+1]) under the plain base model, computed here without the server."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]])).logits[0]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens[1:]).unsqueeze(-1)).squeeze(-1)


TOKENS = [5, 17, 23, 40, 41, 42, 60, 61]


def test_capabilities_name_the_served_model_and_another_base_model_is_refused(service_client, served):
    import tinker

    names = [m.model_name for m in service_client.get_server_capabilities().supported_models]
    assert names == [served.engine.name]
    with pytest.raises(tinker.RequestFailedError, match="is not served here") as info:
        service_client.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result(timeout=T)
    assert "\n" not in str(info.value)


def test_forward_returns_the_base_models_logprobs_and_the_weighted_sum_as_loss(service_client, served):
    tc = service_client.create_lora_training_client(base_model=served.engine.source, rank=4, seed=0).result(timeout=T)
    assert tc.get_info().model_data.tokenizer_id == served.engine.source
    out = tc.forward([_datum(TOKENS, [1.0, 1.0, 0.0, 0.5, 1.0, 1.0, 1.0])], "cross_entropy").result(timeout=T)
    expected = _reference_logps(served.engine.source, TOKENS)  # LoRA starts at B = 0: the base model exactly
    got = out.loss_fn_outputs[0]["logprobs"].to_torch()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    weights = torch.tensor([1.0, 1.0, 0.0, 0.5, 1.0, 1.0, 1.0])
    assert out.metrics["loss:sum"] == pytest.approx(-(weights * expected).sum().item(), abs=1e-4)


def test_training_lowers_the_loss_each_client_owns_its_lora_and_the_seed_fixes_it(service_client, served):
    from tinker import types

    base = served.engine.source
    a = service_client.create_lora_training_client(base_model=base, rank=4, seed=1).result(timeout=T)
    b = service_client.create_lora_training_client(base_model=base, rank=4, seed=1).result(timeout=T)
    data = [_datum(TOKENS)]
    before = a.forward(data, "cross_entropy").result(timeout=T).metrics["loss:sum"]
    for _ in range(3):
        a.forward_backward(data, "cross_entropy")
        a.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=T)
    after = a.forward(data, "cross_entropy").result(timeout=T).metrics["loss:sum"]
    assert after < before - 0.5
    # b (same seed, never stepped) still computes the base model; stepping it the same way reproduces a exactly.
    assert b.forward(data, "cross_entropy").result(timeout=T).metrics["loss:sum"] == pytest.approx(before, abs=1e-5)
    for _ in range(3):
        b.forward_backward(data, "cross_entropy")
        b.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=T)
    assert b.forward(data, "cross_entropy").result(timeout=T).metrics["loss:sum"] == pytest.approx(after, abs=1e-5)


def test_sampled_logprobs_equal_the_learners_and_sampling_follows_its_params(service_client, served):
    from tinker import types

    tc = service_client.create_lora_training_client(base_model=served.engine.source, rank=4, seed=2).result(timeout=T)
    tc.forward_backward([_datum(TOKENS)], "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=T)
    sampler = tc.save_weights_and_get_sampling_client().result(timeout=T)
    prompt = types.ModelInput.from_ints(TOKENS[:4])
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7, stop=[])
    result = sampler.sample(prompt, 3, params).result(timeout=T)
    assert len(result.sequences) == 3 and len({s.sequence_id for s in result.sequences}) == 3
    again = sampler.sample(prompt, 3, params).result(timeout=T)
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]  # the seed fixes the draw
    unseeded = types.SamplingParams(max_tokens=6, temperature=1.0, stop=[])
    draws = [[s.tokens for s in sampler.sample(prompt, 3, unseeded).result(timeout=T).sequences] for _ in range(2)]
    assert draws[0] != draws[1]  # without a seed, each request draws anew
    for seq in result.sequences:
        assert len(seq.tokens) == 6 and seq.stop_reason == "length"
        full = TOKENS[:4] + seq.tokens
        learner = tc.forward([_datum(full)], "cross_entropy").result(timeout=T).loss_fn_outputs[0]["logprobs"]
        # sampler/learner KL on the same weights: the same numbers (CPU fp32)
        torch.testing.assert_close(torch.tensor(seq.logprobs), learner.to_torch()[3:], rtol=0, atol=1e-5)
    # A stop token ends the sample with it, as "stop" (same seed: the same draws up to there).
    tokens = sampler.sample(prompt, 1, params).result(timeout=T).sequences[0].tokens
    eos = set(served.engine.tokenizer.all_special_ids)
    end = next((i for i, t in enumerate(tokens) if t in eos), 6)  # EOS stops too: cut before any
    cut = max(i for i in range(end) if tokens[i] not in tokens[:i])  # the last token that first appears there
    stop = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7, stop=[tokens[cut]])
    seq = sampler.sample(prompt, 1, stop).result(timeout=T).sequences[0]
    assert seq.stop_reason == "stop" and seq.tokens == tokens[: cut + 1]
    # Prompt log-probabilities: None first, then the learner's.
    logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result(timeout=T)
    learner = tc.forward([_datum(TOKENS)], "cross_entropy").result(timeout=T).loss_fn_outputs[0]["logprobs"]
    assert logprobs[0] is None
    torch.testing.assert_close(torch.tensor(logprobs[1:]), learner.to_torch(), rtol=0, atol=1e-5)


def test_greedy_sampling_from_the_base_model_picks_the_argmax(service_client, served):
    from tinker import types

    sampler = service_client.create_sampling_client(base_model=served.engine.source).result(timeout=T)
    seq = sampler.sample(
        types.ModelInput.from_ints(TOKENS), 1, types.SamplingParams(max_tokens=1, temperature=0.0, stop=[])
    ).result(timeout=T)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(served.engine.source).eval()
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0, -1]
    assert seq.sequences[0].tokens == [int(logits.argmax())]
    assert seq.sequences[0].logprobs[0] == pytest.approx(torch.log_softmax(logits, -1).max().item(), abs=1e-5)


def test_saved_state_and_sampler_weights_reload(service_client, served, tmp_path):
    import tinker
    from tinker import types

    from grpokit.service.engine import Engine

    tc = service_client.create_lora_training_client(base_model=served.engine.source, rank=4, seed=3).result(timeout=T)
    data = [_datum(TOKENS)]
    tc.forward_backward(data, "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=T)
    state = tc.save_state("step1").result(timeout=T).path
    sampler_path = tc.save_weights_for_sampler("step1").result(timeout=T).path
    assert state.endswith("/weights/step1") and sampler_path.endswith("/sampler_weights/step1")
    with pytest.raises(tinker.RequestFailedError, match="exists already; save under another name"):
        tc.save_state("step1").result(timeout=T)  # the SDK's overwrite=False: the first save stays
    trained = tc.forward(data, "cross_entropy").result(timeout=T).metrics["loss:sum"]

    plain = service_client.create_training_client_from_state(state).result(timeout=T)
    assert plain.forward(data, "cross_entropy").result(timeout=T).metrics["loss:sum"] == pytest.approx(
        trained, abs=1e-5
    )
    # With the optimizer: the next step from the reloaded client equals the next step of the original.
    resumed = service_client.create_training_client_from_state_with_optimizer(state).result(timeout=T)
    for client in (tc, resumed):
        client.forward_backward(data, "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=T)
    stepped = [c.forward(data, "cross_entropy").result(timeout=T).metrics["loss:sum"] for c in (tc, resumed)]
    assert stepped[0] == pytest.approx(stepped[1], abs=1e-5)
    # Without it the moments restart, and the same step lands elsewhere.
    plain.forward_backward(data, "cross_entropy")
    plain.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=T)
    assert plain.forward(data, "cross_entropy").result(timeout=T).metrics["loss:sum"] != pytest.approx(stepped[0])

    prompt = types.ModelInput.from_ints(TOKENS)
    from_path = service_client.create_sampling_client(model_path=sampler_path).result(timeout=T)
    online = from_path.compute_logprobs(prompt).result(timeout=T)
    # A new server over the same state folder (a restart) samples the same weights from the same path.
    fresh = Engine(served.engine.source, served.engine.state_dir)
    offline = fresh.sample(
        sampler_path,
        TOKENS,
        1,
        max_tokens=1,
        temperature=1.0,
        top_k=-1,
        top_p=1.0,
        stop=[],
        seed=0,
        prompt_logprobs=True,
        topk_prompt=0,
        topk_sample=0,
        prompt_last_n=None,
    )
    assert math.isnan(offline.prompt_logprobs[0])
    torch.testing.assert_close(offline.prompt_logprobs[1:], torch.tensor(online[1:]), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda t: t.forward_backward([_datum([5, 6, 10**6])], "cross_entropy"), "outside the vocabulary"),
        (lambda t: t.forward_backward([_datum(TOKENS)], "gspo"), "'gspo' is not served"),
        (lambda t: t.forward_backward([_datum(TOKENS)], "ppo"), "needs loss_fn_inputs logprobs, advantages"),
    ],
)
def test_a_bad_request_fails_with_one_line_and_the_server_keeps_serving(service_client, served, make, says):
    import tinker

    tc = service_client.create_lora_training_client(base_model=served.engine.source, rank=4).result(timeout=T)
    with pytest.raises(tinker.RequestFailedError, match=says) as info:
        make(tc).result(timeout=T)
    assert "\n" not in str(info.value)
    assert service_client.create_sampling_client(base_model=served.engine.source).result(timeout=T) is not None
    tc2 = service_client.create_lora_training_client(base_model=served.engine.source, rank=4).result(timeout=T)
    assert tc2.forward([_datum(TOKENS)], "cross_entropy").result(timeout=T).metrics["loss:sum"] > 0


def test_mismatched_lengths_and_unknown_paths_are_named(service_client, served):
    import tinker
    from tinker import types

    tc = service_client.create_lora_training_client(base_model=served.engine.source, rank=4).result(timeout=T)
    bad = types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]), loss_fn_inputs={"target_tokens": TOKENS[1:4]}
    )
    with pytest.raises(tinker.RequestFailedError, match=r"has 3 values for 7 input tokens"):
        tc.forward([bad], "cross_entropy").result(timeout=T)
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint at"):
        service_client.create_training_client_from_state("tinker://nobody:train:0/weights/none").result(timeout=T)
    with pytest.raises(tinker.BadRequestError, match="no checkpoint at"):
        service_client.create_sampling_client(model_path="tinker://nobody:train:0/sampler_weights/none").result(
            timeout=T
        )


def test_off_loopback_needs_a_key_and_a_wrong_key_is_refused(served, start_server):
    import tinker

    from grpokit.service import serve

    with pytest.raises(ValueError, match="set an API key"):
        serve("any-model", host="0.0.0.0")
    keyed = start_server(served.engine, api_key="tml-secret")
    try:
        with pytest.raises(tinker.AuthenticationError, match="invalid or missing API key"):
            tinker.ServiceClient(base_url=keyed.url, api_key="tml-wrong").get_server_capabilities()
        good = tinker.ServiceClient(base_url=keyed.url, api_key="tml-secret").get_server_capabilities()
        assert [m.model_name for m in good.supported_models] == [served.engine.name]
    finally:
        keyed.stop()


def test_sdk_versions_outside_the_tested_range_are_warned_about():
    from grpokit.service.app import _tested_sdk

    assert _tested_sdk("0.34.0") and _tested_sdk("0.38.0") and _tested_sdk(None)
    assert not _tested_sdk("0.24.1") and not _tested_sdk("0.39.0")
