"""A vision-language model on a real 2-process CPU (gloo) run where, every step, one process's batch has no image:
its vision tower gets no gradient, which DDP allows only when it looks for unused parameters (set for vision models,
as TRL does). Both processes finish and hold the same weights."""

import json
import os

from _launch import launch_two_cpu_processes

WORKER = os.path.join(os.path.dirname(__file__), "_vision_worker.py")


def test_a_process_without_images_does_not_stop_ddp(tmp_path):
    result = launch_two_cpu_processes(WORKER, cwd=tmp_path, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"vision-rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert rank["type"] == "DistributedType.MULTI_CPU" and rank["processes"] == 2
        assert rank["steps"] == 2 and rank["find_unused"] is True
    # each step, one process scored the image prompt and the other the text one
    assert [a != b for a, b in zip(ranks[0]["had_images"], ranks[1]["had_images"], strict=True)] == [True, True]
    assert abs(ranks[0]["checksum"] - ranks[1]["checksum"]) < 1e-9
