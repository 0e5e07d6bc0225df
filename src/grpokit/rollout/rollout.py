"""One rollout: generate completions for a batch of prompts, score them, and turn the scores into advantages.

`produce_rollout` is a free function of its collaborators (a tokenizer, a generation backend, the reward functions,
optional log-probability scorers, the cross-process collective), so it runs and is tested without a Trainer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from grpokit import routing, vision
from grpokit.algorithms import group_advantages, reward_metrics
from grpokit.dist import LOCAL, Collective
from grpokit.generation import (
    GenerationBackend,
    check_prompt_lengths,
    decode_completions,
    encode_prompts,
    is_conversational,
    is_truncated,
    pad,
)

from .correction import sampling_correction
from .rewards import RewardError, RewardFunctions, column_values

# (input_ids (B, P+C), attention_mask (B, P+C), logits_to_keep C[, vision=VisionRows]) -> log-probabilities (B, C);
# `vision` is passed only for a vision-language model's rows
LogpsFn = Callable[[Tensor, Tensor, int], Tensor]

# TRL 1.16's `GRPOTrainer._generate(prompts)` result, one entry per prompt in each list: (prompt_ids, completion_ids,
# tool_mask, completions, logprobs, extra_fields, images, tool_images); see `generate_completions`.
GenerateFn = Callable[[list], tuple]

# Fields of a rollout that training consumes, split into micro-batches along dim 0 (others are replicated).
ROW_FIELDS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "advantages",
    "old_logps",
    "ref_logps",
    "sampling_logps",
    "importance_sampling_ratio",
    "prompt_routes",
    "completion_routes",
)
ROUTES_FIELD = "_routes"  # the extra field of a generation that carries the sampler's routed experts (routing replay)


@dataclass
class RolloutSettings:
    """What shapes a rollout, besides its collaborators (`from_config` fills it from a `GRPOConfig`)."""

    num_generations: int
    max_prompt_length: int | None = None
    chat_template_kwargs: dict = field(default_factory=dict)
    mask_truncated_completions: bool = False
    pad_to_multiple_of: int | None = None
    scale_rewards: str = "group"
    reward_weights: list[float] | None = None
    multi_objective_aggregation: str = "sum_then_normalize"
    # vLLM importance-sampling correction (None: off); needs the backend's sampling logprobs and old_logps_fn
    importance_sampling_mode: str | None = None
    importance_sampling_clip_min: float | None = None
    importance_sampling_clip_max: float | None = None
    # routing_replay: every round must bring the sampler's routed experts (grpokit.routing)
    routing_replay: bool = False
    # grpokit's sampler corrections on top of the mode (see algorithms.importance_sampling); only with a mode
    importance_sampling_geometric: bool = False
    sampler_kl_threshold: float | None = None
    sampler_kl_estimator: str = "k3"
    sampler_kl_reduction: str = "mean"
    sampler_token_veto: float | None = None
    # The policy's positions (max_position_embeddings): a prompt whose tokens plus max_completion_length exceed them
    # is refused, never cut silently (max_prompt_length cuts on purpose). None: not checked.
    max_positions: int | None = None
    max_completion_length: int | None = None
    # The generation engine's own sequence limit when it has one (vLLM's max model length): a tool round whose next
    # turn's input would reach it is dropped, as one reaching max_positions is.
    engine_positions: int | None = None
    # Keep the images of image prompts in the rollout (all processes) for the completion records (log_multimodal)
    log_images: bool = False

    @classmethod
    def from_config(cls, args, num_generations: int, *, max_positions: int | None = None) -> RolloutSettings:
        """The settings of `args` (a `GRPOConfig`) for rounds of `num_generations` completions per prompt (training
        and evaluation may differ) with a policy of `max_positions` positions. The importance-sampling correction is
        on only with vLLM, as in TRL."""
        correction = correction_settings(args) if args.use_vllm else {}
        return cls(
            num_generations=num_generations,
            max_prompt_length=args.max_prompt_length,
            chat_template_kwargs=dict(args.chat_template_kwargs or {}),
            mask_truncated_completions=args.mask_truncated_completions,
            pad_to_multiple_of=args.pad_to_multiple_of,
            scale_rewards=args.scale_rewards,
            reward_weights=args.reward_weights,
            multi_objective_aggregation=args.multi_objective_aggregation,
            max_positions=max_positions,
            max_completion_length=args.max_completion_length,
            engine_positions=args.vllm_max_model_length if args.use_vllm else None,
            log_images=bool(args.log_completions and args.log_multimodal),
            routing_replay=bool(getattr(args, "routing_replay", False)),
            **correction,
        )


@dataclass
class Rollout:
    """A generation batch of this process, ready for the loss, plus what is logged about the whole batch.

    Row tensors (B rows of this process; P prompt and C completion positions) are on the training device:
    prompt ids left-padded, completion ids right-padded, `completion_mask` 1 up to and including the first EOS
    (all 0 for a truncated completion when `mask_truncated_completions`). With tools, `tool_mask` marks the tool
    turns inside completions: attention sees them, the loss does not (`loss_mask`).
    """

    prompt_ids: Tensor  # (B, P)
    prompt_mask: Tensor  # (B, P)
    completion_ids: Tensor  # (B, C)
    completion_mask: Tensor  # (B, C)
    advantages: Tensor  # (B,)
    num_items_in_batch: Tensor  # () tokens the loss counts in the generation batch (model-written), all processes
    tool_mask: Tensor | None = None  # (B, C) 0 on tokens the model did not write (tool turns), 1 elsewhere; None: all
    old_logps: Tensor | None = None  # (B, C) under the policy that generated, when updates are off-policy
    ref_logps: Tensor | None = None  # (B, C) under the reference model, when beta > 0
    sampling_logps: Tensor | None = None  # (B, C) the generation backend's own logprobs (vLLM), NaN where unknown
    importance_sampling_ratio: Tensor | None = None  # (B, C) or (B, 1) pi_old / pi_sampler weights (vLLM correction)
    vision: vision.VisionRows | None = None  # a vision-language model's image inputs, one entry per row
    # routing_replay: the sampler's experts of each token (grpokit.routing), (B, P | C, routers, top_k), -1 at padding
    prompt_routes: Tensor | None = None
    completion_routes: Tensor | None = None
    images: list | None = None  # (N,) each row's PIL images (None: none), all processes; with settings.log_images
    # Logging, over all processes (N = B x processes rows)
    prompts: list = field(default_factory=list)
    completions: list = field(default_factory=list)
    rewards: Tensor | None = None  # (N, F), NaN where a function returned None
    all_advantages: Tensor | None = None  # (N,)
    num_tokens: int = 0  # prompt + completion tokens generated with, all processes
    metrics: dict[str, float] = field(default_factory=dict)
    unscorable: bool = False  # every reward of every completion, all processes, was None/NaN: zero advantages

    @property
    def loss_mask(self) -> Tensor:
        """(B, C) the tokens the loss, entropy and importance weights count: the model's own."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    def micro_batches(self, n: int, *, shuffle: bool = True) -> list[dict[str, Tensor]]:
        """The rows split into `n` equal micro-batches (after a random permutation when `shuffle`), as dicts of the
        tensors the loss needs; `num_items_in_batch` goes with each."""
        rows = self.prompt_ids.size(0)
        if rows % n != 0:
            raise ValueError(f"a rollout of {rows} rows cannot be split into {n} equal micro-batches")
        order = torch.randperm(rows) if shuffle else torch.arange(rows)
        tensors = {f.name: getattr(self, f.name) for f in fields(self) if f.name in ROW_FIELDS}
        tensors = {k: v[order.to(v.device)] for k, v in tensors.items() if v is not None}
        size = rows // n
        batches = [
            {
                **{k: v[i * size : (i + 1) * size] for k, v in tensors.items()},
                "num_items_in_batch": self.num_items_in_batch,
            }
            for i in range(n)
        ]
        if self.vision is not None:
            for i, batch in enumerate(batches):
                batch["vision"] = self.vision.select(order[i * size : (i + 1) * size])
        return batches


def correction_settings(args) -> dict:
    """`RolloutSettings`' importance-sampling fields from `args` (empty when vllm_importance_sampling_correction is
    off): TRL's mode and bounds, and grpokit's sampler corrections."""
    if not args.vllm_importance_sampling_correction:
        return {}
    return dict(
        importance_sampling_mode=args.vllm_importance_sampling_mode,
        importance_sampling_clip_min=args.vllm_importance_sampling_clip_min,
        importance_sampling_clip_max=args.vllm_importance_sampling_clip_max,
        importance_sampling_geometric=args.sampler_sequence_geometric,
        sampler_kl_threshold=args.sampler_kl_threshold,
        sampler_kl_estimator=args.sampler_kl_estimator,
        sampler_kl_reduction=args.sampler_kl_reduction,
        sampler_token_veto=args.sampler_token_veto,
    )


def produce_rollout(
    rows: list[dict[str, Any]],
    *,
    tokenizer,
    generator: GenerationBackend,
    rewards: RewardFunctions,
    settings: RolloutSettings,
    eos_token_ids: list[int],
    old_logps_fn: LogpsFn | None = None,
    ref_logps_fn: LogpsFn | None = None,
    reward_kwargs: dict[str, Any] | None = None,
    dist: Collective = LOCAL,
    device: torch.device | str = "cpu",
    generate: GenerateFn | None = None,
) -> Rollout:
    """Generate, score and compute advantages for `rows` (dataset rows, each prompt already repeated once per
    generation, groups consecutive across the processes' batches in process order).

    Args:
        rows: this process's rows; each has a `prompt` (text or messages) and any other columns for the rewards; an
            `image` or `images` column puts its images into the (conversational) prompt, as in TRL.
        tokenizer: the policy's processing class: a tokenizer, or a vision-language model's processor.
        old_logps_fn: scores the completions under the current policy; None when updates are on-policy (with the
            importance-sampling correction on, the loss step then computes it: `correction.LossStepCorrection`).
        ref_logps_fn: scores them under the reference model; None when beta = 0.
        reward_kwargs: extra keywords for reward functions (`trainer_state`, `log_extra`, `log_metric`).
        generate: replaces `generate_completions` (the trainer passes its `_generate`, TRL's hook); its extra fields
            reach the reward functions as columns.
    """
    processor, tokenizer = tokenizer, vision.tokenizer_of(tokenizer)
    for i, row in enumerate(rows):  # a stream's rows are met here first
        vision.refuse_image_row(row, i, processor, "batch")
    prompts = [
        vision.attach_images(row["prompt"], vision.row_images(row, i, "batch"), i, "batch")
        if vision.has_image_column(row)
        else row["prompt"]
        for i, row in enumerate(rows)
    ]
    if generate is None:
        generate = functools.partial(generate_completions, tokenizer=processor, generator=generator, settings=settings)
    prompt_id_lists, completion_id_lists, tool_masks, completions, logprobs, extra_fields = _generated(
        generate(prompts)
    )
    routes = extra_fields.pop(ROUTES_FIELD, None)
    if settings.routing_replay and routes is None:
        raise ValueError(
            "routing_replay: this round's generation recorded no routed experts (a _generate override or another "
            "backend generated it); generate with the trainer's own transformers backend, or turn routing_replay off"
        )
    columns = {**column_values(rows), **_extra_columns(extra_fields, len(rows))}
    vision_rows = _vision_rows(processor, prompts, prompt_id_lists, settings, device)

    batch = _pad_batch(prompt_id_lists, completion_id_lists, tokenizer.pad_token_id, settings, device)
    truncated = torch.tensor(
        [is_truncated(ids, eos_token_ids, tokenizer.pad_token_id) for ids in completion_id_lists], device=device
    )
    if settings.mask_truncated_completions:
        batch["completion_mask"] = batch["completion_mask"] * (~truncated).unsqueeze(1).long()
    tool_mask = None
    if tool_masks is not None:  # padded with 1: padding is already outside completion_mask
        tool_mask = pad(tool_masks, value=1, side="right", multiple_of=settings.pad_to_multiple_of).to(device)
    loss_mask = batch["completion_mask"] if tool_mask is None else batch["completion_mask"] * tool_mask

    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # (B, P+C)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # (B, P+C)
    logits_to_keep = batch["completion_ids"].size(1)
    scoring = {"vision": vision_rows} if vision_rows is not None else {}
    if routes is not None:
        widths = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
        routes = routing.padded_routes(routes, [len(p) for p in prompt_id_lists], *widths).to(device)
    with torch.no_grad():
        replay = {} if routes is None else {"routes": routes}  # the policy's pass replays, the reference's does not
        old_logps = (
            old_logps_fn(input_ids, attention_mask, logits_to_keep, **scoring, **replay) if old_logps_fn else None
        )
        ref_logps = ref_logps_fn(input_ids, attention_mask, logits_to_keep, **scoring) if ref_logps_fn else None
    sampling_logps = None
    if logprobs is not None:
        sampling_logps = pad(
            logprobs, value=0.0, side="right", multiple_of=settings.pad_to_multiple_of, dtype=torch.float32
        ).to(device)  # (B, C)
    correction = sampling_correction(old_logps, sampling_logps, loss_mask, settings, dist)
    importance_sampling_ratio = correction.pop("ratio", None)

    local_rewards = _agreed_rewards(
        dist, rewards, prompts, completions, completion_id_lists, columns, **(reward_kwargs or {})
    )  # (B, F)
    all_rewards = dist.gather(local_rewards.to(device))  # (N, F): groups may span processes
    advantage_kwargs = dict(
        reward_weights=settings.reward_weights,
        scale_rewards=settings.scale_rewards,
        multi_objective_aggregation=settings.multi_objective_aggregation,
    )
    all_advantages = group_advantages(all_rewards, settings.num_generations, **advantage_kwargs)  # (N,)
    local = slice(dist.process_index * len(rows), (dist.process_index + 1) * len(rows))

    prompt_lengths = torch.tensor([len(ids) for ids in prompt_id_lists], device=device)
    # The model's own tokens: a tool turn inside a completion is not part of its length (as TRL counts).
    own = completion_id_lists if tool_masks is None else [[1] * sum(mask) for mask in tool_masks]
    completion_lengths = torch.tensor([len(ids) for ids in own], device=device)
    all_completion_lengths = dist.gather(completion_lengths)
    metrics = _length_metrics(all_completion_lengths, dist.gather(truncated))
    metrics.update(_reward_metrics(all_rewards, settings.num_generations, rewards.names, advantage_kwargs))
    metrics.update(correction)
    return Rollout(
        **batch,
        advantages=all_advantages[local],
        num_items_in_batch=dist.sum(loss_mask.sum()),
        tool_mask=tool_mask,
        old_logps=old_logps,
        ref_logps=ref_logps,
        sampling_logps=sampling_logps,
        importance_sampling_ratio=importance_sampling_ratio,
        vision=vision_rows,
        prompt_routes=None if routes is None else routes[:, : batch["prompt_ids"].size(1)],
        completion_routes=None if routes is None else routes[:, batch["prompt_ids"].size(1) :],
        images=_logged_images(prompts, settings, dist),
        prompts=dist.gather_object([vision.without_images(p) for p in prompts]),
        completions=dist.gather_object(completions),
        rewards=all_rewards.cpu(),
        all_advantages=all_advantages.cpu(),
        num_tokens=int(dist.gather(prompt_lengths).sum().item() + all_completion_lengths.sum().item()),
        metrics=metrics,
        unscorable=bool(torch.isnan(all_rewards).all()),
    )


def _logged_images(prompts: list, settings: RolloutSettings, dist: Collective) -> list | None:
    """Every process's rows' images (for the records), or None when not logged or no row has one."""
    if not settings.log_images:
        return None
    images = dist.gather_object([vision.prompt_images(p) or None for p in prompts])
    return images if any(images) else None


def generate_completions(
    prompts: list, *, tokenizer, generator: GenerationBackend, settings: RolloutSettings
) -> tuple:
    """Tokenize `prompts` (text or messages), generate one completion per prompt with `generator`, and decode them,
    returning what TRL 1.16's `GRPOTrainer._generate` returns: `(prompt_ids, completion_ids, tool_mask, completions,
    logprobs, extra_fields, images, tool_images)`, lists with one entry per prompt; `logprobs` None where the backend
    samples from the training model itself; no tool mask here (`None`, `{}`). With a vision-language model's
    processor as `tokenizer`, conversational prompts are encoded with their images (`grpokit.vision`) and `images`
    holds each prompt's images (None where it has none, None when no prompt has any), as in TRL."""
    images = None
    if vision.is_processor(tokenizer) and is_conversational(prompts[0]):
        prompt_ids, vision_rows = vision.encode_vision_prompts(
            tokenizer,
            prompts,
            max_prompt_length=settings.max_prompt_length,
            chat_template_kwargs=settings.chat_template_kwargs,
        )
        check_prompt_lengths(prompt_ids, prompts, settings.max_completion_length, settings.max_positions)
        images = [vision.prompt_images(p) or None for p in prompts]
        images = images if any(images) else None
        generated = _generate_with_images(generator, prompt_ids, vision_rows)
    else:
        prompt_ids = encode_prompts(
            vision.tokenizer_of(tokenizer),
            prompts,
            max_prompt_length=settings.max_prompt_length,
            chat_template_kwargs=settings.chat_template_kwargs,
        )
        check_prompt_lengths(prompt_ids, prompts, settings.max_completion_length, settings.max_positions)
        generated = generator.generate(prompt_ids)
    completions = decode_completions(
        vision.tokenizer_of(tokenizer), generated.completion_ids, conversational=is_conversational(prompts[0])
    )
    extra = {} if generated.routes is None else {ROUTES_FIELD: generated.routes}
    return prompt_ids, generated.completion_ids, None, completions, generated.logprobs, extra, images, []


def _generate_with_images(generator: GenerationBackend, prompt_ids: list[list[int]], vision_rows):
    """Generation with a vision-language model's images; a backend that cannot take them says so."""
    try:
        return generator.generate(prompt_ids, vision=vision_rows)
    except TypeError as exc:
        if "vision" not in str(exc):
            raise
        raise ValueError(
            f"{type(generator).__name__} does not generate from images (its generate takes no vision inputs); "
            "train vision-language models with transformers' generate or vLLM colocate"
        ) from None


def _vision_rows(processor, prompts: list, prompt_ids: list[list[int]], settings: RolloutSettings, device):
    """The image inputs the scoring passes need for a vision-language model's rows (None for a tokenizer), encoded
    from the prompts as generation encoded them; they must give the same prompt tokens `_generate` returned."""
    if not vision.is_processor(processor) or not is_conversational(prompts[0]):
        return None
    ids, rows = vision.encode_vision_prompts(
        processor,
        prompts,
        max_prompt_length=settings.max_prompt_length,
        chat_template_kwargs=settings.chat_template_kwargs,
    )
    for i, (mine, theirs) in enumerate(zip(ids, prompt_ids, strict=True)):
        if list(mine) != list(theirs):
            raise ValueError(
                f"prompt {i}: _generate returned prompt ids that differ from the processor's encoding of the prompt "
                "with its images; the image inputs would not match them"
            )
    return rows.to(device)


def _generated(output: tuple) -> tuple:
    """`(prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields)` of a `_generate` result (TRL's
    8-tuple). `images` are the prompts' own (the rollout encodes them again for scoring); images from tool turns are
    refused in one line: dropping them silently would train on turns the model never saw. A tool mask must have one
    entry per completion token."""
    prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images = output
    if any(tool_images or []):
        raise ValueError("_generate returned tool_images: images in tool turns are not supported yet; return []")
    if tool_mask is not None:
        tool_mask = [list(mask) for mask in tool_mask]
        for i, (mask, ids) in enumerate(zip(tool_mask, completion_ids, strict=True)):
            if len(mask) != len(ids) or any(m not in (0, 1) for m in mask):
                raise ValueError(
                    f"tool_mask (or env_mask) of completion {i}: {len(mask)} values for {len(ids)} completion tokens; "
                    "give one 0 (not the model's) or 1 (the model's) per completion token"
                )
    return prompt_ids, completion_ids, tool_mask, completions, logprobs, dict(extra_fields or {})


def _extra_columns(extra_fields: dict[str, Any], rows: int) -> dict[str, list]:
    """Extra fields of `_generate` as reward columns, as TRL merges them: a list gives one value per row, anything
    else is the value of every row."""
    return {k: list(v) if isinstance(v, list) else [v] * rows for k, v in extra_fields.items()}


def _agreed_rewards(dist: Collective, rewards: RewardFunctions, *args, **kwargs) -> Tensor:
    """This process's rewards; when any process's rewards fail (raise, time out), every process raises: the failing
    one its own error, the others a RewardError with its message, before any of them enters a collective that a
    failed process would never reach."""
    if dist.num_processes == 1:
        return rewards(*args, **kwargs)
    try:
        local, failure = rewards(*args, **kwargs), None
    except Exception as error:  # any failure must reach the other processes
        local, failure = None, error
    message = None if failure is None else (str(failure) if isinstance(failure, RewardError) else repr(failure))
    messages = dist.gather_object([message])
    if failure is not None:
        if isinstance(failure, RewardError):
            raise failure
        raise RewardError(f"scoring rewards failed on process {dist.process_index}: {message}") from failure
    for index, other in enumerate(messages):
        if other is not None:
            raise RewardError(f"{other} (on process {index} of {dist.num_processes})")
    return local


def _pad_batch(prompt_ids, completion_ids, pad_token_id, settings: RolloutSettings, device) -> dict[str, Tensor]:
    multiple = settings.pad_to_multiple_of
    tensors = {
        "prompt_ids": pad(prompt_ids, value=pad_token_id, side="left", multiple_of=multiple),
        "prompt_mask": pad([[1] * len(p) for p in prompt_ids], value=0, side="left", multiple_of=multiple),
        "completion_ids": pad(completion_ids, value=pad_token_id, side="right", multiple_of=multiple),
        "completion_mask": pad([[1] * len(c) for c in completion_ids], value=0, side="right", multiple_of=multiple),
    }
    return {k: v.to(device) for k, v in tensors.items()}


def _length_metrics(lengths: Tensor, truncated: Tensor) -> dict[str, float]:
    lengths = lengths.float()
    terminated = lengths[~truncated]
    if terminated.numel() == 0:  # TRL's convention: 0 when no completion terminated
        terminated = torch.zeros(1, device=lengths.device)
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item(),
        "completions/min_terminated_length": terminated.min().item(),
        "completions/max_terminated_length": terminated.max().item(),
    }


def _reward_metrics(rewards: Tensor, num_generations: int, names: list[str], advantage_kwargs) -> dict[str, float]:
    stats = reward_metrics(rewards, num_generations, **advantage_kwargs)
    metrics = {}
    for i, name in enumerate(names):
        metrics[f"rewards/{name}/mean"] = stats["per_function_mean"][i].item()
        metrics[f"rewards/{name}/std"] = stats["per_function_std"][i].item()
    metrics["reward"] = stats["reward"].item()
    metrics["reward_std"] = stats["reward_std"].item()
    metrics["frac_reward_zero_std"] = stats["frac_reward_zero_std"].item()
    return metrics
