"""DAPO's dynamic sampling (Yu et al., 2025, arXiv:2503.14476): train only on groups whose rewards differ.

A group whose completions all score the same (e.g. all right or all wrong under a binary reward) has zero advantage
everywhere and gives the policy term no gradient. With `dynamic_sampling`, after a generation round is scored its
groups with reward spread at most `dynamic_sampling_min_reward_std` (the Bessel std of the weighted reward sum, as
`frac_reward_zero_std` counts it; a group with fewer than two scorable completions is dropped too) are set aside, and
more prompts are generated, round after round, until every process holds enough kept groups for the round the
optimizer trains on (`per_device_train_batch_size x steps_per_generation` rows per process). After
`dynamic_sampling_max_rounds` extra rounds the batch is filled, with a one-line warning, with dropped groups (the
first ones generated) whose advantages are set to 0, so that shapes and the loss normalisation stay as without the
filter.

Where the extra prompts come from (`RefillStream`): the train dataset in its own order (shuffled with the seed when
`shuffle_dataset`, a new permutation each pass, an incomplete last chunk dropped), one generation batch of distinct
prompts per extra round, each process taking its contiguous slice of it as `RepeatSampler` under accelerate does. The
Trainer's own data stream is left untouched (its position on resume is counted in optimizer steps), and the refill
stream's position (chunks drawn) is saved with the round state of each checkpoint, so a resumed run draws the same
extra prompts as the uninterrupted one.

Several processes: each process holds whole groups (checked in the config rules), filters its own groups, and all
processes run the same number of rounds: after each round they gather each one's count of kept groups and go on while
any of them is short. Advantages of the assembled batch are computed again over all processes' assembled rows, per
group as before; `scale_rewards: batch` therefore divides by the std over the batch the optimizer trains on (kept
groups, plus fillers when the cap was reached), not over everything generated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from grpokit.algorithms import group_advantages, group_reward_stats, weighted_reward_sum
from grpokit.dist import LOCAL, Collective

from .rollout import ROW_FIELDS, Rollout, RolloutSettings

logger = logging.getLogger(__name__)

PREFIX = "dynamic_sampling/"
EQUAL_STD = 1e-6  # a group reward std at most this is float rounding of equal rewards


# ---------------------------------------------------------------------------------------------------- pure functions


def group_spread(rewards: Tensor, num_generations: int, reward_weights: Sequence[float] | None = None) -> Tensor:
    """`(N, F)` rewards (NaN where a function returned None) -> `(N / num_generations,)` std of each group's weighted
    reward sum (Bessel; NaN for a group with fewer than two scorable completions)."""
    _, std, _ = group_reward_stats(weighted_reward_sum(rewards.double(), reward_weights), num_generations)
    return std[::num_generations]


def kept_groups(
    rewards: Tensor, num_generations: int, min_reward_std: float, reward_weights: Sequence[float] | None = None
) -> Tensor:
    """Bool `(N / num_generations,)`: True for a group whose reward std is above `min_reward_std` and above
    `EQUAL_STD` (so that 0 drops the groups with all-equal rewards despite float rounding, e.g. 0.1 + 0.9 against
    0.7 + 0.3 in float32); NaN std (fewer than two scorable completions) is dropped.

    >>> kept_groups(torch.tensor([[1.0], [1.0], [0.0], [1.0]]), 2, 0.0).tolist()
    [False, True]
    """
    std = group_spread(rewards, num_generations, reward_weights)
    return ~torch.isnan(std) & (std > max(min_reward_std, EQUAL_STD))


def choose_groups(kept_per_round: list[list[bool]], needed: int) -> tuple[list[tuple[int, int]], int]:
    """The `(round, group)` pairs one process trains on: the first `needed` kept groups in generation order, then,
    when there are fewer, the first dropped groups (the fillers). Returns (pairs, number of fillers).

    >>> choose_groups([[False, True], [True, True]], 2)
    ([(0, 1), (1, 0)], 0)
    >>> choose_groups([[False, True], [False, False]], 2)
    ([(0, 1), (0, 0)], 1)
    """
    kept = [(r, g) for r, flags in enumerate(kept_per_round) for g, ok in enumerate(flags) if ok]
    dropped = [(r, g) for r, flags in enumerate(kept_per_round) for g, ok in enumerate(flags) if not ok]
    chosen = kept[:needed]
    fillers = dropped[: needed - len(chosen)]
    return chosen + fillers, len(fillers)


def another_round(kept_counts: Sequence[int], needed: int, extra_rounds: int, max_extra_rounds: int) -> bool:
    """Whether every process generates one more round: some process has fewer than `needed` kept groups, and fewer
    than `max_extra_rounds` extra rounds have run. `kept_counts` is every process's count (gathered), so all decide
    the same."""
    return min(kept_counts) < needed and extra_rounds < max_extra_rounds


def refill_chunk(position: int, *, num_rows: int, chunk_prompts: int, shuffle: bool, seed: int) -> list[int]:
    """Dataset indices of refill chunk number `position` (0, 1, ...): `chunk_prompts` distinct prompts. Pass
    k = position // (num_rows // chunk_prompts) is a permutation of the rows drawn with seed `refill_seed(seed, k)`
    (the rows in order when not `shuffle`); an incomplete last chunk of a pass is never drawn.

    >>> [refill_chunk(p, num_rows=5, chunk_prompts=2, shuffle=False, seed=0) for p in range(3)]
    [[0, 1], [2, 3], [0, 1]]
    """
    per_pass = num_rows // chunk_prompts
    if per_pass == 0:
        raise ValueError(
            f"dynamic_sampling needs at least {chunk_prompts} prompts in the train dataset (one generation batch), "
            f"it has {num_rows}"
        )
    epoch, chunk = divmod(position, per_pass)
    if shuffle:
        order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(refill_seed(seed, epoch))).tolist()
    else:
        order = list(range(num_rows))
    return order[chunk * chunk_prompts : (chunk + 1) * chunk_prompts]


def refill_seed(seed: int, epoch: int) -> int:
    """The seed of the refill stream's pass `epoch`: distinct from the train sampler's own seed, so the extra prompts
    do not repeat the main stream's order."""
    return (seed + 1) * 1_000_003 + epoch


# ---------------------------------------------------------------------------------------------------- the refill


@dataclass
class RefillStream:
    """The extra prompts of dynamic sampling, one generation batch per extra round (see the module docstring).

    `rows()` returns this process's rows of the next chunk: its `rows_per_process / num_generations` prompts, each
    repeated `num_generations` times in a row. `position` (chunks drawn) is what a checkpoint saves."""

    dataset: object
    num_generations: int
    rows_per_process: int
    num_processes: int = 1
    process_index: int = 0
    shuffle: bool = True
    seed: int = 0
    position: int = 0

    def rows(self) -> list[dict]:
        per_process = self.rows_per_process // self.num_generations
        indices = refill_chunk(
            self.position,
            num_rows=len(self.dataset),
            chunk_prompts=per_process * self.num_processes,
            shuffle=self.shuffle,
            seed=self.seed,
        )
        self.position += 1
        mine = indices[self.process_index * per_process : (self.process_index + 1) * per_process]
        return [self.dataset[i] for i in mine for _ in range(self.num_generations)]


# ---------------------------------------------------------------------------------------------------- assembly


_PAD = {  # (side, value) per row field; None value: the tokenizer's pad id
    "prompt_ids": ("left", None),
    "prompt_mask": ("left", 0),
    "completion_ids": ("right", None),
    "completion_mask": ("right", 0),
    "tool_mask": ("right", 1),
    "old_logps": ("right", 0.0),
    "ref_logps": ("right", 0.0),
    "sampling_logps": ("right", 0.0),
    "importance_sampling_ratio": ("right", 1.0),
    "prompt_routes": ("left", -1),
    "completion_routes": ("right", -1),
}


def _stack(parts: list[Tensor], side: str, value) -> Tensor:
    """Row tensors `(b_i, L_i, ...)` padded to the longest L on `side` and concatenated; `(b_i,)` just concatenated."""
    if parts[0].dim() == 1:
        return torch.cat(parts)
    width = max(p.size(1) for p in parts)
    padded = []
    for p in parts:
        extra = p.new_full((p.size(0), width - p.size(1), *p.shape[2:]), value)
        padded.append(torch.cat([extra, p] if side == "left" else [p, extra], dim=1))
    return torch.cat(padded)


def assemble(
    rollouts: list[Rollout], pairs: list[tuple[int, int]], num_generations: int, pad_token_id: int
) -> dict[str, object]:
    """The row fields (and vision rows) of the chosen `(round, group)` pairs, in that order, re-padded to a common
    width (prompts on the left, completions on the right; padding is outside the masks)."""
    selected = []  # (rollout, row indices) in the order of `pairs`, one entry per run of consecutive rounds
    for r, g in pairs:
        rows = torch.arange(g * num_generations, (g + 1) * num_generations)
        if selected and selected[-1][0] == r:
            selected[-1] = (r, torch.cat([selected[-1][1], rows]))
        else:
            selected.append((r, rows))
    out: dict[str, object] = {}
    for f in fields(Rollout):
        if f.name not in ROW_FIELDS:
            continue
        values = [getattr(rollouts[r], f.name) for r, _ in selected]
        if all(v is None for v in values):
            out[f.name] = None
            continue
        if any(v is None for v in values):
            if f.name != "tool_mask":
                raise ValueError(f"dynamic sampling: {f.name} is set in some generation rounds and not in others")
            values = [
                torch.ones_like(rollouts[r].completion_mask) if v is None else v
                for v, (r, _) in zip(values, selected, strict=True)
            ]
        side, value = _PAD.get(f.name, ("right", 0))
        value = pad_token_id if value is None else value
        out[f.name] = _stack(
            [v[rows.to(v.device)] for v, (_, rows) in zip(values, selected, strict=True)], side, value
        )
    visions = [rollouts[r].vision for r, _ in selected]
    out["vision"] = None
    if any(v is not None for v in visions):
        chosen = [v.select(rows.tolist()) for v, (_, rows) in zip(visions, selected, strict=True)]
        out["vision"] = type(chosen[0])(
            [row for v in chosen for row in v.rows], [p for v in chosen for p in v.engine_prompts]
        )
    return out


def _local_rewards(rollout: Rollout, dist: Collective) -> Tensor:
    """`(B, F)` this process's rows' rewards (the rollout keeps every process's, in process order)."""
    rows = rollout.prompt_ids.size(0)
    return rollout.rewards[dist.process_index * rows : (dist.process_index + 1) * rows]


# ---------------------------------------------------------------------------------------------------- the loop


@dataclass
class DynamicSampling:
    """Fills a generation round with groups whose rewards differ (see the module docstring)."""

    refill: RefillStream
    settings: RolloutSettings
    min_reward_std: float
    max_extra_rounds: int
    pad_token_id: int
    dist: Collective = LOCAL
    collate: Callable[[list[dict]], list[dict]] = list  # the dataloader's treatment of rows (removed columns)
    warn: Callable[[str], None] | None = None

    def fill(self, first: Rollout, generate: Callable[[list[dict]], Rollout], metrics=None) -> Rollout:
        """The round to train on, starting from `first` (the dataloader's round) and calling `generate(rows)` for
        each extra round (it must produce and record a rollout of this process's `rows`). The round's metrics (over
        all processes, `dynamic_sampling/*`) are appended to `metrics["train"]` (a `grpokit.metrics.MetricBuffers`
        or a dict of lists) when given."""
        num_gen, dist, device = self.settings.num_generations, self.dist, first.prompt_ids.device
        needed = first.prompt_ids.size(0) // num_gen
        rollouts, kept = [], []
        while True:
            rollout = first if not rollouts else generate(self.collate(self.refill.rows()))
            rollouts.append(rollout)
            flags = kept_groups(
                _local_rewards(rollout, dist), num_gen, self.min_reward_std, self.settings.reward_weights
            ).tolist()
            kept.append(flags)
            count = torch.tensor([sum(sum(f) for f in kept)], device=device)
            counts = dist.gather(count).tolist()
            if not another_round(counts, needed, len(rollouts) - 1, self.max_extra_rounds):
                break
        pairs, fillers = choose_groups(kept, needed)
        rows = assemble(rollouts, pairs, num_gen, self.pad_token_id)
        local_rewards = torch.cat(
            [_local_rewards(rollouts[r], dist)[g * num_gen : (g + 1) * num_gen] for r, g in pairs]
        )
        all_rewards = dist.gather(local_rewards.to(device))
        advantages = group_advantages(
            all_rewards,
            num_gen,
            reward_weights=self.settings.reward_weights,
            scale_rewards=self.settings.scale_rewards,
            multi_objective_aggregation=self.settings.multi_objective_aggregation,
        )
        local = advantages[dist.process_index * len(local_rewards) : (dist.process_index + 1) * len(local_rewards)]
        if fillers:
            local = local.clone()
            local[(needed - fillers) * num_gen :] = 0.0
        loss_mask = (
            rows["completion_mask"] if rows["tool_mask"] is None else rows["completion_mask"] * rows["tool_mask"]
        )
        totals = dist.sum(
            torch.tensor(
                [min(sum(sum(f) for f in kept), needed), fillers, sum(len(f) - sum(f) for f in kept)], device=device
            )
        ).tolist()
        in_batch, filler_total, dropped = (int(v) for v in totals)
        generated = len(rollouts) * needed * num_gen * dist.num_processes
        logged = {
            f"{PREFIX}rounds": float(len(rollouts)),
            f"{PREFIX}groups_kept": float(in_batch),
            f"{PREFIX}groups_dropped": float(dropped),
            f"{PREFIX}groups_filled": float(filler_total),
        }
        if in_batch:
            logged[f"{PREFIX}completions_per_kept_sample"] = generated / (in_batch * num_gen)
        if filler_total and self.warn is not None:
            self.warn(
                f"warning: dynamic sampling: after {len(rollouts) - 1} extra generation rounds "
                f"(dynamic_sampling_max_rounds) only {in_batch} of {in_batch + filler_total} groups have reward std > "
                f"{self.min_reward_std}; the batch is filled with {filler_total} dropped groups at advantage 0"
            )
        merged = Rollout(
            **{k: v for k, v in rows.items() if k not in ("vision", "advantages")},
            advantages=local.to(rows["completion_ids"].device),
            vision=rows["vision"],
            num_items_in_batch=dist.sum(loss_mask.sum()),
        )
        if metrics is not None:
            for name, value in logged.items():
                metrics["train"][name].append(value)
        return merged


def build(
    args, dataset, settings: RolloutSettings, *, dist: Collective, pad_token_id: int, collate, warn
) -> DynamicSampling:
    """The trainer's `DynamicSampling` for `args` (a `GRPOConfig` with dynamic_sampling) over the train `dataset`
    (rows as the dataloader gives them); a streaming dataset, which cannot be drawn from by index, is refused."""
    from .stream import is_stream

    if is_stream(dataset):
        raise ValueError(
            "dynamic_sampling needs a train dataset that can be indexed (the extra prompts are drawn by index): "
            "a streaming dataset cannot; load it without streaming or set dynamic_sampling: false"
        )
    refill = RefillStream(
        dataset,
        num_generations=args.num_generations,
        rows_per_process=args.generation_batch_size // dist.num_processes,
        num_processes=dist.num_processes,
        process_index=dist.process_index,
        shuffle=args.shuffle_dataset,
        seed=args.seed,
    )
    return DynamicSampling(
        refill,
        settings,
        min_reward_std=args.dynamic_sampling_min_reward_std,
        max_extra_rounds=args.dynamic_sampling_max_rounds,
        pad_token_id=pad_token_id,
        dist=dist,
        collate=collate,
        warn=warn,
    )
