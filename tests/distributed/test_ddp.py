"""Real CPU processes under accelerate's launcher (DDP over gloo): what each run really got, and that DDP trains what
one process trains on the same global batch (with `beta > 0`, `ignore_bias_buffers`, deterministic completions)."""

import json
import os
import socket
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(__file__), "_ddp_worker.py")
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env.update(HF_HUB_OFFLINE="1", ACCELERATE_USE_CPU="true")
    return env


def launch(*launcher_args: str) -> list[str]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", *launcher_args]
    return command + ["--mixed_precision", "no", "--dynamo_backend", "no"]


def max_diff(a, b) -> float:
    return max(abs(x - y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process with the whole global batch (16 completions); its final weights and the initial ones."""
    work = tmp_path_factory.mktemp("single")
    result = subprocess.run(
        [sys.executable, WORKER, str(work), "16"], env=environment(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.load(open(work / "rank0.json"))
    assert record["num_processes"] == 1 and record["distributed_type"] == "DistributedType.NO"
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(work / "initial_model")
    record["initial"] = [p.detach().flatten().tolist() for p in initial.parameters()]
    return record


def check_ranks(works, single, label: str) -> None:
    ranks = [
        json.load(open(next(w / f"rank{r}.json" for w in works if (w / f"rank{r}.json").exists()))) for r in (0, 1)
    ]
    for record in ranks:
        # what we really got: two processes in one gloo group, the model wrapped in DDP
        assert record["distributed_type"] == "DistributedType.MULTI_CPU"
        assert record["num_processes"] == 2 and record["world_size"] == 2
        assert record["wrapper"] == "DistributedDataParallel"
        assert record["ignored"] == ["model.layers.0.flag"]
        assert "model.layers.0.flag" in record["ddp_ignores"]  # DDP really skips the boolean buffer
        assert record["steps"] == 3
    assert ranks[0]["weights"] == ranks[1]["weights"]  # gradients all-reduced: the ranks never drift apart
    diff, moved = max_diff(single["weights"], ranks[0]["weights"]), max_diff(single["weights"], single["initial"])
    print(f"\n{label} vs 1 process: max weight difference {diff:.2e} (weights moved up to {moved:.2e})")
    assert moved > 1e-4 and diff < 1e-5, (moved, diff)


def test_ddp_two_cpu_processes(tmp_path, single):
    command = launch("--num_processes", "2", "--num_machines", "1", "--main_process_port", "0")
    result = subprocess.run(
        [*command, WORKER, str(tmp_path), "8"], env=environment(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    check_ranks([tmp_path], single, "DDP, 2 processes")


def test_ddp_two_nodes_over_loopback(tmp_path, single):
    """Two launches as two machines (one process each) meeting at 127.0.0.1. They share a folder, as nodes share a
    file system; the model is written before they start (saving writes weights on global rank 0 only)."""
    from grpokit.demo import prepare_demo

    port = str(free_port())
    prepare_demo(str(tmp_path), rows=64)
    works = [tmp_path, tmp_path]
    nodes = []
    for rank in (0, 1):
        command = launch("--num_processes", "2", "--num_machines", "2", "--machine_rank", str(rank))
        command += ["--main_process_ip", "127.0.0.1", "--main_process_port", port, WORKER, str(works[rank]), "8"]
        nodes.append(
            subprocess.Popen(command, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    try:
        outputs = [node.communicate(timeout=600) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr[-3000:]
    check_ranks(works, single, "DDP, 2 nodes")
