"""`grpokit train` as a command watches the process that trains: a run that ends without finishing never reads as a
success. A reward, callback or library that calls `os._exit(0)` ends its process at once, with status 0, and nothing
inside that process can see it coming; a scheduler would take the missing model for a finished run.

So the command (the console script, `python -m grpokit train`) runs the training in a child process, the same command
with `GRPOKIT_SUPERVISED` naming a marker file that the child writes when its command returns. The parent passes
SIGTERM and SIGINT on, waits, and reports a child that exited 0 without the marker in one line, with status 1. A
child killed by a signal (SIGKILL) ends the parent by the same signal: to its own parent, the command died as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

SUPERVISED_ENV = "GRPOKIT_SUPERVISED"


def wanted(argv: list[str]) -> bool:
    """Whether this command line is a training run to supervise from here: `train` (not its help) or bare
    `grpokit` (the demo), in a process that is neither the supervised child nor one a launcher started (the launcher
    watches those)."""
    from grpokit.launch import under_launcher

    return (
        argv[:1] in (["train"], [])
        and not any(a in ("-h", "--help", "--help-all") for a in argv)
        and SUPERVISED_ENV not in os.environ
        and not under_launcher()
    )


def supervise(argv: list[str]) -> int:
    """Run `grpokit *argv` in a child process and return its exit status, or 1 when it exited 0 unfinished."""
    marker_dir = tempfile.mkdtemp(prefix="grpokit-supervisor-")
    marker = os.path.join(marker_dir, "finished")
    child = subprocess.Popen([sys.executable, "-m", "grpokit", *argv], env={**os.environ, SUPERVISED_ENV: marker})
    try:
        code = wait_passing_signals(child)
    finally:
        finished = os.path.exists(marker)
        if finished:
            os.remove(marker)
        os.rmdir(marker_dir)
    if code < 0:  # killed by a signal: end the same way, so that whoever waits on this process sees what happened
        sys.stdout.flush()
        sys.stderr.flush()
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught, so have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal that does not end a process by default (none that kills a child does)
    if code == 0 and not finished:
        print(
            "error: the training process exited with status 0 before `grpokit train` finished (os._exit in a reward, "
            "a callback or a library?): the run is incomplete; its last checkpoint, if any, is in output_dir",
            file=sys.stderr,
        )
        return 1
    return code


def wait_passing_signals(child: subprocess.Popen) -> int:
    """Wait for `child`, passing SIGTERM and SIGINT on to it (it saves and stops) instead of dying first and leaving
    it orphaned: its raw exit status."""
    forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def mark_finished(code: int) -> None:
    """In the supervised child: say that the command returned (with `code`), however it went."""
    marker = os.environ.get(SUPERVISED_ENV)
    if marker:
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(f"{code}\n")
