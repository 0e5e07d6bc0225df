"""`lean_layers`: the Llama MLP and RMSNorm with less kept for backward. The same outputs and gradients as autograd
through the model's own modules (float32, and bf16 autocast up to its rounding), the bytes kept for backward counted
against a hand count, and the modules they do not take."""

import pytest
import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from grpokit.fastpath.lean_layers import gated_mlp, lean_mlp, lean_norm, rms_norm

TOKENS, HIDDEN, INTERMEDIATE = 10, 8, 12


def mlp_and_norm(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_attention_heads=2, num_key_value_heads=2
    )
    mlp, norm = LlamaMLP(config), LlamaRMSNorm(HIDDEN, eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.5)
    return mlp, norm


def saved_activation_bytes(fn, params):
    """Bytes autograd keeps for backward while `fn()` runs, parameters left out (each storage counted once)."""
    kept = {}
    skip = {p.data_ptr() for p in params}

    def pack(t):
        if t.data_ptr() not in skip:
            kept[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(kept.values())


def grads(out, inputs, upstream):
    return torch.autograd.grad(out, inputs, upstream)


def test_same_outputs_and_gradients_as_the_modules():
    mlp, norm = mlp_and_norm()
    x = torch.randn(1, TOKENS, HIDDEN, requires_grad=True)
    upstream = torch.randn(1, TOKENS, HIDDEN)
    params = [x, *mlp.parameters(), norm.weight]
    theirs = mlp(norm(x))
    ours = gated_mlp(mlp, rms_norm(norm, x))
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=1e-5)
    for a, b in zip(grads(ours, params, upstream), grads(theirs, params, upstream), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_under_bf16_autocast_as_autocast_through_the_modules():
    mlp, norm = mlp_and_norm(1)
    x = torch.randn(1, TOKENS, HIDDEN, requires_grad=True)
    upstream = torch.randn(1, TOKENS, HIDDEN)
    params = [x, *mlp.parameters(), norm.weight]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = mlp(norm(x))
        ours = gated_mlp(mlp, rms_norm(norm, x))
    assert ours.dtype == theirs.dtype == torch.bfloat16
    assert torch.allclose(ours.float(), theirs.float(), atol=0.02, rtol=0.02)  # bf16: 8 bits of mantissa
    for a, b in zip(grads(ours, params, upstream), grads(theirs, params, upstream), strict=True):
        assert a.dtype == b.dtype == torch.float32  # gradients of float32 tensors
        assert torch.allclose(a, b, atol=0.03 * b.abs().max().item(), rtol=0.03)


def test_keeps_less_for_backward():
    mlp, norm = mlp_and_norm()
    x = torch.randn(1, TOKENS, HIDDEN, requires_grad=True)
    params = [*mlp.parameters(), norm.weight]
    h = norm(x).detach().requires_grad_()
    _, theirs = saved_activation_bytes(lambda: mlp(h), params)
    _, ours = saved_activation_bytes(lambda: gated_mlp(mlp, h), params)
    # ours: h (tokens x hidden), the gate's and up's outputs (tokens x intermediate), float32
    assert ours == 4 * (TOKENS * HIDDEN + 2 * TOKENS * INTERMEDIATE)
    # autograd also keeps SiLU's output and the product
    assert theirs == ours + 4 * 2 * TOKENS * INTERMEDIATE
    _, theirs = saved_activation_bytes(lambda: norm(x), params)
    _, ours = saved_activation_bytes(lambda: rms_norm(norm, x), params)
    assert ours == 4 * (TOKENS * HIDDEN + TOKENS)  # x and one scale per token
    assert theirs >= ours + 4 * TOKENS * HIDDEN - 4 * TOKENS  # autograd keeps the normalised x as well


def test_frozen_weights_get_no_gradient():
    mlp, _ = mlp_and_norm()
    mlp.requires_grad_(False)
    x = torch.randn(1, TOKENS, HIDDEN, requires_grad=True)
    (grad_x,) = torch.autograd.grad(gated_mlp(mlp, x).sum(), [x])
    (expected,) = torch.autograd.grad(mlp(x).sum(), [x])
    assert torch.allclose(grad_x, expected, atol=1e-6)


def test_only_plain_modules():
    mlp, norm = mlp_and_norm()
    x = torch.randn(2, HIDDEN)
    assert lean_mlp(mlp) and lean_norm(norm, x)
    assert not lean_norm(norm, x.bfloat16())  # the model's own casts differ there
    hooked, _ = mlp_and_norm()
    hooked.up_proj.register_forward_hook(lambda *a: None)
    assert not lean_mlp(hooked)
    gelu, _ = mlp_and_norm()
    gelu.act_fn = nn.GELU()
    assert not lean_mlp(gelu)
    biased = LlamaMLP(
        LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_attention_heads=2, mlp_bias=True)
    )
    assert not lean_mlp(biased)
    _, hooked_norm = mlp_and_norm()
    hooked_norm.register_forward_pre_hook(lambda *a: None)
    assert not lean_norm(hooked_norm, x)


@pytest.mark.parametrize("lora", [False, True])
def test_adapters_keep_the_modules_forward(lora):
    if not lora:
        assert lean_mlp(mlp_and_norm()[0])
        return
    peft = pytest.importorskip("peft")
    mlp, _ = mlp_and_norm()
    wrapped = peft.get_peft_model(
        nn.ModuleDict({"mlp": mlp}), peft.LoraConfig(target_modules=["gate_proj"], r=2, lora_alpha=4)
    )
    assert not lean_mlp(wrapped.base_model.model["mlp"])
