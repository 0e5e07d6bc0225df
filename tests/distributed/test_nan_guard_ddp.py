"""The NaN guard decides the same on every process: a loss that is NaN on one process only, with finite gradients
(so the all-reduced gradient norm is finite), skips the step on both processes of a real 2-process CPU (gloo) run, and
the two replicas stay identical."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(__file__)
WORKER = os.path.join(HERE, "_nan_guard_worker.py")
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def test_a_nan_loss_on_one_process_skips_the_step_on_every_process(tmp_path):
    from grpokit.tiny import save_tiny

    rows = [{"prompt": f"{i}+{i}="} for i in range(8)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {
        "model_name_or_path": str(save_tiny(tmp_path / "tiny")),
        "dataset_name": str(tmp_path / "data.jsonl"),
        "reward_funcs": ["_nan_guard_worker.length_reward"],
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "max_completion_length": 8,
        "max_steps": 3,
        "learning_rate": 1.0e-2,
        "logging_steps": 1,
        "gradient_checkpointing": False,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "recipe.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in recipe.items()))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES and not k.startswith("ACCELERATE_")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        ACCELERATE_USE_CPU="true",
        PYTHONPATH=os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")])),  # the worker's reward
    )
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--main_process_port", "0", "--mixed_precision", "no"]
    command += ["--dynamo_backend", "no", WORKER, str(tmp_path / "recipe.yaml")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    ranks = [json.loads((tmp_path / f"result-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["weights"] != ranks[0]["initial"]  # steps 1 and 3 trained
    assert ranks[0]["weights"] == ranks[1]["weights"]  # the replicas did not diverge
    assert [r["adam_steps"] for r in ranks] == [2, 2]  # steps 1 and 3 applied, step 2 skipped on both
    assert ranks[0]["skipped"] == {"1": 0, "2": 1, "3": 0}
    warnings = [line for line in result.stderr.splitlines() if "optimizer step skipped" in line]
    assert len(warnings) == 1 and "step 2: non-finite loss;" in warnings[0], result.stderr[-3000:]
