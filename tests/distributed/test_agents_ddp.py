"""Tool calling across 2 real DDP processes (CPU, gloo) with an `environment_factory`: rank 0 calls tools (two tool
rounds per step), rank 1 none, so the tool loop must keep both processes in the same rounds (rank 1 generating
throwaway turns) instead of deadlocking in its collectives; the tool metrics and the environments' reward count every
process's rollouts. A deadlock fails the test at the launch's timeout (the launcher's whole process group is killed).
"""

import json
import os
import signal
import subprocess

import pytest
from _launch import HERE, two_cpu_processes

WORKER = os.path.join(HERE, "_agents_worker.py")
TIMEOUT_S = 300


def _launch(work) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu` of the worker on 2 CPU processes, in its own process group so that a hang
    kills every process of it."""
    command, env = two_cpu_processes(WORKER, str(work))
    proc = subprocess.Popen(
        command, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the 2-process run did not finish in {TIMEOUT_S}s (a deadlock?):\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


def test_tool_rounds_stay_in_step_across_processes(tmp_path):
    result = _launch(tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:  # really two DDP processes, not two lone ones
        assert rank["distributed_type"] == "DistributedType.MULTI_CPU"
        assert rank["num_processes"] == 2 and rank["world_size"] == 2
        assert rank["steps"] == 2
        assert rank["reward_func_names"] == ["Counter"]

    # Rank 0, per step: 4 first turns calling bump(3), then rollout 0 calls bump(4) once more.
    assert ranks[0]["calls"] == [3, 3, 3, 3, 4] * 2
    assert ranks[1]["calls"] == []
    # Per step, each rank generates 3 times: the first turn, then one turn per tool round of rank 0 (2 rounds).
    assert ranks[0]["generate_sizes"] == [4, 4, 1] * 2
    assert ranks[0]["tool_turns"] == [[0, 0, 0, 0], [1, 1, 1, 1], [2]] * 2
    # rank 1 has nothing pending: a throwaway turn (one row, the first prompt: no tool turn in it) in each round
    assert ranks[1]["generate_sizes"] == [4, 1, 1] * 2
    assert ranks[1]["tool_turns"] == [[0, 0, 0, 0], [0], [0]] * 2

    last0, last1 = ranks[0]["last_batch"], ranks[1]["last_batch"]
    assert last0["calls_per_rollout"] == [2, 1, 1, 1] and last0["totals"] == [7, 3, 3, 3]
    assert last0["roles"][0] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert all(r == ["assistant", "tool", "assistant"] for r in last0["roles"][1:])
    assert all(n > 0 for n in last0["tool_mask_zeros"])
    assert last1["calls_per_rollout"] == [0] * 4 and last1["totals"] == [0] * 4
    assert last1["tool_mask_zeros"] == [0] * 4 and all(r == ["assistant"] for r in last1["roles"])

    # The metrics are over both processes' 8 rollouts: 5 calls (rank 0) / 8; rewards 10 * calls + total:
    # rank 0 [27, 13, 13, 13], rank 1 [0, 0, 0, 0].
    logs = ranks[0]["logs"]
    assert len(logs) == 2
    for row in logs:
        assert row["tools/call_frequency"] == pytest.approx(5 / 8)
        assert row["tools/failure_frequency"] == 0.0
        assert row["rewards/Counter/mean"] == pytest.approx((27 + 13 * 3) / 8)
    if ranks[1]["logs"]:  # every process logs the same (gathered) values
        assert [r["tools/call_frequency"] for r in ranks[1]["logs"]] == [r["tools/call_frequency"] for r in logs]
