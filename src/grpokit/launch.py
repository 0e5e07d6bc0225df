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
