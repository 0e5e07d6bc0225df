"""Shared by the 2-process grpokit-train tests of this folder: a tiny model, prompts and a recipe in a folder, and
`accelerate launch` of a worker script on 2 CPU processes (gloo)."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(__file__)
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def write_recipe(folder, reward: str, **overrides) -> str:
    """A tiny model, 8 prompts and a recipe training it with `reward` (a dotted name the worker can import); the
    recipe's path."""
    from grpokit.tiny import save_tiny

    rows = [{"prompt": f"{i}+{i}="} for i in range(8)]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {
        "model_name_or_path": str(save_tiny(folder / "tiny")),
        "dataset_name": str(folder / "data.jsonl"),
        "reward_funcs": [reward],
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "max_completion_length": 8,
        "logging_steps": 1,
        "gradient_checkpointing": False,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "output_dir": str(folder / "run"),
        **overrides,
    }
    path = folder / "recipe.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in recipe.items()))
    return str(path)


def two_cpu_processes(worker: str, *args: str) -> tuple[list[str], dict]:
    """The command and environment of `accelerate launch --multi_gpu` of `worker` on 2 CPU processes, this folder
    importable (the workers' rewards)."""
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
    command += ["--dynamo_backend", "no", worker, *args]
    return command, env


def launch_two_cpu_processes(worker: str, *args: str, cwd, timeout: float) -> subprocess.CompletedProcess:
    """Run `two_cpu_processes(worker, *args)` to the end."""
    command, env = two_cpu_processes(worker, *args)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
