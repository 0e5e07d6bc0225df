"""A program cannot change the machine, hold memory past `memory_mb`, store past `disk_mb` or take more than
`MAX_THREADS` tasks (issue 42), with the audit hook off (`attack("kernel", ...)`) as a program that got past it.

Each defence is also switched off (`without=...`, `seccomp=False`, `cgroup=False`) to show the attack go through
then: the test that fails without it. Writes that go through in those runs write back the value already there (a
sysctl, the mode of `/dev/null`), so the machine ends as it was.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time

import pytest
from _sandbox_helpers import attack, processes_with

from grpokit.rewards import _cgroup, sandbox
from grpokit.rewards.sandbox import MAX_THREADS

ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="the trainer runs as root in these tests (as CI does)")
MEMORY, _ = _cgroup.find("grpokit-sandbox-probe-tests")
PIDS, _ = _cgroup.find("grpokit-sandbox-probe-tests", controller="pids")
needs_memory_cgroup = pytest.mark.skipif(MEMORY is None, reason="no memory cgroup here")
needs_pids_cgroup = pytest.mark.skipif(PIDS is None, reason="no pids cgroup here")


def lines(result) -> list[str]:
    assert result.stderr == "" or result.status != "ok", result.stderr
    return result.stdout.splitlines()


# --------------------------------------------------------------------------------------------- who it is


def program_uids(seen: list[list[str]], stop: threading.Event) -> None:
    """Fill `seen` with the uids (real, effective, saved, filesystem) of the sandboxed interpreter, as the machine
    sees them: the process running the bootstrap (its command line) that is Python, not bwrap or the launcher."""
    while not seen and not stop.is_set():
        for pid in processes_with("def _limit():"):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if not f.read().startswith("python"):
                        continue
                with open(f"/proc/{pid}/status") as f:
                    seen += [line.split()[1:] for line in f if line.startswith("Uid:")]
            except OSError:
                pass
        time.sleep(0.01)


@as_root
@pytest.mark.parametrize("without", [set(), {"uid"}])
def test_the_program_is_not_the_machines_root(without):
    """Seen from the machine: every uid of the program's process is SANDBOX_UID (0 without the drop)."""
    seen: list[list[str]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=program_uids, args=(seen, stop))
    watcher.start()
    try:
        result = attack("kernel", "import time\ntime.sleep(1.5)\n", without=without)
    finally:
        stop.set()
        watcher.join()
    assert result.status == "ok", result
    assert seen[0] == ["0" if without else str(sandbox.SANDBOX_UID)] * 4


# ------------------------------------------------------------------------------------- nothing of the machine

SYSCTL = "/proc/sys/fs/lease-break-time"


@as_root
@pytest.mark.parametrize(
    ("without", "expected"),
    [
        (set(), f"EROFS {errno.EROFS}"),  # both defences
        ({"proc"}, f"EACCES {errno.EACCES}"),  # nobody may not write root's sysctls
        ({"uid"}, f"EROFS {errno.EROFS}"),  # /proc/sys is read-only
        ({"uid", "proc"}, "written"),  # the attack: the machine's root writes the machine's sysctl
    ],
)
def test_the_machines_sysctls_cannot_be_written(without, expected):
    with open(SYSCTL) as f:
        before = f.read()
    source = f"""
    import errno
    try:
        with open({SYSCTL!r}, "w") as f:
            f.write({before!r})  # the value it has: the machine ends as it was even when this goes through
        print("written")
    except OSError as e:
        print(errno.errorcode[e.errno], e.errno)
    """
    assert lines(attack("kernel", source, without=without)) == [expected]
    with open(SYSCTL) as f:
        assert f.read() == before


@as_root
@pytest.mark.parametrize("without", [set(), {"uid"}])
def test_the_machines_device_nodes_cannot_be_changed_and_still_work(without):
    """`/dev/null` inside is the machine's own inode: its owner may chmod it (0 without the uid drop). Writing,
    reading and the full device still work."""
    mode = os.stat("/dev/null").st_mode & 0o7777
    ctime = os.stat("/dev/null").st_ctime_ns
    source = f"""
    import errno, os
    try:
        os.chmod("/dev/null", {mode:#o})  # the mode it has
        print("chmod done")
    except OSError as e:
        print("chmod", errno.errorcode[e.errno])
    with open("/dev/null", "w") as f:
        print(f.write("x" * 10))
    for name in ("/dev/zero", "/dev/urandom", "/dev/random"):
        with open(name, "rb") as f:
            print(name, len(f.read(8)))
    try:
        with open("/dev/full", "w") as f:
            f.write("x")
    except OSError as e:
        print("/dev/full", errno.errorcode[e.errno])
    """
    got = lines(attack("kernel", source, without=without))
    assert got == [
        "chmod done" if without else "chmod EPERM",
        "10",
        "/dev/zero 8",
        "/dev/urandom 8",
        "/dev/random 8",
        "/dev/full ENOSPC",
    ]
    assert os.stat("/dev/null").st_mode & 0o7777 == mode
    assert (os.stat("/dev/null").st_ctime_ns != ctime) == bool(without)  # the machine's inode was touched


@as_root
@pytest.mark.parametrize("without", [set(), {"proc"}, {"uid"}, {"uid", "proc"}])
def test_the_trainers_keys_are_not_listed(without):
    """/proc/keys lists the keys its reader possesses whose owner its user namespace maps, and the program inherits
    the trainer's session keyring: root's keys show only where root is mapped (without the uid drop) and the listing
    is not hidden."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    description = f"grpokit-test-{os.urandom(4).hex()}".encode()
    key = libc.syscall(248, b"user", description, b"secret", 6, -3)  # add_key to the session keyring (x86_64)
    if os.uname().machine != "x86_64" or key < 0:
        pytest.skip("no session keyring for this test's process, or not x86_64")
    try:
        source = """
        print(len(open("/proc/keys").read()), len(open("/proc/key-users").read()))
        print(open("/proc/keys").read())
        """
        result = attack("kernel", source, without=without)
        assert result.status == "ok", result
        if without == {"uid", "proc"}:
            assert description.decode() in result.stdout
        else:
            assert description.decode() not in result.stdout
        if "proc" not in without:  # empty files (unmasked, /proc/key-users lists the uids mapped that hold keys)
            assert lines(result)[0] == "0 0"
    finally:
        libc.syscall(250, 21, key)  # KEYCTL_INVALIDATE


# ---------------------------------------------------------------------------------------------------- threads

THREADS = """
import threading
threading.stack_size(64 << 10)
release = threading.Event()
started = 0
try:
    for _ in range(400):
        threading.Thread(target=release.wait).start()
        started += 1
except RuntimeError:
    pass
release.set()
print(started)
"""


@pytest.mark.parametrize(
    ("without", "most"),
    [
        (set(), MAX_THREADS - 1),  # RLIMIT_NPROC: 64 tasks of the run's user namespace, its main thread one
        ({"pids"}, MAX_THREADS - 1),
        pytest.param({"nproc"}, MAX_THREADS, marks=needs_pids_cgroup),  # pids.max 66: bwrap, the main thread, 64
        ({"nproc", "pids"}, 400),  # the issue's: as many as the machine's process table and memory allow
    ],
)
def test_a_run_holds_at_most_max_threads(without, most):
    result = attack("kernel", THREADS, without=without, timeout=10)
    assert lines(result) == [str(most)]


# ------------------------------------------------------------------------------------------------------- disk

NAMES = """
import errno, os
os.mkdir("d")
entries = stored = 0
kind = "file"
try:
    while entries < 40000:
        name = f"d/{entries:08d}" + "n" * 240  # 248 bytes of name
        if entries % 3 == 0:
            open(name, "w").close()
        elif entries % 3 == 1:
            os.link(f"d/{entries - 1:08d}" + "n" * 240, name)
        else:
            os.symlink("t" * 100, name)  # a short target: kept in the inode, not in a page
            stored += 100
        entries += 1
        stored += 248
except OSError as e:
    kind = errno.errorcode[e.errno]
data = 0
try:
    with open("data", "wb") as f:  # then data, until the rest is full
        while True:
            f.write(b"x" * 4096)
            f.flush()
            data += 4096
except OSError:
    pass
print(entries, stored, kind)
print(data + stored + os.path.getsize("solution.py"))
"""


@pytest.mark.parametrize("without", [set(), {"inodes"}])
def test_disk_mb_bounds_names_links_and_symlinks(without):
    """8 MiB allow 512 names (one per 16 KiB): the tmpfs's root, solution.py and `d` take 3, so 509 entries fit;
    hard links count as names too; what the names hold and the data written after them stay within the 8 MiB.
    Without the cap, 40,000 entries store 11 MB of names, past the 8 MiB."""
    result = attack("kernel", NAMES, disk_mb=8, without=without, timeout=20)
    entries, stored, end = lines(result)[0].split()
    if without:
        assert (int(entries), end) == (40000, "file") and int(stored) > 8 << 20
    else:
        assert (int(entries), end) == (509, "ENOSPC")
        assert int(stored) == 509 * 248 + 169 * 100  # 169 symlinks among the first 509 (entries 2, 5, ..., 506)
        assert int(lines(result)[1]) <= 8 << 20  # names, symlink targets and data together: within disk_mb


# ---------------------------------------------------------------------------------------------------- sockets

FILL = """
import socket, sys
kind, grow = {kind!r}, {grow!r}
held, pairs, refused = 0, [], ""
for _ in range({pairs}):
    if kind == "unix":
        a, b = socket.socketpair()
    else:
        server = socket.create_server(("127.0.0.1", 0))
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
        server.close()
    if grow:
        try:
            a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
            b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        except OSError as e:
            refused = e.errno
    a.setblocking(False)
    try:
        while True:
            held += a.send(b"x" * 65536)
    except (BlockingIOError, OSError):
        pass
    pairs.append((a, b))  # written, never read
print(held >> 20, refused)
"""


def fill(kind: str, *, pairs: int, grow: bool = True, **kwargs):
    source = FILL.replace("{kind!r}", repr(kind)).replace("{grow!r}", repr(grow)).replace("{pairs}", str(pairs))
    return attack("kernel", source, memory_mb=64, timeout=20, **kwargs)


@needs_memory_cgroup
@pytest.mark.parametrize("cgroup", [True, False])
def test_tcp_buffers_count_against_memory_mb(cgroup):
    """The issue's attack (the filter off: it refuses internet sockets first): 15 loopback connections written and
    never read. On cgroup v1 TCP's own counter holds 1/16 of the run's 64 MiB (4 MiB); on v2 memory.max counts them
    with the rest. Without the cgroup they held 256 MiB (the issue's figure; here more than 64 MiB)."""
    result = fill("tcp", pairs=15, seccomp=False, cgroup=cgroup)
    if not cgroup:
        assert int(lines(result)[0].split()[0]) > 64
    elif MEMORY.version == 1:
        held = int(lines(result)[0].split()[0])
        assert held <= 4 + 1, held  # (each socket keeps the kernel's minimum: a page or so under pressure)
    else:
        assert result.status == "memory" or int(lines(result)[0].split()[0]) <= 64


def test_internet_sockets_and_bigger_buffers_are_refused():
    assert lines(
        attack("kernel", "import socket\ntry:\n  socket.socket()\nexcept OSError as e:\n  print(e.errno)")
    ) == [str(errno.EAFNOSUPPORT)]
    # growing a socket's buffers is refused: (held MiB, errno) with 30 socketpairs at the default size
    held, refused = lines(fill("unix", pairs=30, cgroup=False))[0].split()
    assert refused == str(errno.EPERM)


@pytest.mark.parametrize(("seccomp", "cgroup"), [(True, True), (True, False), (False, True), (False, False)])
def test_unix_socket_buffers_are_bounded(seccomp, cgroup):
    """30 socketpairs filled, never read (60 of the 64 descriptors). The memory cgroup counts Unix socket buffers
    (v1 and v2): the run ends at 64 MiB ("memory") or holds less. Without one, the filter keeps each socket at the
    machine's default buffer (`net.core.wmem_default`), so the 30 hold at most 30 times that. Without either, a
    program asks for `wmem_max` (4 MiB on some machines) a socket and holds far more than its 64 MiB."""
    if cgroup and MEMORY is None:
        pytest.skip("no memory cgroup here")
    result = fill("unix", pairs=30, seccomp=seccomp, cgroup=cgroup)
    if cgroup:
        assert result.status == "memory" or int(lines(result)[0].split()[0]) < 64, result
        return
    held = int(lines(result)[0].split()[0])
    with open("/proc/sys/net/core/wmem_default") as f:
        default = int(f.read())
    with open("/proc/sys/net/core/wmem_max") as f:
        most = int(f.read())
    if seccomp:
        assert held <= 30 * default * 2 >> 20, held  # (an skb's overhead counts in the buffer, so data is less)
    elif most >= 1 << 20:
        assert held > 64, held


# ------------------------------------------------------------------------------------------ an ordinary user

ORDINARY_UID = 4242  # a uid no account has here
AS_USER = r"""
import errno, json, os, sys
sys.path.insert(0, {tests!r})
from _sandbox_helpers import attack
from grpokit.rewards import sandbox
import test_sandbox_machine as t

out = {{"mode": sandbox._boundary()["mode"], "uid": os.geteuid()}}
sysctl = "import errno\ntry:\n  open({sysctl!r}, 'w')\n  print('opened')\nexcept OSError as e:\n  print(errno.errorcode[e.errno])"
out["sysctl"] = attack("kernel", sysctl).stdout.strip()
out["sysctl without proc"] = attack("kernel", sysctl, without={{"proc"}}).stdout.strip()
chmod = "import errno, os\ntry:\n  os.chmod('/dev/null', 0o666)\n  print('done')\nexcept OSError as e:\n  print(errno.errorcode[e.errno])"
out["chmod"] = attack("kernel", chmod).stdout.strip()
out["threads"] = attack("kernel", t.THREADS, timeout=10).stdout.strip()
out["threads without nproc"] = attack("kernel", t.THREADS, timeout=10, without={{"nproc"}}).stdout.strip()
out["names"] = attack("kernel", t.NAMES, disk_mb=8, timeout=20).stdout.splitlines()[0]
out["uid inside"] = attack("kernel", "import os\nprint(os.stat('solution.py').st_uid)").stdout.strip()
print(json.dumps(out))
"""


@as_root
def test_as_an_ordinary_user_nothing_of_the_machine_changes_and_the_caps_hold(tmp_path):
    """The trainer as an ordinary user (uid 4242, no cgroup of its own): the launcher's user namespace stages the
    working directory, so the cap on names holds; RLIMIT_NPROC caps the threads; the sysctls and device nodes are
    root's. (The Python install is made reachable for that user first: pyenv's sits under root's 0700 home.)"""
    import json
    import shlex
    import subprocess
    import sys

    install = os.path.realpath(sys.base_prefix)
    tests = os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.realpath(os.path.dirname(os.path.dirname(tests)))
    code = AS_USER.format(tests=tests, sysctl=SYSCTL)
    q = shlex.quote
    # Each path the user needs, under a folder others cannot enter (pyenv's under root's 0700 home, a checkout made
    # by `mktemp -d`), is bound aside, that folder is covered by a readable tmpfs, and the path bound back in place.
    needed = [
        install,
        *(os.path.join(checkout, n) for n in (".venv", "src", "tests") if os.path.isdir(os.path.join(checkout, n))),
    ]
    blocked = {}
    for path in needed:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            if not os.stat(ancestor).st_mode & 0o001:
                blocked[path] = ancestor
                break
    lines_ = []
    for i, path in enumerate(blocked):
        lines_ += [f"mkdir {tmp_path}/p{i}", f"mount --bind {q(path)} {tmp_path}/p{i}"]
    for ancestor in sorted(set(blocked.values()), key=len):
        lines_.append(f"mount -t tmpfs -o mode=0755 grpokit-test {q(ancestor)}")
    for i, path in enumerate(blocked):
        lines_ += [f"mkdir -p {q(path)}", f"mount --bind {tmp_path}/p{i} {q(path)}"]
    lines_.append(
        f"exec setpriv --reuid={ORDINARY_UID} --regid={ORDINARY_UID} --clear-groups "
        f"env HOME=/tmp {shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    )
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-ec", "\n".join(lines_)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd="/",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got == {
        "mode": "user",
        "uid": ORDINARY_UID,
        "sysctl": "EROFS",
        "sysctl without proc": "EACCES",
        "chmod": "EPERM",
        "threads": str(MAX_THREADS - 1),
        "threads without nproc": "400",  # no pids cgroup for an ordinary user here
        "names": f"509 {509 * 248 + 169 * 100} ENOSPC",
        "uid inside": "0",  # root of the launcher's user namespace: the trainer's user on the machine
    }
