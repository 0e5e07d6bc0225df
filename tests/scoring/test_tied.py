"""A tied embedding and LM head: the weight's two gradients built in one tensor, the same sum as autograd's, received
once by the weight; the embedding module as usual wherever that would not hold."""

import pytest
import torch
from test_prefix import grpo_batch, scores_and_grads
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from grpokit.scoring.tied import TiedWeight, tied_weight


def test_the_embeddings_rows_added_to_the_handed_over_gradient_by_hand():
    embedding = nn.Embedding(4, 2, padding_idx=0)
    tied = TiedWeight(embedding)
    tokens = torch.tensor([[1, 2, 1, 0]])
    x = tied.embed(tokens)
    assert torch.equal(x, embedding.weight.detach()[tokens])
    upstream = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]])
    (x * upstream).sum().backward(retain_graph=True)
    # token 1 twice: (1, 2) + (5, 6); token 2: (3, 4); the padding token 0 gets nothing
    assert embedding.weight.grad.tolist() == [[0, 0], [6, 8], [3, 4], [0, 0]]
    embedding.weight.grad = None
    handed = torch.full((4, 2), 0.5)
    tied.hand_over(handed)  # as the LM head's backward does
    (x * upstream).sum().backward()
    assert embedding.weight.grad.tolist() == [[0.5, 0.5], [6.5, 8.5], [3.5, 4.5], [0.5, 0.5]]
    assert handed.tolist() == embedding.weight.grad.tolist()  # added into in place (the weight's is a copy: the
    # test holds `handed`, so AccumulateGrad cannot take it)
    assert tied.take() is None
    tied.hand_over(torch.ones(4, 2))
    tied.hand_over(torch.ones(4, 2))  # two LM heads on one embedding: both count
    assert tied.take().tolist() == [[2, 2]] * 4


class _NewTensorsOfShape(TorchDispatchMode):
    """Counts the operations that return a new tensor of `shape` (in-place operations and views left out)."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.ops = torch.Size(shape), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        fresh = not name.endswith("_") and not func.is_view and "out" not in (kwargs or {})
        if fresh and isinstance(out, torch.Tensor) and out.shape == self.shape:
            self.ops.append(name)
        return out


def test_the_tied_weights_gradient_received_once_as_from_autograd(tiny_model):
    ids, mask, completion_mask = grpo_batch()
    weight = tiny_model.get_input_embeddings().weight
    assert tiny_model.get_output_embeddings().weight is weight
    seen, accumulated = [], []
    weight.register_hook(lambda grad: seen.append(grad.clone()))
    weight.register_post_accumulate_grad_hook(lambda p: accumulated.append(p.grad.clone()))
    plain = scores_and_grads(tiny_model, ids, mask, completion_mask, share_prefix=False)
    assert len(seen) == 1 and len(accumulated) == 1
    shared = scores_and_grads(tiny_model, ids, mask, completion_mask)
    assert len(seen) == 2 and len(accumulated) == 2  # one sum, received once
    name = next(n for n, p in tiny_model.named_parameters() if p is weight)
    torch.testing.assert_close(shared[2][name], plain[2][name], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(seen[1], plain[2][name], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(accumulated[1], plain[2][name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "share_prefix, expected", [(False, ["mm", "embedding_dense_backward", "add"]), (True, ["zeros_like"])]
)
def test_the_tied_weights_gradient_built_in_one_tensor(tiny_model, share_prefix, expected):
    from grpokit.scoring import score_tokens

    ids, mask, completion_mask = grpo_batch()
    weight = tiny_model.get_input_embeddings().weight
    assert sum(p.shape == weight.shape for p in tiny_model.parameters()) == 1
    tiny_model.zero_grad()
    scores = score_tokens(tiny_model, ids, mask, completion_mask.size(1), share_prefix=share_prefix)
    with _NewTensorsOfShape(weight.shape) as counted:
        scores.logps[completion_mask.bool()].sum().backward()
    # the plain pass: the LM head's gradient (its product), the embedding's, and autograd's sum of the two; the one
    # pass: the LM head's only (zeros_like, added into by chunk), the embedding's rows added into it, and the weight
    # takes that tensor (no copy)
    assert counted.ops == expected, counted.ops
    assert weight.grad is not None


def test_gradients_accumulate_across_backward_passes(tiny_model):
    from grpokit.scoring import score_tokens

    ids, mask, completion_mask = grpo_batch(seed=1)
    weight = tiny_model.get_input_embeddings().weight

    def backward():
        scores = score_tokens(tiny_model, ids, mask, completion_mask.size(1), temperature=0.8)
        scores.logps[completion_mask.bool()].sum().backward()

    tiny_model.zero_grad()
    backward()
    once = weight.grad.clone()
    backward()
    torch.testing.assert_close(weight.grad, 2 * once)


def test_a_backward_pass_that_does_not_reach_the_weight_leaves_it_alone(tiny_model):
    from grpokit.scoring import score_tokens

    ids, mask, completion_mask = grpo_batch(seed=2)
    tiny_model.zero_grad()
    norm = tiny_model.model.norm.weight
    scores = score_tokens(tiny_model, ids, mask, completion_mask.size(1))
    scores.logps[completion_mask.bool()].sum().backward(inputs=[norm])
    assert norm.grad is not None and tiny_model.get_input_embeddings().weight.grad is None


def test_only_a_plain_tied_weight_that_gets_a_gradient(tiny_tokenizer):
    from grpokit.tiny import build_model

    model = build_model(tiny_tokenizer)
    assert isinstance(tied_weight(model), TiedWeight)
    with torch.no_grad():
        assert tied_weight(model) is None
    model.get_input_embeddings().weight.requires_grad_(False)
    assert tied_weight(model) is None
    model.get_input_embeddings().weight.requires_grad_(True)
    model.enable_input_require_grads()  # what activation checkpointing (and PEFT with it) adds: still plain
    assert isinstance(tied_weight(model), TiedWeight)
    handle = model.get_input_embeddings().register_forward_hook(lambda module, args, out: out * 2)
    assert tied_weight(model) is None  # the user's hook runs: the module's own forward
    handle.remove()
    model.get_input_embeddings().max_norm = 1.0
    assert tied_weight(model) is None
    model.get_input_embeddings().max_norm = None
    model.get_input_embeddings().sparse = True
    assert tied_weight(model) is None
    untied = build_model(tiny_tokenizer)
    untied.lm_head.weight = nn.Parameter(untied.lm_head.weight.detach().clone())
    assert tied_weight(untied) is None


@pytest.mark.parametrize("hooked", [False, True])
def test_scores_use_the_tied_path_only_where_it_holds(tiny_model, monkeypatch, hooked):
    from grpokit.scoring import tied as tied_module

    made = []
    real = tied_module.TiedWeight.embed
    monkeypatch.setattr(tied_module.TiedWeight, "embed", lambda self, tokens: made.append(1) or real(self, tokens))
    if hooked:
        tiny_model.get_input_embeddings().register_forward_hook(lambda module, args, out: out)
    ids, mask, completion_mask = grpo_batch(seed=3)
    plain = scores_and_grads(tiny_model, ids, mask, completion_mask, share_prefix=False)
    shared = scores_and_grads(tiny_model, ids, mask, completion_mask)
    assert len(made) == (0 if hooked else 1)
    for name in plain[2]:
        torch.testing.assert_close(shared[2][name], plain[2][name], rtol=1e-4, atol=1e-6)
