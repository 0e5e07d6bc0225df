"""Dynamic sampling's pieces (grpokit.rollout.dynamic), with hand-computed values: the group filter, the choice of
groups, the refill stream, the assembly of rounds of different widths, the advantages of the assembled batch, the
metrics, the cap warning, and the agreement of several processes on the number of rounds."""

import math
import threading
from collections import defaultdict

import pytest
import torch

from grpokit.rollout import Rollout, RolloutSettings
from grpokit.rollout.dynamic import (
    DynamicSampling,
    RefillStream,
    another_round,
    choose_groups,
    group_spread,
    kept_groups,
    refill_chunk,
)

PAD = 0
EPS = 1e-4  # grpokit.algorithms.advantages.STD_EPS


def test_group_spread_and_filter():
    rewards = torch.tensor([[1.0], [1.0], [0.0], [1.0], [0.2], [0.3], [float("nan")], [1.0]])
    std = group_spread(rewards, 2)
    assert std[:3].tolist() == pytest.approx([0.0, math.sqrt(0.5), math.sqrt(0.005)])
    assert math.isnan(std[3])  # one scorable completion
    assert kept_groups(rewards, 2, 0.0).tolist() == [False, True, True, False]
    assert kept_groups(rewards, 2, 0.1).tolist() == [False, True, False, False]  # sqrt(0.005) = 0.0707 <= 0.1


def test_filter_uses_the_weighted_sum_and_ignores_rounding():
    # two functions that cancel with weights (1, 1): every row sums to 1 -> dropped; weights (1, 0): kept
    rewards = torch.tensor([[0.1, 0.9], [0.7, 0.3]])
    assert kept_groups(rewards, 2, 0.0).tolist() == [False]
    assert kept_groups(rewards, 2, 0.0, reward_weights=[1.0, 0.0]).tolist() == [True]
    thirds = torch.tensor([[0.1], [0.1], [0.1]])  # the mean is not exactly 0.1 in floating point
    assert kept_groups(thirds, 3, 0.0).tolist() == [False]


def test_choose_groups_kept_first_then_fillers():
    assert choose_groups([[True, False], [False, True]], 2) == ([(0, 0), (1, 1)], 0)
    assert choose_groups([[True, True], [True, True]], 3) == ([(0, 0), (0, 1), (1, 0)], 0)
    assert choose_groups([[False, False], [False, True]], 2) == ([(1, 1), (0, 0)], 1)


def test_another_round_until_every_process_is_full_or_the_cap():
    assert another_round([2, 1], needed=2, extra_rounds=0, max_extra_rounds=3)
    assert not another_round([2, 5], needed=2, extra_rounds=0, max_extra_rounds=3)
    assert not another_round([0, 0], needed=2, extra_rounds=3, max_extra_rounds=3)


def test_refill_chunks_cycle_through_passes_with_their_own_seed():
    plain = [refill_chunk(p, num_rows=7, chunk_prompts=3, shuffle=False, seed=0) for p in range(3)]
    assert plain == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]  # the incomplete last chunk (6) is never drawn
    first_pass = refill_chunk(0, num_rows=7, chunk_prompts=3, shuffle=True, seed=5) + refill_chunk(
        1, num_rows=7, chunk_prompts=3, shuffle=True, seed=5
    )
    assert len(set(first_pass)) == 6  # distinct within a pass
    expected = torch.randperm(7, generator=torch.Generator().manual_seed(6 * 1_000_003)).tolist()[:3]
    assert first_pass[:3] == expected
    with pytest.raises(ValueError, match="at least 4 prompts"):
        refill_chunk(0, num_rows=3, chunk_prompts=4, shuffle=False, seed=0)


def test_refill_stream_gives_each_process_its_slice_and_counts_chunks():
    data = [{"prompt": str(i)} for i in range(8)]
    streams = [
        RefillStream(data, num_generations=2, rows_per_process=4, num_processes=2, process_index=p, shuffle=False)
        for p in range(2)
    ]
    assert [r["prompt"] for r in streams[0].rows()] == ["0", "0", "1", "1"]
    assert [r["prompt"] for r in streams[1].rows()] == ["2", "2", "3", "3"]
    assert [r["prompt"] for r in streams[0].rows()] == ["4", "4", "5", "5"]
    assert streams[0].position == 2
    streams[1].position = 2  # as a resumed run restores it
    assert [r["prompt"] for r in streams[1].rows()] == ["2", "2", "3", "3"]  # pass 2 (no shuffle): chunk 0 again


def rollout(rewards, *, prompt_width, completion_width, tag, processes=1, rank=0):
    """A fake round of len(rewards) rows of this process: prompt ids = tag, completions of `completion_width` tokens
    tag+1 (the last row one shorter), rewards of every process (`processes` copies shifted by 10 per rank)."""
    n = len(rewards)
    completion_mask = torch.ones(n, completion_width, dtype=torch.long)
    completion_mask[-1, -1] = 0
    everyone = torch.tensor([[r + 10 * p] for p in range(processes) for r in rewards], dtype=torch.float32)
    everyone[rank * n : (rank + 1) * n, 0] = torch.tensor(rewards, dtype=torch.float32)
    return Rollout(
        prompt_ids=torch.full((n, prompt_width), tag),
        prompt_mask=torch.ones(n, prompt_width, dtype=torch.long),
        completion_ids=torch.full((n, completion_width), tag + 1) * completion_mask,
        completion_mask=completion_mask,
        advantages=torch.full((n,), 99.0),
        num_items_in_batch=torch.tensor(float(completion_mask.sum())),
        old_logps=torch.full((n, completion_width), -1.0 * tag),
        rewards=everyone,
    )


def sampler(rounds, *, max_extra_rounds=5, scale_rewards="group", warn=None, dist=None):
    """A DynamicSampling whose extra rounds are `rounds` in order (the refill stream's rows are not looked at)."""
    data = [{"prompt": str(i)} for i in range(64)]
    kwargs = {} if dist is None else {"dist": dist}
    refill = RefillStream(data, num_generations=2, rows_per_process=4, shuffle=False)
    ds = DynamicSampling(
        refill,
        RolloutSettings(num_generations=2, scale_rewards=scale_rewards),
        min_reward_std=0.0,
        max_extra_rounds=max_extra_rounds,
        pad_token_id=PAD,
        warn=warn,
        **kwargs,
    )
    pending = list(rounds)
    calls = []

    def generate(rows):
        calls.append(rows)
        return pending.pop(0)

    return ds, generate, calls


def test_fill_keeps_groups_that_differ_and_repads_rounds():
    first = rollout([1.0, 1.0, 0.0, 1.0], prompt_width=2, completion_width=3, tag=10)  # group 0 dropped, 1 kept
    second = rollout([0.0, 0.0, 2.0, 0.0], prompt_width=4, completion_width=5, tag=20)  # group 0 dropped, 1 kept
    ds, generate, calls = sampler([second])
    metrics = {"train": defaultdict(list)}
    out = ds.fill(first, generate, metrics)
    assert len(calls) == 1 and [r["prompt"] for r in calls[0]] == ["0", "0", "1", "1"]  # one extra round
    assert ds.refill.position == 1
    # rows: first's group 1 (rows 2, 3), then second's group 1 (rows 2, 3); prompts left-padded to 4
    assert out.prompt_ids.tolist() == [[PAD, PAD, 10, 10], [PAD, PAD, 10, 10], [20] * 4, [20] * 4]
    assert out.prompt_mask.tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [1] * 4, [1] * 4]
    assert out.completion_ids.tolist() == [[11] * 3 + [PAD] * 2, [11, 11, 0, PAD, PAD], [21] * 5, [21] * 4 + [0]]
    assert out.completion_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1] * 5, [1, 1, 1, 1, 0]]
    assert out.old_logps.tolist() == [[-10.0] * 3 + [0.0] * 2] * 2 + [[-20.0] * 5] * 2
    assert out.tool_mask is None and out.ref_logps is None
    assert out.num_items_in_batch.item() == 3 + 2 + 5 + 4
    # group [0, 1]: mean 0.5, std sqrt(0.5); group [2, 0]: mean 1, std sqrt(2)
    a, b = 0.5 / (math.sqrt(0.5) + EPS), 1.0 / (math.sqrt(2.0) + EPS)
    assert out.advantages.tolist() == pytest.approx([-a, a, b, -b], rel=1e-5)
    assert dict(metrics["train"]) == {
        "dynamic_sampling/rounds": [2.0],
        "dynamic_sampling/groups_kept": [2.0],
        "dynamic_sampling/groups_dropped": [2.0],
        "dynamic_sampling/groups_filled": [0.0],
        "dynamic_sampling/completions_per_kept_sample": [2.0],  # 8 generated for 4 trained on
    }


def test_batch_scaling_uses_the_std_of_the_assembled_batch():
    first = rollout([1.0, 1.0, 0.0, 1.0], prompt_width=2, completion_width=3, tag=10)
    second = rollout([0.0, 0.0, 2.0, 0.0], prompt_width=2, completion_width=3, tag=20)
    ds, generate, _ = sampler([second], scale_rewards="batch")
    out = ds.fill(first, generate)
    # rewards trained on: 0, 1, 2, 0 -> mean 0.75, Bessel std sqrt(2.75 / 3); centring per group
    std = math.sqrt(2.75 / 3)
    assert out.advantages.tolist() == pytest.approx([x / (std + EPS) for x in (-0.5, 0.5, 1.0, -1.0)], rel=1e-5)


def test_no_extra_round_when_the_first_is_full():
    first = rollout([0.0, 1.0, 0.0, 1.0], prompt_width=2, completion_width=3, tag=10)
    ds, generate, calls = sampler([])
    out = ds.fill(first, generate)
    assert calls == [] and ds.refill.position == 0
    assert out.prompt_ids.tolist() == first.prompt_ids.tolist()


def test_cap_fills_with_dropped_groups_at_advantage_zero_and_warns():
    first = rollout([1.0, 1.0, 0.0, 0.0], prompt_width=2, completion_width=3, tag=10)  # both dropped
    second = rollout([3.0, 3.0, 0.0, 1.0], prompt_width=2, completion_width=3, tag=20)  # group 1 kept
    warnings = []
    ds, generate, calls = sampler([second], max_extra_rounds=1, warn=warnings.append)
    metrics = {"train": defaultdict(list)}
    out = ds.fill(first, generate, metrics)
    assert len(calls) == 1
    # second's group 1, then the first dropped group (first's group 0) as filler
    assert out.prompt_ids[:, -1].tolist() == [20, 20, 10, 10]
    a = 0.5 / (math.sqrt(0.5) + EPS)
    assert out.advantages.tolist() == pytest.approx([-a, a, 0.0, 0.0], rel=1e-5)
    assert warnings == [
        "warning: dynamic sampling: after 1 extra generation rounds (dynamic_sampling_max_rounds) only 1 of 2 groups "
        "have reward std > 0.0; the batch is filled with 1 dropped groups at advantage 0"
    ]
    assert metrics["train"]["dynamic_sampling/groups_filled"] == [1.0]
    assert metrics["train"]["dynamic_sampling/groups_dropped"] == [3.0]
    assert metrics["train"]["dynamic_sampling/completions_per_kept_sample"] == [4.0]  # 8 generated, 2 kept


class ThreadCollective:
    """Two 'processes' as threads exchanging through a barrier: gather concatenates in process order."""

    def __init__(self, shared, rank):
        self.shared, self.process_index, self.num_processes = shared, rank, 2

    def _exchange(self, value):
        slots, barrier = self.shared
        slots[self.process_index] = value
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out

    def gather(self, tensor):
        return torch.cat(self._exchange(tensor))

    def sum(self, tensor):
        return sum(self._exchange(tensor))

    def gather_object(self, items):
        return [x for part in self._exchange(list(items)) for x in part]


def test_processes_agree_on_the_number_of_rounds():
    # process 0 is full after its first round; process 1 needs two extra rounds: both must run three rounds.
    shared = ([None, None], threading.Barrier(2, timeout=20))
    plans = {
        0: [[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [5.0, 6.0, 5.0, 5.0]],
        1: [[1.0, 1.0, 1.0, 1.0], [2.0, 3.0, 4.0, 4.0], [7.0, 7.0, 0.0, 2.0]],
    }
    results, errors = {}, []

    def work(rank):
        try:
            rounds = [
                rollout(r, prompt_width=2, completion_width=3, tag=10 * (i + 1), processes=2, rank=rank)
                for i, r in enumerate(plans[rank])
            ]
            ds, generate, calls = sampler(rounds[1:], dist=ThreadCollective(shared, rank))
            metrics = {"train": defaultdict(list)}
            out = ds.fill(rounds[0], generate, metrics)
            results[rank] = (len(calls), out, dict(metrics["train"]))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert results[0][0] == results[1][0] == 2
    # process 0 keeps its first round's two groups; process 1 round 2's group 0 and round 3's group 1
    assert results[0][1].prompt_ids[:, 0].tolist() == [10, 10, 10, 10]
    assert results[1][1].prompt_ids[:, 0].tolist() == [20, 20, 30, 30]
    for rank in range(2):
        assert results[rank][2]["dynamic_sampling/rounds"] == [3.0]
        assert results[rank][2]["dynamic_sampling/groups_kept"] == [4.0]
        # dropped: process 0: round 2's two groups and round 3's group 1; process 1: round 1's two, round 2's
        # group 1 and round 3's group 0
        assert results[rank][2]["dynamic_sampling/groups_dropped"] == [7.0]
        assert results[rank][2]["dynamic_sampling/completions_per_kept_sample"] == [24 / 8]
    # advantages over both processes' assembled rows, per group: [0, 1] twice on 0, [2, 3] and [0, 2] on 1
    a = 0.5 / (math.sqrt(0.5) + EPS)
    c = 1.0 / (math.sqrt(2.0) + EPS)
    assert results[0][1].advantages.tolist() == pytest.approx([-a, a, -a, a], rel=1e-5)
    assert results[1][1].advantages.tolist() == pytest.approx([-a, a, -c, c], rel=1e-5)


def test_assembly_keeps_each_rows_vision_inputs():
    from grpokit.vision import VisionRows

    first = rollout([1.0, 1.0, 0.0, 1.0], prompt_width=2, completion_width=3, tag=10)
    second = rollout([0.0, 1.0, 2.0, 2.0], prompt_width=2, completion_width=3, tag=20)
    first.vision = VisionRows([{"pixel_values": ("image", torch.full((1,), float(i)))} for i in range(4)])
    second.vision = VisionRows([{} for _ in range(4)], engine_prompts=[f"e{i}" for i in range(4)])
    ds, generate, _ = sampler([second])
    out = ds.fill(first, generate)
    # first's group 1 (rows 2, 3: images 2.0 and 3.0), then second's group 0 (rows 0, 1: text only)
    assert [row["pixel_values"][1].item() if row else None for row in out.vision.rows] == [2.0, 3.0, None, None]
    assert out.vision.engine_prompts == [None, None, "e0", "e1"]
