"""What the sandbox's adversarial tests share: running a program with some of the sandbox's layers switched off."""

from __future__ import annotations

import os
import textwrap

from grpokit.rewards import sandbox
from grpokit.rewards.sandbox import DEFAULT_DISK_MB, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_OUTPUT_BYTES, run_program

LAYERS = ["full", "kernel"]


def attack(
    layer: str,
    source: str,
    *,
    timeout: float = 3,
    memory_mb: int | None = 256,
    seccomp: bool = True,
    cgroup: bool = True,
    without: frozenset[str] | set[str] = frozenset(),
    **kwargs,
):
    """Run `source` in the sandbox: "full" as the code rewards do; "kernel" with the audit hook off (a program that
    got past it, `ctypes` included), and then `seccomp=False` or `cgroup=False` leave the seccomp filter or the
    memory cgroup out too, and `without` the other defences (`sandbox.DEFENCES`), to show what the rest hold alone."""
    source = textwrap.dedent(source)
    if layer == "full":
        return run_program(source, timeout=timeout, memory_mb=memory_mb, **kwargs)
    return sandbox._run(
        source,
        "",
        float(timeout),
        kwargs.get("cpu_seconds", int(timeout) + 1),
        (memory_mb or 0) << 20,
        kwargs.get("max_output_bytes", DEFAULT_MAX_OUTPUT_BYTES),
        kwargs.get("max_file_bytes", DEFAULT_MAX_FILE_BYTES),
        kwargs.get("disk_mb", DEFAULT_DISK_MB) << 20,
        audit_hook=False,
        seccomp=seccomp,
        cgroup=cgroup,
        without=without,
    )


def processes_with(token: str) -> list[int]:
    """Pids of the machine whose command line holds `token`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found
