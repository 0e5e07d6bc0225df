"""bench_memory.py's floor: the parameter count of a Llama config and the floor's parts, by hand."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
bench_memory = pytest.importorskip("bench_memory")

MB = 2**20
# 2 layers, hidden 8, 4 heads of 2 (q width 8), 2 key/value heads (k, v width 4), intermediate 16, vocabulary 32
CONFIG = {
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "intermediate_size": 16,
    "vocab_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 2,
    "tie_word_embeddings": True,
}


def test_parameter_count_by_hand():
    # a layer: q 8x8 + k, v 2 x 8x4 + o 8x8 + gate, up, down 3 x 8x16 + two norms 2 x 8 = 64+64+64+384+16 = 592
    # two layers 1184, embeddings 32x8 = 256 (tied: once), final norm 8
    assert bench_memory.parameter_count(CONFIG) == 1184 + 256 + 8
    assert bench_memory.parameter_count({**CONFIG, "tie_word_embeddings": False}) == 1184 + 2 * 256 + 8


def test_parameter_count_matches_a_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**CONFIG, attention_bias=False, mlp_bias=False))
    assert bench_memory.parameter_count(CONFIG) == sum(p.numel() for p in model.parameters())


def test_floor_takes_the_larger_of_gradients_and_backward_start():
    params = 1448
    workload = bench_memory.bench_grpo.WORKLOADS["real-short"]  # 6-token prompts, fp32
    floor = bench_memory.floor_mb(workload, CONFIG, process_mb=100.0)
    # tokens: 2 groups x 6 prompt tokens + 16 completions x 32 = 524; per token and layer 2x8 + (8 + 2x4) + 8 + 2x16 = 72
    assert floor["activations"] == pytest.approx(524 * 2 * 72 * 4 / MB)
    assert floor["lm_head_gradient"] == pytest.approx(4 * 32 * 8 / MB)
    assert floor["gradients"] == pytest.approx(4 * params / MB)
    # the activations (301,824 bytes) + LM-head gradient (1,024) outweigh the gradients (5,792 bytes)
    assert floor["total"] == pytest.approx(100 + (4 + 8) * params / MB + (301824 + 1024) / MB)
    bf16 = bench_memory.floor_mb(bench_memory.bench_grpo.WORKLOADS["real-short-bf16"], CONFIG, process_mb=100.0)
    assert bf16["activations"] == pytest.approx(floor["activations"] / 2)


def test_floor_under_activation_checkpointing_keeps_each_layer_input_and_one_layer():
    workload = bench_memory.bench_grpo.WORKLOADS["real-short-gc"]
    floor = bench_memory.floor_mb(workload, CONFIG, process_mb=100.0)
    # 524 tokens x (2 layer inputs of 8 + one layer's 72 values) = 524 x 88 values of 4 bytes
    assert floor["activations"] == pytest.approx(524 * 88 * 4 / MB)
    bf16 = bench_memory.floor_mb(bench_memory.bench_grpo.WORKLOADS["real-short-bf16-gc"], CONFIG, process_mb=100.0)
    assert bf16["activations"] == pytest.approx(524 * 88 * 2 / MB)
