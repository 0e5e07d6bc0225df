"""Mixture-of-experts routing replay: the experts recorded while generating are those a full forward chooses, the
learner's forward routes to them with gate weights from its own router (which keeps its gradient), identical weights
give the same log-probabilities, and a perturbed router is held to the sampler's experts. Three families: Qwen3-MoE,
Mixtral, OLMoE (tiny random configs)."""

import copy

import pytest
import torch
from transformers import GenerationConfig

from grpokit import routing
from grpokit.generation.transformers_backend import TransformersGenerator
from grpokit.scoring import score_tokens
from grpokit.tiny import MOE_FAMILIES, build_model, build_moe, build_tokenizer

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15, 16]]
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _generate(model, tokenizer, prompts=PROMPTS):
    """Completions of `prompts` by the transformers backend with routes recorded: (prompt ids, completion ids,
    routes per row)."""
    config = GenerationConfig(
        do_sample=True, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id
    )
    generator = TransformersGenerator(
        model, config, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id]
    )
    generator.route_recorder = routing.RouteRecorder()
    torch.manual_seed(0)
    generated = generator.generate(prompts)
    return generated.completion_ids, generated.routes


def _batch(prompts, completions, routes):
    """input_ids, attention_mask, completion width and the padded routes of a left/right padded batch."""
    width_p, width_c = max(map(len, prompts)), max(map(len, completions))
    ids = torch.zeros(len(prompts), width_p + width_c, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, width_p - len(p) : width_p] = torch.tensor(p)
        ids[i, width_p : width_p + len(c)] = torch.tensor(c)
        mask[i, width_p - len(p) : width_p + len(c)] = 1
    padded = routing.padded_routes(routes, [len(p) for p in prompts], width_p, width_c)
    return ids, mask, width_c, padded


def _own_routes(model, ids, mask) -> torch.Tensor:
    """The routers' own choice over a full forward of the batch: (B, T, routers, k)."""
    recorder = routing.RouteRecorder()
    with recorder.recording(model, ids.size(0)), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    return torch.stack(recorder.steps[0], dim=2).long()


def _same_sets(a, b):
    return (a.sort(dim=-1).values == b.sort(dim=-1).values).all(dim=-1)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_generation_records_the_experts_a_full_forward_chooses(family, tokenizer):
    model = build_moe(tokenizer, family).eval()
    completions, routes = _generate(model, tokenizer)
    assert [r.shape for r in routes] == [(len(p) + NEW_TOKENS, 2, 2) for p in PROMPTS]  # tokens, routers, top_k
    for row in routes:  # every token recorded but the last sampled one, which the sampler never fed back
        assert (row[:-1] >= 0).all() and (row[-1] == routing.UNROUTED).all()
    ids, mask, _, padded = _batch(PROMPTS, completions, routes)
    recorded = (padded >= 0).all(dim=-1)
    assert int(recorded.sum()) == 2 * sum(len(p) + NEW_TOKENS - 1 for p in PROMPTS)  # per router
    own = _own_routes(model, ids, mask)
    assert _same_sets(own, padded.long())[recorded].all()
    assert not recorded[mask == 0].any()  # padding is never replayed


def test_a_lora_wrapped_model_is_recorded_as_a_plain_one(tokenizer):
    """PEFT's generate calls the model inside its wrapper: the routers alone mark each forward call."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_moe(tokenizer, "olmoe"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.eval()
    completions, routes = _generate(model, tokenizer)
    ids, mask, _, padded = _batch(PROMPTS, completions, routes)
    recorded = (padded >= 0).all(dim=-1)
    assert int(recorded.sum()) == 2 * sum(len(p) + NEW_TOKENS - 1 for p in PROMPTS)
    assert _same_sets(_own_routes(model, ids, mask), padded.long())[recorded].all()


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_replay_with_identical_weights_gives_the_same_logprobs_and_trains_the_router(family, tokenizer):
    model = build_moe(tokenizer, family).eval()
    completions, routes = _generate(model, tokenizer)
    ids, mask, width_c, padded = _batch(PROMPTS, completions, routes)
    with torch.no_grad():
        plain = score_tokens(model, ids, mask, width_c).logps
    agreement = routing.Agreement()
    replayed = score_tokens(model, ids, mask, width_c, routes=padded, agreement=agreement).logps
    active = mask[:, -width_c:].bool()
    assert torch.allclose(replayed[active], plain[active], atol=1e-6)  # ratio exp(0) = 1
    assert agreement.fraction == 1.0 and agreement.replayed == int((padded >= 0).all(-1).sum())
    replayed[active].sum().backward()
    grads = [router.weight.grad for router in routing.routers(model)]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)  # the gates are the learner's: it learns


def test_gate_weights_are_the_learners_softmax_at_the_replayed_experts(tokenizer):
    """One router, two tokens replayed to experts (2, 0) and (5, 7): gates softmax(h W^T) at those, whatever the
    router's own top-2 is; renormalised to sum 1 when the router renormalises (Qwen3-MoE's norm_topk_prob)."""
    model = build_moe(tokenizer, "qwen3_moe").eval()
    router = routing.routers(model)[0]
    hidden = torch.randn(2, router.weight.size(1), generator=torch.Generator().manual_seed(3))
    routes = torch.full((1, 2, 2, 2), routing.UNROUTED, dtype=torch.int16)
    routes[0, :, 0] = torch.tensor([[2, 0], [5, 7]], dtype=torch.int16)
    probs = torch.softmax(hidden @ router.weight.t(), dim=-1).detach()
    expected = torch.stack([probs[0, [2, 0]], probs[1, [5, 7]]])
    for normalise in (False, True):
        router.norm_topk_prob = normalise
        with routing.replaying(model, routes), torch.no_grad():
            logits, gates, indices = router(hidden)
        assert indices.tolist() == [[2, 0], [5, 7]]
        want = expected / expected.sum(-1, keepdim=True) if normalise else expected
        assert torch.allclose(gates, want, atol=1e-6)
    assert "forward" not in vars(router)  # the block's end restores the router


def test_a_perturbed_router_is_held_to_the_samplers_experts(tokenizer):
    """The learner's routers moved by noise: by itself it routes some tokens elsewhere and its log-probabilities move;
    replaying, every token goes to the sampler's experts and the log-probabilities stay closer to the sampler's."""
    sampler = build_moe(tokenizer, "qwen3_moe").eval()
    completions, routes = _generate(sampler, tokenizer)
    ids, mask, width_c, padded = _batch(PROMPTS, completions, routes)
    learner = copy.deepcopy(sampler)
    with torch.no_grad():
        for router in routing.routers(learner):
            router.weight.add_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
        reference = score_tokens(sampler, ids, mask, width_c).logps
        own = score_tokens(learner, ids, mask, width_c).logps
        agreement = routing.Agreement()
        used = []
        handles = [r.register_forward_hook(lambda m, a, out: used.append(out[2])) for r in routing.routers(learner)]
        replayed = score_tokens(learner, ids, mask, width_c, routes=padded, agreement=agreement).logps
        for handle in handles:
            handle.remove()
    recorded = (padded >= 0).all(dim=-1)
    assert agreement.fraction < 0.9  # by itself the learner would route many tokens elsewhere
    used = torch.stack(used, dim=1).reshape(padded.shape).long()  # (B, T, routers, k)
    assert _same_sets(used, padded.long())[recorded].all()  # replayed: the sampler's experts, every one
    active = mask[:, -width_c:].bool()
    gap_own = (own - reference)[active].abs().mean()
    gap_replayed = (replayed - reference)[active].abs().mean()
    assert gap_replayed < 0.5 * gap_own, (gap_replayed, gap_own)


def test_activation_checkpointing_recomputes_with_the_replayed_experts(tokenizer):
    """Under gradient checkpointing the backward pass runs each layer's forward again: the routers must replay there
    too (until `routing.release`), so the gradients equal those without checkpointing. A learner whose routers moved
    makes that visible: routed by itself in the recomputation, its experts (and gradients) would differ."""
    sampler = build_moe(tokenizer, "mixtral").eval()
    completions, routes = _generate(sampler, tokenizer)
    ids, mask, width_c, padded = _batch(PROMPTS, completions, routes)
    grads = []
    for checkpointed in (False, True):
        learner = copy.deepcopy(sampler).train()
        with torch.no_grad():
            for router in routing.routers(learner):
                router.weight.add_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
        if checkpointed:
            learner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        agreement = routing.Agreement()
        logps = score_tokens(learner, ids, mask, width_c, routes=padded, agreement=agreement).logps
        assert all("forward" in vars(r) for r in routing.routers(learner))  # still replaying: backward is to come
        logps[mask[:, -width_c:].bool()].sum().backward()
        routing.release(learner)
        assert not any("forward" in vars(r) for r in routing.routers(learner))
        assert agreement.replayed == int((padded >= 0).all(-1).sum())  # counted once, not again in the recomputation
        grads.append({n: p.grad.clone() for n, p in learner.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_a_model_without_routers_or_with_another_router_is_refused(tokenizer):
    with pytest.raises(routing.ReplayUnsupported, match="Qwen2ForCausalLM has no mixture-of-experts router"):
        routing.routers(build_model(tokenizer))

    class SigmoidTopKRouter(torch.nn.Module):  # DeepSeek-V3-style scores: not a softmax top-k
        def __init__(self):
            super().__init__()
            self.top_k, self.weight = 2, torch.nn.Parameter(torch.randn(4, 8))

        def forward(self, hidden):
            logits = hidden @ self.weight.t()
            scores, indices = torch.topk(torch.sigmoid(logits), 2, dim=-1)
            return logits, scores, indices

    holder = torch.nn.Sequential(SigmoidTopKRouter())
    with pytest.raises(routing.ReplayUnsupported, match="SigmoidTopKRouter does not route by the softmax top-k"):
        routing.routers(holder)
