"""No silent single process: a launch that differs from what was asked stops with one line naming the fix."""

import os
import subprocess
import sys

import pytest

from grpokit.launch import launch_problems

ACCELERATE = ["/venv/bin/accelerate", "launch", "--num_processes", "4", "-m", "grpokit", "train"]


def test_asked_for_several_got_one():
    (line,) = launch_problems(1, "DistributedType.NO", env={}, parent_argv=ACCELERATE)
    assert line.startswith("accelerate launch asked for 4 processes but started one")
    assert "--multi_gpu" in line and "ACCELERATE_USE_CPU=true" in line


@pytest.mark.parametrize(
    "world_size, kind, env, argv",
    [
        (4, "DistributedType.MULTI_GPU", {"WORLD_SIZE": "4"}, ACCELERATE),  # got what it asked for
        (1, "DistributedType.NO", {}, ["python", "-m", "grpokit", "train"]),  # no launcher at all
        (1, "DistributedType.NO", {}, ["/venv/bin/accelerate", "launch", "-m", "grpokit", "train"]),  # 1 asked
        (2, "DistributedType.FSDP", {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"}, []),
        # before the accelerator exists, GPU processes read MULTI_GPU: accelerate makes them FSDP later
        (2, "DistributedType.MULTI_GPU", {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"}, []),
        (2, "DistributedType.DEEPSPEED", {"WORLD_SIZE": "2", "ACCELERATE_USE_DEEPSPEED": "true"}, []),
    ],
)
def test_launches_that_match_their_request(world_size, kind, env, argv):
    assert launch_problems(world_size, kind, env=env, parent_argv=argv) == []


def test_processes_that_are_not_one_group():
    (line,) = launch_problems(1, "DistributedType.NO", env={"WORLD_SIZE": "2"}, parent_argv=[])
    assert line.startswith("the launcher started 2 processes but each runs alone")


def test_deepspeed_processes_that_are_not_one_group():
    env = {"WORLD_SIZE": "2", "ACCELERATE_USE_DEEPSPEED": "true"}
    (line,) = launch_problems(1, "DistributedType.DEEPSPEED", env=env, parent_argv=[])
    assert line.startswith("the launcher started 2 DeepSpeed processes but each runs alone")
    assert "ddp_backend: gloo" in line


def test_fsdp_that_became_ddp():
    env = {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"}
    (line,) = launch_problems(2, "DistributedType.MULTI_CPU", env=env, parent_argv=[])
    assert line.startswith("FSDP was asked for (--use_fsdp) but accelerate runs MULTI_CPU")


def test_deepspeed_turned_off_by_use_cpu():
    env = {"WORLD_SIZE": "2", "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_CPU": "true"}
    (line,) = launch_problems(2, "DistributedType.MULTI_CPU", env=env, parent_argv=[])
    assert line.startswith("DeepSpeed was asked for (--use_deepspeed) but accelerate runs MULTI_CPU")
    assert "drop it" in line


def test_accelerate_launch_without_multi_gpu_stops_in_one_line(tmp_path):
    """The real launcher: `--num_processes 2` alone starts one process, and grpokit says so instead of training."""
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in launcher and not k.startswith("ACCELERATE_")}
    env["HF_HUB_OFFLINE"] = "1"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1"]
    command += ["--mixed_precision", "no", "--dynamo_backend", "no", "-m", "grpokit", "train", "--demo"]
    command += ["--max_steps", "2", "--output_dir", str(tmp_path / "out")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    errors = {line for line in result.stderr.splitlines() if line.startswith("error: ")}
    assert len(errors) == 1, result.stderr[-2000:]
    assert "accelerate launch asked for 2 processes but started one" in errors.pop()
    assert not (tmp_path / "out" / "model.safetensors").exists()  # nothing trained, nothing saved


ENGINE_DEFAULTS = dict(use_cpu=False, use_vllm=False, ds3_gather_for_generation=True)


@pytest.mark.parametrize(
    "engine, settings, expected",
    [
        ({"deepspeed_stage": 3}, {}, []),
        ({"deepspeed_stage": 2}, {"use_cpu": True}, ["use_cpu=True: accelerate turns DeepSpeed off"]),
        (
            {"deepspeed_stage": 3},
            {"use_vllm": True, "ds3_gather_for_generation": False},
            ["ds3_gather_for_generation"],
        ),
        ({"deepspeed_stage": 2}, {"use_vllm": True, "ds3_gather_for_generation": False}, []),  # only ZeRO-3 gathers
        ({"fsdp_version": 1}, {}, ["fsdp_version=1: FSDP1 is not supported"]),
        ({"fsdp_version": 2}, {}, []),
    ],
)
def test_engine_problems(engine, settings, expected):
    from grpokit.launch import engine_problems

    arguments = {"deepspeed_stage": None, "fsdp_version": None}
    lines = engine_problems(**{**arguments, **engine}, **{**ENGINE_DEFAULTS, **settings})
    assert len(lines) == len(expected) and all(line.startswith(e) for line, e in zip(lines, expected, strict=True))


def test_launched_engine_reads_the_launcher_environment():
    from grpokit.launch import launched_engine

    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}
    assert launched_engine(env) == {"deepspeed_stage": None, "fsdp_version": 2}
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}
    assert launched_engine(env)["deepspeed_stage"] == 3
    assert launched_engine({})["deepspeed_stage"] is None


def test_default_ddp_backend_is_gloo_only_for_deepspeed_processes_without_an_accelerator():
    import torch

    from grpokit.launch import default_ddp_backend

    launched = {"ACCELERATE_USE_DEEPSPEED": "true", "LOCAL_RANK": "0"}
    assert default_ddp_backend(launched) == (None if torch.accelerator.is_available() else "gloo")
    assert default_ddp_backend({"ACCELERATE_USE_DEEPSPEED": "true"}) is None  # not launched: one process
    assert default_ddp_backend({"LOCAL_RANK": "0"}) is None  # DDP: accelerate chooses
