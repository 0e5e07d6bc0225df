"""What the launcher asked for against what this process really got: no run goes on as one process, or as plain DDP,
when several processes, FSDP or DeepSpeed were asked for.

accelerate starts several CPU processes only with `--multi_gpu` (plus `use_cpu`); `accelerate launch --num_processes
4` alone starts one, and `--use_fsdp` on a CPU machine becomes DDP. Neither says so. `launch_problems` compares the
request (the launcher's command line and environment) with the distributed state and returns one line per mismatch,
with the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

# Set by the launching `grpokit train` for the processes it starts: a YAML `accelerate_config:` is then expected there
# and ignored without a warning.
LAUNCHED_ENV = "GRPOKIT_LAUNCHED"

CPU_FORM = (
    "ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes N --num_machines 1 --mixed_precision no "
    "--dynamo_backend no -m grpokit train ..."
)


def launch_problems(
    world_size: int,
    distributed_type: str,
    *,
    env: Mapping[str, str] | None = None,
    parent_argv: Sequence[str] | None = None,
) -> list[str]:
    """One line per way this launch differs from what was asked.

    Args:
        world_size: the processes this run's distributed state has.
        distributed_type: its `accelerate.DistributedType` (e.g. "MULTI_CPU", "FSDP", "DEEPSPEED", "NO").
        env: the environment (default `os.environ`).
        parent_argv: the launcher's command line (default: the parent process's, when it is `accelerate launch`).
    """
    env = os.environ if env is None else env
    parent_argv = _parent_argv() if parent_argv is None else parent_argv
    kind = distributed_type.rsplit(".", 1)[-1]
    problems = []
    asked = _asked_processes(parent_argv)
    if asked is not None and asked > 1 and world_size == 1 and "WORLD_SIZE" not in env:
        problems.append(
            f"accelerate launch asked for {asked} processes but started one (accelerate needs --multi_gpu for "
            f"several); on GPUs add --multi_gpu, on CPU use: {CPU_FORM}"
        )
    started = _int(env.get("WORLD_SIZE"))
    if started is not None and started > 1 and world_size == 1 and _true(env.get("ACCELERATE_USE_DEEPSPEED")):
        problems.append(
            f"the launcher started {started} DeepSpeed processes but each runs alone (not one group: every process "
            "would train its own copy); on a CPU machine set ddp_backend: gloo (and not use_cpu)"
        )
    elif started is not None and started > 1 and world_size == 1:
        problems.append(
            f"the launcher started {started} processes but each runs alone (not one group: every process would "
            f"train its own copy); on a CPU machine set use_cpu: true (or ACCELERATE_USE_CPU=true), or use: {CPU_FORM}"
        )
    # The process state is read before the accelerator exists: accelerate turns several GPU-like processes
    # (MULTI_GPU, MULTI_XPU, ...) into FSDP when it builds the accelerator, but never CPU processes or a single one.
    if _true(env.get("ACCELERATE_USE_FSDP")) and kind in ("MULTI_CPU", "NO"):
        problems.append(
            f"FSDP was asked for (--use_fsdp) but accelerate runs {kind}: it switches to FSDP only with several GPU "
            "processes; drop --use_fsdp on CPU (DDP) or run on GPUs"
        )
    if _true(env.get("ACCELERATE_USE_DEEPSPEED")) and kind != "DEEPSPEED":
        problems.append(
            f"DeepSpeed was asked for (--use_deepspeed) but accelerate runs {kind}: use_cpu (ACCELERATE_USE_CPU) "
            "turns DeepSpeed off; drop it, DeepSpeed runs over gloo on a CPU machine without it"
        )
    return problems


def engine_problems(
    *,
    deepspeed_stage: int | None,
    fsdp_version: int | None,
    use_cpu: bool,
    use_vllm: bool,
    ds3_gather_for_generation: bool,
) -> list[str]:
    """One line per setting the sharding engine cannot honour, found before any model loads.

    Args:
        deepspeed_stage: the ZeRO stage when DeepSpeed runs (None otherwise).
        fsdp_version: 1 or 2 when FSDP runs (None otherwise).
        use_cpu, use_vllm, ds3_gather_for_generation: the training configuration's.
    """
    problems = []
    if deepspeed_stage is not None and use_cpu:
        problems.append(
            "use_cpu=True: accelerate turns DeepSpeed off when told to use the CPU (plain DDP would run); set "
            "use_cpu: false, DeepSpeed runs over gloo on a CPU machine without it"
        )
    if deepspeed_stage == 3 and use_vllm and not ds3_gather_for_generation:
        problems.append(
            "ds3_gather_for_generation=False: with use_vllm the ZeRO-3 weights are gathered anyway, to be pushed to "
            "vLLM, which generates; drop it (or set it true)"
        )
    if fsdp_version == 1:
        problems.append(
            "fsdp_version=1: FSDP1 is not supported (generating with its flattened parameters is not implemented); "
            "use fsdp_version: 2 (the fsdp2 preset)"
        )
    return problems


def launched_engine(env: Mapping[str, str] | None = None, deepspeed_plugin=None) -> dict:
    """The sharding engine accelerate's launcher asked this process for (`engine_problems` keywords)."""
    env = os.environ if env is None else env
    stage = None
    if _true(env.get("ACCELERATE_USE_DEEPSPEED")):
        stage = getattr(deepspeed_plugin, "zero_stage", None)
        stage = stage if stage is not None else _int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"))
        stage = stage if stage is not None else 2  # accelerate's default
    version = (_int(env.get("FSDP_VERSION")) or 1) if _true(env.get("ACCELERATE_USE_FSDP")) else None
    return {"deepspeed_stage": stage, "fsdp_version": version}


def under_launcher(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by a launcher (accelerate launch, torchrun): it must not launch again."""
    env = os.environ if env is None else env
    return any(k in env for k in ("LOCAL_RANK", "WORLD_SIZE", "ACCELERATE_MIXED_PRECISION", LAUNCHED_ENV))


def default_ddp_backend(env: Mapping[str, str] | None = None) -> str | None:
    """The process-group backend when `ddp_backend` is unset: gloo for DeepSpeed processes on a machine without an
    accelerator (accelerate leaves it unset there, and every process then counts one process); None (accelerate
    chooses) otherwise."""
    env = os.environ if env is None else env
    if not _true(env.get("ACCELERATE_USE_DEEPSPEED")) or _int(env.get("LOCAL_RANK")) is None:
        return None
    import torch

    return None if torch.accelerator.is_available() else "gloo"


def _asked_processes(argv: Sequence[str]) -> int | None:
    """The `--num_processes` of an `accelerate launch` command line (None when it is not one or does not say)."""
    head = list(argv[:3])
    accelerate_launch = "accelerate.commands.launch" in head or (
        "launch" in head and any("accelerate" in os.path.basename(a) for a in head)
    )  # `accelerate launch ...` or `python -m accelerate.commands.launch ...`
    if not accelerate_launch:
        return None
    for i, arg in enumerate(argv):
        if arg == "--num_processes" and i + 1 < len(argv):
            return _int(argv[i + 1])
        if arg.startswith("--num_processes="):
            return _int(arg.split("=", 1)[1])
    return None


def _parent_argv() -> list[str]:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:  # not Linux, or no permission: nothing to compare
        return []


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _true(value) -> bool:
    return str(value).lower() in ("1", "true", "yes")
