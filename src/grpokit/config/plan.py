"""`grpokit config plan`: the batch geometry and a memory estimate, from the resolved values alone."""

from __future__ import annotations

import json
import os

from .rules import num_processes_from_env

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "auto": 2}


def batch_geometry(values) -> list[tuple[str, object, str]]:
    """(name, value, how it is obtained) rows of the batch geometry."""
    processes = num_processes_from_env()
    per_device = values["per_device_train_batch_size"]
    accum = values["gradient_accumulation_steps"]
    num_gen = values["num_generations"]
    gen_batch = values["generation_batch_size"]
    steps = values["steps_per_generation"]
    iterations = values["num_iterations"]
    micro_steps_per_round = steps * iterations
    on_policy = accum % micro_steps_per_round == 0
    return [
        ("processes", processes, "WORLD_SIZE of the launch (accelerate launch sets it); 1 otherwise"),
        ("per_device_train_batch_size", per_device, "completions per process per micro-step"),
        ("gradient_accumulation_steps", accum, "micro-steps per optimizer step"),
        ("num_generations", num_gen, "completions per prompt (group size)"),
        ("generation_batch_size", gen_batch, "completions per generation round, all processes"),
        ("steps_per_generation", steps, "micro-steps per process fed by one generation round"),
        ("prompts_per_generation", gen_batch // num_gen, "generation_batch_size / num_generations"),
        ("completions_per_optimizer_step", per_device * processes * accum, "per_device x processes x accumulation"),
        (
            "optimizer_steps_per_generation",
            round(micro_steps_per_round / accum, 4),
            "steps_per_generation x num_iterations / gradient_accumulation_steps",
        ),
        ("num_iterations", iterations, "passes over each generation round"),
        (
            "on_policy",
            on_policy,
            "no update between generating and training on a round: old logprobs not needed"
            if on_policy
            else "the policy moves within a round: old logprobs are computed and ratios are clipped",
        ),
    ]


def _model_dims(path) -> dict | None:
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    model_type = cfg.get("model_type", "")
    cfg = cfg.get("text_config", cfg)
    try:
        hidden = cfg["hidden_size"]
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or hidden // heads
        attention_bias = cfg.get("attention_bias", False)
        return {
            "vocab": cfg["vocab_size"],
            "hidden": hidden,
            "layers": cfg["num_hidden_layers"],
            "intermediate": cfg.get("intermediate_size", 4 * hidden),
            "q_dim": heads * head_dim,
            "kv_dim": cfg.get("num_key_value_heads", heads) * head_dim,
            "tied": cfg.get("tie_word_embeddings", False),
            # Qwen2 always has q/k/v biases; Llama-style configs say so with attention_bias (q/k/v/o) and mlp_bias.
            "qkv_bias": model_type.startswith("qwen2") or attention_bias,
            "o_bias": attention_bias,
            "mlp_bias": cfg.get("mlp_bias", False),
            # Qwen3 normalises queries and keys per head (one RMSNorm weight of head_dim each).
            "qk_norm": 2 * head_dim if model_type.startswith("qwen3") else 0,
        }
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def parameter_count(dims) -> int:
    """Weights of a decoder-only transformer with these dimensions (embeddings, attention, gated MLP, norms)."""
    h, inter, q, kv = dims["hidden"], dims["intermediate"], dims["q_dim"], dims["kv_dim"]
    per_layer = sum(i * o for i, o in _linear_shapes(dims)) + 2 * h + dims["qk_norm"]
    per_layer += (q + 2 * kv) * dims["qkv_bias"] + h * dims["o_bias"] + (2 * inter + h) * dims["mlp_bias"]
    return dims["vocab"] * h * (1 if dims["tied"] else 2) + dims["layers"] * per_layer + h


def _linear_shapes(dims) -> list[tuple[int, int]]:
    h, inter, q, kv = dims["hidden"], dims["intermediate"], dims["q_dim"], dims["kv_dim"]
    return [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]  # q k v o gate up down


def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(int(n))


def _gib(n_bytes: float) -> str:
    if n_bytes < 1024**2:
        return f"{n_bytes / 1024:.1f} KiB"
    if n_bytes < 1024**3:
        return f"{n_bytes / 1024**2:.1f} MiB"
    return f"{n_bytes / 1024**3:.2f} GiB"


def memory_estimate(values) -> list[tuple[str, str, str]] | None:
    """(item, size, how) rows per process; None when the model's dimensions are not known locally."""
    dims = _model_dims(values.get("model_name_or_path"))
    if dims is None:
        return None
    h, n_layers, inter, vocab = dims["hidden"], dims["layers"], dims["intermediate"], dims["vocab"]
    linear_shapes = _linear_shapes(dims)
    params = parameter_count(dims)
    dtype = values.get("dtype") or "float32"
    weight_bytes = _BYTES.get(dtype, 4)
    if values.get("use_peft"):
        trainable = values.get("lora_r", 16) * n_layers * sum(i + o for i, o in linear_shapes)
    else:
        trainable = params
    micro = values["per_device_train_batch_size"]
    completion = values.get("max_completion_length") or 512
    prompt = values.get("max_prompt_length")
    prompt_note = f"prompt {prompt}" if prompt else "prompt length unknown: 512 assumed (set max_prompt_length)"
    seq = (prompt or 512) + completion
    act_per_token_layer = h if values.get("gradient_checkpointing") else 10 * h + 2 * inter
    rows = [
        ("parameters", _count(params), f"{params:,} weights, from {values['model_name_or_path']}/config.json"),
        ("weights", _gib(params * weight_bytes), f"{dtype}"),
        (
            "gradients",
            _gib(trainable * weight_bytes),
            "LoRA adapters only" if values.get("use_peft") else "all weights",
        ),
        ("optimizer state", _gib(trainable * 2 * weight_bytes), "AdamW: two moments per trainable weight"),
    ]
    ref = values.get("beta", 0) > 0 and not values.get("use_peft")
    rows.append(
        (
            "reference model",
            _gib(params * weight_bytes) if ref else "0",
            "beta > 0 without PEFT" if ref else "not loaded (beta = 0 or PEFT adapters disabled instead)",
        )
    )
    rows.append(
        (
            "logits (one micro-batch)",
            _gib(micro * completion * vocab * 4),
            f"{micro} x {completion} completion tokens x {vocab} vocab, float32; grpokit computes them in chunks",
        )
    )
    rows.append(
        (
            "activations (one micro-batch)",
            _gib(micro * seq * n_layers * act_per_token_layer * weight_bytes),
            f"rough: {micro} x {seq} tokens x {n_layers} layers, "
            f"{'with' if values.get('gradient_checkpointing') else 'without'} gradient checkpointing; "
            f"{prompt_note}",
        )
    )
    return rows
