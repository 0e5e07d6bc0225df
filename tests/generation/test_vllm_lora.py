"""LoRA adapter-only sync (`generation/vllm_lora.py`) without a server: what can be served, what a server must allow,
the adapter folder, and the versions loaded and unloaded (the server's routes recorded)."""

import json
import os

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file

from grpokit.generation import vllm_lora


def lora(model, **overrides):
    values = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    values.update(overrides)
    return get_peft_model(model, LoraConfig(**values))


def test_served_rank_rounds_up_to_a_rank_vllm_builds():
    assert [vllm_lora.served_rank(r) for r in (1, 2, 8, 9, 33, 512)] == [1, 8, 8, 16, 64, 512]
    with pytest.raises(ValueError, match="LoRA rank 600 is above the largest rank vLLM serves"):
        vllm_lora.served_rank(600)


def test_what_vllm_can_serve(tiny_model):
    assert vllm_lora.adapter_problem(tiny_model) == "the policy has no PEFT adapter"
    assert vllm_lora.adapter_problem(lora(tiny_model)) is None


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"use_dora": True}, "DoRA's magnitude vectors"),
        ({"bias": "lora_only"}, "bias='lora_only' trains biases"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save=['lm_head'] are trained whole"),
        ({"target_modules": ["q_proj", "lm_head"]}, "the adapter targets ['lm_head']"),
    ],
)
def test_what_vllm_cannot_serve_is_named(tiny_model, overrides, reason):
    assert reason in vllm_lora.adapter_problem(lora(tiny_model, **overrides))


def test_rank_of_a_rank_pattern(tiny_model):
    model = lora(tiny_model, rank_pattern={"v_proj": 12})
    assert vllm_lora.adapter_rank(model.peft_config["default"]) == 12


def test_what_the_server_must_allow():
    assert "started without --enable-lora" in vllm_lora.server_problem(None, 4, 3)
    assert "--max-lora-rank 8 --max-loras 3" in vllm_lora.server_problem(None, 4, 3)
    assert vllm_lora.server_problem({"max_lora_rank": 8, "max_loras": 3}, 4, 3) is None
    assert "--max-lora-rank is 8, below the adapter's rank 12 (use 16)" in vllm_lora.server_problem(
        {"max_lora_rank": 8, "max_loras": 3}, 12, 3
    )
    assert "--max-loras is 2; requests in flight may name 3" in vllm_lora.server_problem(
        {"max_lora_rank": 8, "max_loras": 2}, 4, 3
    )


def test_the_adapter_folder_is_what_vllm_reads(tiny_model, tmp_path):
    model = lora(tiny_model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.5)  # a trained adapter (PEFT starts B at 0)
    folder = str(tmp_path / "grpokit-x-v1")
    size = vllm_lora.save_adapter(model, folder)
    assert sorted(os.listdir(folder)) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["grpokit-x-v1"]  # nothing half-written left beside it
    config = json.loads(open(os.path.join(folder, "adapter_config.json")).read())
    assert config["r"] == 4 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    tensors = load_file(os.path.join(folder, "adapter_model.safetensors"))
    layers = model.config.num_hidden_layers
    assert len(tensors) == layers * 2 * 2  # q and v, A and B, per layer
    assert all(float(t.float().mean()) == 0.5 for n, t in tensors.items() if "lora_B" in n)
    # the weights' bytes: only the adapter, never the base model
    adapter_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    assert adapter_bytes <= size < adapter_bytes + 64 * 1024  # + the safetensors header
    base_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" not in n)
    assert size < base_bytes / 10


def test_versions_are_loaded_under_new_names_and_the_old_ones_unloaded(tiny_model, tmp_path):
    model = lora(tiny_model)
    calls = []
    versions = vllm_lora.AdapterVersions(lambda path, body: calls.append((path, body)), str(tmp_path), keep=2)
    versions.version = 5  # a resumed run carries on from its checkpoint's version
    names = [versions.push(model) for _ in range(3)]
    run = versions.run
    assert names == [f"grpokit-{run}-v6", f"grpokit-{run}-v7", f"grpokit-{run}-v8"]
    assert versions.current == names[-1]
    assert calls == [
        (
            "/v1/load_lora_adapter",
            {"lora_name": names[0], "lora_path": str(tmp_path / names[0]), "load_inplace": False},
        ),
        (
            "/v1/load_lora_adapter",
            {"lora_name": names[1], "lora_path": str(tmp_path / names[1]), "load_inplace": False},
        ),
        (
            "/v1/load_lora_adapter",
            {"lora_name": names[2], "lora_path": str(tmp_path / names[2]), "load_inplace": False},
        ),
        ("/v1/unload_lora_adapter", {"lora_name": names[0]}),
    ]
    # the unloaded version's folder outlives it by one push (vLLM reads a folder lazily)
    assert sorted(os.listdir(tmp_path)) == names
    versions.push(model)
    assert sorted(os.listdir(tmp_path)) == [names[1], names[2], f"grpokit-{run}-v9"]
    assert vllm_lora.AdapterVersions(None, str(tmp_path), keep=1).run != run  # a new process: new names
