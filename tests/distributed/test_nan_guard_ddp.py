"""The NaN guard decides the same on every process: a loss that is NaN on one process only, with finite gradients
(so the all-reduced gradient norm is finite), skips the step on both processes of a real 2-process CPU (gloo) run, and
the two replicas stay identical."""

import json
import os

from _launch import launch_two_cpu_processes, write_recipe

WORKER = os.path.join(os.path.dirname(__file__), "_nan_guard_worker.py")


def test_a_nan_loss_on_one_process_skips_the_step_on_every_process(tmp_path):
    recipe = write_recipe(tmp_path, "_nan_guard_worker.length_reward", max_steps=3, learning_rate=1.0e-2)
    result = launch_two_cpu_processes(WORKER, recipe, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    ranks = [json.loads((tmp_path / f"result-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["weights"] != ranks[0]["initial"]  # steps 1 and 3 trained
    assert ranks[0]["weights"] == ranks[1]["weights"]  # the replicas did not diverge
    assert [r["adam_steps"] for r in ranks] == [2, 2]  # steps 1 and 3 applied, step 2 skipped on both
    assert ranks[0]["skipped"] == {"1": 0, "2": 1, "3": 0}
    warnings = [line for line in result.stderr.splitlines() if "optimizer step skipped" in line]
    assert len(warnings) == 1 and "step 2: non-finite loss;" in warnings[0], result.stderr[-3000:]
