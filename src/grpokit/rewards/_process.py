"""One sandboxed run as a process: started in a session of its own, fed its stdin, its outputs read up to a cap, and
its whole group killed when it ends (`_execute`), without a pid ever being reused under it. The sandbox's boundary
(bwrap's options, the seccomp filter, the memory cgroup) is `sandbox.py`'s; this is only the process."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping

_READ_CHUNK = 1 << 16
_DRAIN_SECONDS = 1.0  # after the group is killed, how long to wait for the pipes to close


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        return []


def _kill_group(pgid: int) -> None:
    """SIGKILL the run: first the leader's children, then its process group.

    Under bwrap the child is PID 1 of the sandbox, in a session of its own: killing it ends the PID namespace, and
    bwrap, which reaps it, exits only once every process in there is gone. (Killing bwrap alone would end them too,
    through --die-with-parent, but a moment after `run_program` returned.) The pidfd is checked to still be a child
    of the leader, so a pid reused meanwhile is never signalled."""
    for child in _children(pgid):
        try:
            pidfd = os.pidfd_open(child)
        except OSError:
            continue
        try:
            if child in _children(pgid):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _has_exited(pid: int) -> bool:
    """Whether `pid` has exited, without reaping it (so its process group id stays valid for `killpg`)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _read_into(fd: int, buffer: bytearray, cap: int) -> tuple[bool, bool]:
    """Read one chunk of `fd` into `buffer` up to `cap` bytes; (end of file, over the cap)."""
    chunk = os.read(fd, _READ_CHUNK)
    room = cap - len(buffer)
    buffer += chunk[:room]
    return not chunk, len(chunk) > room


def _execute(
    argv: list[str],
    stdin: bytes,
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout: float,
    max_output_bytes: int,
    pass_fds: tuple[int, ...] = (),
) -> tuple[str, int, bytes, bytes, float, bool, float]:
    """Run `argv` in a new session; feed `stdin`, read both outputs up to the cap, kill the group when it ends.

    Returns (reason, returncode, stdout, stderr, seconds, truncated, cpu_seconds) with reason "exited", "timeout"
    or "output_limit". The group is killed while the program is still unreaped, so its id cannot have been reused.
    """
    start = time.monotonic()
    deadline = start + timeout
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=dict(env),
        start_new_session=True,
        close_fds=True,
        pass_fds=pass_fds,
    )
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray()}
    reason, truncated = "exited", False
    pending = memoryview(stdin)
    selector = selectors.DefaultSelector()
    try:
        selector.register(out_fd, selectors.EVENT_READ)
        selector.register(err_fd, selectors.EVENT_READ)
        if pending:
            os.set_blocking(in_fd, False)
            selector.register(in_fd, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()

        def reading() -> bool:
            return any(key.fd in buffers for key in selector.get_map().values())

        while reading():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                reason = "timeout"
                break
            # Wake up now and then to notice a program that exited while a stray child still holds its pipes.
            events = selector.select(timeout=min(remaining, 0.05))
            for key, _ in events:
                if key.fd == in_fd:
                    try:
                        pending = pending[os.write(in_fd, pending[:_READ_CHUNK]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # the program does not read (all of) its input
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(in_fd)
                        proc.stdin.close()
                    continue
                eof, over = _read_into(key.fd, buffers[key.fd], max_output_bytes)
                if eof:
                    selector.unregister(key.fd)
                if over:
                    reason, truncated = "output_limit", True
            if reason == "output_limit" or (not events and _has_exited(proc.pid)):
                break
        while reason == "exited" and not _has_exited(proc.pid):  # outputs closed: wait for the exit itself
            if time.monotonic() >= deadline:
                reason = "timeout"
                break
            time.sleep(0.002)
        _kill_group(proc.pid)
        # Read what the (now dead) group left in the pipes, up to the cap; a process that escaped the group and
        # still holds them is not waited for beyond _DRAIN_SECONDS.
        drain_deadline = time.monotonic() + _DRAIN_SECONDS
        while reading() and time.monotonic() < drain_deadline:
            for key, _ in selector.select(timeout=max(0.0, drain_deadline - time.monotonic())):
                if key.fd not in buffers:
                    selector.unregister(key.fd)
                    continue
                eof, over = _read_into(key.fd, buffers[key.fd], max_output_bytes)
                truncated = truncated or over
                if eof or over:
                    selector.unregister(key.fd)
    finally:
        selector.close()
        _kill_group(proc.pid)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        _, wait_status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
    seconds = time.monotonic() - start
    cpu = usage.ru_utime + usage.ru_stime
    return reason, proc.returncode, bytes(buffers[out_fd]), bytes(buffers[err_fd]), seconds, truncated, cpu
