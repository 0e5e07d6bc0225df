"""A local sandbox for running untrusted Python programs (model completions) against test inputs.

`run_program(source, stdin)` runs one program and returns a `RunResult`; `run_many(jobs, workers=N)` runs several
at once (threads, each waiting on its own subprocess) and returns the results in input order.

What each run gets, and how:

- **Its own process and process group.** The program runs in a fresh interpreter (`python -I -S -B -X utf8`: no
  user site, no site-packages, no `PYTHON*` variables, no bytecode writes, UTF-8 I/O) started in a new session.
  When the program ends, or is stopped, the whole process group is killed with SIGKILL before the program is
  reaped, so a child that was forked anyway (see below) and stayed in the group does not outlive the run.
- **Limits.** Wall-clock `timeout` (the group is killed; status "timeout"); CPU time `cpu_seconds` (RLIMIT_CPU;
  status "timeout"); address space `memory_mb` (RLIMIT_AS; a `MemoryError` gives status "memory"); the size of any
  file written, `max_file_bytes` (RLIMIT_FSIZE; writing more fails with EFBIG); 64 open files (RLIMIT_NOFILE); no
  core dumps. Limits are set by the bootstrap in the child itself (no `preexec_fn`, which is unsafe with threads)
  before the program's code runs, and the program may not change them.
- **Output caps.** stdout and stderr are each read up to `max_output_bytes`; one byte more kills the group
  (status "output_limit", `truncated=True`).
- **A temporary working directory**, also `HOME` and `TMPDIR`, removed afterwards; a minimal environment
  (`PATH=/usr/bin:/bin`, a UTF-8 locale: no proxies, tokens or other variables of the trainer).
- **Refused operations**, through an audit hook (`sys.addaudithook`) installed by a small bootstrap before the
  program's code is compiled and executed: creating sockets and any other `socket.*` event (so no network, no
  DNS); `os.fork`, `os.forkpty`, `os.exec*`, `os.posix_spawn*`, `os.spawn*`, `os.system`, `subprocess.Popen` and
  `_posixsubprocess.fork_exec` (no child processes); `os.kill`/`os.killpg`/`signal.pthread_kill`; `ctypes` (its
  import and every `ctypes.*` event); `resource.setrlimit`/`prlimit`; `chmod`/`chown`; `gc.get_objects` and
  friends; and writing, creating, renaming or deleting files outside the working directory (reads are allowed
  anywhere). A refused operation raises `PermissionError("sandbox: ... is not allowed")` in the program; if it
  ends the program, the status is "refused".
- **A network namespace of its own, where available.** If `unshare --user --map-root-user --net` works without
  privileges (checked once, quickly), the program also runs in a new user and network namespace: it sees only a
  loopback interface that is down, so even native code cannot reach 127.0.0.1 or the network (and it sees itself
  as uid 0 of that namespace, which gives it nothing outside). Otherwise only the audit hook keeps the program off
  the network.

What it does NOT guarantee: an audit hook is not a security boundary. It stops accidents and the naive ways a
model's program could do harm (a fork bomb, a stray `rm`, a request to a server), not a hostile program: native code
(a compiled extension importable from the standard library path, a bug in the interpreter) is not watched, and
Python code can reach the hook's state through frame introspection; a write through a directory descriptor
(`os.open(name, flags, dir_fd=...)`) is checked against the working directory, not against that directory. Reads are
not restricted (the program can read any file the trainer's user can). RLIMIT_AS limits virtual memory, which can
run out before that much memory is really used. Threads are allowed; RLIMIT_NPROC is not set, because it counts
every process and thread of the whole user (a low value breaks the common `threading` deep-recursion idiom, a high
one stops nothing) and is not enforced for root; forks are refused by the hook and the group is killed instead. A
process that left the group (`setsid` after a fork past the hook) would survive. Many files of up to
`max_file_bytes` each can still be written inside the working directory within the time limit. For untrusted code at
scale, run the trainer itself in a container or VM.

Only Python runs locally; other languages raise `ValueError`.
"""

from __future__ import annotations

import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "refused"]

DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
DEFAULT_MAX_FILE_BYTES = 16 << 20
LANGUAGES = ("python",)

# Exit codes the bootstrap uses to say why the program ended (a program exiting with them itself is rare and only
# changes the status label of a failed run).
_EXIT_MEMORY = 117
_EXIT_REFUSED = 118
_SOURCE_NAME = "solution.py"
_READ_CHUNK = 1 << 16
_DRAIN_SECONDS = 1.0  # after the group is killed, how long to wait for the pipes to close

# The child's bootstrap (run with `python -I -S -B -X utf8 -c`): set the limits, install the audit hook, then run
# solution.py as __main__. argv: cpu_seconds memory_bytes file_bytes.
_BOOTSTRAP = r"""
import os, sys

def _limit():
    import resource
    cpu, memory, fsize = (int(a) for a in sys.argv[1:4])
    wanted = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_FSIZE, fsize, fsize),
              (resource.RLIMIT_NOFILE, 64, 64), (resource.RLIMIT_CORE, 0, 0)]
    if memory > 0:
        wanted.append((resource.RLIMIT_AS, memory, memory))
    for which, soft, hard in wanted:
        _, old_hard = resource.getrlimit(which)
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))

def _install(refused):
    import _posixsubprocess
    root = os.path.realpath(os.getcwd())
    prefix = root + os.sep
    realpath, fsdecode = os.path.realpath, os.fsdecode
    banned = frozenset({
        "os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile",
        "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit",
        "resource.prlimit", "os.chmod", "os.chown", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.remote_exec",
    })
    banned_prefixes = ("socket.", "ctypes.")
    banned_imports = frozenset({"_ctypes", "ctypes", "_posixsubprocess"})
    path_args = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
                 "os.symlink": (1,), "os.truncate": (0,), "os.utime": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
                 "shutil.rmtree": (0,)}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

    def refuse(what):
        refused.append(what)
        raise PermissionError(f"sandbox: {what} is not allowed")

    def inside(path):
        if isinstance(path, int):
            return True  # an already open descriptor
        resolved = realpath(fsdecode(path))
        return resolved == root or resolved.startswith(prefix)

    def hook(event, args):
        if event in banned or event.startswith(banned_prefixes):
            refuse(event)
        elif event == "open":
            path, flags = args[0], args[2]
            if flags & write_flags and not inside(path):
                refuse(f"writing {path!r} outside the working directory")
        elif event in path_args:
            for i in path_args[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    refuse(f"{event} on {args[i]!r} outside the working directory")
        elif event == "import" and args[0] in banned_imports:
            refuse(f"importing {args[0]}")

    def fork_exec(*args, **kwargs):
        refuse("_posixsubprocess.fork_exec")

    _posixsubprocess.fork_exec = fork_exec  # imported by `subprocess`; re-importing it is refused below
    sys.addaudithook(hook)

def _run():
    import sys  # the module's globals are cleared for the program below
    refused = []
    _limit()
    with open(__SOURCE__, "rb") as f:
        source = f.read()
    _install(refused)
    main = sys.modules["__main__"].__dict__
    for name in [n for n in main if n not in ("__name__", "__doc__", "__builtins__", "__spec__", "__package__")]:
        del main[name]
    main["__file__"] = __SOURCE__
    sys.argv[:] = [__SOURCE__]
    try:
        exec(compile(source, __SOURCE__, "exec"), main)
    except MemoryError:
        main.clear()
        sys.stderr.write("MemoryError: the program exceeded its memory limit\n")
        sys.exit(__EXIT_MEMORY__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        import traceback
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # from the program's own frames
        sys.exit(__EXIT_REFUSED__ if refused else 1)

_run()
""".replace("__SOURCE__", repr(_SOURCE_NAME))
_BOOTSTRAP = _BOOTSTRAP.replace("__EXIT_MEMORY__", str(_EXIT_MEMORY)).replace("__EXIT_REFUSED__", str(_EXIT_REFUSED))


@dataclass(frozen=True)
class RunResult:
    """How one program run ended.

    status: "ok" (exit code 0), "error" (non-zero exit, an uncaught exception, a signal), "timeout" (wall-clock or
    CPU limit), "memory" (memory limit), "output_limit" (stdout or stderr over the cap), "refused" (ended by a
    refused operation, e.g. a socket or a fork).
    returncode: the exit code, or minus the signal number that ended it. stdout/stderr: decoded as UTF-8 (bad bytes
    replaced), at most `max_output_bytes` each. seconds: wall-clock time. truncated: an output was cut at the cap.
    """

    status: Status
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ------------------------------------------------------------------------------------------------ network namespace

_NETNS_LOCK = threading.Lock()
_NETNS_PREFIX: list[str] | None = None


def _netns_prefix() -> list[str]:
    """`unshare --user --map-root-user --net` if it runs a program unprivileged here (checked once), else []."""
    global _NETNS_PREFIX
    with _NETNS_LOCK:
        if _NETNS_PREFIX is None:
            _NETNS_PREFIX = []
            unshare = shutil.which("unshare")
            if unshare is not None and sys.platform.startswith("linux"):
                prefix = [unshare, "--user", "--map-root-user", "--net"]
                try:
                    probe = subprocess.run(
                        [*prefix, sys.executable, "-I", "-S", "-c", "pass"],
                        capture_output=True,
                        timeout=2.0,
                        env=_environment(tempfile.gettempdir()),
                    )
                    if probe.returncode == 0:
                        _NETNS_PREFIX = prefix
                except (OSError, subprocess.SubprocessError):
                    pass
        return list(_NETNS_PREFIX)


# ---------------------------------------------------------------------------------------------------- one process


def _environment(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def _kill_group(pgid: int) -> None:
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


# ---------------------------------------------------------------------------------------------------- public API


def _positive(name: str, value: Any, *, integer: bool = False) -> float:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0 or not math.isfinite(value):
        kind = "int" if integer else "number"
        raise ValueError(f"sandbox: `{name}` must be a positive {kind}, got {value!r}")
    return value


def check_language(language: Any, owner: str = "sandbox") -> str:
    """`language` if the local sandbox can run it, else a ValueError naming it."""
    if language not in LANGUAGES:
        raise ValueError(
            f"{owner}: language {language!r} cannot run in the local sandbox, which runs {', '.join(LANGUAGES)} only"
        )
    return language


def run_program(
    source: str,
    stdin: str = "",
    *,
    language: str = "python",
    timeout: float = DEFAULT_TIMEOUT,
    cpu_seconds: int | None = None,
    memory_mb: int | None = DEFAULT_MEMORY_MB,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> RunResult:
    """Run the program `source` with `stdin` in the sandbox (see the module docstring for what it guarantees).

    `timeout` is wall-clock seconds; `cpu_seconds` defaults to `ceil(timeout)`; `memory_mb=None` sets no memory
    limit. Never raises for what the program does; raises ValueError for bad arguments or a language other than
    Python.

    >>> run_program("print(sum(map(int, input().split())))", "2 3\\n").stdout
    '5\\n'
    >>> run_program("while True: pass", timeout=0.5).status
    'timeout'
    """
    check_language(language)
    if not isinstance(source, str) or not isinstance(stdin, str):
        raise ValueError("sandbox: `source` and `stdin` must be strings")
    timeout = float(_positive("timeout", timeout))
    cpu = int(_positive("cpu_seconds", cpu_seconds, integer=True)) if cpu_seconds is not None else math.ceil(timeout)
    memory = int(_positive("memory_mb", memory_mb, integer=True)) << 20 if memory_mb is not None else 0
    max_output_bytes = int(_positive("max_output_bytes", max_output_bytes, integer=True))
    max_file_bytes = int(_positive("max_file_bytes", max_file_bytes, integer=True))

    workdir = tempfile.mkdtemp(prefix="grpokit-sandbox-")
    try:
        with open(os.path.join(workdir, _SOURCE_NAME), "w", encoding="utf-8") as f:
            f.write(source)
        argv = [
            *_netns_prefix(),
            sys.executable,
            "-I",
            "-S",
            "-B",  # no .pyc writes (outside the working directory, they would be refused)
            "-X",
            "utf8",
            "-c",
            _BOOTSTRAP,
            str(cpu),
            str(memory),
            str(max_file_bytes),
        ]
        reason, code, out, err, seconds, truncated, cpu_used = _execute(
            argv,
            stdin.encode("utf-8"),
            cwd=workdir,
            env=_environment(workdir),
            timeout=timeout,
            max_output_bytes=max_output_bytes,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if reason != "exited":
        status = reason
    elif code == 0:
        status = "ok"
    elif code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu_used >= cpu):
        status = "timeout"
    elif code == _EXIT_MEMORY:
        status = "memory"
    elif code == _EXIT_REFUSED:
        status = "refused"
    else:
        status = "error"
    decode = lambda data: data.decode("utf-8", errors="replace")  # noqa: E731
    return RunResult(status, code, decode(out), decode(err), seconds, truncated)


def run_many(jobs: Iterable[Mapping[str, Any]], *, workers: int = 2) -> list[RunResult]:
    """Run several programs, at most `workers` at a time; results in the order of `jobs`.

    Each job is a mapping of `run_program` arguments: `{"source": ..., "stdin": ..., "timeout": ...}`.

    >>> [r.stdout for r in run_many([{"source": "print(1)"}, {"source": "print(2)"}], workers=2)]
    ['1\\n', '2\\n']
    """
    jobs = [dict(job) for job in jobs]
    workers = int(_positive("workers", workers, integer=True))
    for job in jobs:
        if "source" not in job:
            raise ValueError("sandbox: each job needs a 'source'")
        check_language(job.get("language", "python"))
    if not jobs:
        return []
    if workers == 1 or len(jobs) == 1:
        return [run_program(**job) for job in jobs]
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="grpokit-sandbox") as pool:
        return list(pool.map(lambda job: run_program(**job), jobs))
