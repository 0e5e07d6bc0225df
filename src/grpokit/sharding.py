"""Sharded parameters (DeepSpeed ZeRO-3, FSDP2): telling them apart, gathering them where generation, the reference
model's update, a weight push or a record needs whole tensors, and preparing inference-only models for DeepSpeed.

Under ZeRO-3 each rank holds a slice of every parameter (`param.ds_tensor`); the visible tensor is empty until
DeepSpeed's hooks (or `deepspeed.zero.GatheredParameters`) gather it. Under FSDP2 parameters are DTensors sharded on
their first dimension, gathered by hooks around each sharded module's forward.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn


def zero3_partitioned(model: nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 manages (partitions) the parameters of `model`, gathered at the moment or not."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def fsdp2_sharded(model: nn.Module) -> bool:
    """Whether `model` holds FSDP2 (DTensor) parameters."""
    return any(type(p).__name__ == "DTensor" for p in model.parameters())


def is_sharded(model: nn.Module) -> bool:
    """Whether the parameters of `model` are sharded across processes right now (ZeRO-3 parameters not gathered, or
    FSDP2): code that reads weights directly (the CPU fast paths) must step aside, and every rank must run the same
    number of forward calls."""
    partitioned = any(hasattr(p, "ds_id") and p.ds_status.name != "AVAILABLE" for p in model.parameters())
    return partitioned or fsdp2_sharded(model)


@contextlib.contextmanager
def full_parameters(model: nn.Module, *, modifier_rank: int | None = None) -> Iterator[list[torch.Tensor]]:
    """The parameters of `model` as whole tensors, in `model.parameters()` order, for the duration.

    ZeRO-3: gathered on every rank (with `modifier_rank`, what that rank writes into them is partitioned back on
    exit); FSDP2: every sharded module unsharded (the module then holds plain whole tensors, so code that reads the
    model, such as a weight push from rank 0 alone, sees them) and resharded on exit; otherwise the parameters as
    they are. Every rank must enter this together.
    """
    if zero3_partitioned(model):
        import deepspeed

        params = list(model.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank):
            yield params
    elif fsdp2_sharded(model):
        from torch.distributed.fsdp import FSDPModule

        sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for module in sharded:
            module.unshard()
        try:
            yield list(model.parameters())
        finally:
            for module in sharded:
                module.reshard()
    else:
        yield list(model.parameters())


@contextlib.contextmanager
def gathered_for_generation(engine, model: nn.Module) -> Iterator[None]:
    """ZeRO-3 `ds3_gather_for_generation`: the whole policy gathered on every rank and DeepSpeed's per-module hooks
    detached meanwhile, so generation runs on plain tensors and ranks need not stay in step; hooks re-attached after.

    Args:
        engine: the `deepspeed.DeepSpeedEngine` that wraps `model`.
        model: the engine's module.
    """
    import deepspeed

    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        for param in model.parameters():
            param.ds_active_sub_modules.clear()
        for hook in offload.forward_hooks + offload.backward_hooks:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:
            offload._register_deepspeed_module(offload.module)


def copy_for_reference(model: nn.Module) -> nn.Module:
    """A frozen copy of `model` in eval mode. A ZeRO-3 partitioned model cannot be deep-copied (its tensors are
    empty): the copy is built from its config under ZeRO-3 (so partitioned alike) and filled from the gathered
    weights."""
    if not zero3_partitioned(model):
        return copy.deepcopy(model).eval().requires_grad_(False)
    reference = type(model)._from_config(model.config, dtype=next(model.parameters()).dtype)
    copy_weights(reference, model)
    reference.generation_config = copy.deepcopy(model.generation_config)
    return reference.eval().requires_grad_(False)


@torch.no_grad()
def copy_weights(target: nn.Module, source: nn.Module, alpha: float = 1.0) -> None:
    """target <- alpha * source + (1 - alpha) * target, parameter by parameter; one parameter pair gathered at a
    time under ZeRO-3 (rank 0 writes, DeepSpeed partitions the result back). FSDP2 parameters sharded alike are
    mixed shard by shard. Every rank must call this together."""
    import torch.distributed as dist

    pairs = list(zip(target.parameters(), source.parameters(), strict=True))
    if zero3_partitioned(target) or zero3_partitioned(source):
        import deepspeed

        for t, s in pairs:
            with deepspeed.zero.GatheredParameters([t, s], modifier_rank=0):
                if not dist.is_initialized() or dist.get_rank() == 0:
                    t.data.mul_(1.0 - alpha).add_(s.data.to(t.dtype), alpha=alpha)
        return
    for module in (*target.modules(), *source.modules()):
        if type(module).__name__.startswith("FSDP") and hasattr(module, "reshard"):
            module.reshard()  # parameters left gathered after a forward become shards again
    for t, s in pairs:
        t, s = _local(t), _local(s)
        if t.shape != s.shape:
            raise RuntimeError(f"reference and policy are sharded differently ({tuple(t.shape)} vs {tuple(s.shape)})")
        t.mul_(1.0 - alpha).add_(s.to(t.dtype), alpha=alpha)


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 parameter (its storage: writes land in the parameter); a plain tensor's data."""
    return param.to_local() if type(param).__name__ == "DTensor" else param.data


def prepare_deepspeed_inference(model: nn.Module, accelerator) -> nn.Module:
    """An inference-only ZeRO-3 engine for a reference or reward model, partitioned like the policy (the policy's
    DeepSpeed config without optimizer or scheduler). Under stages 0-2, which divide only optimizer state and
    gradients, a frozen model needs no engine: it stays a full copy per rank."""
    import deepspeed

    config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    for key in ("optimizer", "scheduler", "train_batch_size", "gradient_accumulation_steps"):
        config.pop(key, None)
    config["train_micro_batch_size_per_gpu"] = 1
    # what the Trainer fills in ("auto") for the policy only when training starts
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    zero = config["zero_optimization"]
    for key, value in (
        ("reduce_bucket_size", hidden and hidden * hidden),
        ("stage3_prefetch_bucket_size", hidden and int(0.9 * hidden * hidden)),
        ("stage3_param_persistence_threshold", hidden and 10 * hidden),
    ):
        if zero.get(key) == "auto":
            if value:
                zero[key] = value
            else:
                zero.pop(key)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()
    return engine


def shard_reference_fsdp2(model: nn.Module, accelerator) -> nn.Module:
    """An inference-only FSDP2 copy: each decoder layer and the root sharded across the processes (no optimizer, so
    nothing else to divide)."""
    from torch.distributed.fsdp import fully_shard

    layer_classes = tuple(
        type(m) for m in model.modules() if type(m).__name__ in set(getattr(model, "_no_split_modules", None) or [])
    )
    mesh = getattr(accelerator.state, "device_mesh", None) or getattr(accelerator, "torch_device_mesh", None)
    kwargs = {"mesh": mesh} if mesh is not None else {}
    for module in model.modules():
        if layer_classes and isinstance(module, layer_classes):
            fully_shard(module, reshard_after_forward=True, **kwargs)
    # Said explicitly: by default FSDP2 keeps the root's parameters (embeddings, head) gathered after forward, for
    # the backward a frozen model never runs.
    fully_shard(model, reshard_after_forward=True, **kwargs)
    return model
