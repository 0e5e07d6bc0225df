"""A reward that raises, or hangs past reward_timeout, on one process of a real 2-process CPU (gloo) run stops every
process with the message: no process is left waiting in a collective, each exits non-zero, and process 0 (which saves
the weights) names the reward function."""

import json
import os
import subprocess
import sys
import time

import pytest

import grpokit

HERE = os.path.dirname(__file__)
WORKER = os.path.join(HERE, "_reward_fault_worker.py")
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def launch(tmp_path, reward: str, **overrides) -> tuple[subprocess.CompletedProcess, float]:
    from grpokit.tiny import save_tiny

    rows = [{"prompt": f"{i}+{i}="} for i in range(8)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {
        "model_name_or_path": save_tiny(tmp_path / "tiny"),
        "dataset_name": str(tmp_path / "data.jsonl"),
        "reward_funcs": [f"_reward_fault_worker.{reward}"],
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "max_completion_length": 8,
        "max_steps": 2,
        "logging_steps": 1,
        "gradient_checkpointing": False,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "output_dir": str(tmp_path / "run"),
        **overrides,
    }
    (tmp_path / "recipe.yaml").write_text(
        "".join(f"{k}: {json.dumps(str(v) if k.endswith('path') else v)}\n" for k, v in recipe.items())
    )
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES and not k.startswith("ACCELERATE_")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        ACCELERATE_USE_CPU="true",
        PYTHONPATH=os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")])),
    )
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--main_process_port", "0", "--mixed_precision", "no"]
    command += ["--dynamo_backend", "no", WORKER, str(tmp_path / "recipe.yaml")]
    start = time.monotonic()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
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
    saved = tmp_path / "run" / "interrupted-step-0"
    # Process 0 reports process 1's failure; process 1 its own.
    assert f"error: {message}" in "\n".join(lines), result.stderr[-3000:]
    (on_0,) = [line for line in lines if "(on process 1 of 2)" in line]
    assert on_0.startswith(f"error: {message}") and on_0.endswith(f"(weights at step 0 saved to {saved})")
    assert len(lines) == 2, lines
    assert (saved / "model.safetensors").is_file()
    # The only traceback is the launcher's own report of a non-zero exit; none comes from grpokit or the worker.
    assert f'File "{os.path.dirname(grpokit.__file__)}' not in result.stderr and f'File "{WORKER}' not in result.stderr
