"""A local sandbox for running untrusted Python programs (model completions) against test inputs.

`run_program(source, stdin)` runs one program and returns a `RunResult`; `run_many(jobs, workers=N)` runs several
at once (threads, each waiting on its own subprocess) and returns the results in input order. `check_boundary()`
says, in one line, why programs cannot run here (the code rewards call it when they are built, before any model
loads).

The boundary is the kernel's, set up by bubblewrap (`bwrap`, the system package `bubblewrap`) for each run, started
by a short launcher (`_launcher`: util-linux's `unshare`, `mount` and `setpriv`, and `/bin/sh`):

- **Never the machine's root.** A trainer running as root (as CI does, and most training containers) launches each
  run in a mount namespace of its own (`unshare --mount`), stages the working directory and the Python install there
  (see below), then becomes `SANDBOX_UID` (65534, "nobody"; `setpriv`: no supplementary groups, no capabilities,
  an empty bounding set, no_new_privs) and execs bwrap, which makes its user namespace as that user. On the machine
  the program is uid 65534: sysctl files and device nodes, checked by owner and mode, are root's, so it can write
  the first no more than it can chmod the second, and RLIMIT_NPROC binds it (it is not enforced for root). A trainer
  running as an ordinary user needs no such step: the program is that user on the machine (it cannot become another
  without privileges), in a user namespace of the launcher's own (`unshare --user --map-root-user --mount`) where
  the staging is done; where that user may not make one with `unshare` (bwrap alone is allowed, as under some
  AppArmor profiles), bwrap starts alone and the working directory's names are not capped (said once). What this
  needs: as root, CAP_SYS_ADMIN and CAP_SETUID (a container's root without CAP_SYS_ADMIN gets a one-line error
  naming it: run the trainer as an ordinary user there) and unprivileged user namespaces for uid 65534; as an
  ordinary user, unprivileged user namespaces (bwrap needed them already).
- **Namespaces of its own** (`--unshare-all --unshare-user`): a new user namespace with no capabilities at all
  (`--cap-drop ALL`: as root, bwrap would otherwise keep every capability inside it), and new PID, mount, network,
  IPC, UTS and (where the kernel allows) cgroup namespaces. The program is PID 1 of its PID namespace
  (`--as-pid-1`) with a fresh `/proc`: no other process of the machine is visible, so none can be signalled,
  traced or read (`os.getppid()` is 0); the network namespace has only a loopback interface of its own, where
  nothing listens, so no connection reaches the machine's 127.0.0.1, its abstract Unix sockets or the network.
- **A filesystem of its own**: an empty root (read-only) holding read-only binds of `/usr` (with the `/bin`, `/lib`,
  `/lib64`, `/sbin` links), the dynamic loader's cache and the Python install running the trainer (`sys.base_prefix`:
  the interpreter and its standard library; not the virtual environment, since the program runs with
  `python -I -S`), a read-only minimal `/dev` (so no POSIX shared memory: `/dev/shm` is read-only too), and the
  working directory `/sandbox` (also `HOME` and `TMPDIR`), the only writable place: a fresh tmpfs of `disk_mb`
  (64 MiB) for all its files together and one name (file, directory, hard link, symlink) per 16 KiB of it
  (`BYTES_PER_NAME`: 4,096 names by default, 512 for 8 MiB; names cost kernel memory that no size counts, about
  1 KiB each, and can carry data: 248-byte names and 100-byte symlink targets stored 11 MB in a 8 MiB directory
  before the cap; the tmpfs is 384 bytes smaller per name allowed, what a name and an inline symlink target can
  hold, so that data and names together stay within `disk_mb`), holding the program, gone with the run's mount
  namespace; writing more, or more names, fails with ENOSPC. Nothing is written on the trainer's disk. Home directories (beyond the Python install, when it
  lives in one, as pyenv's does), the checkout, datasets, checkpoints, other runs' files and `/etc` (beyond the
  loader cache and the time zone) do not exist there. `/sys` does not exist; `/proc/sys` is the machine's,
  read-only (EROFS, whoever the program is); `/proc/keys` and `/proc/key-users` are empty files (they list the keys
  of the trainer's session keyring, which the program inherits). The device nodes (`null`, `zero`, `full`,
  `random`, `urandom`, `tty`) are the machine's own inodes, bound in by bwrap so that they work; uid 65534 does
  not own them, so it cannot chmod them.
- **A clean environment** (`--clearenv`): `PATH`, `HOME`, `TMPDIR`, `LANG`, `LC_ALL` (and bwrap's `PWD`) only.
- **An allowlist of system calls** (a seccomp filter, `_seccomp.py`): what CPython needs to run a program, and
  nothing else. New processes (`fork`, `vfork`, non-thread `clone`), new namespaces, `ptrace` and `process_vm_*`
  fail with EPERM; threads work; every call outside the list fails with ENOSYS: kernel keyrings (not namespaced:
  a key of the trainer's would be readable), io_uring, bpf, perf events, userfaultfd, mounts, kexec,
  `memfd_create`, System V IPC, POSIX message queues. Sockets of other families than Unix fail (the program has
  no network to reach, and internet sockets' buffers are what a cgroup v1 does not count), and so do growing a
  socket's buffers (SO_SNDBUF, SO_RCVBUF) and a pipe's. Two calls pass any seccomp filter, by the kernel's design:
  `uretprobe` (Linux 6.11+) and `uprobe` (6.16+, x86_64); they only return from a probe that the machine's root
  set, and kill a process that has none. On an architecture the filter does not know (only x86_64 and aarch64
  are), there is no filter; a forked process still dies with the run.
- **At most `MAX_THREADS` (64) tasks**, its main thread included: RLIMIT_NPROC, counted in the run's own user
  namespace (not enforced for root: hence the uid drop), and a pids cgroup per run where one can be made (v1 or v2;
  `pids.max` 66: bwrap's process and the launcher's `mount` besides). A thread costs the machine's process table a
  PID wherever it runs: 64 of them against a `pid_max` of 32,768 or more.
- **A memory cgroup per run** (`_cgroup.py`, where one can be made: root, or a delegated cgroup; v1 or v2):
  `memory_mb` bounds everything the run makes the kernel hold, not only its address space: files in its working
  directory, shared memory, pipe and Unix socket buffers, kernel objects; no swap. On cgroup v1, TCP buffers have
  a counter of their own that counts only once it has a limit: a run gets 1/16 of `memory_mb` there and the rest
  for everything else (measured with the filter off: 15 loopback connections written and never read held 4 MiB of
  a 64 MiB run, 157 MiB with no cgroup). On v2 memory.max counts socket buffers with the rest. At the limit the
  kernel's OOM killer ends the run (status "memory"), never the trainer. Where none can be made, a warning says so once: `memory_mb`
  then bounds the address space, and the working directory (`disk_mb`, and its names), pipe buffers (64 files of
  64 KiB) and Unix socket buffers (at the machine's default size, `net.core.wmem_default`: 30 socketpairs filled
  and never read held 6 MiB here, 235 MiB when the filter let them grow) come on top.
- **Its lifetime**: `--die-with-parent` kills the program when the trainer dies (even by SIGKILL); `--new-session`
  detaches it from the trainer's terminal; at the end of a run its PID 1 and bwrap's process group are killed,
  which ends the PID namespace and everything in it before `run_program` returns. No process outlives the run.

On top of that, inside the interpreter:

- **Limits.** Wall-clock `timeout` (the run is killed; status "timeout"); CPU time `cpu_seconds` (RLIMIT_CPU;
  status "timeout"); address space `memory_mb` (RLIMIT_AS; a `MemoryError` gives status "memory"); the size of any
  file written, `max_file_bytes` (RLIMIT_FSIZE; writing more fails with EFBIG); 64 open files (RLIMIT_NOFILE); no
  core dumps. The bootstrap sets them before the program's code runs.
- **Output caps.** stdout and stderr are each read up to `max_output_bytes`; one byte more kills the run
  (status "output_limit", `truncated=True`).
- **An audit hook** (`sys.addaudithook`), a second layer that turns the common mistakes into a clear status
  "refused" with `PermissionError("sandbox: ... is not allowed")`: sockets, child processes, signals, `ctypes`,
  raising limits, `chmod`/`chown`, `gc` introspection, replacing a function's `__code__`, and writes outside the
  working directory. A hostile program can get past it (Python can reach its state); the kernel's boundary above
  does not depend on it.

What it does not guarantee: the program may use its CPU, memory and disk limits in full until its time is up (the
cgroup's OOM kill may come a little after the limit is crossed; RLIMIT_AS limits virtual memory, which can run out
before that much memory is really used). It can read what every program on the machine can read in `/usr` and the
Python install, and use the system calls of the allowlist, whose kernel code it relies on: a kernel bug in them is
not contained. Without a memory cgroup, memory is bounded as said above, not by `memory_mb` alone.

A trainer killed mid-run leaves its lock (and, with a cgroup, the run's empty cgroup; in the unsafe mode its
working folders): the next trainer sweeps them once it proves the owner dead by taking its lock (`_leftovers.py`).

Where the boundary cannot be set up (bwrap missing, or unable to create user namespaces: some container runtimes,
`kernel.apparmor_restrict_unprivileged_userns=1`), `run_program` raises `SandboxUnavailable` naming what is missing,
unless `GRPOKIT_UNSAFE_SANDBOX=1` asks for the unsafe local mode: the program then runs as the trainer's user with
the limits, caps and audit hook only, in a new session whose process group is killed at the end, and a warning says
so once per process.

Only Python runs locally; other languages raise `ValueError`.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from . import _cgroup, _leftovers, _seccomp
from ._process import _execute

logger = logging.getLogger("grpokit.rewards")

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "refused"]

DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
DEFAULT_MAX_FILE_BYTES = 16 << 20
DEFAULT_DISK_MB = 64
LANGUAGES = ("python",)
UNSAFE_ENV = "GRPOKIT_UNSAFE_SANDBOX"
INSTALL_HINT = "apt-get install bubblewrap (dnf, zypper, pacman, apk: bubblewrap)"

# Exit codes the bootstrap uses to say why the program ended (a program exiting with them itself is rare and only
# changes the status label of a failed run).
_EXIT_MEMORY = 117
_EXIT_REFUSED = 118
_SOURCE_NAME = "solution.py"
_PROBE_SECONDS = 10.0  # the one-time check that bwrap works here (it takes about 50 ms)

# The child's bootstrap (run with `python -I -S -B -X utf8 -c`): set the limits, install the audit hook, then run
# solution.py as __main__. argv: cpu_seconds memory_bytes file_bytes audit_hook(1/0) max_tasks (0: none).
_BOOTSTRAP = r"""
import os, sys

def _limit():
    import resource
    cpu, memory, fsize = (int(a) for a in sys.argv[1:4])
    tasks = int(sys.argv[5])
    # soft = hard: SIGKILL when the CPU time is used up (as PID 1 of its namespace, SIGXCPU would be ignored)
    wanted = [(resource.RLIMIT_CPU, cpu, cpu), (resource.RLIMIT_FSIZE, fsize, fsize),
              (resource.RLIMIT_NOFILE, 64, 64), (resource.RLIMIT_CORE, 0, 0)]
    if memory > 0:
        wanted.append((resource.RLIMIT_AS, memory, memory))
    if tasks > 0:  # counted in the run's own user namespace; not enforced for the machine's root
        wanted.append((resource.RLIMIT_NPROC, tasks, tasks))
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
        elif event == "object.__setattr__" and args[1] == "__code__":
            refuse("replacing a function's __code__")  # the simplest way to switch this hook off

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
    if sys.argv[4] == "1":
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


# ---------------------------------------------------------------------------------------------------- the boundary


class SandboxUnavailable(ValueError):
    """The kernel's boundary cannot be set up here (bwrap missing or unable to create namespaces).

    A ValueError, as a setting this machine cannot honour: the trainer's command reports it in one line."""


# Host paths the program sees read-only (when they exist): the libraries and the loader's cache; the Python install
# is added by `_read_only_paths`. A link among them (`/bin -> usr/bin`) is recreated as a link.
_SYSTEM_PATHS = (
    "/usr",
    "/bin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
)

_BOUNDARY_LOCK = threading.Lock()
_BOUNDARY: dict[str, str | None] = {}  # filled once: {"bwrap": path or None, "problem": line or None}
_WARNED_UNSAFE = threading.Event()


_WORKDIR = "/sandbox"  # the program's working directory inside the sandbox: a tmpfs of `disk_mb`
_WARNED_NO_CGROUP = threading.Event()
_WARNED_NO_STAGE = threading.Event()

SANDBOX_UID = SANDBOX_GID = 65534  # "nobody": who a program is on the machine when the trainer is root
MAX_THREADS = 64  # a run's tasks at once, its main thread included (pids cgroup, and RLIMIT_NPROC)
BYTES_PER_NAME = 16 << 10  # `disk_mb` allows one name (file, directory, link) per 16 KiB
# What one name can hold beyond the tmpfs's size: 255 bytes of name and a symlink target under 128 bytes, which tmpfs
# keeps in the inode. The tmpfs is that much smaller per name, so that data and names together stay within disk_mb.
NAME_BYTES = 384
_MIN_NAMES = 64
_LAUNCH_TASKS = 2  # besides the program's: bwrap's own process, and the launcher's `mount` while it runs
_STAGE_POINTS = ("/tmp", "/var/tmp", "/mnt", "/srv", "/opt")
# What the defences below are called when a test switches one off (`_run(without=...)`).
DEFENCES = frozenset({"uid", "proc", "inodes", "pids", "nproc"})


def _hierarchy(controller: str) -> tuple[_cgroup.Hierarchy | None, str]:
    """Where this process's run cgroups of `controller` go, or (None, why none can be made here); looked up once."""
    return _cgroup.find(f"{_leftovers.PREFIX}probe-{os.getpid()}", controller=controller)


def _token() -> str:
    """This trainer process's token (see `_leftovers`); the first call removes what dead trainers left."""
    parents = [h.parent for h in (_hierarchy("memory")[0], _hierarchy("pids")[0]) if h is not None]
    return _leftovers.token(tempfile.gettempdir(), sorted(set(parents)))


def _new_workdir() -> str:
    """A fresh host folder for one program of the unsafe mode, `<tmp>/grpokit-sandbox-<token>-*` (removed after
    the run; the sweep removes those a dead trainer left)."""
    return tempfile.mkdtemp(prefix=f"{_leftovers.PREFIX}{_token()}-")


_RUN_NUMBERS = itertools.count()


def _run_cgroups(memory: int, tasks: int) -> tuple[_cgroup.Hierarchy | None, list[str]]:
    """Fresh cgroups for one run: memory (at most `memory` bytes; 0: none) and pids (at most `tasks`; 0: none).
    Returns the memory hierarchy (None: no memory cgroup) and the cgroups made, the memory one first. Where a
    memory cgroup cannot be made here, that is said once per process."""
    memory_hierarchy = pids_hierarchy = None
    if memory:
        memory_hierarchy, reason = _hierarchy("memory")
        if memory_hierarchy is None and not _WARNED_NO_CGROUP.is_set():
            _WARNED_NO_CGROUP.set()
            logger.warning(
                "sandbox: no memory cgroup can be made here (%s): `memory_mb` bounds a program's address space "
                "only; what the kernel holds for it (files in its working directory, up to `disk_mb`, pipe and "
                "socket buffers) comes on top",
                reason,
            )
    if tasks:
        pids_hierarchy, _ = _hierarchy("pids")  # without it, RLIMIT_NPROC still caps the threads
    name = f"{_leftovers.PREFIX}{_token()}-{next(_RUN_NUMBERS)}" if memory_hierarchy or pids_hierarchy else ""
    groups: list[str] = []
    try:
        if memory_hierarchy is not None:
            groups.append(memory_hierarchy.create(name, memory))
        if pids_hierarchy is not None:
            if memory_hierarchy is not None and pids_hierarchy.parent == memory_hierarchy.parent:  # v2: one cgroup
                pids_hierarchy.set_limit(groups[0], tasks)
            else:
                groups.append(pids_hierarchy.create(name, tasks))
    except BaseException:
        for group in groups:
            _cgroup.remove(group)
        raise
    return memory_hierarchy, groups


def _interpreter() -> str:
    """The Python install's own binary (a virtual environment's `python` is a link to it; `-I -S` needs no more)."""
    return os.path.realpath(sys.executable)


def _read_only_paths() -> list[str]:
    """`_SYSTEM_PATHS` plus the Python install, without a path that another one already contains."""
    install = [sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(_interpreter()))]
    paths = []
    for path in sorted({*_SYSTEM_PATHS, *(os.path.realpath(p) for p in install)}, key=len):
        if os.path.lexists(path) and not any(path.startswith(kept.rstrip("/") + "/") for kept in paths):
            paths.append(path)
    return paths


def _staged_paths() -> list[str]:
    """The read-only paths that are not the system's: the Python install, which may sit where the sandbox's
    unprivileged identity cannot look (pyenv's under root's 0700 home); the launcher binds them for bwrap."""
    return [p for p in _read_only_paths() if p not in _SYSTEM_PATHS and not os.path.islink(p)]


def _stage_point() -> str | None:
    """A host directory the launcher may cover with its staging tmpfs (in its own mount namespace only): one that
    holds none of the read-only paths."""
    for point in _STAGE_POINTS:
        if os.path.isdir(point) and not os.path.islink(point):
            if not any(p == point or p.startswith(point + "/") for p in _read_only_paths()):
                return point
    return None


def _names(disk: int) -> int:
    """How many names (inodes: files, directories, links, symlinks) a working directory of `disk` bytes holds."""
    return max(_MIN_NAMES, disk // BYTES_PER_NAME)


def _stage_script(stage: str, *, disk: int, owner: int, inodes: bool) -> str:
    """The launcher's shell script, run as root of a mount namespace of its own: a staging tmpfs holding the
    working directory (a tmpfs of `disk` bytes and `_names(disk)` names, owned by `owner`) and binds of the staged
    paths (`p0`, `p1`, ...); then it execs its arguments (bwrap, or setpriv then bwrap)."""
    q = shlex.quote
    work = f"{stage}/work"
    size = disk - _names(disk) * NAME_BYTES if inodes else disk
    options = f"size={size},mode=0700,uid={owner},gid={owner}" + (f",nr_inodes={_names(disk)}" if inodes else "")
    lines = ["set -e", f"mount -t tmpfs -o size=65536,mode=0755 grpokit-stage {q(stage)}"]
    staged = _staged_paths()
    lines.append("mkdir " + " ".join(q(d) for d in [work, *(f"{stage}/p{i}" for i in range(len(staged)))]))
    lines.append(f"mount -t tmpfs -o {options} grpokit-sandbox {q(work)}")
    lines += [f"mount --bind {q(path)} {q(f'{stage}/p{i}')}" for i, path in enumerate(staged)]
    lines.append('exec "$@"')
    return "\n".join(lines)


def _bwrap_argv(
    bwrap: str,
    *,
    disk: int,
    source_fd: int,
    seccomp_fd: int | None,
    stage: str | None = None,
    empty_fds: tuple[int, ...] = (),
) -> list[str]:
    """bwrap's options for one run (the command follows): its working directory is a fresh tmpfs of `disk` bytes
    holding the program read from `source_fd`; `seccomp_fd` holds the filter, or None. With `stage`, the working
    directory and the staged paths come from the launcher's staging tmpfs (`_stage_script`); without it, bwrap makes
    the tmpfs itself (no cap on names). With two `empty_fds` (empty files), `/proc/sys` is read-only and the keyrings'
    listings are those empty files."""
    argv = [bwrap, "--unshare-all", "--unshare-user", "--cap-drop", "ALL", "--as-pid-1", "--die-with-parent"]
    argv += ["--new-session", "--hostname", "sandbox", "--clearenv"]
    for name, value in _environment(_WORKDIR).items():
        argv += ["--setenv", name, value]
    staged = _staged_paths() if stage else []
    for path in _read_only_paths():
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif path in staged:
            argv += ["--ro-bind", f"{stage}/p{staged.index(path)}", path]
        else:
            argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc"]
    if empty_fds:  # sysctls stay the machine's; /proc/keys would list the keys of the trainer's session keyring
        argv += ["--ro-bind", "/proc/sys", "/proc/sys"]
        argv += [
            "--ro-bind-data",
            str(empty_fds[0]),
            "/proc/keys",
            "--ro-bind-data",
            str(empty_fds[1]),
            "/proc/key-users",
        ]
    argv += ["--dev", "/dev", "--remount-ro", "/dev"]
    argv += ["--bind", f"{stage}/work", _WORKDIR] if stage else ["--size", str(disk), "--tmpfs", _WORKDIR]
    argv += ["--file", str(source_fd), f"{_WORKDIR}/{_SOURCE_NAME}", "--chdir", _WORKDIR]
    argv += ["--remount-ro", "/"]  # last: the mounts above need their mount points made
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv


_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def _launcher(
    bwrap: str,
    *,
    disk: int,
    source_fd: int,
    seccomp_fd: int | None,
    groups: list[str] = (),  # type: ignore[assignment]
    empty_fds: tuple[int, ...] = (),
    mode: str,
    without: frozenset[str] = frozenset(),
) -> list[str]:
    """The command line that starts bwrap for one run (the program's command follows it).

    - dies with the trainer from its first exec on (`setpriv --pdeathsig`, where util-linux's setpriv is installed),
      and stops at once if the trainer died before that;
    - joins the run's cgroups first (a shell that writes its pid, then execs the rest), so nothing is outside them;
    - "root" mode (the trainer is root): a mount namespace of its own (`unshare --mount`) where the staging script
      makes the working directory and binds the Python install, then `setpriv` becomes `SANDBOX_UID` with no
      groups, no capabilities and no_new_privs, and execs bwrap, which makes its user namespace as that user;
    - "user" mode (an ordinary user): the same, in a user namespace of its own (`unshare --user --map-root-user`),
      where the trainer's user is root; no `setpriv`: the program is the trainer's user on the machine;
    - "plain" mode (an ordinary user who cannot make a user namespace with `unshare`): bwrap alone.
    """
    caps_names = mode != "plain" and "inodes" not in without
    drops_uid = mode == "root" and "uid" not in without  # the Python install is bound in before the drop
    stage = _stage_point() if caps_names or drops_uid else None
    empty_fds = () if "proc" in without else empty_fds
    argv = _bwrap_argv(bwrap, disk=disk, source_fd=source_fd, seccomp_fd=seccomp_fd, stage=stage, empty_fds=empty_fds)
    if drops_uid:  # changing the uid clears the parent-death signal: set again after it (bwrap sets its own too)
        drop = [f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_GID}", "--clear-groups", "--inh-caps=-all"]
        argv = ["setpriv", *drop, "--bounding-set=-all", "--no-new-privs", "--pdeathsig", "KILL", "--", *argv]
    if stage is not None:
        owner = SANDBOX_UID if drops_uid else 0
        script = _stage_script(stage, disk=disk, owner=owner, inodes="inodes" not in without)
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if mode == "user":
            unshare[1:1] = ["--user", "--map-root-user"]
        argv = [*unshare, "/bin/sh", "-c", script, "sh", *argv]
    if groups:
        argv = ["/bin/sh", "-c", _JOIN, "sh", *(os.path.join(g, "cgroup.procs") for g in groups), "--", *argv]
    if shutil.which("setpriv"):
        # bwrap's --die-with-parent comes only once bwrap runs: a trainer killed while the launcher stages the run
        # would leave it orphaned, to start the program anyway. So the first exec already dies with the trainer
        # (the signal is kept across the execs up to the uid change above), and stops if the trainer died before.
        guard = f'[ "$PPID" = {os.getpid()} ] || exit 125; exec "$@"'
        argv = ["setpriv", "--pdeathsig", "KILL", "--", "/bin/sh", "-c", guard, "sh", *argv]
    return argv


def _memfd(name: str, data: bytes) -> int:
    """A descriptor of `data` from its start (bwrap reads it to the end)."""
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _empty_fds() -> list[int]:
    """Two empty files for bwrap to put over /proc/keys and /proc/key-users (each is read once)."""
    return [_memfd("grpokit-sandbox-empty", b""), _memfd("grpokit-sandbox-empty", b"")]


def _seccomp_fd() -> int | None:
    """A fresh descriptor of the seccomp filter for one bwrap, or None where there is none."""
    program = _seccomp.program()
    return None if program is None else _memfd("grpokit-sandbox-seccomp", program)


def _probe(bwrap: str, mode: str) -> str | None:
    """None if bwrap runs a program behind the full boundary here, launched in `mode`, else the complaint."""
    fds = [_memfd("grpokit-sandbox-probe", b"print('ok')\n"), *_empty_fds()]
    seccomp = _seccomp_fd()
    if seccomp is not None:
        fds.append(seccomp)
    try:
        if mode != "plain" and _stage_point() is None:
            return f"no directory to stage the sandbox in (one of {', '.join(_STAGE_POINTS)} not holding Python)"
        launcher = _launcher(
            bwrap, disk=1 << 20, source_fd=fds[0], seccomp_fd=seccomp, empty_fds=tuple(fds[1:3]), mode=mode
        )
        argv = [*launcher, _interpreter()]
        probe = subprocess.run(
            [*argv, "-I", "-S", _SOURCE_NAME],
            capture_output=True,
            timeout=_PROBE_SECONDS,
            env=_environment(_WORKDIR),
            cwd="/",
            pass_fds=tuple(fds),
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        for fd in fds:
            os.close(fd)
    if probe.returncode == 0 and probe.stdout == b"ok\n":
        return None
    said = " ".join(probe.stderr.decode("utf-8", errors="replace").split())[:200]
    return said or f"exit code {probe.returncode}"


def _boundary() -> dict[str, str | None]:
    """Where bwrap is, how runs are launched ("root", "user" or "plain") and why programs cannot run here (None:
    they can), checked once per process."""
    with _BOUNDARY_LOCK:
        if not _BOUNDARY:
            bwrap = shutil.which("bwrap") if sys.platform.startswith("linux") else None
            mode = "root" if os.geteuid() == 0 else "user"
            _BOUNDARY.update(bwrap=bwrap, mode=mode, problem=None, unstaged=None)
            missing = [
                tool
                for tool in ("unshare", "mount", "setpriv")[: 3 if mode == "root" else 2]
                if shutil.which(tool) is None
            ]
            if bwrap is None:
                _BOUNDARY["problem"] = (
                    "running model programs needs bubblewrap (`bwrap`), which is not installed (or not on PATH): "
                    f"{INSTALL_HINT}"
                )
            elif mode == "root" and missing:
                _BOUNDARY["problem"] = (
                    f"running model programs as root needs util-linux's {', '.join(missing)}, not found on PATH "
                    "(apt-get install util-linux mount)"
                )
            elif mode == "root" and (said := _probe(bwrap, mode)) is not None:
                _BOUNDARY["problem"] = (
                    f"bubblewrap ({bwrap}) cannot set up the sandbox here for a trainer running as root: {said} "
                    f"(the trainer needs "
                    f"CAP_SYS_ADMIN and CAP_SETUID to stage it and become uid {SANDBOX_UID}, and bwrap must make "
                    f"a user namespace as that uid; in a container without them, run the trainer as an ordinary "
                    f"user)"
                )
            elif mode == "user" and (missing or (said := _probe(bwrap, mode)) is not None):
                why = f"{', '.join(missing)} not found" if missing else said
                _BOUNDARY.update(mode="plain", unstaged=why)
                if (said := _probe(bwrap, "plain")) is not None:
                    _BOUNDARY["problem"] = (
                        f"bubblewrap ({bwrap}) cannot set up the sandbox here: {said} (it needs unprivileged user "
                        "namespaces: sysctl kernel.unprivileged_userns_clone=1 or "
                        "kernel.apparmor_restrict_unprivileged_userns=0, or a container that allows them)"
                    )
        return dict(_BOUNDARY)


def unsafe_mode() -> bool:
    """Whether `GRPOKIT_UNSAFE_SANDBOX=1` asks for programs to run without the kernel's boundary."""
    return os.environ.get(UNSAFE_ENV) == "1"


def check_boundary(owner: str = "sandbox") -> None:
    """Raise SandboxUnavailable (one line, starting with `owner`) if programs cannot run behind the boundary here.

    In the unsafe mode it warns instead, once per process."""
    if unsafe_mode():
        if not _WARNED_UNSAFE.is_set():
            _WARNED_UNSAFE.set()
            logger.warning(
                "warning: %s=1: model programs run WITHOUT the sandbox's kernel boundary (no namespaces, no seccomp: "
                "the audit hook and limits only); a hostile program can read your files, kill the trainer and "
                "outlive the run",
                UNSAFE_ENV,
            )
        return
    boundary = _boundary()
    if boundary["problem"] is not None:
        raise SandboxUnavailable(
            f"{owner}: {boundary['problem']}; or set {UNSAFE_ENV}=1 to run them unsandboxed, at your risk"
        )
    if boundary["unstaged"] is not None and not _WARNED_NO_STAGE.is_set():
        _WARNED_NO_STAGE.set()
        logger.warning(
            "sandbox: the working directory cannot be staged here (%s): `disk_mb` bounds its data but not how many "
            "names it holds (the memory cgroup, where there is one, still counts them)",
            boundary["unstaged"],
        )


# ---------------------------------------------------------------------------------------------------- one process


def _environment(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


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
    disk_mb: int = DEFAULT_DISK_MB,
) -> RunResult:
    """Run the program `source` with `stdin` in the sandbox (see the module docstring for what it guarantees).

    `timeout` is wall-clock seconds; `cpu_seconds` defaults to `ceil(timeout)`; `memory_mb=None` sets no memory
    limit; `disk_mb` is the size of the working directory (all files together; writing more fails with ENOSPC). Never raises for what the program does; raises ValueError for bad arguments or a language other than
    Python, and SandboxUnavailable (a ValueError) where the boundary cannot be set up (see `check_boundary`).

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
    disk = int(_positive("disk_mb", disk_mb, integer=True)) << 20
    return _run(source, stdin, timeout, cpu, memory, max_output_bytes, max_file_bytes, disk)


def _run(
    source: str,
    stdin: str,
    timeout: float,
    cpu: int,
    memory: int,
    max_output_bytes: int,
    max_file_bytes: int,
    disk: int = DEFAULT_DISK_MB << 20,
    *,
    audit_hook: bool = True,
    seccomp: bool = True,
    cgroup: bool = True,
    without: frozenset[str] | set[str] = frozenset(),
) -> RunResult:
    """`run_program` on checked arguments. Tests switch layers off (`audit_hook=False`, `seccomp=False`,
    `cgroup=False`: the memory cgroup) and the other defences (`without`, names from `DEFENCES`: "uid" the uid drop
    of a root trainer, "proc" the read-only `/proc/sys` and hidden keyrings, "inodes" the cap on names, "pids" the
    pids cgroup, "nproc" RLIMIT_NPROC) to show that the others hold on their own."""
    without = frozenset(without)
    assert without <= DEFENCES, without - DEFENCES
    check_boundary()
    python = [_interpreter(), "-I", "-S", "-B", "-X", "utf8"]  # -B: no .pyc writes
    tasks = 0 if unsafe_mode() or "nproc" in without else MAX_THREADS
    limits = [str(cpu), str(memory), str(max_file_bytes), "1" if audit_hook else "0", str(tasks)]
    command = [*python, "-c", _BOOTSTRAP, *limits]
    if unsafe_mode():
        workdir = _new_workdir()
        try:
            with open(os.path.join(workdir, _SOURCE_NAME), "w", encoding="utf-8") as f:
                f.write(source)
            outcome = _execute(
                command,
                stdin.encode("utf-8"),
                cwd=workdir,
                env=_environment(workdir),
                timeout=timeout,
                max_output_bytes=max_output_bytes,
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        reason, code, out, err, seconds, truncated, cpu_used = outcome
        return RunResult(_status(reason, code, cpu_used, cpu), code, _decode(out), _decode(err), seconds, truncated)

    fds = [_memfd("grpokit-sandbox-source", source.encode("utf-8")), *_empty_fds()]
    hierarchy, groups = None, []
    boundary = _boundary()
    try:
        seccomp_fd = _seccomp_fd() if seccomp else None
        if seccomp_fd is not None:
            fds.append(seccomp_fd)
        pids = 0 if "pids" in without else MAX_THREADS + _LAUNCH_TASKS
        hierarchy, groups = _run_cgroups(memory if cgroup else 0, pids)
        prefix = _launcher(
            boundary["bwrap"],
            disk=disk,
            source_fd=fds[0],
            seccomp_fd=seccomp_fd,
            groups=groups,
            empty_fds=tuple(fds[1:3]),
            mode=boundary["mode"],
            without=without,
        )
        reason, code, out, err, seconds, truncated, cpu_used = _execute(
            [*prefix, *command],
            stdin.encode("utf-8"),
            cwd="/",
            env=_environment(_WORKDIR),
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            pass_fds=tuple(fds),
        )
        oom_killed = hierarchy is not None and hierarchy.oom_kills(groups[0]) > 0
    finally:
        for fd in fds:
            os.close(fd)
        for group in groups:
            _cgroup.remove(group)  # one still busy is left for the sweep
    if 128 < code < 128 + signal.NSIG:
        code = 128 - code  # bwrap reports a program ended by signal N as exit code 128 + N
    status = _status(reason, code, cpu_used, cpu)
    if oom_killed and status in ("error", "timeout"):
        status = "memory"  # the cgroup's OOM killer ended it (SIGKILL)
    return RunResult(status, code, _decode(out), _decode(err), seconds, truncated)


def _status(reason: str, code: int, cpu_used: float, cpu: int) -> Status:
    if reason != "exited":
        return reason
    if code == 0:
        return "ok"
    # RLIMIT_CPU kills with SIGKILL (soft = hard); the CPU time the kernel reports for the run can fall a little
    # short of the limit it enforced (seen: 1.96 s of 2), hence the margin.
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu_used >= 0.9 * cpu):
        return "timeout"
    if code == _EXIT_MEMORY:
        return "memory"
    if code == _EXIT_REFUSED:
        return "refused"
    return "error"


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


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
