"""The sandbox's kernel layer alone holds against a program that has `ctypes`.

Every attack runs with the audit hook off (`attack("kernel", ...)`: `sandbox._run(audit_hook=False)`), which is
what a program that got past the hook has: `import ctypes` works and any system call can be made through
`libc.syscall`. Each defence is then checked by switching it off too (`seccomp=False`, `cgroup=False`) and seeing
the attack go through: the test that fails without it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest
from _sandbox_helpers import attack

from grpokit.rewards import _cgroup, _leftovers, _seccomp, sandbox
from grpokit.rewards.sandbox import run_program

X86_64 = platform.machine() == "x86_64"
needs_x86_64 = pytest.mark.skipif(not X86_64, reason="system call numbers below are x86_64's")
HIERARCHY, NO_CGROUP = _cgroup.find("grpokit-sandbox-probe-tests")
needs_cgroup = pytest.mark.skipif(HIERARCHY is None, reason=f"no memory cgroup here: {NO_CGROUP}")


def nr(name: str) -> int:
    return _seccomp.number(name)


SYSCALL = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def call(name, number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(number, *args)
    print(name, result, ctypes.get_errno() if result == -1 else 0, flush=True)
    return result
"""


def ctypes_program(body: str) -> str:
    return SYSCALL + textwrap.dedent(body)


def results(stdout: str) -> dict[str, tuple[int, int]]:
    """{name: (return value, errno)} from the lines `call` printed."""
    found = {}
    for line in stdout.splitlines():
        name, value, error = line.rsplit(" ", 2)
        if value.lstrip("-").isdigit() and error.isdigit():
            found[name] = (int(value), int(error))
    return found


# ------------------------------------------------------------------------------------ system calls, for real


@needs_x86_64
def test_kernel_keyrings_are_out_of_reach_and_a_key_of_the_trainer_is_not_read():
    """Keyrings are not namespaced: a key in the trainer's session keyring is found and read from inside the
    sandbox unless the filter refuses the keyring calls."""
    secret = f"grpokit-{os.urandom(6).hex()}".encode()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    description = f"grpokit-test-{os.getpid()}".encode()
    key = libc.syscall(nr("add_key"), b"user", description, secret, len(secret), -3)  # the session keyring
    if key < 0:
        pytest.skip(f"no session keyring for this test's process (errno {ctypes.get_errno()})")
    try:
        source = ctypes_program(f"""
        key = call("request_key", {nr("request_key")}, b"user", {description!r}, None, 0)
        buffer = ctypes.create_string_buffer(256)
        call("keyctl read", {nr("keyctl")}, 11, key if key > 0 else {key}, buffer, 256)  # KEYCTL_READ
        call("add_key", {nr("add_key")}, b"user", b"mine", b"x", 1, -3)
        print("payload", buffer.value)
        """)
        kernel = attack("kernel", source)
        assert secret.decode() not in kernel.stdout
        assert results(kernel.stdout.rsplit("\npayload", 1)[0]) == {
            "request_key": (-1, errno.ENOSYS),
            "keyctl read": (-1, errno.ENOSYS),
            "add_key": (-1, errno.ENOSYS),
        }
        without_filter = attack("kernel", source, seccomp=False)
        assert secret.decode() in without_filter.stdout  # the attack of the issue, when the filter is off
    finally:
        libc.syscall(nr("keyctl"), 21, key)  # KEYCTL_INVALIDATE


@needs_x86_64
def test_calls_outside_the_allowlist_fail_and_work_without_the_filter():
    """A kernel surface no code judge needs: each call fails with ENOSYS (as on a kernel without it); the ones that
    succeed here without the filter show it is the filter that stops them."""
    source = ctypes_program(f"""
    params = ctypes.create_string_buffer(120)
    call("io_uring_setup", {nr("io_uring_setup")}, 8, params)
    call("memfd_create", {nr("memfd_create")}, b"x", 0)
    call("shmget", {nr("shmget")}, 0, 1 << 20, 0o1600)
    call("msgget", {nr("msgget")}, 0, 0o1600)
    call("semget", {nr("semget")}, 0, 1, 0o1600)
    call("mq_open", {nr("mq_open")}, b"q", 0o102, 0o600, None)
    call("bpf", {nr("bpf")}, 0, None, 0)
    call("perf_event_open", {nr("perf_event_open")}, None, 0, -1, -1, 0)
    call("userfaultfd", {nr("userfaultfd")}, 0)
    call("mount", {nr("mount")}, b"none", b"/sandbox", b"tmpfs", 0, None)
    call("umount2", {nr("umount2")}, b"/proc", 2)
    call("fsopen", {nr("fsopen")}, b"tmpfs", 0)
    call("open_tree", {nr("open_tree")}, -100, b"/usr", 1)
    call("pivot_root", {nr("pivot_root")}, b"/sandbox", b"/sandbox")
    call("chroot", {nr("chroot")}, b"/sandbox")
    call("kexec_load", {nr("kexec_load")}, 0, 0, None, 0)
    call("kexec_file_load", {nr("kexec_file_load")}, -1, -1, 0, None, 0)
    call("flock", {nr("flock")}, 0, 2)
    call("sync", {nr("sync")})
    """)
    got = results(attack("kernel", source).stdout)
    assert got == {name: (-1, errno.ENOSYS) for name in got} and len(got) == 19, got
    without_filter = results(attack("kernel", source, seccomp=False).stdout)
    for name in ("io_uring_setup", "memfd_create", "shmget", "msgget", "semget", "flock"):
        assert without_filter[name][0] >= 0, (name, without_filter[name])


@needs_x86_64
def test_processes_tracing_and_namespaces_are_refused_and_clone3_says_enosys():
    thread_flags = 0x3D0F00  # what glibc's pthread_create passes: VM FS FILES SIGHAND THREAD SYSVSEM SETTLS ...
    source = ctypes_program(f"""
    call("fork", {nr("fork")})
    call("vfork", {nr("vfork")})
    call("clone process", {nr("clone")}, 17, None, None, None, None)  # SIGCHLD: a fork
    call("clone thread in a user namespace", {nr("clone")}, {thread_flags | 0x10000000}, None, None, None, None)
    call("clone thread in a pid namespace", {nr("clone")}, {thread_flags | 0x20000000}, None, None, None, None)
    call("unshare user", {nr("unshare")}, 0x10000000)
    call("unshare mount", {nr("unshare")}, 0x00020000)
    call("setns", {nr("setns")}, 0, 0)
    call("ptrace", {nr("ptrace")}, 16, 1, None, None)
    call("process_vm_readv", {nr("process_vm_readv")}, 1, None, 0, None, 0, 0)
    args = ctypes.create_string_buffer(88)  # struct clone_args, all zero: a plain fork
    ctypes.memmove(ctypes.addressof(args) + 80, (ctypes.c_uint64 * 1)(0), 8)
    call("clone3", {nr("clone3")}, args, 88)
    import threading
    box = []
    thread = threading.Thread(target=box.append, args=(1,))
    thread.start(); thread.join()
    print("a thread ran", box == [1])
    """)
    result = attack("kernel", source)
    got = results(result.stdout)
    refused = [name for name in got if name != "clone3"]
    assert got == {**{name: (-1, errno.EPERM) for name in refused}, "clone3": (-1, errno.ENOSYS)}, got
    assert len(refused) == 10
    assert result.stdout.endswith("a thread ran True\n")  # glibc falls back to clone for threads


@needs_x86_64
def test_a_call_of_the_x32_abi_kills_the_program():
    """x32 numbers (bit 30 set) would slip past the checks by number: the filter kills the process (SIGSYS)."""
    source = ctypes_program(f"""
    call("getpid", {nr("getpid")})
    call("x32 getpid", 0x40000000 | {nr("getpid")})
    print("ALIVE")
    """)
    result = attack("kernel", source)
    assert result.stdout == "getpid 1 0\n" and result.returncode == -signal.SIGSYS, result
    without_filter = attack("kernel", source, seccomp=False)
    assert "ALIVE" in without_filter.stdout  # (x32 is ENOSYS or works: either way the program goes on)


def test_sockets_of_other_families_than_local_are_refused():
    source = """
    import socket
    for name in ("AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET", "AF_ALG", "AF_VSOCK"):
        try:
            socket.socket(getattr(socket, name), socket.SOCK_DGRAM if name != "AF_ALG" else socket.SOCK_SEQPACKET)
            print(name, "ok")
        except OSError as e:
            print(name, e.errno)
    """
    result = attack("kernel", source)
    assert result.stdout.splitlines() == [
        "AF_UNIX ok",
        *(f"{name} {errno.EAFNOSUPPORT}" for name in ("AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET", "AF_ALG")),
        f"AF_VSOCK {errno.EAFNOSUPPORT}",
    ]
    without_filter = attack("kernel", source, seccomp=False).stdout
    assert "AF_NETLINK ok" in without_filter and "AF_INET ok" in without_filter


# ------------------------------------------------------------------------------------------------------ memory

_SYSV = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
held = 0
for _ in range(8):
    segment = libc.shmget(0, 32 << 20, 0o1600)
    if segment < 0:
        print("shmget", ctypes.get_errno())
        break
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 32 << 20)
    libc.shmdt(ctypes.c_void_p(address))  # detached: outside the address space, held until the IPC namespace ends
    held += 32
    print("held", held, flush=True)
"""
_MEMFD = """
import os
held = 0
fds = []
try:
    for _ in range(8):
        fds.append(os.memfd_create("x"))
        for _ in range(32):
            os.write(fds[-1], b"x" * (1 << 20))
        held += 32
        print("held", held, flush=True)
except OSError as e:
    print("memfd_create", e.errno)
"""
_FILES = """
held = 0
try:
    for i in range(8):
        with open(f"f{i}", "wb") as f:
            for _ in range(32):
                f.write(b"x" * (1 << 20))
        held += 32
        print("held", held, flush=True)
except OSError as e:
    print("write", e.errno)
"""
ROUTES = {"System V shared memory": _SYSV, "memfd_create": _MEMFD, "files in the working directory": _FILES}


def held(stdout: str) -> int:
    return max([int(line.split()[1]) for line in stdout.splitlines() if line.startswith("held ")], default=0)


@needs_cgroup
@pytest.mark.parametrize("route", ROUTES)
def test_memory_held_by_the_kernel_counts_against_memory_mb(route):
    """With memory_mb=96, 256 MiB through each route: the cgroup ends the run ("memory") before 96 MiB are held;
    without the cgroup all 256 MiB are. The filter is off here (it refuses shmget and memfd_create outright);
    files get a working directory bigger than memory_mb, and a file-size limit out of the way."""
    limits = dict(memory_mb=96, seccomp=False, disk_mb=512, max_file_bytes=1 << 30, timeout=10)
    result = attack("kernel", ROUTES[route], **limits)
    assert result.status == "memory" and held(result.stdout) < 96, (result.status, result.stdout)
    assert held(attack("kernel", ROUTES[route], cgroup=False, **limits).stdout) == 256


@pytest.mark.parametrize("route", ["System V shared memory", "memfd_create"])
def test_the_filter_refuses_shared_memory_outright(route):
    result = attack("kernel", ROUTES[route], memory_mb=96, max_file_bytes=1 << 30)
    assert result.status == "ok" and held(result.stdout) == 0
    assert result.stdout.split()[-1] == str(errno.ENOSYS)


def test_posix_shared_memory_has_nowhere_to_go():
    source = """
    import _posixshmem
    try:
        _posixshmem.shm_open("/grpokit", 0o102, 0o600)
        print("opened")
    except OSError as e:
        print(e.errno)
    """
    assert attack("kernel", source).stdout == f"{errno.EROFS}\n"  # /dev/shm is on the read-only /dev


_PIPES = """
import fcntl, os
held, fds = 0, []
try:
    for i in range(31):
        r, w = os.pipe()
        fds += [r, w]
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
        except OSError as e:
            if i == 0:
                print("F_SETPIPE_SZ", e.errno)
        os.set_blocking(w, False)
        try:
            while True:
                held += os.write(w, b"x" * 65536)
        except BlockingIOError:
            pass
except OSError as e:
    pass
print("pipes hold", held >> 20, flush=True)
"""


@needs_cgroup
def test_pipe_buffers_stay_small_and_count_against_memory_mb():
    """31 pipes (64 files at most) of 1 MiB hold 31 MiB outside the address space. The filter keeps each at
    64 KiB; without it, the cgroup ends the run at memory_mb=32; without both, 30 MiB are held."""
    filtered = attack("kernel", _PIPES, memory_mb=32)
    assert filtered.stdout == f"F_SETPIPE_SZ {errno.EPERM}\npipes hold 1\n"  # 31 x 64 KiB
    cgroup_only = attack("kernel", _PIPES, memory_mb=32, seccomp=False)
    assert cgroup_only.status == "memory" and "pipes hold" not in cgroup_only.stdout
    neither = attack("kernel", _PIPES, memory_mb=32, seccomp=False, cgroup=False)
    assert neither.stdout == "pipes hold 30\n"


def test_the_working_directory_holds_disk_mb_in_all_its_files():
    """RLIMIT_FSIZE caps one file; the tmpfs caps them all together (ENOSPC), here 8 MiB in 1 MiB files."""
    source = """
    import os
    written = 0
    try:
        for i in range(64):
            with open(f"part{i}", "wb") as f:
                f.write(b"x" * (1 << 20))
            written += 1
    except OSError as e:
        print("stopped", e.errno)
    print("files", written, "bytes", sum(os.path.getsize(n) for n in os.listdir(".") if n.startswith("part")))
    """
    for layer in ("full", "kernel"):
        result = attack(layer, source, disk_mb=8)
        lines = result.stdout.splitlines()
        assert lines[0] == f"stopped {errno.ENOSPC}", result
        files, total = int(lines[1].split()[1]), int(lines[1].split()[3])
        assert 6 <= files < 8 and total <= 8 << 20  # the program's own file takes a page of it
    assert "files 64" in attack("full", source, disk_mb=128).stdout  # room for all with a bigger quota


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_disk_mb_is_checked(value):
    with pytest.raises(ValueError, match="`disk_mb` must be a positive int"):
        run_program("print(1)", disk_mb=value)


# --------------------------------------------------------------------------------- the filter, instruction by
# instruction, on both architectures (a small classic-BPF interpreter: what the kernel would decide)


def run_filter(machine: str, number: int, args=(0,) * 6, arch: int | None = None) -> tuple[str, int]:
    program = _seccomp.program(machine)
    arch = _seccomp._ARCHES[machine][0] if arch is None else arch
    data = struct.pack("<iIQ6Q", number, arch, 0, *(list(args) + [0] * 6)[:6])
    ops = [struct.unpack("<HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, accumulator = 0, 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == 0x20:
            accumulator = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):
            taken = {0x15: accumulator == k, 0x35: accumulator >= k, 0x45: bool(accumulator & k)}[code]
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:
            if k == 0x7FFF0000:
                return "allow", 0
            if k == 0x80000000:
                return "kill", 0
            assert k & 0xFFFF0000 == 0x00050000, hex(k)
            return "errno", k & 0xFFFF
        else:
            raise AssertionError(f"unexpected BPF instruction {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_decides_each_branch(machine):
    def decide(name, *args, **kwargs):
        return run_filter(machine, _seccomp.number(name, machine), args, **kwargs)

    thread = 0x3D0F00
    for name in _seccomp.ALLOWED:
        if _seccomp.number(name, machine) is not None:
            assert decide(name) == ("allow", 0), name
    for name in (
        "keyctl",
        "add_key",
        "request_key",
        "io_uring_setup",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "mount",
        "umount2",
        "fsopen",
        "move_mount",
        "kexec_load",
        "memfd_create",
        "shmget",
        "flock",
    ):
        assert decide(name) == ("errno", errno.ENOSYS), name
    for name in _seccomp.REFUSED:
        if _seccomp.number(name, machine) is not None:
            assert decide(name) == ("errno", errno.EPERM), name
    assert decide("clone3") == ("errno", errno.ENOSYS)
    assert decide("clone", thread) == ("allow", 0)
    assert decide("clone", 17) == ("errno", errno.EPERM)  # a process
    for namespace in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert decide("clone", thread | namespace) == ("errno", errno.EPERM), hex(namespace)
    assert decide("fcntl", 0, 1031) == ("errno", errno.EPERM)  # F_SETPIPE_SZ
    assert decide("fcntl", 0, 3) == ("allow", 0)  # F_GETFL
    assert decide("socket", 1) == ("allow", 0)  # AF_UNIX
    for family in (2, 10, 16, 17, 38, 40):  # inet, inet6, netlink, packet, alg, vsock
        assert decide("socket", family) == ("errno", errno.EAFNOSUPPORT)
    for option in (7, 8, 32, 33):  # SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE at SOL_SOCKET
        assert decide("setsockopt", 3, 1, option) == ("errno", errno.EPERM), option
    assert decide("setsockopt", 3, 1, 2) == ("allow", 0)  # SO_REUSEADDR
    assert decide("setsockopt", 3, 6, 7) == ("allow", 0)  # another level with option 7
    assert decide("read", arch=0x40000003) == ("kill", 0)  # i386 (int 0x80 on x86_64)
    assert run_filter(machine, 1 << 20) == ("errno", errno.ENOSYS)  # a number no kernel has yet
    if machine == "x86_64":
        assert run_filter(machine, 0x40000000 | _seccomp.number("read", machine)) == ("kill", 0)  # x32


def test_unknown_architectures_get_no_filter():
    assert _seccomp.program("riscv64") is None


# --------------------------------------------------------------------------------------------- honest programs

HONEST = r"""
import bisect, collections, functools, heapq, itertools, json, math, re, string, sys, threading
from collections import Counter, defaultdict, deque

def solve(data):
    n, *values = map(int, data.split())
    counts = Counter(values)
    heap = list(values)
    heapq.heapify(heap)
    smallest = [heapq.heappop(heap) for _ in range(min(3, n))]
    graph = defaultdict(list)
    for a, b in zip(values, values[1:]):
        graph[a].append(b)
    seen, queue = {values[0]}, deque([values[0]])
    while queue:
        for nxt in graph[queue.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    pairs = sum(1 for a, b in itertools.combinations(values, 2) if math.gcd(a, b) == 1)
    words = re.findall(r"[a-z]+", "abc, def; ghi")
    return json.dumps({"common": counts.most_common(1)[0][0], "smallest": smallest, "reach": len(seen),
                       "coprime_pairs": pairs, "words": words, "pos": bisect.bisect_left(sorted(values), 5)})

@functools.lru_cache(maxsize=None)
def depth(k):
    return 0 if k == 0 else 1 + depth(k - 1)

def main():
    print(solve(sys.stdin.read()))
    print(depth(50000))

sys.setrecursionlimit(1 << 20)
threading.stack_size(256 << 20)
worker = threading.Thread(target=main)
worker.start()
worker.join()
"""


def test_an_honest_competitive_programming_solution_runs_behind_every_layer():
    """stdin, the usual modules, deep recursion on a big thread stack: as code judges' solutions do."""
    stdin = "6\n4 9 4 7 2 5\n"
    result = run_program(HONEST, stdin, memory_mb=512, timeout=20)
    assert result.status == "ok", result.stderr
    expected = {
        "common": 4,
        "smallest": [2, 4, 4],
        "reach": 5,
        "coprime_pairs": 12,  # of the 15 pairs, all but (4, 4), (4, 2) twice
        "words": ["abc", "def", "ghi"],
        "pos": 3,
    }
    assert result.stdout.splitlines() == [json.dumps(expected), "50000"]


def test_tempfile_and_sqlite_work():
    source = """
    import sqlite3, tempfile, os
    with tempfile.TemporaryDirectory() as d:
        print(os.path.dirname(d) == os.getcwd())
    print(sqlite3.connect(":memory:").execute("select 6 * 7").fetchone()[0])
    """
    assert run_program(textwrap.dedent(source)).stdout == "True\n42\n"


def test_the_filter_lets_asyncio_run():
    """asyncio's event loop (epoll, a socketpair for its self-pipe) passes the filter; the audit hook, a layer
    above, refuses it (asyncio's import sets a function's __code__, and the hook refuses sockets)."""
    source = """
    import asyncio
    async def main():
        await asyncio.sleep(0.01)
        return 3
    print(asyncio.run(main()))
    """
    assert attack("kernel", source).stdout == "3\n"


# ----------------------------------------------------------------------------------------- leftovers, by lock

_TRAINER = """
import os, sys, time
from grpokit.rewards import _leftovers
token = _leftovers.token(sys.argv[1])
os.mkdir(os.path.join(sys.argv[1], f"grpokit-sandbox-{token}-work"))
print(token, os.getpid(), flush=True)
time.sleep(60)
"""


def _start_trainer(tmp_path, *, new_pid_namespace: bool):
    prefix = ["unshare", "--pid", "--fork", "--kill-child"] if new_pid_namespace else []
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", _TRAINER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    token, pid = proc.stdout.readline().split()
    return proc, token, int(pid)


@pytest.mark.parametrize("namespaces", ["same PID namespace", "other PID namespace"])
def test_the_sweep_removes_only_what_a_dead_trainer_left(tmp_path, namespaces):
    """Two trainers share one temporary directory; the second sweeps it. The first one's folder stays while it
    lives (whatever pid it has where: in its own PID namespace it is pid 1, a number that says nothing here), and
    goes once it is dead."""
    other = namespaces == "other PID namespace"
    if other and (shutil.which("unshare") is None or os.geteuid() != 0):
        pytest.skip("needs unshare(1) as root")
    first, token, pid = _start_trainer(tmp_path, new_pid_namespace=other)
    try:
        if other:
            assert pid == 1  # as the first trainer sees itself
        folder = tmp_path / f"grpokit-sandbox-{token}-work"
        assert _leftovers.sweep(str(tmp_path)) == [] and folder.is_dir()  # alive: kept
        (tmp_path / "grpokit-sandbox-999999-work").mkdir()  # an old-style folder with a dead pid: not provably dead
    finally:
        first.kill()
        first.wait()
    deadline = time.monotonic() + 5
    swept = []
    while not swept and time.monotonic() < deadline:  # the lock goes with the last process holding it
        swept = _leftovers.sweep(str(tmp_path))
        time.sleep(0.02)
    assert swept == [token]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grpokit-sandbox-999999-work"]


def test_a_live_trainers_lock_is_not_taken_by_another_process(tmp_path):
    first, token, _ = _start_trainer(tmp_path, new_pid_namespace=False)
    try:
        code = f"from grpokit.rewards import _leftovers\nprint(_leftovers.sweep({str(tmp_path)!r}))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
        assert out == "[]\n" and (tmp_path / f"grpokit-sandbox-{token}.lock").exists()
    finally:
        first.kill()
        first.wait()


def test_the_sandbox_is_still_available():
    sandbox.check_boundary("tests")


# ------------------------------------------------------------------------------ cgroup lookup, on fake trees
# (this machine has one hierarchy; the other is checked on a directory tree laid out as the kernel's would be)


def _fake_cgroupfs(tmp_path, version: int, *, memory_enabled: bool = True):
    root = tmp_path / "sys-fs-cgroup"
    own = root / "user.slice" / "trainer.scope" if version == 2 else root / "memory" / "docker" / "abc"
    own.mkdir(parents=True)
    if version == 2:
        (own / "cgroup.controllers").write_text("cpu io memory pids\n")
        (own / "cgroup.subtree_control").write_text("memory\n" if memory_enabled else "")
        mounts = f"30 23 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        groups = "0::/user.slice/trainer.scope\n"
    else:  # a container's view: the mount's root is the container's own cgroup
        mounts = f"35 31 0:30 /docker/abc {root}/memory/docker/abc rw - cgroup cgroup rw,memory\n"
        groups = "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n"
    (tmp_path / "mountinfo").write_text("22 1 8:1 / / rw - ext4 /dev/vda rw\n" + mounts)
    (tmp_path / "cgroup").write_text(groups)
    return own


@pytest.mark.parametrize("version", [1, 2])
def test_run_cgroups_are_found_made_and_read_on_both_hierarchies(tmp_path, version):
    own = _fake_cgroupfs(tmp_path, version)  # (v1: the container's own cgroup is the mount point itself)
    _cgroup.forget()
    try:
        hierarchy, reason = _cgroup.find("probe", mountinfo=str(tmp_path / "mountinfo"), own=str(tmp_path / "cgroup"))
    finally:
        _cgroup.forget()
    assert reason == "" and hierarchy == _cgroup.Hierarchy(version, str(own))
    # the lookup made a cgroup to be sure (a real cgroupfs removes it with its files; a plain folder keeps them)
    probe_limit = 64 << 20 if version == 2 else 60 << 20  # v1: 1/16 of it is TCP's
    assert (own / "probe" / ("memory.max" if version == 2 else "memory.limit_in_bytes")).read_text() == str(
        probe_limit
    )
    path = hierarchy.create("run-1", 96 << 20)
    written = {p.name: p.read_text() for p in (own / "run-1").iterdir()}
    if version == 2:
        assert written == {"memory.max": str(96 << 20), "memory.swap.max": "0", "memory.oom.group": "1"}
        (own / "run-1" / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    else:  # 96 MiB: 6 MiB for TCP's buffers, 90 MiB for the rest
        assert written == {
            "memory.kmem.tcp.limit_in_bytes": str(6 << 20),
            "memory.limit_in_bytes": str(90 << 20),
            "memory.memsw.limit_in_bytes": str(90 << 20),
        }
        (own / "run-1" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert hierarchy.oom_kills(path) == (1 if version == 2 else 2)


def test_a_v2_cgroup_without_the_memory_controller_for_children_is_said(tmp_path):
    own = _fake_cgroupfs(tmp_path, 2, memory_enabled=False)
    os.chmod(own / "cgroup.subtree_control", 0o444)  # as for a cgroup the trainer does not own
    _cgroup.forget()
    try:
        if os.geteuid() == 0:  # root writes read-only files: make the enabling fail as the kernel would (EBUSY)
            (own / "cgroup.subtree_control").unlink()
            (own / "cgroup.subtree_control").mkdir()
        hierarchy, reason = _cgroup.find("probe", mountinfo=str(tmp_path / "mountinfo"), own=str(tmp_path / "cgroup"))
    finally:
        _cgroup.forget()
    assert hierarchy is None and reason.startswith(f"cannot enable the memory controller for children of {own}")


def test_without_a_memory_cgroup_programs_still_run_and_it_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(_cgroup, "find", lambda *a, **k: (None, "no cgroup mount"))
    monkeypatch.setattr(sandbox, "_WARNED_NO_CGROUP", type(sandbox._WARNED_NO_CGROUP)())
    with caplog.at_level("WARNING", logger="grpokit.rewards"):
        first, second = run_program("print(1)"), run_program("print(2)")
    assert (first.stdout, second.stdout) == ("1\n", "2\n")
    (record,) = [r for r in caplog.records if "memory cgroup" in r.getMessage()]
    assert "no memory cgroup can be made here (no cgroup mount)" in record.getMessage()


@pytest.mark.parametrize("version", [1, 2])
def test_pids_cgroups_are_found_and_capped_on_both_hierarchies(tmp_path, version):
    """v2: the pids controller is enabled for children of the trainer's cgroup (`+pids`) and a run's pids.max goes in
    the same cgroup as its memory limit; v1: the pids hierarchy of the trainer's cgroup."""
    own = _fake_cgroupfs(tmp_path, version)
    if version == 1:  # the pids hierarchy beside the memory one
        own = tmp_path / "sys-fs-cgroup" / "pids" / "docker" / "abc"
        own.mkdir(parents=True)
        with open(tmp_path / "mountinfo", "a") as f:
            f.write(f"36 31 0:31 /docker/abc {own} rw - cgroup cgroup rw,pids\n")
    _cgroup.forget()
    try:
        hierarchy, reason = _cgroup.find(
            "probe", mountinfo=str(tmp_path / "mountinfo"), own=str(tmp_path / "cgroup"), controller="pids"
        )
    finally:
        _cgroup.forget()
    assert reason == "" and hierarchy == _cgroup.Hierarchy(version, str(own), "pids")
    if version == 2:
        assert (own / "cgroup.subtree_control").read_text() == "+pids"  # (a plain file: the write replaced it)
    assert (own / "probe" / "pids.max").read_text() == "64"
    hierarchy.create("run-1", 66)
    assert {p.name: p.read_text() for p in (own / "run-1").iterdir()} == {"pids.max": "66"}
