"""What the vLLM backends share, without vLLM: the sampling mapping, parameter names, the weights pushed."""

from types import SimpleNamespace

import pytest
import torch

from grpokit.generation.vllm_common import policy_weights, sampling_kwargs, vllm_name


def args(**overrides):
    values = dict(
        repetition_penalty=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        max_completion_length=256,
        vllm_structured_outputs_regex=None,
        generation_kwargs=None,
    )
    return SimpleNamespace(**{**values, **overrides})


def test_sampling_defaults_as_trl_maps_them():
    assert sampling_kwargs(args()) == {
        "n": 1,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,  # vLLM's "off"
        "min_p": 0.0,  # None -> vLLM's "off"
        "max_tokens": 256,  # max_completion_length
        "logprobs": 0,  # the sampled token's logprob only
    }


def test_every_field_reaches_sampling_and_generation_kwargs_win():
    kwargs = sampling_kwargs(
        args(
            temperature=0.7,
            top_p=0.9,
            top_k=50,
            min_p=0.05,
            repetition_penalty=1.1,
            max_completion_length=64,
            generation_kwargs={"temperature": 0.5, "min_tokens": 8},
        ),
        n=4,
    )
    assert kwargs["n"] == 4 and kwargs["top_p"] == 0.9 and kwargs["top_k"] == 50 and kwargs["min_p"] == 0.05
    assert kwargs["repetition_penalty"] == 1.1 and kwargs["max_tokens"] == 64
    assert kwargs["temperature"] == 0.5 and kwargs["min_tokens"] == 8  # generation_kwargs override the fields


def test_structured_outputs_regex_wins_over_generation_kwargs():
    kwargs = sampling_kwargs(
        args(vllm_structured_outputs_regex=r"\d+", generation_kwargs={"structured_outputs": {"regex": "[a-z]+"}})
    )
    assert kwargs["structured_outputs"] == {"regex": r"\d+"}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("module.model.norm.weight", "model.norm.weight"),  # DDP
        ("base_model.model.model.layers.1.mlp.up_proj.base_layer.weight", "model.layers.1.mlp.up_proj.weight"),  # PEFT
        ("base_model.model.model.layers.1.mlp.up_proj.lora_A.default.weight", None),  # adapter matrices: merged
        ("model.layers.0._checkpoint_wrapped_module.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight"),
        ("_orig_mod.lm_head.weight", "lm_head.weight"),  # torch.compile
    ],
)
def test_parameter_names_as_vllm_loads_them(name, expected):
    assert vllm_name(name) == expected


def test_lora_weights_are_merged_without_touching_the_model(tiny_model):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], init_lora_weights=False)
    model = peft.get_peft_model(tiny_model, config)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pushed = dict(policy_weights(model))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # base and adapter untouched
    assert not any("lora" in name for name in pushed)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    expected = layer.base_layer.weight + layer.lora_B["default"].weight @ layer.lora_A["default"].weight * (4 / 2)
    torch.testing.assert_close(pushed["model.layers.0.self_attn.q_proj.weight"], expected)
    k_proj = model.base_model.model.model.layers[0].self_attn.k_proj.weight  # not adapted: as it is
    assert torch.equal(pushed["model.layers.0.self_attn.k_proj.weight"], k_proj)
    assert len(pushed) == len(list(tiny_model.named_parameters())) - 2 * 2  # every base weight once, no lora_A/B


QWEN2_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def test_trainable_weights_are_whole_engine_layers(tiny_model):
    """Full fine-tuning: every weight. A frozen embedding (tied LM head) and frozen norms: left out. LoRA on q_proj
    and up_proj: the fused q/k/v and gate/up layers whole (their engine layers reload from every part), nothing else;
    without a packing map each part stands alone."""
    peft = pytest.importorskip("peft")
    from grpokit.generation.vllm_common import trainable_weights

    every = {name for name, _ in policy_weights(tiny_model)}
    assert trainable_weights(tiny_model, QWEN2_PACKED) == every
    for name, param in tiny_model.named_parameters():
        param.requires_grad_("norm" not in name and "embed" not in name)
    assert trainable_weights(tiny_model, QWEN2_PACKED) == {n for n in every if "norm" not in n and "embed" not in n}
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "up_proj"])
    lora = peft.get_peft_model(tiny_model, config)
    expected = {
        f"model.layers.{i}.{part}.{leaf}"
        for i in range(tiny_model.config.num_hidden_layers)
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
        for leaf in ("weight", "bias")
    } & every
    assert trainable_weights(lora, QWEN2_PACKED) == expected
    assert (
        "model.layers.0.self_attn.o_proj.weight" not in expected and "model.layers.0.mlp.gate_proj.weight" in expected
    )
    assert {n for n in trainable_weights(lora, {}) if "gate" in n or "k_proj" in n} == set()  # no fusing: parts alone
