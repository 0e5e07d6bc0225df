"""Resuming an asynchronous run killed with SIGKILL: each prompt of each epoch is trained exactly once over the two
processes' lives, the step count is the uninterrupted run's (no epoch overrun), and the policy version continues.
Samples in flight at the kill (queued or being generated, never trained) are generated again after the resume."""

import json
import os
import signal
import subprocess
import sys

RUNNER = os.path.join(os.path.dirname(__file__), "_async_resume_run.py")
PROMPTS = ["ab", "cde", "fghi", "jk", "lmnop", "qr", "stu", "vwxyz"]


def run(tmp_path, name, spec):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, RUNNER, str(path)], capture_output=True, text=True, env=env, timeout=600)


def test_a_killed_run_resumes_each_prompt_once_without_overrun(tmp_path, tiny_model_dir):
    trained = tmp_path / "trained.jsonl"
    args = dict(
        per_device_train_batch_size=4,  # two prompts (groups of 2) per step: 4 steps an epoch
        num_generations=2,
        num_train_epochs=2,
        max_completion_length=6,
        max_staleness=2,  # the worker runs up to two batches ahead: some are in flight at the kill
        save_strategy="steps",
        save_steps=3,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        use_vllm=False,
        shuffle_dataset=False,
        seed=0,
    )
    spec = {"model": str(tiny_model_dir), "output_dir": str(tmp_path / "out"), "args": args, "trained": str(trained)}
    killed = run(tmp_path, "first", {**spec, "kill_after_step": 5})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    checkpoint = tmp_path / "out" / "checkpoint-3"
    state = json.loads((checkpoint / "async_rollout_state.json").read_text())
    assert state == {"model_version": 4, "prompts": {"epoch": 0, "trained": {"0": [0, 1, 2, 3, 4, 5]}}}
    first = [json.loads(line) for line in trained.read_text().splitlines()]
    assert [row["step"] for row in first] == [1, 2, 3, 4, 5]

    resumed = run(tmp_path, "resumed", {**spec, "resume": str(checkpoint)})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (tmp_path / "out" / "final_step.txt").read_text() == "8"
    rows = [json.loads(line) for line in trained.read_text().splitlines()][len(first) :]
    assert [row["step"] for row in rows] == [4, 5, 6, 7, 8]
    kept = first[:3] + rows  # steps 4 and 5 of the first life were lost with it
    groups = [prompt for row in kept for prompt in row["prompts"][::2]]
    assert all(row["prompts"][0::2] == row["prompts"][1::2] for row in kept)  # whole groups of 2
    assert groups == PROMPTS + PROMPTS
