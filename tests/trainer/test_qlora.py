"""QLoRA: LoRA adapters trained on a bitsandbytes-quantised base (`quantization_config`, TRL's way in).

Runs where bitsandbytes is installed (the `qlora` extra, in `test` too, so CI runs it); its CPU build trains 4-bit
and 8-bit layers."""

import os

import pytest
import torch
from _trainer_helpers import last_log_with, text_reward

from grpokit import GRPOTrainer

bnb = pytest.importorskip("bitsandbytes")
peft = pytest.importorskip("peft")

TARGETS = ["q_proj", "v_proj", "up_proj"]
# peft reads transformers' deprecated alias when it wraps a model (the trainer silences it the same way)
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


def _quantization(kind):
    from transformers import BitsAndBytesConfig

    if kind == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=kind, bnb_4bit_use_double_quant=True)


def _base_layers(model):
    """Every Linear of the decoder layers: (name, module), LoRA's wrapper replaced by the layer it wraps."""
    layers = {}
    for name, module in model.named_modules():
        if ".layers." in name and isinstance(module, torch.nn.Linear) and ".lora_" not in name:
            layers[name.replace(".base_layer", "")] = module
    return layers


@pytest.mark.parametrize("kind", ["nf4", "fp4", "8bit"])
def test_qlora_trains_the_adapters_and_keeps_the_base_quantised(tiny_model_dir, dataset, make_args, kind):
    args = make_args(max_steps=2, beta=0.04, save_strategy="no")
    trainer = GRPOTrainer(
        tiny_model_dir,
        text_reward,
        args=args,
        train_dataset=dataset,
        quantization_config=_quantization(kind),
        peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS),
    )
    quantised = bnb.nn.Linear8bitLt if kind == "8bit" else bnb.nn.Linear4bit
    base = _base_layers(trainer.model)
    assert len(base) == 2 * 7  # 2 decoder layers x (q, k, v, o, gate, up, down): every one quantised
    assert all(isinstance(m, quantised) for m in base.values()), {n: type(m).__name__ for n, m in base.items()}
    stored = {n: m.weight.data.clone() for n, m in base.items()}
    assert all(w.dtype in (torch.uint8, torch.int8) for w in stored.values())
    adapters = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert len(adapters) == 2 * len(TARGETS) * 2  # lora_A and lora_B of each target in each layer
    assert {p.dtype for p in adapters.values()} == {torch.bfloat16}  # as TRL: QLoRA adapters in bfloat16
    assert trainer.ref_model is None  # the reference is the quantised base, adapters disabled

    trainer.train()

    # The reference is the quantised base itself: LoRA's B starts at 0, so the first step's policy equals it exactly.
    assert trainer.state.log_history[0]["kl"] == 0.0
    assert last_log_with(trainer, "kl")["kl"] > 0.0  # and the trained adapters move away from it
    after = _base_layers(trainer.model)
    assert all(isinstance(m, quantised) for m in after.values())
    assert all(torch.equal(after[n].weight.data, w) for n, w in stored.items())  # the base is frozen as stored
    now = dict(trainer.model.named_parameters())
    assert all(not torch.equal(now[n].detach(), p) for n, p in adapters.items() if ".lora_B." in n)
    assert any(not torch.equal(now[n].detach(), p) for n, p in adapters.items() if ".lora_A." in n)

    out = os.path.join(args.output_dir, "final")
    trainer.save_model(out)
    files = set(os.listdir(out))
    assert {"adapter_model.safetensors", "adapter_config.json"} <= files
    assert not {"model.safetensors", "pytorch_model.bin"} & files  # the adapter, not a full model
    from safetensors.torch import load_file

    saved = load_file(os.path.join(out, "adapter_model.safetensors"))
    assert len(saved) == len(adapters) and all(".lora_" in n for n in saved)


def test_a_no_gradient_eval_forward_does_not_break_training(tiny_model_dir, dataset, make_args):
    """bitsandbytes' CPU path repacks 4-bit weights on the first no-gradient forward in eval mode (on CPUs with
    AVX512-BF16), after which a training forward of the layer fails; the trainer turns that repacking off."""
    trainer = GRPOTrainer(
        tiny_model_dir,
        text_reward,
        args=make_args(),
        train_dataset=dataset,
        quantization_config=_quantization("nf4"),
        peft_config=peft.LoraConfig(r=4, target_modules=TARGETS),
    )
    model = trainer.model
    ids = torch.tensor([[7, 8, 9, 10, 11]])
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    model.train()
    logits = model(input_ids=ids).logits
    logits.sum().backward()
    assert torch.allclose(logits.detach(), expected)  # dropout off: the same function in both modes
    assert all(p.grad is not None for n, p in model.named_parameters() if ".lora_A." in n)


@pytest.mark.parametrize("kind", ["nf4", "8bit"])
def test_vllm_gets_the_dequantised_base_with_the_adapter_merged(tiny_model_dir, kind):
    """What is pushed to vLLM, loaded into a plain (unquantised) copy of the model, computes what the QLoRA policy
    computes: the quantised base's values plus the adapter, in the model's dtype and shapes."""
    from transformers import AutoModelForCausalLM

    from grpokit.generation.vllm_common import policy_weights
    from grpokit.models import dense_shape, load_policy, prepare_quantized

    policy = load_policy(tiny_model_dir, None, False, _quantization(kind))
    lora = peft.LoraConfig(r=4, target_modules=TARGETS, init_lora_weights=False)  # B != 0: a real delta
    policy = peft.get_peft_model(policy, lora)
    prepare_quantized(policy)
    pushed = dict(policy_weights(policy))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    reference = {name: tensor.clone() for name, tensor in plain.state_dict().items()}  # the checkpoint's
    assert set(pushed) == set(reference) - {"lm_head.weight"}  # tied to the embeddings
    for name, tensor in pushed.items():
        assert (tensor.dtype, tensor.shape) == (torch.float32, reference[name].shape), name
    quantised = {n: p for n, p in policy.named_parameters() if type(p).__name__ in ("Params4bit", "Int8Params")}
    assert quantised and all(
        dense_shape(p) == reference[n.replace("base_model.model.", "").replace(".base_layer", "")].shape
        for n, p in quantised.items()
    )
    plain.load_state_dict(pushed, strict=False)
    ids = torch.tensor([[7, 8, 9, 10, 11, 12]])
    policy.eval()
    with torch.no_grad():
        expected, got = policy(input_ids=ids).logits, plain(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-2, rtol=1e-2), (got - expected).abs().max()
    # and not the checkpoint's own weights: the quantisation error is there
    assert not torch.equal(pushed["model.layers.0.mlp.up_proj.weight"], reference["model.layers.0.mlp.up_proj.weight"])


def test_a_quantised_model_instance_without_an_adapter_is_refused(tiny_model_dir, dataset, make_args):
    from grpokit.models import load_policy

    model = load_policy(tiny_model_dir, None, False, _quantization("nf4"))
    with pytest.raises(ValueError, match=r"^the model is quantised \(bitsandbytes\) and has no PEFT adapter"):
        GRPOTrainer(model, text_reward, args=make_args(), train_dataset=dataset)
