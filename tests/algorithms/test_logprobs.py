"""`linear_token_logps`: the LM head and log-softmax fused in chunks, against hand-worked values and autograd."""

import math

import pytest
import torch

from grpokit.algorithms.logprobs import linear_token_logps


def test_by_hand():
    # hidden (1, 2) = [1, 0]; weight rows give logits [0, ln 3] (+ bias 0): p = [1/4, 3/4].
    hidden = torch.tensor([[1.0, 0.0]])
    weight = torch.tensor([[0.0, 5.0], [math.log(3.0), 7.0]])
    logps, entropies = linear_token_logps(hidden, weight, None, torch.tensor([1]), entropy="detached")
    assert logps.item() == pytest.approx(math.log(0.75))
    assert entropies.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    # A bias of [0, ln 3] makes the logits [0, 2 ln 3]; temperature 2 brings them back to [0, ln 3]: the same p.
    bias = torch.tensor([0.0, math.log(3.0)])
    logps, none = linear_token_logps(hidden, weight, bias, torch.tensor([1]), temperature=2.0)
    assert logps.item() == pytest.approx(math.log(0.75)) and none is None


def _reference(hidden, weight, bias, labels, temperature):
    log_probs = torch.log_softmax((hidden @ weight.t() + bias) / temperature, dim=-1)
    return log_probs.gather(-1, labels[:, None])[:, 0], -(log_probs.exp() * log_probs).sum(-1)


@pytest.mark.parametrize("entropy", ["none", "detached", "grad"])
@pytest.mark.parametrize("logits_per_chunk", [10**6, 50 * 7])  # one chunk; chunks of 7 rows
def test_values_and_gradients_match_autograd(entropy, logits_per_chunk):
    torch.manual_seed(0)
    hidden = torch.randn(23, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(50, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (23,))
    up_logps, up_entropies = torch.randn(23, dtype=torch.float64), torch.randn(23, dtype=torch.float64)

    logps, entropies = linear_token_logps(
        hidden, weight, bias, labels, temperature=0.7, entropy=entropy, logits_per_chunk=logits_per_chunk
    )
    ref_logps, ref_entropies = _reference(hidden, weight, bias, labels, 0.7)
    assert torch.allclose(logps.double(), ref_logps, atol=1e-5)
    loss, ref_loss = (logps * up_logps).sum(), (ref_logps * up_logps).sum()
    if entropy == "none":
        assert entropies is None
    else:
        assert torch.allclose(entropies.double(), ref_entropies, atol=1e-5)
        assert entropies.requires_grad == (entropy == "grad")
    if entropy == "grad":
        loss, ref_loss = loss + (entropies * up_entropies).sum(), ref_loss + (ref_entropies * up_entropies).sum()
    grads = torch.autograd.grad(loss, [hidden, weight, bias])
    ref_grads = torch.autograd.grad(ref_loss, [hidden, weight, bias])
    for grad, ref in zip(grads, ref_grads, strict=True):
        assert torch.allclose(grad, ref, rtol=1e-5, atol=1e-5)


def test_vanishing_probabilities_give_no_nan():
    # exp(-1e4) underflows to p = 0 in float32: 0 log 0 counts as 0 in the entropy and its gradient.
    hidden = torch.tensor([[1.0]], requires_grad=True)
    weight = torch.tensor([[0.0], [1.0], [-1e4]])
    logps, entropies = linear_token_logps(hidden, weight, None, torch.tensor([0]), entropy="grad")
    (logps + entropies).sum().backward()
    assert torch.isfinite(entropies).all() and torch.isfinite(hidden.grad).all()


def test_unknown_entropy_mode():
    with pytest.raises(ValueError, match="entropy='yes'"):
        linear_token_logps(torch.ones(1, 1), torch.ones(2, 1), None, torch.tensor([0]), entropy="yes")


def test_autocast_backward_recomputes_the_forward_logits():
    # Under bfloat16 autocast the forward's logits are bfloat16 products; the backward pass must recompute the same
    # ones (not float32 ones), or the gradient of log p would not be 1[label] - p: it would not sum to 0 over a row.
    torch.manual_seed(0)
    hidden = torch.randn(5, 8, requires_grad=True)
    weight = torch.randn(30, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logps, _ = linear_token_logps(hidden, weight, None, torch.randint(0, 30, (5,)))
    logps.sum().backward()
    # d(sum of log p)/d(weight) = sum_rows (1[label] - p) hidden: summed over the vocabulary, (1 - 1) hidden = 0.
    assert weight.grad.sum(0).abs().max() < 1e-4


def test_entropy_counts_zero_probabilities_as_nothing():
    from grpokit.algorithms.logprobs import _entropy

    half, quarter = torch.tensor(0.5).log(), torch.tensor(0.25).log()
    log_probs = torch.tensor(
        [[half, half, -torch.inf, -torch.inf], [quarter] * 4, [0.0, -torch.inf, -torch.inf, -1e30]]
    )
    # -sum p log p: two halves, log 2; four quarters, log 4; one certain token, 0 (0 log 0 = 0, never NaN)
    expected = torch.tensor([2.0, 4.0, 1.0]).log()
    assert torch.allclose(_entropy(log_probs), expected, atol=1e-6)
