"""What crosses from the rollout worker to the trainer, and TRL 1.16's two plug-in points.

A `RolloutSample` is one scored completion with TRL's fields: the whole token sequence (`input_ids`), which of its
tokens are trained (`completion_mask`: 0 on the prompt and on tool results), the sampler's per-token log-probabilities
(`old_log_probs`), its advantage, and the policy version it was generated with. A worker written for TRL (its
`RolloutWorkerProtocol`) puts such samples on `rollout_buffer`; a weight transfer written for TRL (its
`WeightTransferProtocol`) receives the policy's weights. `rollout_of` turns one generation batch of samples into the
synchronous trainer's `Rollout`, so both trainers train with the same loss and importance-sampling code.
"""

from __future__ import annotations

import math
import queue
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from grpokit.generation import pad
from grpokit.rollout.rollout import Rollout, _length_metrics, _reward_metrics


@dataclass(slots=True)
class RolloutSample:
    """One scored completion (TRL 1.16's fields, then grpokit's, which a TRL worker may leave out)."""

    prompt: Any  # the prompt as given (text or messages), for the records and reward logging
    completion: Any  # the decoded completion (text or messages)
    input_ids: np.ndarray  # (L,) prompt then completion tokens, tool results included
    completion_mask: np.ndarray  # (L,) 1 on the tokens the loss trains (the model's own), 0 elsewhere
    old_log_probs: np.ndarray  # (L,) the sampler's log-probability of each token (0 where not trained)
    advantage: float
    model_version: int  # the policy version generation started with
    group_id: int
    metrics: dict[str, float]  # "reward", "reward_std", "rewards/<function>", ...
    enqueued_at: float | None = None
    # grpokit: the last version the sampler held while generating (> model_version: the weights changed mid-request,
    # and each token's old_log_probs is under the weights that sampled it); None: model_version
    last_model_version: int | None = None
    truncated: bool = False  # stopped at max_completion_length
    extra: dict[str, Any] = field(default_factory=dict)  # log_extra's values and the tool calls, for the records


class RolloutWorkerProtocol(Protocol):
    """TRL 1.16's rollout-worker interface: the trainer drains `rollout_buffer` (scored `RolloutSample`s) and
    `metrics_queue` (dicts of metric values, a `(numerator, denominator)` pair for a rate), and calls `start` once
    after the first weight sync, `update_model_version` after each sync, `check_health` while it waits, `stop` at the
    end."""

    rollout_buffer: Any
    metrics_queue: Any

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def update_model_version(self, model_version: int) -> None: ...

    def check_health(self, stale_after_s: float) -> None: ...


class WeightTransferProtocol(Protocol):
    """TRL 1.16's weight-transfer interface, called on the main process in this order: `init_weight_transfer` once,
    then per sync `pause`, `send_weights(iterator of (name, tensor))`, `resume`; `destroy` at the end."""

    def init_weight_transfer(self) -> None: ...

    def pause(self) -> None: ...

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None: ...

    def resume(self) -> None: ...

    def destroy(self) -> None: ...


WORKER_PROTOCOL = ("rollout_buffer", "metrics_queue", "start", "stop", "update_model_version", "check_health")
TRANSFER_PROTOCOL = ("init_weight_transfer", "pause", "send_weights", "resume", "destroy")


def check_plugged(worker, transfer) -> None:
    """A plugged worker or transfer lacking part of TRL's protocol: one TypeError naming what, before anything loads."""
    for what, plugged, names in (
        ("rollout_worker", worker, WORKER_PROTOCOL),
        ("weight_transfer", transfer, TRANSFER_PROTOCOL),
    ):
        missing = [name for name in names if plugged is not None and not hasattr(plugged, name)]
        if missing:
            raise TypeError(f"{what}: {type(plugged).__name__} lacks {', '.join(missing)} of TRL's protocol")


def drain(source) -> list:
    """Every item waiting on a queue (`queue.Queue` or `multiprocessing.Queue`), without blocking."""
    items = []
    while True:
        try:
            items.append(source.get_nowait())
        except queue.Empty:
            return items


def reduce_window(name: str, values: list) -> float:
    """One logged number from a logging window's values, as TRL reduces them: `(numerator, denominator)` pairs as
    a rate, a name with the word `total` summed, `max`/`min` as extremes, anything else averaged; NaN ignored."""
    pairs = [v for v in values if isinstance(v, tuple)]
    if pairs:
        numerator, denominator = (sum(column) for column in zip(*pairs, strict=True))
        return numerator / denominator if denominator else math.nan
    values = [float(v) for v in values if not math.isnan(float(v))]
    if not values:
        return math.nan
    words = name.split("/")[-1].split("_")
    if "total" in words:
        return sum(values)
    if "max" in words:
        return max(values)
    if "min" in words:
        return min(values)
    return sum(values) / len(values)


def split(sample: RolloutSample) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt ids, completion ids, trained mask of the completion, sampler logprobs of the completion): the
    completion starts at the first trained token; a sample with none is all prompt."""
    ids = np.asarray(sample.input_ids).tolist()
    mask = np.asarray(sample.completion_mask).tolist()
    logps = np.asarray(sample.old_log_probs, dtype=np.float64).tolist()
    if not (len(ids) == len(mask) == len(logps)):
        raise ValueError(
            f"rollout sample of group {sample.group_id}: input_ids, completion_mask and old_log_probs have "
            f"{len(ids)}, {len(mask)} and {len(logps)} entries; give one per token"
        )
    if any(m not in (0, 1) for m in mask):
        raise ValueError(f"rollout sample of group {sample.group_id}: completion_mask holds values other than 0 and 1")
    first = next((i for i, m in enumerate(mask) if m), len(ids))
    return ids[:first], ids[first:], [int(m) for m in mask[first:]], logps[first:]


def rollout_of(
    samples: list[RolloutSample],
    *,
    process_index: int,
    num_processes: int,
    pad_token_id: int,
    reward_names: list[str],
    num_generations: int,
    advantage_kwargs: dict,
    pad_to_multiple_of: int | None = None,
    device: torch.device | str = "cpu",
) -> Rollout:
    """This process's share (an equal, contiguous slice) of one generation batch of samples, as the synchronous
    trainer's `Rollout`: prompts left-padded, completions right-padded, the tool results as `tool_mask` 0, the sampler's
    log-probabilities as `sampling_logps`, the samples' advantages. Logged values cover every sample."""
    if len(samples) % num_processes:
        raise ValueError(f"{len(samples)} samples cannot be shared equally by {num_processes} processes")
    parts = [split(s) for s in samples]
    per = len(samples) // num_processes
    mine = parts[process_index * per : (process_index + 1) * per]
    prompts, completions, masks, logps = (list(column) for column in zip(*mine, strict=True))
    multiple = pad_to_multiple_of
    tool_mask = None
    if any(0 in m for m in masks):
        tool_mask = pad(masks, value=1, side="right", multiple_of=multiple).to(device)
    total_trained = sum(sum(m) for _, _, m, _ in parts)
    all_rewards = _rewards_of(samples, reward_names)
    all_advantages = torch.tensor([float(s.advantage) for s in samples], dtype=torch.float32)
    lengths = torch.tensor([sum(m) for _, _, m, _ in parts])
    truncated = torch.tensor([bool(s.truncated) for s in samples])
    metrics = _length_metrics(lengths, truncated)
    metrics.update(_reward_logs(samples, all_rewards, reward_names, num_generations, advantage_kwargs))
    return Rollout(
        prompt_ids=pad(prompts, value=pad_token_id, side="left", multiple_of=multiple).to(device),
        prompt_mask=pad([[1] * len(p) for p in prompts], value=0, side="left", multiple_of=multiple).to(device),
        completion_ids=pad(completions, value=pad_token_id, side="right", multiple_of=multiple).to(device),
        completion_mask=pad([[1] * len(c) for c in completions], value=0, side="right", multiple_of=multiple).to(
            device
        ),
        advantages=all_advantages[process_index * per : (process_index + 1) * per].to(device),
        num_items_in_batch=torch.tensor(float(total_trained), device=device),
        tool_mask=tool_mask,
        sampling_logps=pad(logps, value=0.0, side="right", multiple_of=multiple, dtype=torch.float32).to(device),
        prompts=[s.prompt for s in samples],
        completions=[s.completion for s in samples],
        rewards=all_rewards,
        all_advantages=all_advantages,
        num_tokens=sum(len(p) + len(c) for p, c, _, _ in parts),
        metrics=metrics,
        unscorable=bool(torch.isnan(all_rewards).all()) if all_rewards.numel() else False,
    )


def _rewards_of(samples: list[RolloutSample], names: list[str]) -> torch.Tensor:
    """(N, F) each function's reward of each sample (from `metrics["rewards/<name>"]`, NaN where missing); a worker
    that logs no per-function rewards gives one column, its total `reward`."""
    if names and all(f"rewards/{n}" in s.metrics for s in samples for n in names):
        rows = [[float(s.metrics[f"rewards/{n}"]) for n in names] for s in samples]
    else:
        rows = [[float(s.metrics.get("reward", math.nan))] for s in samples]
    return torch.tensor(rows, dtype=torch.float32)


def _reward_logs(samples, rewards, names, num_generations, advantage_kwargs) -> dict[str, float]:
    """The synchronous trainer's reward metrics when the batch is whole groups in order (as the built-in worker
    delivers it); otherwise the samples' own values averaged."""
    whole_groups = len(samples) % num_generations == 0 and all(
        samples[i].group_id == samples[i - i % num_generations].group_id for i in range(len(samples))
    )
    if whole_groups and rewards.size(1) == len(names):
        return _reward_metrics(rewards, num_generations, names, advantage_kwargs)
    out = {}
    for key in ("reward", "reward_std"):
        values = [s.metrics[key] for s in samples if key in s.metrics and not math.isnan(s.metrics[key])]
        out[key] = sum(values) / len(values) if values else math.nan
    return out
