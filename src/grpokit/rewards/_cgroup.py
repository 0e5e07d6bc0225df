"""A memory cgroup and a pids cgroup per sandboxed run: every byte a program makes the kernel hold counts against
`memory_mb`, and its threads against a fixed cap.

RLIMIT_AS bounds the program's address space only. Memory the kernel holds for it elsewhere does not count there:
System V shared memory (detached segments stay until the IPC namespace ends), files on a memory-backed directory
(the working directory is a tmpfs), pipe and socket buffers, kernel objects. A memory cgroup counts all of them,
charged to the process that made them; at `memory.max` the kernel's OOM killer ends the run (and only the run:
the cgroup is its own), and the run's status is "memory".

Each run gets a child cgroup `<parent>/grpokit-sandbox-<owner>-<n>` of the trainer's own cgroup, limit and no swap
set before the run's first process joins it (the sandbox's launcher writes its own pid into `cgroup.procs`, then
execs bwrap), removed afterwards. Both hierarchies are handled:

- cgroup v2 (most systems today): where the trainer's cgroup already has the memory controller in
  `cgroup.subtree_control`, or can have it (a delegated cgroup the trainer owns, with no process of its own in it);
- cgroup v1 (older systems, some container hosts): the memory hierarchy's directory of the trainer's cgroup, where
  the trainer may write (root, or a delegated hierarchy).

On cgroup v1, TCP buffers have a counter of their own, which counts nothing until a limit is set on it
(`memory.kmem.tcp.limit_in_bytes`): a run's limit is then split, 1/16 for TCP and the rest for everything else, so
the two together stay within it (measured: 15 loopback connections written and never read held 157 MiB beside a 64 MiB run
before, 4 MiB after). Unix socket buffers are charged to the memory counter itself on both versions (measured on v1: 235 MiB
queued in socketpairs, 250 MiB peak). On v2, socket memory is part of `memory.current` with the rest.

The pids controller (`find(..., controller="pids")`) bounds the number of tasks, threads included, that a run can
hold at once (`pids.max`); on v2 it lives in the same cgroup as the memory limit, on v1 in its own hierarchy.

`find()` looks once which one works here, by making and removing a test cgroup; where none does (an unprivileged
user without delegation, a container with a read-only `/sys/fs/cgroup`), it returns the reason, and the sandbox runs
with the other bounds only (its docstring says which).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass

_MOUNTINFO = "/proc/self/mountinfo"
_SELF = "/proc/self/cgroup"
_REMOVE_SECONDS = 1.0  # a run's last processes may take a moment to leave after its PID 1 died
_PAGE = 4096
TCP_SHARE = 16  # on cgroup v1, 1/16 of a run's memory limit is TCP's (the rest, everything else)


@dataclass(frozen=True)
class Hierarchy:
    """Where this process's run cgroups go (`parent`), which cgroup version's files they have and which controller
    they are made for ("memory" or "pids")."""

    version: int
    parent: str
    controller: str = "memory"

    def create(self, name: str, limit: int) -> str:
        """A new cgroup `name` under the parent with `limit` set (`set_limit`)."""
        path = os.path.join(self.parent, name)
        os.mkdir(path)
        try:
            self.set_limit(path, limit)
        except BaseException:
            os.rmdir(path)
            raise
        return path

    def set_limit(self, path: str, limit: int) -> None:
        """memory: at most `limit` bytes, no swap (on v1, TCP buffers' 1/16 included); pids: at most `limit` tasks."""
        if self.controller == "pids":
            _write(path, "pids.max", limit)
        elif self.version == 2:
            _write(path, "memory.max", limit)
            _write(path, "memory.swap.max", 0, optional=True)
            _write(path, "memory.oom.group", 1, optional=True)  # the OOM killer takes the whole run
        else:
            tcp = limit // TCP_SHARE // _PAGE * _PAGE
            try:  # TCP's own counter starts counting once it has a limit (kernels that have it)
                _write(path, "memory.kmem.tcp.limit_in_bytes", tcp)
            except OSError:
                tcp = 0
            _write(path, "memory.limit_in_bytes", limit - tcp)
            _write(path, "memory.memsw.limit_in_bytes", limit - tcp, optional=True)  # with swap accounting

    def oom_kills(self, path: str) -> int:
        """How many processes the OOM killer ended in the cgroup at `path` (0 when it cannot tell)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(path, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak(self, path: str) -> int | None:
        """The most memory the cgroup at `path` held, in bytes (None where the kernel does not say)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            with open(os.path.join(path, name)) as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None


def _write(path: str, name: str, value: int | str, *, optional: bool = False) -> None:
    try:
        with open(os.path.join(path, name), "w") as f:
            f.write(str(value))
    except FileNotFoundError:
        if not optional:
            raise


def remove(path: str) -> bool:
    """Remove the (empty) cgroup at `path`, waiting a little for its last processes to be gone; whether it is."""
    deadline = time.monotonic() + _REMOVE_SECONDS
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                return False
            time.sleep(0.005)


# ---------------------------------------------------------------------------------------------------- finding it


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, filesystem type, super options) of each cgroup mount."""
    found = []
    with open(mountinfo) as f:
        for line in f:
            fields = line.split()
            if " - " not in line:
                continue
            after = line.split(" - ", 1)[1].split()
            if len(after) >= 3 and after[0] in ("cgroup", "cgroup2"):
                found.append((fields[3], fields[4], after[0], set(after[2].split(","))))
    return found


def _under(mount_point: str, mount_root: str, path: str) -> str | None:
    """The directory of cgroup `path` in a mount of `mount_root` at `mount_point` (None: not visible there)."""
    relative = os.path.relpath(path, mount_root)
    if relative.startswith(".."):
        return None
    return os.path.normpath(os.path.join(mount_point, relative))


def _candidates(mountinfo: str, own: str, controller: str = "memory") -> list[Hierarchy]:
    """The places where this process could make run cgroups: v2 first, then v1's hierarchy of `controller`."""
    with open(own) as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    v2_path = next((path for hid, controllers, path in lines if hid == "0" and controllers == ""), None)
    v1_path = next((path for _, controllers, path in lines if controller in controllers.split(",")), None)
    found = []
    for root, point, kind, options in _mounts(mountinfo):
        if kind == "cgroup2" and v2_path is not None:
            directory = _under(point, root, v2_path)
            if directory and os.path.isdir(directory):
                found.append(Hierarchy(2, directory, controller))
        elif kind == "cgroup" and controller in options and v1_path is not None:
            directory = _under(point, root, v1_path)
            if directory and os.path.isdir(directory):
                found.append(Hierarchy(1, directory, controller))
    return sorted(found, key=lambda h: -h.version)


_PROBE_LIMITS = {"memory": 64 << 20, "pids": 64}


def _usable(hierarchy: Hierarchy, probe_name: str) -> str | None:
    """None when a run cgroup can be made under `hierarchy.parent`, else why not."""
    controller = hierarchy.controller
    if hierarchy.version == 2:
        try:
            with open(os.path.join(hierarchy.parent, "cgroup.controllers")) as f:
                if controller not in f.read().split():
                    return f"{hierarchy.parent} has no {controller} controller"
            with open(os.path.join(hierarchy.parent, "cgroup.subtree_control")) as f:
                enabled = controller in f.read().split()
            if not enabled:
                _write(hierarchy.parent, "cgroup.subtree_control", f"+{controller}")
        except OSError as e:
            return f"cannot enable the {controller} controller for children of {hierarchy.parent}: {e.strerror}"
    try:
        path = hierarchy.create(probe_name, _PROBE_LIMITS[controller])
    except OSError as e:
        return f"cannot make a {controller} cgroup under {hierarchy.parent}: {e.strerror}"
    remove(path)
    return None


_FOUND: dict[str, dict[str, object]] = {}
_FOUND_LOCK = threading.Lock()


def find(
    probe_name: str, *, mountinfo: str = _MOUNTINFO, own: str = _SELF, controller: str = "memory"
) -> tuple[Hierarchy | None, str]:
    """(where run cgroups of `controller` go, "") or (None, why there is none here); looked up once per process."""
    with _FOUND_LOCK:
        found = _FOUND.get(controller)
        if found is None or found.get("pid") != os.getpid():
            hierarchy, reasons = None, []
            try:
                candidates = _candidates(mountinfo, own, controller)
            except OSError as e:
                candidates, reasons = [], [f"cannot read {e.filename}: {e.strerror}"]
            for candidate in candidates:
                reason = _usable(candidate, probe_name)
                if reason is None:
                    hierarchy = candidate
                    break
                reasons.append(reason)
            found = _FOUND[controller] = dict(
                pid=os.getpid(), hierarchy=hierarchy, reason="; ".join(reasons) or "no cgroup mount"
            )
        hierarchy = found["hierarchy"]
        return hierarchy, "" if hierarchy is not None else str(found["reason"])  # type: ignore[return-value]


def forget() -> None:
    """Look again at the next `find` (tests)."""
    with _FOUND_LOCK:
        _FOUND.clear()
