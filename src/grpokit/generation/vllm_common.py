"""What both vLLM backends share: the sampling settings, the policy's weights named as vLLM loads them, this
machine's address towards a peer, and the one-line errors when vLLM is missing. Nothing here imports vLLM at module
level, nor either backend (`factory.py` chooses between them).
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Iterator

import torch
from torch import nn

logger = logging.getLogger(__name__)

# The logprobs vLLM reports for sampled tokens: after its logits processing (temperature, penalties, top-k/p), i.e.
# of the distribution the token was drawn from; the trainer scores with logits divided by the temperature.
LOGPROBS_MODE = "processed_logprobs"

# KV block size on CPU. vLLM's CPU default is 128 tokens, and its prefix cache shares only whole blocks of a prompt
# (not the one holding its last token): a group's G copies of a prompt under 129 tokens then share nothing and its
# prefill runs G times. 32 (the smallest the CPU attention takes) shares all but the last partial block; measured on 2
# cores (process CPU time, 2 prompts x 8 completions of 32 tokens, 4-layer 512-wide model): 128-token prompts
# 0.76 -> 0.43 s per generate call, 6-token prompts 0.31 -> 0.28 s. GPUs keep vLLM's default (16).
CPU_BLOCK_SIZE = 32


def require_vllm() -> None:
    """Fail with one line naming the install command when vLLM cannot be imported."""
    from grpokit.config.precision import INSTALL_HINT, installed

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


def policy_weights(model: nn.Module, only: set[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """`(vLLM name, tensor)` for every weight of the policy (or those named in `only`), detached; with a LoRA
    adapter, the merged weights.

    A LoRA layer's weight is computed as `base + delta` into a new tensor (`get_delta_weight` of each active
    adapter), so neither the base weights nor the adapter are touched: training goes on exactly as without vLLM. A
    quantised base (QLoRA) is pushed dequantised, in the dtype of the model's other weights: vLLM samples from the
    very policy the trainer scores (its quantised base plus the adapter), not from the checkpoint it started from.
    """
    from grpokit.models import dequantized

    deltas = _lora_deltas(model)
    quantized_dtype = dense_dtype(model)
    seen = set()
    for name, param in model.named_parameters():
        target = vllm_name(name)
        if target is None or target in seen or (only is not None and target not in only):
            continue
        seen.add(target)
        tensor = dequantized(param, quantized_dtype)
        tensor = param.detach() if tensor is None else tensor
        module_name = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
        if module_name in deltas and name.endswith(".weight"):
            tensor = tensor + deltas[module_name].to(tensor.dtype)
        yield target, tensor


def dense_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the policy's first floating-point weight that vLLM holds (the embeddings): the dtype a quantised
    weight is pushed in."""
    for name, param in model.named_parameters():
        if param.is_floating_point() and vllm_name(name) is not None:
            return param.dtype
    return torch.float32


def trainable_weights(model: nn.Module, packed: dict[str, list[str]]) -> set[str]:
    """vLLM names of the policy's weights that training can change (trainable ones; a LoRA layer's base weight when
    its adapter is trainable, since it is pushed merged), widened to whole engine layers: `packed` maps a fused
    engine layer to the checkpoint layers it packs (vLLM's `packed_modules_mapping`, e.g. `qkv_proj: [q_proj,
    k_proj, v_proj]`), and a fused layer is reloaded from all its parts or not at all."""
    part_of = {part: fused for fused, parts in packed.items() for part in parts}

    def layer(target: str) -> str:
        module = target.rsplit(".", 1)[0]
        parent, _, last = module.rpartition(".")
        return f"{parent}.{part_of[last]}" if last in part_of else module

    adapted = {
        name.split(".lora_", 1)[0] for name, p in model.named_parameters() if ".lora_" in name and p.requires_grad
    }
    targets, changing = {}, set()
    for name, param in model.named_parameters():
        target = vllm_name(name)
        if target is None:
            continue
        targets[target] = layer(target)
        base_of = name.split(".base_layer.", 1)[0] if ".base_layer." in name else None
        if param.requires_grad or base_of in adapted:
            changing.add(targets[target])
    return {target for target, key in targets.items() if key in changing}


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


def local_address_towards(host: str, port: int) -> str:
    """The address of this machine's interface that routes to `host` (no packet is sent): what a weight-transfer peer
    there connects back to (gloo and NCCL rendezvous alike)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, port))
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def hosted_store(host: str, port: int, timeout: datetime.timedelta):
    """A `TCPStore` served on the interface of `host` only. torch's store server listens on every interface whatever
    host it is given (the name is for its clients); a socket bound here and handed over (`master_listen_fd`, owned by
    the store from then on) keeps it to the interface asked for: 127.0.0.1 stays local."""
    import torch.distributed as tdist

    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return tdist.TCPStore(
        host,
        listener.getsockname()[1],
        None,
        True,
        timeout,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
        use_libuv=True,
    )
