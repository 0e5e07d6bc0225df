"""Truncated sampling: the kept set of top-k / top-p / min-p, log-probabilities renormalised over it, in both scoring
paths, and the filters as transformers' own warpers apply them."""

import math

import pytest
import torch

from grpokit import GRPOConfig
from grpokit.algorithms.logprobs import linear_token_logps, token_logps_and_entropy
from grpokit.algorithms.truncation import Truncation, kept_mask, sampling_truncation

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])
Z = PROBS.log().unsqueeze(0)  # (1, 4): tempered logits whose softmax is PROBS


def _kept(**filters) -> list[int]:
    return kept_mask(Z, Truncation(**filters))[0].nonzero().flatten().tolist()


def test_each_filter_keeps_what_it_should():
    assert _kept(top_k=2) == [0, 1]
    # ascending mass 0.05, 0.20, 0.50, 1.0: top_p 0.7 drops what is at most 0.3, top_p 0.9 what is at most 0.1
    assert _kept(top_p=0.7) == [0, 1]
    assert _kept(top_p=0.9) == [0, 1, 2]
    # min_p keeps p >= min_p x 0.5
    assert _kept(min_p=0.5) == [0, 1]  # 0.3 >= 0.25
    assert _kept(min_p=0.2) == [0, 1, 2]  # 0.15 >= 0.1
    assert _kept(top_k=1, top_p=0.99) == [0]
    assert not Truncation().active and Truncation(top_k=3).active


def test_the_backends_order_matters_for_min_p_with_top_p():
    """transformers: top-p on the whole distribution (ascending mass 0.05, 0.20, ...: drops only 0.05 at top_p 0.83),
    then min-p 0.2 (keeps >= 0.1): {0, 1, 2}. vLLM: min-p first ({0, 1, 2}, renormalised to 0.526, 0.316, 0.158),
    then top-p 0.83 drops 0.158 <= 0.17: {0, 1}."""
    assert _kept(top_p=0.83, min_p=0.2, order="transformers") == [0, 1, 2]
    assert _kept(top_p=0.83, min_p=0.2, order="vllm") == [0, 1]


def test_the_sampled_token_is_always_kept():
    keep = kept_mask(Z, Truncation(top_k=1), labels=torch.tensor([2]))
    assert keep[0].tolist() == [True, False, True, False]


def test_logps_are_renormalised_over_the_kept_set_with_its_gradient():
    """top_k 2, label 1: log(0.3 / 0.8); gradient d/dz = onehot(1) - (0.625, 0.375, 0, 0) = (-0.625, 0.625, 0, 0)."""
    z = Z.clone().unsqueeze(0).requires_grad_(True)  # (1, 1, 4)
    logps, entropies = token_logps_and_entropy(z, torch.tensor([[1]]), truncation=Truncation(top_k=2))
    assert logps.item() == pytest.approx(math.log(0.3 / 0.8), abs=1e-6)
    expected_entropy = -(0.625 * math.log(0.625) + 0.375 * math.log(0.375))
    assert entropies.item() == pytest.approx(expected_entropy, abs=1e-6)
    logps.sum().backward()
    assert z.grad.flatten().tolist() == pytest.approx([-0.625, 0.625, 0.0, 0.0], abs=1e-6)
    full, _ = token_logps_and_entropy(Z.unsqueeze(0), torch.tensor([[1]]))
    assert full.item() == pytest.approx(math.log(0.3), abs=1e-6)  # no truncation: the whole vocabulary


def test_temperature_is_applied_before_the_filters():
    """At temperature 2 the tempered probabilities are sqrt(p) normalised: 0.707, 0.548, 0.387, 0.224 over 1.866,
    i.e. 0.379, 0.294, 0.208, 0.120; min_p 0.5 keeps >= 0.190: {0, 1, 2}, where at temperature 1 it keeps {0, 1}."""
    labels = torch.tensor([[2]])
    logps, _ = token_logps_and_entropy(Z.unsqueeze(0), labels, temperature=2.0, truncation=Truncation(min_p=0.5))
    roots = PROBS.sqrt()
    assert logps.item() == pytest.approx(math.log(roots[2] / roots[:3].sum()), abs=1e-6)


def test_the_fused_head_path_agrees_with_the_plain_one_values_and_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(12, 16, dtype=torch.float64)
    weight = torch.randn(50, 16, dtype=torch.float64)
    labels = torch.randint(0, 50, (12,))
    truncation = Truncation(top_k=20, top_p=0.8, min_p=0.05)
    results = []
    for fused in (True, False):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        if fused:
            logps, entropies = linear_token_logps(
                h, w, None, labels, temperature=0.7, entropy="grad", logits_per_chunk=150, truncation=truncation
            )  # 3 rows a chunk: the kept set is recomputed per chunk, forward and backward
        else:
            logps, entropies = token_logps_and_entropy(h @ w.t(), labels, temperature=0.7, truncation=truncation)
        (logps.sum() + 0.1 * entropies.sum()).backward()
        results.append((logps.detach(), entropies.detach(), h.grad, w.grad))
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a.double(), b.double(), atol=1e-5)  # both paths compute in float32
    assert torch.isfinite(results[0][0]).all()


def test_the_filters_match_transformers_own_warpers():
    """Random logits through transformers' TemperatureLogitsWarper, TopK, TopP and MinP, in generate's order: the
    tokens they leave finite are exactly the kept set."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(1)
    logits = torch.randn(64, 1000) * 3
    for top_k, top_p, min_p in [(20, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.1), (20, 0.8, 0.1), (0, 0.9, 0.05)]:
        warped = TemperatureLogitsWarper(0.7)(None, logits.clone())
        if top_k:
            warped = TopKLogitsWarper(top_k)(None, warped)
        if top_p < 1:
            warped = TopPLogitsWarper(top_p)(None, warped)
        if min_p:
            warped = MinPLogitsWarper(min_p)(None, warped)
        ours = kept_mask(logits / 0.7, Truncation(top_k=top_k, top_p=top_p, min_p=min_p))
        assert torch.equal(ours, torch.isfinite(warped)), (top_k, top_p, min_p)


def test_the_run_takes_its_sampler_filters_from_the_config(tmp_path):
    def config(**kwargs):
        return GRPOConfig(output_dir=str(tmp_path), report_to="none", **kwargs)

    assert sampling_truncation(config()) is None  # TRL's defaults do not truncate
    assert sampling_truncation(config(top_p=0.9)) == Truncation(top_p=0.9, order="transformers")
    assert sampling_truncation(config(top_p=0.9, generation_kwargs={"top_k": 5, "top_p": 1.0})) == Truncation(top_k=5)
    assert sampling_truncation(config(min_p=0.1, use_vllm=True)) == Truncation(min_p=0.1, order="vllm")
    assert sampling_truncation(config(top_k=20, logprobs_over_kept_tokens=False)) is None


def test_top_p_cut_beyond_its_candidates_sorts_the_row():
    """top_p 0.7 keeps 0.5 and 0.3: the cut is log 0.3. With one candidate the nucleus reaches past it (the mass
    before the second token, 0.5, is below 0.7): the row is sorted whole and gives the same cut."""
    from grpokit.algorithms.truncation import kept_threshold

    for candidates in (1, 2, 4):
        cut = kept_threshold(Z, Truncation(top_p=0.7), candidates=candidates)
        assert cut.tolist() == pytest.approx([math.log(0.3)], abs=1e-6)
    torch.manual_seed(3)
    flat = torch.randn(16, 500) * 0.3  # a nucleus of hundreds of tokens
    few = kept_threshold(flat, Truncation(top_p=0.9), candidates=8)
    assert torch.equal(few, kept_threshold(flat, Truncation(top_p=0.9), candidates=500))


def test_the_fused_path_filters_once_and_reuses_the_cut_in_backward(monkeypatch):
    """The forward pass computes each chunk's thresholds; backward recomputes the logits, not the filters."""
    import grpokit.algorithms.logprobs as logprobs

    calls = []
    original = logprobs.kept_threshold
    monkeypatch.setattr(logprobs, "kept_threshold", lambda *a, **k: calls.append(1) or original(*a, **k))
    hidden = torch.randn(12, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    logps, _ = linear_token_logps(
        hidden, weight, None, torch.randint(0, 50, (12,)), logits_per_chunk=150, truncation=Truncation(top_p=0.8)
    )
    assert len(calls) == 4  # 12 rows, 3 a chunk
    logps.sum().backward()
    assert len(calls) == 4 and hidden.grad is not None


def test_top_p_never_keeps_what_an_earlier_filter_took_away():
    """top-k 2 leaves 0.5 and 0.3 (renormalised 0.625, 0.375); a top-p of nearly 1 keeps both, and not the tokens
    top-k removed, even when the two kept masses sum to a hair under top_p in float32."""
    assert _kept(top_k=2, top_p=1 - 1e-7) == [0, 1]
    assert _kept(top_k=2, top_p=1 - 1e-7, order="vllm") == [0, 1]
