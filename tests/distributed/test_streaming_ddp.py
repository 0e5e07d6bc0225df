"""A streaming train set on a real 2-process CPU (gloo) run: each process reads its own part of the stream and forms
whole groups from it, or, when a group would span the processes, reads it all and keeps its slice of each generation
batch (what RepeatSampler and accelerate's batch sharding give a map-style set)."""

import json
import os

import pytest
from _launch import launch_two_cpu_processes

WORKER = os.path.join(os.path.dirname(__file__), "_stream_worker.py")


def pairs(*names):
    return [name for name in names for _ in range(2)]


@pytest.mark.parametrize(
    ("rows", "shards", "expected"),
    [
        # 4 rows a process = 2 whole groups. One file-shard: split_dataset_by_node gives every other row (p0 p2 p4 p6
        # p8 / p1 p3 p5 p7 p9), 2 prompts a round, the fifth left out of each pass, pass 1 starting again.
        (4, 1, {0: [pairs("p0", "p2"), pairs("p4", "p6"), pairs("p0", "p2")],
                1: [pairs("p1", "p3"), pairs("p5", "p7"), pairs("p1", "p3")]}),
        # Two file-shards: each process reads one file only (p0..p4 / p5..p9).
        (4, 2, {0: [pairs("p0", "p1"), pairs("p2", "p3"), pairs("p0", "p1")],
                1: [pairs("p5", "p6"), pairs("p7", "p8"), pairs("p5", "p6")]}),
        # 3 rows a process: the generation batch p0 p0 p1 p1 p2 p2 is cut p0 p0 p1 | p1 p2 p2 (all read the stream).
        (3, 1, {0: [["p0", "p0", "p1"], ["p3", "p3", "p4"], ["p6", "p6", "p7"]],
                1: [["p1", "p2", "p2"], ["p4", "p5", "p5"], ["p7", "p8", "p8"]]}),
    ],
)  # fmt: skip
def test_each_process_reads_its_part_of_the_stream(tmp_path, rows, shards, expected):
    result = launch_two_cpu_processes(WORKER, str(rows), str(shards), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = {rank: json.loads((tmp_path / f"stream-rank{rank}.json").read_text()) for rank in (0, 1)}
    assert seen == expected
