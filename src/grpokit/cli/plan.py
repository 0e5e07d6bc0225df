"""`grpokit config plan`: the batch geometry and a memory estimate, from the resolved values alone.

For a launch (`--accelerate_config NAME|FILE --num_processes N`) the estimate is per process: weights, gradients,
optimizer state and reference model are divided by N where the engine shards them (`sharding`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from grpokit.config.rules import num_processes_from_env

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "auto": 2}


def batch_geometry(values, *, processes=None, processes_how=None) -> list[tuple[str, object, str]]:
    """(name, value, how it is obtained) rows of the batch geometry, for `processes` processes (default: WORLD_SIZE).
    `values` must be resolved for the same number (`Resolution.processes`): generation_batch_size depends on it."""
    if processes is None:
        processes = num_processes_from_env()
    processes_how = processes_how or "WORLD_SIZE of the launch (accelerate launch sets it); 1 otherwise"
    per_device = values["per_device_train_batch_size"]
    accum = values["gradient_accumulation_steps"]
    num_gen = values["num_generations"]
    gen_batch = values["generation_batch_size"]
    steps = values["steps_per_generation"]
    iterations = values["num_iterations"]
    micro_steps_per_round = steps * iterations
    on_policy = accum % micro_steps_per_round == 0
    # Not whole groups only where `grpokit config` was given no process count (a note says so): show the fraction.
    whole = gen_batch % num_gen == 0
    prompts = gen_batch // num_gen if whole else round(gen_batch / num_gen, 2)
    return [
        ("processes", processes, processes_how),
        ("per_device_train_batch_size", per_device, "completions per process per micro-step"),
        ("gradient_accumulation_steps", accum, "micro-steps per optimizer step"),
        ("num_generations", num_gen, "completions per prompt (group size)"),
        ("generation_batch_size", gen_batch, "completions per generation round, all processes"),
        ("steps_per_generation", steps, "micro-steps per process fed by one generation round"),
        (
            "prompts_per_generation",
            prompts,
            "generation_batch_size / num_generations"
            + ("" if whole else f": not whole groups at {processes} process(es), see the note"),
        ),
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


def _checkpoint_dtype(path) -> str | None:
    """The dtype a checkpoint's config.json says its weights are stored in (`dtype`, or `torch_dtype` before
    transformers 4.56), which `dtype: auto` loads them in."""
    with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    for part in (cfg, cfg.get("text_config") or {}):
        stored = part.get("dtype") or part.get("torch_dtype")
        if isinstance(stored, str):
            return stored.removeprefix("torch.")
    return None


def weights_dtype(values) -> tuple[str, str]:
    """(dtype, why) of the policy's weights as `grpokit train` loads them: model_init_kwargs' dtype wins over dtype
    (as TRL merges them), unset means float32, and 'auto' takes the checkpoint's own (its config.json)."""
    init_kwargs = values.get("model_init_kwargs")
    given = init_kwargs.get("dtype") if isinstance(init_kwargs, dict) else None
    dtype, why = (str(given).removeprefix("torch."), "model_init_kwargs") if given is not None else (None, "")
    if dtype is None:
        dtype = values.get("dtype") or "float32"
    if dtype == "auto":
        stored = _checkpoint_dtype(values["model_name_or_path"])
        if stored is None:
            return "float32", "dtype auto, and config.json names no dtype: assumed"
        return stored, "dtype auto: the checkpoint's, from config.json"
    return dtype, why


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


@dataclass(frozen=True)
class Sharding:
    """How a launch divides the model states among its processes."""

    engine: str  # e.g. "ZeRO-3", "FSDP FULL_SHARD", "DDP", "one process"
    divisor: int  # the processes the divided states are spread over
    divided: frozenset = frozenset()  # of "weights", "gradients", "optimizer", "reference"
    kind: str = "plain"  # "deepspeed", "fsdp" or "plain" (PyTorch's own: one process or DDP)
    offloaded: frozenset = frozenset()  # of "weights", "optimizer": kept in CPU memory


_ALL_STATES = frozenset({"weights", "gradients", "optimizer", "reference"})
_GRADS_AND_OPTIMIZER = frozenset({"gradients", "optimizer"})


def sharding(accelerate_config, processes: int) -> Sharding:
    """What the engine of `accelerate_config` (a `grpokit.cli.launch_presets.AccelerateConfig`, or None: plain data
    parallel) divides by what, over `processes` processes.

    DDP (and ZeRO-0) keep everything whole on every process; ZeRO-1 shards the optimizer state, ZeRO-2 also the
    gradients, ZeRO-3 also the weights and (as TRL prepares it) the reference model; FSDP FULL_SHARD (FSDP2 with
    reshard_after_forward) shards all four, SHARD_GRAD_OP gradients and optimizer state; HYBRID_* do so within a
    machine.
    """
    if processes <= 1 and accelerate_config is None:
        return Sharding("one process", 1)
    if accelerate_config is None:
        return Sharding("DDP", processes)
    kind = accelerate_config.distributed_type
    offloaded = frozenset(accelerate_config.offloaded)
    if kind == "DEEPSPEED":
        stage = accelerate_config.zero_stage
        divided = {
            0: frozenset(),
            1: frozenset({"optimizer"}),
            2: _GRADS_AND_OPTIMIZER,
            3: _ALL_STATES,
        }.get(stage, frozenset())
        engine = f"ZeRO-{stage}" if stage is not None else "DeepSpeed (ZeRO stage not given)"
        return Sharding(engine, processes, divided, "deepspeed", offloaded)
    if kind == "FSDP":
        strategy = accelerate_config.fsdp_strategy
        per_machine = max(1, processes // accelerate_config.num_machines)
        divided, divisor = {
            "FULL_SHARD": (_ALL_STATES, processes),
            "SHARD_GRAD_OP": (_GRADS_AND_OPTIMIZER, processes),
            "HYBRID_SHARD": (_ALL_STATES, per_machine),
            "HYBRID_SHARD_ZERO2": (_GRADS_AND_OPTIMIZER, per_machine),
        }.get(strategy, (frozenset(), processes))
        name = "FSDP2" if accelerate_config.fsdp_version == 2 else "FSDP"
        return Sharding(f"{name} {strategy}", divisor, divided, "fsdp", offloaded)
    if processes <= 1:
        return Sharding("one process", 1)
    return Sharding("DDP", processes)


def _mixed_precision(values, accelerate_config) -> str:
    """ "bf16", "fp16" or "no": the training config's bf16/fp16, else (bf16 unset) the accelerate config's."""
    if values.get("fp16"):
        return "fp16"
    if values.get("bf16"):
        return "bf16"
    if values.get("bf16") is None and accelerate_config is not None:
        if accelerate_config.mixed_precision in ("bf16", "fp16"):
            return accelerate_config.mixed_precision
    return "no"


def memory_estimate(values, *, processes: int = 1, accelerate_config=None) -> list[tuple[str, str, str]] | None:
    """(item, size, how) rows per process; None when the model's dimensions are not known locally.

    Per process over a launch of `processes` processes with `accelerate_config` (see `sharding`). Bytes per weight:
    PyTorch (one process, DDP) keeps weights, gradients and AdamW's two moments in the model's dtype; DeepSpeed under
    bf16/fp16 mixed precision holds the model in 16-bit (2 bytes for weights and gradients) and its optimizer keeps
    the two moments and a master copy of each trainable weight in fp32 (12 bytes); FSDP under mixed precision holds
    the sharded weights in fp32 (accelerate upcasts them), so weights and gradients take 4 bytes, the moments 8.
    """
    dims = _model_dims(values.get("model_name_or_path"))
    if dims is None:
        return None
    h, n_layers, inter, vocab = dims["hidden"], dims["layers"], dims["intermediate"], dims["vocab"]
    linear_shapes = _linear_shapes(dims)
    params = parameter_count(dims)
    dtype, dtype_why = weights_dtype(values)
    weight_bytes = _BYTES.get(dtype, 4)
    peft = bool(values.get("use_peft"))
    if peft:
        trainable = values.get("lora_r", 16) * n_layers * sum(i + o for i, o in linear_shapes)
    else:
        trainable = params
    micro = values["per_device_train_batch_size"]
    completion = values.get("max_completion_length") or 512
    prompt = values.get("max_prompt_length")
    prompt_note = f"prompt {prompt}" if prompt else "prompt length unknown: 512 assumed (set max_prompt_length)"
    seq = (prompt or 512) + completion
    images = image_tokens(values.get("model_name_or_path"))
    if images is not None and images[0] is not None and not prompt:
        # max_prompt_length counts image tokens when set; else they come on top of the assumed text
        seq += images[0]
        prompt_note += f", plus {images[0]} image tokens (one image)"
    act_per_token_layer = h if values.get("gradient_checkpointing") else 10 * h + 2 * inter

    plan = sharding(accelerate_config, processes)
    mixed = _mixed_precision(values, accelerate_config)
    held_bytes, grad_bytes, optim_bytes, ref_bytes = weight_bytes, weight_bytes, 2 * weight_bytes, weight_bytes
    held_how = f"{dtype} ({dtype_why})" if dtype_why else dtype
    optim_how = "AdamW: 2 moments per trainable weight"
    if plan.kind == "deepspeed" and mixed != "no":
        held_bytes, grad_bytes, optim_bytes, ref_bytes = 2, 2, 12, 2
        held_how = f"{mixed}: DeepSpeed holds the model in 16-bit under {mixed} mixed precision"
        optim_how = (
            f"AdamW: 2 moments + fp32 master copy under {mixed} mixed precision, 4+4+4 bytes per trainable weight"
        )
    elif plan.kind == "fsdp" and mixed != "no":
        held_bytes, grad_bytes, optim_bytes = 4, 4, 8
        held_how = (
            f"float32: accelerate upcasts FSDP's sharded weights (the master copy) under {mixed} mixed precision"
        )
        optim_how = "AdamW: 2 fp32 moments per trainable weight"
    elif mixed != "no":
        optim_how += f" (the weights are the master copy: {mixed} mixed precision only casts the compute)"
        if dtype == "float32":
            held_how += f" ({mixed} casts only the compute; dtype: bfloat16 would load the weights in 16-bit)"

    def per_process(item, n_bytes, how):
        if item in plan.divided:
            n_bytes /= plan.divisor
            how += f"; / {plan.divisor}: {plan.engine} shards it over {plan.divisor} processes"
        elif plan.engine != "one process":
            how += f"; whole on every process ({plan.engine})"
        if item in plan.offloaded:
            how += "; offloaded to CPU memory"
        return n_bytes, how

    weights, weights_how = per_process("weights", params * held_bytes, held_how)
    grads, grads_how = per_process(
        "gradients", trainable * grad_bytes, "LoRA adapters only" if peft else "all weights"
    )
    optim, optim_how = per_process("optimizer", trainable * optim_bytes, optim_how)
    rows = [
        ("parameters", _count(params), f"{params:,} weights, from {values['model_name_or_path']}/config.json"),
        ("weights", _gib(weights), weights_how),
        ("gradients", _gib(grads), grads_how),
        ("optimizer state", _gib(optim), optim_how),
    ]
    ref = values.get("beta", 0) > 0 and not peft
    if ref:
        ref_size, ref_how = per_process("reference", params * ref_bytes, "beta > 0 without PEFT")
        rows.append(("reference model", _gib(ref_size), ref_how))
    else:
        ref_size = 0
        rows.append(("reference model", "0", "not loaded (beta = 0 or PEFT adapters disabled instead)"))
    on_device = [(weights, "weights"), (grads, "gradients"), (optim, "optimizer"), (ref_size, "weights")]
    total = sum(size for size, item in on_device if item not in plan.offloaded)
    rows.append(
        (
            "model states",
            _gib(total),
            "weights + gradients + optimizer state + reference model"
            + (" (less what is offloaded to CPU memory)" if plan.offloaded else ""),
        )
    )
    logits = micro * completion * vocab * 4
    rows.append(
        (
            "logits (one micro-batch)",
            _gib(logits),
            f"{micro} x {completion} completion tokens x {vocab} vocab, float32; grpokit computes them in chunks",
        )
    )
    activations = micro * seq * n_layers * act_per_token_layer * weight_bytes
    rows.append(
        (
            "activations (one micro-batch)",
            _gib(activations),
            f"rough: {micro} x {seq} tokens x {n_layers} layers, "
            f"{'with' if values.get('gradient_checkpointing') else 'without'} gradient checkpointing; "
            f"{prompt_note}",
        )
    )
    per_process_total = total + logits + activations
    rows.append(("total per process", _gib(per_process_total), "model states + logits + activations"))
    rows.append(
        (
            f"total, {processes} process{'es' if processes != 1 else ''}",
            _gib(per_process_total * processes),
            f"{processes} x total per process: the whole launch"
            + (", less what is offloaded to CPU memory" if plan.offloaded else ""),
        )
    )
    return rows


def _json(path: str, name: str) -> dict:
    file = os.path.join(path, name)
    if not os.path.isfile(file):
        return {}
    with open(file, encoding="utf-8") as fh:
        return json.load(fh)


def image_tokens(path) -> tuple[int | None, str] | None:
    """`(tokens per image, how)` of a local vision-language checkpoint, from its config.json and processor config
    (`tokens` None when its family's count is not known here); None for a text-only or non-local model."""
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    config = _json(path, "config.json")
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    processor = {**_json(path, "preprocessor_config.json"), **_json(path, "processor_config.json")}
    images = processor.get("image_processor", processor)
    kind = config.get("model_type", "")
    try:
        if kind == "llava":
            side = vision["image_size"] // vision["patch_size"]
            extra = 1 if config.get("vision_feature_select_strategy", "default") == "full" else 0
            return side * side + extra, f"LLaVA: ({vision['image_size']} / {vision['patch_size']})^2 patches"
        if kind == "gemma3":
            n = config.get("mm_tokens_per_image", 256)
            return n + 4, f"Gemma3: mm_tokens_per_image {n} + begin/end of image and a blank line each side"
        if kind in ("idefics3", "smolvlm"):
            seq_len = processor.get("image_seq_len", 64)
            if not images.get("do_image_splitting", True):
                return seq_len + 3, f"{kind}: image_seq_len {seq_len} + 3 markers, no splitting"
            tiles = -(-images["size"]["longest_edge"] // images["max_image_size"]["longest_edge"])
            n = (tiles * tiles + 1) * (seq_len + 3)
            return n, f"{kind}: up to {tiles}x{tiles} tiles + the whole image, image_seq_len {seq_len} + 3 each"
        if kind in ("qwen2_vl", "qwen2_5_vl"):
            pixels = images.get("max_pixels") or images.get("size", {}).get("longest_edge")
            patch, merge = images.get("patch_size", 14), images.get("merge_size", 2)
            n = pixels // (patch * patch * merge * merge)
            return n + 2, f"{kind}: up to max_pixels {pixels} / ({patch}x{patch} patches x {merge}x{merge}) + 2"
    except (KeyError, TypeError, ZeroDivisionError):
        pass
    return None, f"model_type {kind!r}: its image token count is not known here"


def vision_plan(values) -> list[tuple[str, object, str]] | None:
    """(name, value, how) rows for a local vision-language model; None otherwise."""
    found = image_tokens(values.get("model_name_or_path"))
    if found is None:
        return None
    tokens, how = found
    prompt = values.get("max_prompt_length")
    rows: list[tuple[str, object, str]] = [
        ("image tokens per image", "unknown" if tokens is None else tokens, how),
        ("vision tower", "not counted", "the memory rows below count the language model's weights only"),
    ]
    if prompt:
        rows.append(
            (
                "max_prompt_length",
                prompt,
                "counts the image tokens; a prompt cut through an image is refused, so leave room for your images",
            )
        )
    return rows


def agent_plan(values) -> list[tuple[str, object, str]] | None:
    """(name, value, how) rows for an agent run (`tools` or `environment_factory` set); None otherwise. In TRL's
    semantics every turn and every tool result of a rollout share one completion budget, so the memory rows above
    hold for agent runs too; what grows with tools is the number of generation requests and the waiting."""
    tools, environments = values.get("tools") or [], values.get("environment_factory")
    if not tools and not environments:
        return None
    cap = values.get("max_tool_calling_iterations")
    completion = values.get("max_completion_length")
    prompt = values.get("max_prompt_length")
    timeout = values.get("tool_timeout")
    names = [environments] if isinstance(environments, str) else list(environments or {})
    rows: list[tuple[str, object, str]] = [
        (
            "tools",
            len(tools),
            "functions from `tools`" + (", plus each environment's public methods" if names else ""),
        ),
        ("environments", len(names), "one instance per rollout, pooled" if names else "none"),
        (
            "tool rounds per rollout",
            "no cap" if cap is None else cap,
            "until a turn calls no tool (max_tool_calling_iterations: null)"
            if cap is None
            else "max_tool_calling_iterations" + (": calls are parsed, never run" if cap == 0 else ""),
        ),
        (
            "generation requests per rollout",
            "1 + rounds" if cap is None else f"<= {1 + cap}",
            "the first turn, then one turn after each tool round",
        ),
        (
            "completion budget",
            completion,
            "max_completion_length: every turn and tool result of a rollout together; a tool result that would "
            "overflow it is dropped and its round rolled back",
        ),
    ]
    if completion:
        longest = f"{prompt + completion}" if prompt else f"prompt + {completion}"
        rows.append(
            ("longest engine input", longest, "prompt + completion so far: the input of a rollout's last turn")
        )
    wait = "no limit (tool_timeout: null)" if timeout is None else f"{timeout:g} s per call"
    round_cap = values.get("tool_round_timeout")
    wait += ", no cap per round" if round_cap is None else f", at most {round_cap:g} s per round"
    rows.append(("tool wait per round", wait, "sync calls of a turn run one after another, async calls together"))
    rows.append(
        (
            "tool result",
            f"<= {values.get('max_tool_result_chars', 65536)} characters",
            "max_tool_result_chars: a longer result is cut before it is rendered, with a line the model sees",
        )
    )
    return rows


def async_plan(values) -> list[tuple[str, object, str]] | None:
    """(name, value, how) rows of the asynchronous pipeline (async_grpo), None without it."""
    if not values.get("async_grpo"):
        return None
    staleness = values.get("max_staleness", 4)
    batch = values["generation_batch_size"]
    inflight = values.get("max_inflight_tasks", -1)
    queue = values.get("queue_maxsize", 1024)
    generator = (
        "vLLM server " + str(values.get("vllm_server_base_url") or "")
        if values.get("use_vllm")
        else ("the worker's own copy of the policy (transformers)")
    )
    mode = values.get("vllm_importance_sampling_mode") if values.get("vllm_importance_sampling_correction") else None
    cap = values.get("vllm_importance_sampling_clip_max")
    return [
        ("rollout worker", "thread", "on the main process: generates, scores and queues while the trainer trains"),
        ("generator", "", generator.strip()),
        ("max_staleness", staleness, "weight updates a sample may lag the policy that trains it (older: dropped)"),
        (
            "batches ahead",
            f"<= {staleness}",
            f"the worker starts a batch only once the policy is within {staleness} version(s) of the one that trains it",
        ),
        ("samples in flight", f"<= {(staleness + 1) * batch}", f"(max_staleness + 1) x generation_batch_size {batch}"),
        (
            "per request",
            batch if inflight == -1 else max(inflight, values["num_generations"]),
            "max_inflight_tasks: completions asked of the generator at once (-1: a generation batch)",
        ),
        ("queue", f"<= {queue}", "queue_maxsize: samples waiting; a full queue blocks the worker, never the trainer"),
        ("weight sync", f"every {values.get('weight_sync_steps', 1)} step(s)", "pause, push, resume; version + 1"),
        ("staleness correction", mode or "off", _correction_how(mode, cap)),
        (
            "worker heartbeat",
            f"{values.get('heartbeat_stale_after_s', 300.0):g} s",
            "a worker silent for longer (a hung generation or reward) stops training",
        ),
    ]


def _correction_how(mode: str | None, cap) -> str:
    if mode is None:
        return "vllm_importance_sampling_correction is off: stale samples are only clipped"
    unit, how = mode.split("_")
    weight = "each token by pi_current / pi_sampler" if unit == "token" else "each completion by its ratio"
    return f"{weight}, {'capped at' if how == 'truncate' else 'dropped above'} {cap}"


def sampler_plan(values) -> list[tuple[str, object, str]] | None:
    """(name, value, how) rows of how the sampler's and the learner's log-probabilities are reconciled: scoring over
    the kept set of a truncating sampler, the importance-sampling correction and grpokit's rejections (where the
    sampler reports log-probabilities: vLLM, async_grpo), MoE routing replay. None when none of them applies."""
    overrides = values.get("generation_kwargs") or {}
    overrides = overrides if isinstance(overrides, dict) else {}
    filters = {
        name: overrides.get(name, values.get(name, default))
        for name, default in (("top_k", 0), ("top_p", 1.0), ("min_p", None))
    }
    truncates = bool(filters["top_k"]) or (filters["top_p"] or 1.0) < 1.0 or bool(filters["min_p"])
    reports = bool(values.get("use_vllm") or values.get("async_grpo"))
    replay = bool(values.get("routing_replay"))
    if not (truncates or reports or replay):
        return None
    rows: list[tuple[str, object, str]] = []
    if truncates:
        kept = values.get("logprobs_over_kept_tokens", True)
        shown = ", ".join(f"{k} {v}" for k, v in filters.items() if v not in (0, 1.0, None))
        rows.append(
            (
                "truncated sampling",
                shown,
                "the policy is scored over the tokens these keep, renormalised (logprobs_over_kept_tokens)"
                if kept
                else "logprobs_over_kept_tokens: false: scored over the whole vocabulary, as TRL (ratio = kept mass)",
            )
        )
    if reports:
        on = values.get("vllm_importance_sampling_correction", True)
        mode = values.get("vllm_importance_sampling_mode", "sequence_mask") if on else None
        low, high = (
            values.get("vllm_importance_sampling_clip_min"),
            values.get("vllm_importance_sampling_clip_max", 3.0),
        )
        bounds = f"[{'-' if low is None else low}, {'-' if high is None else high}]"
        geometric = values.get("sampler_sequence_geometric") and str(mode).startswith("sequence")
        how = (
            "off: sampler/* metrics only"
            if mode is None
            else f"weights learner / sampler {'clamped to' if mode.endswith('truncate') else 'zeroed outside'} {bounds}"
            + (", a sequence's the geometric mean of its tokens'" if geometric else "")
        )
        rows.append(("correction", mode or "off", how))
        threshold = values.get("sampler_kl_threshold")
        if mode is not None and threshold is not None:
            estimator, reduction = values.get("sampler_kl_estimator", "k3"), values.get("sampler_kl_reduction", "mean")
            rows.append(
                ("KL rejection", f"> {threshold}", f"a sequence's {estimator} estimate, {reduction} over its tokens")
            )
        veto = values.get("sampler_token_veto")
        if mode is not None and veto is not None:
            rows.append(("token veto", f"< {veto}", "a sequence with a token whose ratio learner / sampler is below"))
    if replay:
        rows.append(("routing replay", "on", "each token routed to the experts the sampler used; routing/agreement"))
    return rows
