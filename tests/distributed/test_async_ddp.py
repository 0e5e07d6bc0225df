"""AsyncGRPOTrainer on 2 real processes (CPU, gloo), under DDP, DeepSpeed ZeRO-2, ZeRO-3 (every parameter really
partitioned) and FSDP2 (through the test-only shim): the worker thread runs on rank 0 only, each generation batch is
shared out (each process trains its own half), the weights stay identical, staleness stays within its bound; sharded,
at staleness 0, the worker's copy gets the gathered weights at every sync (importance ratios 1)."""

import json
import subprocess

import pytest
from _launch import HERE, two_cpu_processes

WORKER = f"{HERE}/_async_worker.py"
ENGINES = {
    "ddp": ([], "DistributedType.MULTI_CPU", "DistributedDataParallel"),
    "zero2": (["--use_deepspeed", "--zero_stage", "2"], "DistributedType.DEEPSPEED", "DeepSpeedEngine"),
    "zero3": (["--use_deepspeed", "--deepspeed_config_file"], "DistributedType.DEEPSPEED", "DeepSpeedEngine"),
    "fsdp2": (
        ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"],
        "DistributedType.FSDP",
        "FSDPQwen2ForCausalLM",
    ),
}
# ZeRO-3 keeps parameters below a size threshold whole; at 0 every parameter of the tiny model is partitioned.
ZERO3_CONFIG = {
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_two_processes_train_their_halves_of_each_batch(tmp_path, engine):
    flags, kind, wrapper = ENGINES[engine]
    if engine == "zero3":
        (tmp_path / "ds.json").write_text(json.dumps(ZERO3_CONFIG))
        flags = [*flags, str(tmp_path / "ds.json")]
    sharded = engine in ("zero3", "fsdp2")
    staleness = 0 if sharded else 1
    command, env = two_cpu_processes(WORKER, str(tmp_path), str(staleness))
    if engine.startswith("zero"):  # DeepSpeed must not be told "cpu" (accelerate would drop it for DDP): gloo
        env.pop("ACCELERATE_USE_CPU")
    if flags:
        command = [c for c in command if c != "--multi_gpu"]
        command[3:3] = flags
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert rank["distributed_type"] == kind and rank["wrapper"] == wrapper
        assert rank["partitioned"] == sharded
        assert rank["num_processes"] == 2
        assert rank["steps"] == 3 and len(rank["slices"]) == 3
        assert all(s["rows"] == 2 for s in rank["slices"])  # half of each 4-sample batch
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # DDP kept the replicas equal
    for step in range(3):
        first, second = ranks[0]["slices"][step], ranks[1]["slices"][step]
        assert first["batch"] == second["batch"]  # both saw the same broadcast batch
        # rank 0 trains the first group (2 samples of one prompt), rank 1 the second
        assert first["batch"][0] == first["batch"][1] != first["batch"][2] == first["batch"][3]
        half = len(first["tokens"]) // 2
        assert first["tokens"][:half] == first["tokens"][half:]  # one prompt, twice
        other = len(second["tokens"]) // 2
        assert second["tokens"][:other] == second["tokens"][other:] != first["tokens"][:half]
    prompts = [p for step in ranks[0]["slices"] for p in step["batch"][::2]]
    assert prompts == ["ab", "cde", "fghi", "jk", "lmnop", "qr"]
    assert ranks[0]["model_version"] == 4  # the first sync, then one per step
    assert all(row["sample/staleness_max"] <= staleness for row in ranks[0]["logs"])
    if staleness == 0:  # the copy holds the trained weights at every step, gathered from both ranks' partitions
        for row in ranks[0]["logs"]:
            assert abs(row["sampling/importance_sampling_ratio/min"] - 1) < 1e-4
            assert abs(row["sampling/importance_sampling_ratio/max"] - 1) < 1e-4


def test_environments_with_two_processes(tmp_path):
    """environment_factory under DDP: rank 0's worker runs the environments of every row of a generation batch (both
    processes' halves: 4 rows, 4 instances, the factory's probe one of them, pooled across steps), rank 1 only its
    probe; the environments' rewards (rows
    0..3 add 1..4: mean 2.5) reach both ranks' batches; the worker's tool metrics are the main process's."""
    command, env = two_cpu_processes(f"{HERE}/_async_env_worker.py", str(tmp_path))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert rank["distributed_type"] == "DistributedType.MULTI_CPU" and rank["num_processes"] == 2
        assert rank["steps"] == 2
        assert [row["rewards/Counter/mean"] for row in rank["logs"]] == [2.5, 2.5]
    assert [row["tools/call_frequency"] for row in ranks[0]["logs"]] == [1.0, 1.0]
    assert [rank["environments_made"] for rank in ranks] == [4, 1]
