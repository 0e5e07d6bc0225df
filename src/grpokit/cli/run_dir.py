"""The output directory of a run: checked before anything loads, locked while a run writes into it, and cleared only
when asked.

Checked (`output_dir_problems`, from `grpokit train`'s checks): the path is not a file; it (or the folder it will be
made in) is writable; its disk has room for a checkpoint (estimated from the model's config); another run is not
writing into it (the lock); it holds no previous run (checkpoints, saved weights, records), unless the run resumes
(`resume_from_checkpoint`) or replaces it (`overwrite_output_dir`).

Locked (`RunLock`): the process that writes the run (process 0) holds `output_dir/.grpokit.lock`, created exclusively
and naming its host and pid; a lock whose process is gone (same host, no such pid) is stale and taken over with a
warning. Released when the run ends, however it ends.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import time

LOCK_NAME = ".grpokit.lock"
RECORDS = ("metrics.jsonl", "completions.jsonl")
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "adapter_model.safetensors")
_RUN_FOLDER = re.compile(r"^(tmp-)?checkpoint-\d+$|^interrupted-step-\d+$")


class RunDirError(Exception):
    """A one-line reason why a run cannot write into its output_dir."""


def previous_run(output_dir: str) -> list[str]:
    """What in `output_dir` belongs to an earlier run (sorted names): checkpoint and interrupted-step folders, saved
    weights, non-empty records. A lone resolved_config.yaml (a start that failed) is not a run."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if _RUN_FOLDER.match(name) and os.path.isdir(path):
            found.append(name)
        elif name in WEIGHTS or (name in RECORDS and os.path.getsize(path) > 0):
            found.append(name)
    return found


def clear_previous_run(output_dir: str) -> list[str]:
    """Delete what `previous_run` finds (asked for with overwrite_output_dir); the names deleted."""
    found = previous_run(output_dir)
    for name in found:
        path = os.path.join(output_dir, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    return found


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**28 else f"{n_bytes / 2**20:.0f} MiB"


def output_dir_problems(
    output_dir: str, *, resuming: bool, overwrite: bool, checkpoint_bytes: int | None = None
) -> list[str]:
    """One line per reason the run cannot write into `output_dir`; nothing is created or changed."""
    if not output_dir:
        return ["output_dir is empty: give the folder the run writes into"]
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        return [f"output_dir={output_dir!r} is a file, not a folder: choose another output_dir"]
    existing = _nearest_existing(output_dir)
    if not os.path.isdir(existing):
        return [f"output_dir={output_dir!r}: {existing!r} is a file, so the folder cannot be made"]
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == os.path.abspath(output_dir) else f"{existing!r}, where it would be made,"
        return [f"output_dir={output_dir!r}: {where} is not writable: choose another output_dir"]
    problems = []
    if checkpoint_bytes:
        free = shutil.disk_usage(existing).free
        if free < checkpoint_bytes:
            problems.append(
                f"output_dir={output_dir!r}: {_gib(free)} free on its disk, a checkpoint needs about "
                f"{_gib(checkpoint_bytes)} (weights and optimizer states): free some space or choose another output_dir"
            )
    holder = lock_holder(output_dir)
    if holder is not None and holder["alive"]:
        problems.append(
            f"output_dir={output_dir!r} is in use by another run ({holder['what']}): wait for it to end or choose "
            "another output_dir"
        )
    found = previous_run(output_dir)
    if found and not resuming and not overwrite:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        problems.append(
            f"output_dir={output_dir!r} holds a previous run ({shown}): resume it with --resume_from_checkpoint true, "
            "replace it with --overwrite_output_dir true, or choose another output_dir"
        )
    return problems


def checkpoint_bytes(values) -> int | None:
    """About how many bytes one checkpoint takes: the weights in their dtype plus AdamW's two fp32 states per weight
    (weights only with save_only_model). None when the model's size is unknown (not a local folder) or the run trains
    a LoRA adapter (its checkpoints are a small fraction of the model)."""
    from grpokit.cli.plan import _model_dims, parameter_count

    if values.get("use_peft"):
        return None
    dims = _model_dims(values.get("model_name_or_path"))
    if dims is None:
        return None
    dtype = str(values.get("dtype") or (values.get("model_init_kwargs") or {}).get("dtype") or "float32")
    weight = 2 if dtype in ("bfloat16", "float16", "torch.bfloat16", "torch.float16") else 4
    optimizer = 0 if values.get("save_only_model") else 8
    return parameter_count(dims) * (weight + optimizer)


# ---------------------------------------------------------------------------------------------------- the lock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def lock_holder(output_dir: str) -> dict | None:
    """The run holding `output_dir`'s lock: {"what": "pid N on HOST since TIME", "alive": bool}; None if unlocked.
    A lock from another host is taken to be alive (its pid cannot be checked from here)."""
    path = os.path.join(output_dir, LOCK_NAME)
    try:
        with open(path, encoding="utf-8") as fh:
            info = json.load(fh)
        pid, host, since = int(info["pid"]), str(info["host"]), str(info.get("since", "?"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return {"what": f"an unreadable lock file {path}", "alive": False}
    alive = _pid_alive(pid) if host == socket.gethostname() else True
    return {"what": f"pid {pid} on {host} since {since}", "alive": alive}


class RunLock:
    """`output_dir/.grpokit.lock`, held by the process that writes the run. `acquire()` raises RunDirError when a live
    run holds it; a stale one (its process gone) is replaced, and `stale` says whose it was."""

    def __init__(self, output_dir: str):
        self.path = os.path.join(output_dir, LOCK_NAME)
        self.held = False
        self.stale = None

    def acquire(self) -> RunLock:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = lock_holder(os.path.dirname(self.path))
                if holder is None:
                    continue  # released meanwhile: try again
                if holder["alive"]:
                    raise RunDirError(
                        f"output_dir={os.path.dirname(self.path)!r} is in use by another run ({holder['what']}): "
                        "wait for it to end or choose another output_dir"
                    ) from None
                self.stale = holder["what"]
                os.remove(self.path)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(info, fh)
            self.held = True
            return self
        raise RunDirError(f"could not take the lock {self.path}: another run keeps taking it")

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


LOW_SPACE_BYTES = 16 * 2**20


def is_disk_full(exc: BaseException, path: str | None = None) -> bool:
    """Whether `exc` comes from a full disk: an OSError "no space left" / "quota exceeded" (or one it was raised
    from), or, with `path`, any error while that path's disk has less than 16 MiB free. torch.save on a full disk
    raises a RuntimeError ("unexpected pos 64 vs 0") that names no errno: the free space tells."""
    error = exc
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            return True
        error = error.__cause__ or error.__context__
    if path is None:
        return False
    try:
        return shutil.disk_usage(_nearest_existing(path)).free < LOW_SPACE_BYTES
    except OSError:
        return False
