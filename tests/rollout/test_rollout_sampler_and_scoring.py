"""The prompt order of RepeatSampler, and chunked log-probability scoring against a plain full forward pass."""

import math

import pytest
import torch

from grpokit.algorithms.logprobs import token_logps_and_entropy
from grpokit.rollout import RepeatSampler
from grpokit.scoring import score_tokens


def test_repeat_sampler_order():
    # 5 prompts, chunks of 2 (the fifth is dropped), each chunk served twice, each prompt three times in a row.
    order = list(RepeatSampler(range(5), mini_repeat_count=3, batch_size=2, repeat_count=2, shuffle=False))
    assert order == [0, 0, 0, 1, 1, 1] * 2 + [2, 2, 2, 3, 3, 3] * 2
    assert len(RepeatSampler(range(5), mini_repeat_count=3, batch_size=2, repeat_count=2)) == 24


def test_repeat_sampler_shuffles_reproducibly():
    a = list(RepeatSampler(range(8), mini_repeat_count=2, batch_size=4, seed=1))
    b = list(RepeatSampler(range(8), mini_repeat_count=2, batch_size=4, seed=1))
    assert a == b and sorted(a) == sorted(list(range(8)) * 2) and a != sorted(a)
    assert all(a[i] == a[i + 1] for i in range(0, len(a), 2))  # groups stay whole


def test_token_logps_and_entropy_by_hand():
    # Two tokens with probabilities 1/4 and 3/4: log p(token 1) = ln 0.75; H = -(0.25 ln 0.25 + 0.75 ln 0.75).
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    logps, entropy = token_logps_and_entropy(logits, torch.tensor([[1]]))
    assert logps.item() == pytest.approx(math.log(0.75))
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    # Temperature 2 on logits [0, ln 9] gives the same distribution.
    tempered, _ = token_logps_and_entropy(torch.tensor([[[0.0, math.log(9.0)]]]), torch.tensor([[1]]), temperature=2.0)
    assert tempered.item() == pytest.approx(math.log(0.75))


def test_score_tokens_matches_a_full_forward_pass(tiny_model):
    torch.manual_seed(0)
    prompt = torch.randint(7, 90, (5, 4))
    completion = torch.randint(7, 90, (5, 3))
    input_ids = torch.cat([prompt, completion], dim=1)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # a left-padded prompt
    with torch.no_grad():
        logits = tiny_model(input_ids=input_ids, attention_mask=attention_mask).logits  # (5, 7, V)
        expected = torch.log_softmax(logits[:, 3:-1] / 0.7, dim=-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        for chunk_size in (None, 2, 1):
            scores = score_tokens(
                tiny_model, input_ids, attention_mask, 3, temperature=0.7, chunk_size=chunk_size, compute_entropy=True
            )
            assert torch.allclose(scores.logps, expected, atol=1e-5)
            assert scores.entropies.shape == (5, 3) and (scores.entropies > 0).all()
            assert scores.aux_loss is None


def test_score_tokens_keeps_the_gradient(tiny_model):
    input_ids = torch.randint(7, 90, (2, 5))
    scores = score_tokens(tiny_model, input_ids, torch.ones_like(input_ids), 2, compute_entropy=True)
    (scores.logps.sum() + scores.entropies.sum()).backward()
    assert tiny_model.lm_head.weight.grad is not None


def test_float32_slices_and_checkpointing_change_nothing(tiny_model, monkeypatch):
    import grpokit.scoring as scoring

    input_ids = torch.randint(7, 90, (3, 6))
    mask = torch.ones_like(input_ids)

    def loss_and_grad():
        tiny_model.zero_grad()
        scores = score_tokens(tiny_model, input_ids, mask, 4, temperature=0.9, compute_entropy=True)
        (scores.logps.sum() - 0.1 * scores.entropies.sum()).backward()
        return scores.logps.detach(), tiny_model.lm_head.weight.grad.clone()

    whole_logps, whole_grad = loss_and_grad()  # the tiny batch fits one float32 slice
    monkeypatch.setattr(scoring, "FLOAT32_BUDGET", 1)  # one row per slice, each checkpointed
    sliced_logps, sliced_grad = loss_and_grad()
    assert torch.allclose(whole_logps, sliced_logps, atol=1e-6)
    assert torch.allclose(whole_grad, sliced_grad, atol=1e-6)
