"""Two real CPU processes under accelerate's launcher (DDP over gloo): what the run really got, and that DDP kept the
ranks' weights identical (with `beta > 0` and `ignore_bias_buffers`)."""

import json
import os
import subprocess
import sys

WORKER = os.path.join(os.path.dirname(__file__), "_ddp_worker.py")


def test_ddp_two_cpu_processes(tmp_path):
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env.update(HF_HUB_OFFLINE="1", ACCELERATE_USE_CPU="true")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port"]
    command += ["0", WORKER, str(tmp_path)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    for record in ranks:
        # what we really got: two processes in one gloo group, the model wrapped in DDP
        assert record["distributed_type"] == "DistributedType.MULTI_CPU"
        assert record["num_processes"] == 2 and record["world_size"] == 2
        assert record["wrapper"] == "DistributedDataParallel"
        assert record["ignored"] == ["model.layers.0.flag"]
        assert "model.layers.0.flag" in record["ddp_ignores"]  # DDP really skips the boolean buffer
        assert record["steps"] == 3
    assert ranks[0]["weights"] == ranks[1]["weights"]  # gradients all-reduced: the ranks never drift apart
