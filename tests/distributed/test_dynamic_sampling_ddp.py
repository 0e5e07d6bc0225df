"""Dynamic sampling on a real 2-process CPU (gloo) run: the processes agree on how many rounds each step generates
(a process already full keeps generating while the other is short, so no one waits forever), each trains only on its
groups whose rewards differ, and both log the same counts over both processes (worked out by hand below)."""

import json
import os

from _launch import launch_two_cpu_processes

WORKER = os.path.join(os.path.dirname(__file__), "_dynamic_worker.py")


def rounds(*prompts):
    return [[p, p] for p in prompts]


def test_two_processes_agree_on_rounds_and_keep_only_groups_that_differ(tmp_path):
    result = launch_two_cpu_processes(WORKER, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = {rank: json.loads((tmp_path / f"dynamic-rank{rank}.json").read_text()) for rank in (0, 1)}
    for rank in (0, 1):
        assert seen[rank]["distributed_type"] == "DistributedType.MULTI_CPU"
        assert seen[rank]["num_processes"] == 2 and seen[rank]["world_size_env"] == "2"
    # Unshuffled. Step 1: the dataloader's round p0 | p1, then refill chunks p0 | p1, p2 | p3, p4 | p5 (process 0
    # has its first kept group, p4, only in the fourth round; process 1 kept p1 at once and generates along).
    # Step 2: the dataloader's p2 | p3, then refill chunks p6 | p7, p0 | p1 (the refill's second pass), p2 | p3,
    # p4 | p5. GOOD prompts: p1, p4, p7.
    assert seen[0]["rounds"] == rounds("p0", "p0", "p2", "p4") + rounds("p2", "p6", "p0", "p2", "p4")
    assert seen[1]["rounds"] == rounds("p1", "p1", "p3", "p5") + rounds("p3", "p7", "p1", "p3", "p5")
    assert seen[0]["trained"] == [["p4", "p4"], ["p4", "p4"]]
    assert seen[1]["trained"] == [["p1", "p1"], ["p7", "p7"]]
    # groups dropped, step 1: p0, p0, p2 (process 0) + p3, p5 (process 1); step 2: p2, p6, p0, p2 + p3, p3, p5.
    # completions per kept sample: rounds x 2 processes x 2 completions / 4 kept completions = rounds
    expected = [
        {"rounds": 4.0, "groups_kept": 2.0, "groups_dropped": 5.0, "groups_filled": 0.0, "completions_per_kept_sample": 4.0},
        {"rounds": 5.0, "groups_kept": 2.0, "groups_dropped": 7.0, "groups_filled": 0.0, "completions_per_kept_sample": 5.0},
    ]  # fmt: skip
    for rank in (0, 1):
        got = [{k.removeprefix("dynamic_sampling/"): v for k, v in row.items()} for row in seen[rank]["logged"]]
        assert got == expected
