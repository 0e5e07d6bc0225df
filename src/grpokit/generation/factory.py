"""The one place a generation backend is chosen and built from a `GRPOConfig`: transformers' `generate` by default,
transformers' continuous batching (`use_transformers_continuous_batching`), vLLM in the training process (`vllm_mode="colocate"`) or in a `vllm serve` process (`vllm_mode="server"`) with
`use_vllm`. It imports the backends; they import only what is below them (`base`, `tokens`, `vllm_common`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch

from grpokit.config.rules import CONTINUOUS_WITH_VLLM
from grpokit.dist import LOCAL, Collective

from .base import GenerationBackend
from .transformers_backend import TransformersGenerator
from .vllm_common import sampling_kwargs

logger = logging.getLogger(__name__)


def build_generator(
    args,
    *,
    policy: Callable[[], AbstractContextManager],
    model_path: str | None,
    dtype: torch.dtype,
    tokenizer,
    eos_token_ids: Sequence[int],
    device: torch.device | str | None = None,
    dist: Collective = LOCAL,
    never_sample: Sequence[int] = (),
    vision_model: bool = False,
) -> GenerationBackend:
    """The backend `args` asks for.

    Args:
        args: a `GRPOConfig`.
        policy: a callable returning a context manager that yields the bare policy (transformers generates with it).
        model_path: the policy's checkpoint; vLLM starts its engine from it, and the server must serve it.
        dtype: the policy's dtype (the colocated engine loads the weights in it).
        tokenizer: the policy's tokenizer (pad and bos ids).
        eos_token_ids: every id that ends a completion.
        device: where prompts go for transformers' `generate`.
        dist: the cross-process operations (vLLM gathers prompts across its tensor-parallel group).
        never_sample: token ids generation must not sample (a vision-language model's image placeholders: one
            sampled would no longer match the image features): suppressed in transformers' `generate`, given a
            -100 logit bias in vLLM's sampling.
        vision_model: the policy is a vision-language model (continuous batching refuses it: text prompts only).
    """
    if args.use_transformers_continuous_batching:
        return _continuous_generator(args, policy, tokenizer, eos_token_ids, never_sample, vision_model)
    if args.transformers_continuous_batching_config:
        logger.warning(
            "transformers_continuous_batching_config has no effect without use_transformers_continuous_batching: true"
        )
    if not args.use_vllm:
        return _transformers_generator(args, policy, tokenizer, eos_token_ids, device, never_sample)
    dtype_name = str(dtype).removeprefix("torch.")
    if args.vllm_mode == "server":
        return _server_generator(args, model_path, eos_token_ids, dist, never_sample)
    return _colocate_generator(args, model_path, dtype_name, eos_token_ids, dist, never_sample)


def _biased(sampling: dict, never_sample: Sequence[int]) -> dict:
    """vLLM sampling keywords with a -100 logit bias on `never_sample` (a bias generation_kwargs sets wins)."""
    if never_sample:
        sampling["logit_bias"] = {**{int(t): -100.0 for t in never_sample}, **(sampling.get("logit_bias") or {})}
    return sampling


def _generation_kwargs(args, tokenizer, eos_token_ids, never_sample) -> dict:
    """The `GenerationConfig` keywords of both transformers backends (TRL's, plus `never_sample`'s suppression)."""
    return {
        "max_new_tokens": args.max_completion_length,
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos_token_ids,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "cache_implementation": args.cache_implementation,
        **({"suppress_tokens": list(never_sample)} if never_sample else {}),
        **(args.generation_kwargs or {}),  # they win over the fields above, as in TRL
    }


def _transformers_generator(args, policy, tokenizer, eos_token_ids, device, never_sample) -> TransformersGenerator:
    from transformers import GenerationConfig

    generation_kwargs = _generation_kwargs(args, tokenizer, eos_token_ids, never_sample)
    return TransformersGenerator(
        policy,
        GenerationConfig(**generation_kwargs, disable_compile=True),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=eos_token_ids,
        pad_to_multiple_of=args.pad_to_multiple_of,
        device=device,
    )


def _continuous_generator(args, policy, tokenizer, eos_token_ids, never_sample, vision_model) -> GenerationBackend:
    from transformers import GenerationConfig

    from .continuous import ContinuousBatchingGenerator

    if args.use_vllm:
        raise ValueError(CONTINUOUS_WITH_VLLM)
    if vision_model:
        raise ValueError(
            "use_transformers_continuous_batching does not take a vision-language model (transformers' "
            "generate_batch reads text prompts only); turn it off, or use use_vllm"
        )
    generation_kwargs = _generation_kwargs(args, tokenizer, eos_token_ids, never_sample)
    generation_kwargs.pop("cache_implementation")  # None (the rules refuse it): continuous batching pages its own
    return ContinuousBatchingGenerator(
        policy,
        GenerationConfig(**generation_kwargs, disable_compile=True),
        eos_token_ids=eos_token_ids,
        settings=args.transformers_continuous_batching_config,
    )


def _server_generator(args, model_path, eos_token_ids, dist, never_sample) -> GenerationBackend:
    from .vllm_server import VLLMServerGenerator

    generator = VLLMServerGenerator(
        base_url=args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}",
        timeout=args.vllm_server_timeout,
        group_port=args.vllm_group_port,
        sampling=_biased(sampling_kwargs(args, n=args.num_generations), never_sample),
        num_generations=args.num_generations,
        eos_token_ids=eos_token_ids,
        model_name=model_path,
        dist=dist,
    )
    # A LoRA policy's adapter versions (vllm_lora.py): written beside the run; asynchronous requests in flight may
    # still name the max_staleness versions before the newest
    generator.adapter_root = os.path.join(args.output_dir or ".", "vllm_adapters")
    generator.adapter_keep = args.max_staleness + 1 if getattr(args, "async_grpo", False) else 1
    return generator


def _colocate_generator(args, model_path, dtype_name, eos_token_ids, dist, never_sample) -> GenerationBackend:
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
        sampling=_biased(sampling_kwargs(args, n=1), never_sample),
        eos_token_ids=eos_token_ids,
        dtype=dtype_name,
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
