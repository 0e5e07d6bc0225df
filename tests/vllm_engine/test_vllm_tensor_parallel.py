"""vllm_tensor_parallel_size=2 under two CPU training processes (accelerate, gloo): one vLLM engine sharded over
both, prompts gathered within the group, each rank keeping its own share."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm.distributed.weight_transfer")

WORKER = os.path.join(os.path.dirname(__file__), "_tp_worker.py")


def test_tensor_parallel_two_processes(tmp_path):
    from grpokit.demo import prepare_demo

    model_dir, _ = prepare_demo(str(tmp_path / "demo"))
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", ACCELERATE_USE_CPU="true")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port"]
    command += ["0", WORKER, model_dir, str(tmp_path / "out")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.load(open(tmp_path / "out" / f"rank{r}.json")) for r in (0, 1)]
    for record in records:
        # what we really got: two processes over gloo, not one process that ignored --num_processes
        assert record["distributed_type"] == "DistributedType.MULTI_CPU"
        assert record["num_processes"] == 2 and record["world_size"] == 2
        assert len(record["rewards"]) == 3
        # each rank's completions are its own prompts' (uneven shares: 1 and 2 prompts), as transformers decodes them
        assert record["completions"] == record["expected"]
    assert len(records[0]["completions"]) == 1 and len(records[1]["completions"]) == 2
    # The group's two engines sampled the same tokens at every call (3 rounds at temperature 1, then greedy), from a
    # random state of the group's own: the processes' own states differ (the trainer seeds each process apart).
    assert len(records[0]["engine_calls"]) == 4 and len(records[0]["engine_calls"][0]) == 16
    assert records[0]["engine_calls"] == records[1]["engine_calls"]
    assert all(a != b for a, b in zip(records[0]["process_states"], records[1]["process_states"], strict=True))
