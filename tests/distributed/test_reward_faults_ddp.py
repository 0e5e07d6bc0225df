"""A reward that raises, or hangs past reward_timeout, on one process of a real 2-process CPU (gloo) run stops every
process with the message: no process is left waiting in a collective, each exits non-zero, and process 0 (which saves
the weights) names the reward function."""

import os
import subprocess
import time

import pytest
from _launch import launch_two_cpu_processes, write_recipe

import grpokit

WORKER = os.path.join(os.path.dirname(__file__), "_reward_fault_worker.py")


def launch(tmp_path, reward: str, **overrides) -> tuple[subprocess.CompletedProcess, float]:
    recipe = write_recipe(tmp_path, f"_reward_fault_worker.{reward}", max_steps=2, **overrides)
    start = time.monotonic()
    result = launch_two_cpu_processes(WORKER, recipe, cwd=tmp_path, timeout=120)
    return result, time.monotonic() - start


@pytest.mark.parametrize(
    "reward, overrides, message",
    [
        (
            "fails_on_rank_1",
            {},
            "reward function 'fails_on_rank_1' raised ValueError: rank 1 cannot score this on sample 0",
        ),
        (
            "hangs_on_rank_1",
            {"reward_timeout": 2},
            "reward function 'hangs_on_rank_1' did not return within 2.0 s (reward_timeout) on a batch of 2 completions",
        ),
    ],
)
def test_a_reward_failing_on_one_process_stops_every_process(tmp_path, reward, overrides, message):
    result, seconds = launch(tmp_path, reward, **overrides)
    assert result.returncode != 0
    assert seconds < 60, seconds
    exits = {rank: (tmp_path / f"exit-rank{rank}.txt").read_text() for rank in (0, 1)}
    assert exits == {0: "1", 1: "1"}, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    step = 1 if reward == "fails_on_rank_1" else 0  # the raising reward fails from the second round on
    saved = tmp_path / "run" / f"interrupted-step-{step}"
    # Process 0 reports process 1's failure; process 1 its own. Only process 0, which wrote, says where. Both write
    # to one pipe, so one's line can land in the middle of the other's: the stream is searched, not split in lines.
    assert f"error: {message}" in "\n".join(lines), result.stderr[-3000:]
    assert result.stderr.count("(on process 1 of 2)") == 1, result.stderr[-3000:]
    assert result.stderr.count("saved to") == (1 if step else 0), result.stderr[-3000:]
    if step:
        assert f"(weights at step 1 saved to {saved})" in result.stderr, result.stderr[-3000:]
        assert (saved / "model.safetensors").is_file()
    else:  # nothing was trained: nothing is saved
        assert result.stderr.count("(no step was trained: nothing saved)") == 2, result.stderr[-3000:]
        assert not saved.exists()
    # Exactly two error messages. Counted in the whole stream: both processes write to one pipe, and a line written
    # while the other process writes can land mid-line (seen once in CI).
    assert result.stderr.count("error: ") == 2, lines
    # The only traceback is the launcher's own report of a non-zero exit; none comes from grpokit or the worker.
    assert f'File "{os.path.dirname(grpokit.__file__)}' not in result.stderr and f'File "{WORKER}' not in result.stderr
