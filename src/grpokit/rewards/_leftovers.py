"""What a trainer's sandbox leaves behind when the trainer dies, and how the next one proves it dead.

A trainer process that runs programs owns a token, `<pid>-<random>`, and holds an exclusive `flock` on
`<tmp>/grpokit-sandbox-<token>.lock` for as long as it lives. Its working folders (`<tmp>/grpokit-sandbox-<token>-*`,
unsafe mode only: the sandbox's own working directory is a tmpfs that ends with the run) and run cgroups
(`grpokit-sandbox-<token>-<n>`) carry the token. When a trainer dies, however it dies (SIGKILL, OOM, power cut),
the kernel drops its lock and the folders stay.

`sweep` removes the leftovers of each token whose lock it can take: that is the proof the owner is gone. A pid is
no such proof: two trainers in different PID namespaces (containers, `unshare -p`) sharing `/tmp` see each other's
pids as dead or as someone else, and the sweep that went by pids deleted a live trainer's folders.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import secrets
import shutil
import threading
from collections.abc import Iterable

PREFIX = "grpokit-sandbox-"
_LOCK_SUFFIX = ".lock"
_PENDING_SUFFIX = ".lock.pending"  # a lock being made: taken before it gets its final name

_LOCK = threading.Lock()
_OWNED: dict[int, tuple[str, int]] = {}  # pid -> (token, descriptor holding the lock); a forked child makes its own


def token(tempdir: str, cleanup: Iterable[str] = ()) -> str:
    """This process's token, made (with its lock in `tempdir`) on the first call of each process.

    The first call also sweeps `tempdir` and the `cleanup` directories (where run cgroups go)."""
    with _LOCK:
        owned = _OWNED.get(os.getpid())
        if owned is not None:
            return owned[0]
        for old_pid in list(_OWNED):  # inherited from the parent across fork: its lock is the parent's
            _OWNED.pop(old_pid)
        while True:
            name = f"{os.getpid()}-{secrets.token_hex(4)}"
            pending = os.path.join(tempdir, PREFIX + name + _PENDING_SUFFIX)
            fd = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.rename(pending, os.path.join(tempdir, PREFIX + name + _LOCK_SUFFIX))
            except OSError:  # a sweep took the pending lock first and removed it: try another name
                os.close(fd)
                continue
            break
        _OWNED[os.getpid()] = (name, fd)
        atexit.register(_release, os.getpid(), os.path.join(tempdir, PREFIX + name + _LOCK_SUFFIX))
    sweep(tempdir, cleanup)
    return name


def _release(pid: int, lock: str) -> None:
    """At a normal exit: remove this process's lock (its folders and cgroups are gone by then)."""
    if os.getpid() == pid:
        try:
            os.unlink(lock)
        except OSError:
            pass


def sweep(tempdir: str, cleanup: Iterable[str] = ()) -> list[str]:
    """Remove what dead trainers left in `tempdir` and the `cleanup` directories; the tokens swept."""
    swept = []
    try:
        names = os.listdir(tempdir)
    except OSError:
        return swept
    own = _OWNED.get(os.getpid(), ("",))[0]
    for name in names:
        if not name.startswith(PREFIX) or not name.endswith((_LOCK_SUFFIX, _PENDING_SUFFIX)):
            continue
        dead = name[len(PREFIX) :].split(".", 1)[0]
        if dead == own:
            continue
        path = os.path.join(tempdir, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its owner is alive
                continue
            for directory in (tempdir, *cleanup):
                _remove_owned_by(directory, dead)
            os.unlink(path)  # last, under the lock: another sweeper finds it gone or still locked
            swept.append(dead)
        except OSError:
            pass
        finally:
            os.close(fd)
    return swept


def _remove_owned_by(directory: str, dead: str) -> None:
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith(f"{PREFIX}{dead}-"):
            path = os.path.join(directory, name)
            try:
                os.rmdir(path)  # a run cgroup (empty: its processes died with the trainer) or an empty folder
            except OSError:
                shutil.rmtree(path, ignore_errors=True)
