"""Real 2-process CPU runs under accelerate's launcher, one per engine: DDP (gloo), DeepSpeed ZeRO-2 and ZeRO-3
(generation on gathered weights, and through DeepSpeed's hooks), ZeRO-3 with LoRA, and FSDP2 (through the test-only
shim `_fsdp_cpu_shim.py`); plus two nodes over 127.0.0.1 and one process for reference.

Every run trains the same scripted completions (see `_worker.py`) with `beta > 0` and the reference model pulled
halfway to the policy after every step, so final weights can be compared: DDP against one process with the same
global batch, every other engine against DDP. Each run asserts what it really got: distributed type, process count,
wrapper, how much of the policy a rank holds, whether the reference model and generation saw sharded weights. The
real generator runs greedily at every round, with a different length on each rank; its completions must equal DDP's.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
WORKER = os.path.join(HERE, "_worker.py")
LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
TOLERANCE = 1e-5
FLAG = "model.layers.0.flag"

FSDP2 = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"]
FSDP2 += ["--fsdp_state_dict_type", "FULL_STATE_DICT", "--fsdp_reshard_after_forward", "true"]
# ZeRO-3 keeps parameters below a size threshold gathered for good; at 0 every parameter of the tiny model really
# is partitioned between forward calls, so generation through the hooks has to gather.
ZERO3_CONFIG = {
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
}


def environment(cpu: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES and not k.startswith("ACCELERATE_")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(filter(None, [HERE, env.get("PYTHONPATH")])))
    if cpu:  # DDP and the FSDP shim; DeepSpeed must not be told "cpu" (accelerate then drops it for plain DDP)
        env["ACCELERATE_USE_CPU"] = "true"
    return env


def launch(work, engine: list[str], *worker_args: str, cpu: bool, processes: int = 2) -> None:
    command = [sys.executable, "-m", "accelerate.commands.launch", *engine, "--num_processes", str(processes)]
    command += ["--num_machines", "1", "--main_process_port", "0", "--mixed_precision", "no"]
    command += ["--dynamo_backend", "no", WORKER, str(work), *worker_args]
    result = subprocess.run(command, env=environment(cpu), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def ranks(*works) -> list[dict]:
    return [
        json.load(open(next(w / f"rank{r}.json" for w in works if (w / f"rank{r}.json").exists()))) for r in (0, 1)
    ]


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
        [sys.executable, WORKER, str(work), "16", "--flag-buffer"],
        env=environment(cpu=True),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.load(open(work / "rank0.json"))
    assert record["num_processes"] == 1 and record["distributed_type"] == "DistributedType.NO"
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(work / "initial_model")
    record["initial"] = [p.detach().flatten().tolist() for p in initial.parameters()]
    return record


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    work = tmp_path_factory.mktemp("ddp")
    launch(work, ["--multi_gpu"], "8", "--flag-buffer", cpu=True)
    return ranks(work)


@pytest.fixture(scope="module")
def ddp_lora(tmp_path_factory):
    work = tmp_path_factory.mktemp("ddp-lora")
    launch(work, ["--multi_gpu"], "8", "--lora", cpu=True)
    return ranks(work)


def check_ddp(records, single, label: str) -> None:
    for record in records:
        # what we really got: two processes in one gloo group, the model wrapped in DDP
        assert record["distributed_type"] == "DistributedType.MULTI_CPU"
        assert record["num_processes"] == 2 and record["world_size"] == 2
        assert record["wrapper"] == "DistributedDataParallel"
        assert record["ignored"] == [FLAG]
        assert FLAG in record["ddp_ignores"]  # DDP really skips the boolean buffer
        assert record["steps"] == 3
    assert records[0]["weights"] == records[1]["weights"]  # gradients all-reduced: the ranks never drift apart
    check_saved(records[0])
    diff, moved = max_diff(single["weights"], records[0]["weights"]), max_diff(single["weights"], single["initial"])
    ref_diff = max_diff(single["reference_weights"], records[0]["reference_weights"])
    ref_moved = max_diff(single["reference_weights"], single["initial"])
    print(f"\n{label} vs 1 process: max weight difference {diff:.2e} (moved {moved:.2e}), reference {ref_diff:.2e}")
    assert moved > 1e-4 and diff < TOLERANCE, (moved, diff)
    assert ref_moved > 1e-4 and ref_diff < TOLERANCE, (ref_moved, ref_diff)  # the reference really was synced


def test_ddp_two_cpu_processes(ddp, single):
    check_ddp(ddp, single, "DDP, 2 processes")


def test_ddp_two_nodes_over_loopback(tmp_path, single):
    """Two launches as two machines (one process each) meeting at 127.0.0.1. They share a folder, as nodes share a
    file system; the model is written before they start (saving writes weights on global rank 0 only)."""
    from grpokit.demo import prepare_demo

    port = str(free_port())
    prepare_demo(str(tmp_path), rows=64)
    nodes = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
        command += ["--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1"]
        command += ["--main_process_port", port, "--mixed_precision", "no", "--dynamo_backend", "no"]
        command += [WORKER, str(tmp_path), "8", "--flag-buffer"]
        nodes.append(
            subprocess.Popen(
                command, env=environment(cpu=True), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        outputs = [node.communicate(timeout=600) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr[-3000:]
    check_ddp(ranks(tmp_path), single, "DDP, 2 nodes")


def check_saved(record) -> None:
    """The saved model holds the whole trained policy (gathered from the shards): every weight, or with LoRA every
    adapter weight; a tied LM head is saved once, as the embeddings."""
    weights = dict(zip(record["names"], record["weights"], strict=True))
    lora = any("lora_" in name for name in weights)
    expected = {n for n in weights if "lora_" in n} if lora else set(weights) - {"lm_head.weight"}
    assert expected and expected <= set(record["saved_weights"])
    for name, values in record["saved_weights"].items():
        assert values == weights[name], name


def check_against(records, baseline, *, label, kind, wrapper, sharded, generation_sharded, reference=None) -> None:
    """An engine's two ranks against DDP's at the same process count and global batch."""
    full = sum(len(w) for w in baseline[0]["weights"])
    for record, base in zip(records, baseline, strict=True):
        assert record["distributed_type"] == f"DistributedType.{kind}"
        assert record["num_processes"] == 2 and record["world_size"] == 2
        assert record["wrapper"] == wrapper and record["steps"] == 3
        # a sharded engine holds half of the policy on each rank (ZeRO-3 pads each tensor to an even split)
        assert (record["local_numel"] < 0.55 * full) if sharded else (record["local_numel"] == full)
        assert record["generation_saw_sharded"] == [generation_sharded] * 3
        assert record["real_completions"] == base["real_completions"]  # same greedy generations, rank by rank
        if reference is not None:
            assert record["reference"] == reference
            assert record["reference_sharded"] is sharded
    assert records[0]["weights"] == records[1]["weights"]
    check_saved(records[0])
    diff = max_diff(baseline[0]["weights"], records[0]["weights"])
    line = f"\n{label} vs DDP: max weight difference {diff:.2e}"
    assert diff < TOLERANCE, diff
    if "reference_weights" in baseline[0]:
        ref_diff = max_diff(baseline[0]["reference_weights"], records[0]["reference_weights"])
        line += f", reference {ref_diff:.2e}"
        assert ref_diff < TOLERANCE, ref_diff
    print(line)


def test_deepspeed_zero2(tmp_path, ddp):
    launch(tmp_path, ["--use_deepspeed", "--zero_stage", "2"], "8", cpu=False)
    check_against(
        ranks(tmp_path),
        ddp,
        label="ZeRO-2",
        kind="DEEPSPEED",
        wrapper="DeepSpeedEngine",
        sharded=False,  # ZeRO-2 divides optimizer state and gradients, not the weights
        generation_sharded=False,
        reference="Qwen2ForCausalLM",  # a frozen model has nothing ZeRO-2 divides: a plain copy per rank
    )


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    path = tmp_path_factory.mktemp("zero3") / "ds_config.json"
    path.write_text(json.dumps(ZERO3_CONFIG))
    return ["--use_deepspeed", "--deepspeed_config_file", str(path), "--zero3_init_flag", "true"]


@pytest.mark.parametrize("gather", [True, False], ids=["gathered", "through-hooks"])
def test_deepspeed_zero3(tmp_path, ddp, zero3, gather):
    launch(tmp_path, zero3, "8", *([] if gather else ["--no-gather"]), cpu=False)
    check_against(
        ranks(tmp_path),
        ddp,
        label=f"ZeRO-3 ({'gathered' if gather else 'through hooks'})",
        kind="DEEPSPEED",
        wrapper="DeepSpeedEngine",
        sharded=True,
        generation_sharded=not gather,
        reference="DeepSpeedEngine",  # partitioned like the policy
    )


def test_deepspeed_zero3_lora(tmp_path, ddp_lora, zero3):
    launch(tmp_path, zero3, "8", "--lora", cpu=False)
    records = ranks(tmp_path)
    check_against(
        records,
        ddp_lora,
        label="ZeRO-3 + LoRA",
        kind="DEEPSPEED",
        wrapper="DeepSpeedEngine",
        sharded=True,
        generation_sharded=False,
        reference=None,  # the adapter disabled is the reference
    )
    lora_b = [w for name, w in zip(records[0]["names"], records[0]["weights"], strict=True) if "lora_B" in name]
    assert lora_b and max(abs(x) for w in lora_b for x in w) > 1e-4  # the adapter trained (it starts at zero)


def test_fsdp2(tmp_path, ddp):
    launch(tmp_path, FSDP2, "8", cpu=True)
    check_against(
        ranks(tmp_path),
        ddp,
        label="FSDP2",
        kind="FSDP",
        wrapper="FSDPQwen2ForCausalLM",
        sharded=True,
        generation_sharded=True,
        reference="FSDPQwen2ForCausalLM",
    )
