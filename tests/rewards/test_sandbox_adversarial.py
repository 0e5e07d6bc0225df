"""Hostile programs against the sandbox: each escape a probe found (and its relatives) is contained.

Every attack runs twice: through `run_program` as the code rewards call it ("full": the kernel's boundary plus the
audit hook), and with the audit hook off ("kernel": what a program that switched the hook off still faces). Each
test checks what would change outside if the attack worked (a file, a process, a server, a secret), not only the
status. The programs print what they tried and got, so a failure shows how far an attack went.
"""

from __future__ import annotations

import ast
import errno
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from _sandbox_helpers import LAYERS, attack, processes_with

from grpokit.rewards import _cgroup, sandbox
from grpokit.rewards.code_rewards import code
from grpokit.rewards.sandbox import run_program


@pytest.fixture
def victim():
    """A process of the test's user outside the sandbox, with a secret in its environment."""
    secret = f"hunter2-{uuid.uuid4().hex}"
    proc = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin", "VICTIM_SECRET": secret})
    yield proc, secret
    proc.kill()
    proc.wait()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return next(line.split()[1] for line in f if line.startswith("State:"))


def test_the_boundary_is_available_here():
    """The rest of this file needs bubblewrap; without it, this test names what to install."""
    sandbox.check_boundary("tests")


# ------------------------------------------------------------------------------------------ the audit hook itself


def test_replacing_the_hooks_code_is_refused_and_the_write_still_fails(tmp_path):
    """The probe's escape: find the hook's refusing function through a traceback, swap its __code__, write outside
    and start a shell. The hook now refuses the swap; a program that gets past it still meets a read-only root."""
    target = tmp_path / "model.safetensors"
    target.write_text("weights")
    source = f"""
    import os
    try:
        open({str(target)!r}, "w")
    except PermissionError as e:
        tb = e.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        refuse = tb.tb_frame.f_back.f_locals["refuse"]
        try:
            refuse.__code__ = (lambda what: None).__code__
            print("hook disabled")
        except PermissionError as e:
            print("swap refused:", e)
    for attempt in (lambda: open({str(target)!r}, "w").write("pwned"), lambda: os.system("echo pwned")):
        try:
            attempt()
            print("ESCAPED")
        except OSError as e:
            print(type(e).__name__, e.errno)
    """
    result = attack("full", source)
    assert result.stdout.splitlines() == [
        "swap refused: sandbox: replacing a function's __code__ is not allowed",
        "PermissionError None",  # the hook, still in place, refuses the write
        "PermissionError None",  # and the shell
    ], result.stderr
    assert target.read_text() == "weights"


@pytest.mark.parametrize("layer", LAYERS)
def test_writing_outside_through_a_directory_descriptor_fails(tmp_path, layer):
    (tmp_path / "model.safetensors").write_text("weights")
    source = f"""
    import os
    for directory in ({str(tmp_path)!r}, "/", "/usr", "/tmp", "/proc/self/root"):
        try:
            fd = os.open(directory, os.O_RDONLY)
            os.close(os.open("model.safetensors", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, dir_fd=fd))
            print("ESCAPED", directory)
        except OSError as e:
            print(directory, errno.errorcode.get(e.errno, "refused"))
    """
    result = attack(layer, "import errno\n" + textwrap.dedent(source))
    assert "ESCAPED" not in result.stdout, result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    assert (tmp_path / "model.safetensors").read_text() == "weights"
    if layer == "kernel":  # the folder does not exist in the sandbox; every other root is read-only
        assert result.stdout.splitlines() == [
            f"{tmp_path} ENOENT",
            "/ EROFS",
            "/usr EROFS",
            "/tmp ENOENT",
            "/proc/self/root EROFS",
        ]


# ------------------------------------------------------------------------------------------- other processes


@pytest.mark.parametrize("layer", [*LAYERS, "kernel without seccomp"])
def test_the_trainer_and_other_processes_cannot_be_signalled(victim, layer):
    proc, _ = victim
    source = f"""
    import os, signal
    print("parent", os.getppid(), "processes", sorted(p for p in os.listdir("/proc") if p.isdigit()))
    tries = {{
        "pidfd parent": lambda: signal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL),
        "pidfd test": lambda: signal.pidfd_send_signal(os.pidfd_open({os.getpid()}), signal.SIGKILL),
        "pidfd victim": lambda: signal.pidfd_send_signal(os.pidfd_open({proc.pid}), signal.SIGKILL),
        "kill test": lambda: os.kill({os.getpid()}, signal.SIGKILL),
        "kill victim": lambda: os.kill({proc.pid}, signal.SIGKILL),
        "kill everyone": lambda: os.kill(-1, signal.SIGKILL),
    }}
    for name, attempt in tries.items():
        try:
            attempt()
            print(name, "sent")
        except OSError as e:
            print(name, e.errno)
    """
    result = attack(layer.split()[0], source, seccomp=layer != "kernel without seccomp")
    assert proc.poll() is None  # the victim lives (and so does this test's process)
    # Alone in its PID namespace: no parent (0), no pid names another process (ESRCH), and kill(-1) finds no one.
    # pidfd_open has no audit event: the hook lets it through, and the seccomp filter does not allow it (ENOSYS);
    # without the filter the PID namespace alone leaves it nothing to open. The hook refuses os.kill (None).
    kill_error = None if layer == "full" else errno.ESRCH
    pidfd = [errno.ENOSYS] * 3 if layer != "kernel without seccomp" else [errno.EINVAL, errno.ESRCH, errno.ESRCH]
    assert result.stdout.splitlines() == [
        "parent 0 processes ['1']",
        f"pidfd parent {pidfd[0]}",
        f"pidfd test {pidfd[1]}",
        f"pidfd victim {pidfd[2]}",
        f"kill test {kill_error}",
        f"kill victim {kill_error}",
        f"kill everyone {kill_error}",
    ]


@pytest.mark.parametrize("layer", LAYERS)
def test_ptrace_through_ctypes_reaches_nothing(victim, layer):
    proc, _ = victim
    source = f"""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for pid in (0, 1, {os.getpid()}, {proc.pid}):
        print(pid, libc.ptrace(16, pid, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
    """
    result = attack(layer, source)
    assert _state(proc.pid) == "S" and _state(os.getpid()) in ("R", "S")  # neither stopped nor traced
    if layer == "full":
        assert result.status == "refused" and "sandbox: importing ctypes is not allowed" in result.stderr
    else:  # seccomp refuses ptrace whatever the target
        pids = (0, 1, os.getpid(), proc.pid)
        assert result.stdout.splitlines() == [f"{pid} -1 {errno.EPERM}" for pid in pids]


# ------------------------------------------------------------------------------------------- files and secrets


@pytest.mark.parametrize("layer", LAYERS)
def test_files_and_environments_outside_cannot_be_read(tmp_path, victim, monkeypatch, layer):
    proc, victim_secret = victim
    file_secret = f"file-secret-{uuid.uuid4().hex}"
    (tmp_path / "token.txt").write_text(file_secret)
    monkeypatch.setenv("TRAINER_SECRET", "trainer-secret-value")
    source = f"""
    import os
    print("root", sorted(os.listdir("/")))
    for path in ({str(tmp_path / "token.txt")!r}, "/proc/{os.getpid()}/environ", "/proc/{proc.pid}/environ",
                 {os.path.abspath(__file__)!r}, "/root/.bashrc", "/etc/passwd", "/etc/shadow"):
        try:
            print(path, open(path, "rb").read())
        except OSError as e:
            print(path, "unreadable", e.errno)
    print(open("/proc/1/environ", "rb").read())
    """
    result = attack(layer, source)
    shown = result.stdout + result.stderr
    for secret in (file_secret, victim_secret, "trainer-secret-value", "HF_HUB_OFFLINE"):
        assert secret not in shown
    lines = result.stdout.splitlines()
    # Only the system's libraries, the Python install (under /root for pyenv's) and the working directory
    system = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "usr", "sandbox"}
    install = sys.base_prefix.split("/")[1]
    assert set(ast.literal_eval(lines[0][len("root ") :])) <= system | {install}
    assert all(" unreadable 2" in line for line in lines[1:8]), lines  # ENOENT: none of them exists there
    assert lines[8].count("=") == 6  # the program's own environment: PATH, HOME, TMPDIR, LANG, LC_ALL, PWD


# ------------------------------------------------------------------------------------------------------ network


@pytest.mark.parametrize("layer", [*LAYERS, "network namespace"])
def test_no_connection_reaches_a_server_of_the_host(layer):
    server = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = f"\0grpokit-test-{uuid.uuid4().hex}"
    abstract.bind(abstract_name)
    abstract.listen()
    port = server.getsockname()[1]
    source = f"""
    import socket
    for family, address in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_UNIX, {abstract_name!r})):
        try:
            s = socket.socket(family)
            s.settimeout(1)
            s.connect(address)
            print("CONNECTED")
        except OSError as e:
            print(family.name, e.errno)
    """
    try:
        if layer == "network namespace":  # no filter: an internet socket is made, and finds nothing
            result = attack("kernel", source, seccomp=False)
        else:
            result = attack(layer, source)
        for listener in (server, abstract):
            listener.settimeout(0.2)
            with pytest.raises(TimeoutError):
                listener.accept()  # nobody came
    finally:
        server.close()
        abstract.close()
    if layer == "full":  # the hook refuses the sockets (a PermissionError without errno)
        assert result.stdout.splitlines() == ["AF_INET None", "AF_UNIX None"]
    elif layer == "kernel":  # the filter: no internet socket at all; no abstract socket of the host
        assert result.stdout.splitlines() == [f"AF_INET {errno.EAFNOSUPPORT}", f"AF_UNIX {errno.ECONNREFUSED}"]
    else:  # its own network namespace: a loopback of its own where nothing listens, no abstract socket of the host
        assert result.stdout.splitlines() == [f"AF_INET {errno.ECONNREFUSED}", f"AF_UNIX {errno.ECONNREFUSED}"]


# ------------------------------------------------------------------------------------------ processes of its own


_FRESH_MODULES = """
import importlib.machinery, importlib.util, os, sys
def fresh(name):
    folder = os.path.join(os.path.dirname(os.__file__), "lib-dynload")
    path = next(os.path.join(folder, f) for f in os.listdir(folder) if f.startswith(name + "."))
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path, loader=loader))
    loader.exec_module(module)
    return module
"""


@pytest.mark.parametrize("layer", LAYERS)
def test_fresh_native_modules_cannot_start_processes(layer):
    """`_posixsubprocess` and `_ctypes` loaded again from lib-dynload (the hook's patches are not on them)."""
    source = (
        _FRESH_MODULES
        + """
try:
    ctypes_ = fresh("_ctypes")
    libc = ctypes_.dlopen(None)
    print("dlopen ok")
except Exception as e:
    print("dlopen", type(e).__name__)
posix_ = fresh("_posixsubprocess")
import subprocess
subprocess._fork_exec = posix_.fork_exec
try:
    subprocess.run(["/bin/sh", "-c", "echo SPAWNED"])
except OSError as e:
    print("spawn", type(e).__name__, e.errno)
"""
    )
    result = attack(layer, source)
    assert "SPAWNED" not in result.stdout
    if layer == "full":  # loading an extension module raises the audit event of its import
        assert result.stdout.splitlines() == ["dlopen PermissionError"] and result.status == "refused"
        assert "sandbox: importing _posixsubprocess is not allowed" in result.stderr
    else:
        assert result.stdout.splitlines() == ["dlopen ok", f"spawn PermissionError {errno.EPERM}"]


@pytest.mark.parametrize("ending", ["exits", "times out"])
@pytest.mark.parametrize("layer", [*LAYERS, "kernel without seccomp"])
def test_a_setsid_double_fork_does_not_outlive_the_run(layer, ending):
    token = f"grpokit-outlive-{uuid.uuid4().hex}"
    source = f"""
    import os, time
    try:
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "30", {token!r}])
            os._exit(0)
        os.wait()
        time.sleep(0.3)
        print("forked", len([p for p in os.listdir("/proc") if p.isdigit()]), flush=True)
    except OSError as e:
        print("fork", e.errno, flush=True)
    if {ending == "times out"}:
        time.sleep(30)
    """
    kernel_layer = "kernel" if layer == "kernel without seccomp" else layer
    result = attack(kernel_layer, source, timeout=1.5, seccomp=layer != "kernel without seccomp")
    assert processes_with(token) == []  # at once: gone, not going
    assert result.status == ("ok" if ending == "exits" else "timeout")
    if layer == "full":
        assert result.stdout == "fork None\n"  # the hook's PermissionError
    elif layer == "kernel":
        assert result.stdout == f"fork {errno.EPERM}\n"
    else:  # the grandchild ran (two processes), and died with the PID namespace
        assert result.stdout == "forked 2\n"


def test_a_launch_outliving_its_trainer_stops_before_anything_runs(tmp_path):
    """The launcher's first exec dies with the trainer (parent-death signal) and, in case the trainer died before
    that signal was set, checks that the trainer is still its parent: launched through a middleman (its parent is not
    the process that built the command line, as after the trainer's death), it stops with 125 and runs nothing."""
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("util-linux's setpriv is not installed")
    argv = sandbox._launcher("BWRAP", disk=1 << 20, source_fd=3, seccomp_fd=None, mode="plain")
    guard = argv[: argv.index("BWRAP")]
    assert guard[:4] == ["setpriv", "--pdeathsig", "KILL", "--"]
    marker = tmp_path / "ran"
    command = [*guard, "/bin/sh", "-c", 'echo yes > "$0"', str(marker)]
    assert subprocess.run(command).returncode == 0 and marker.read_text() == "yes\n"  # its parent: this process
    marker.unlink()
    middleman = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", *command])  # its parent: the middleman
    assert middleman.returncode == 125 and not marker.exists()


def test_nothing_survives_the_trainer_being_killed(tmp_path):
    """--die-with-parent: a SIGKILLed trainer takes its running programs with it."""
    token = 7_654_321  # an unusual max_file_bytes: it shows up on the program's command line
    trainer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from grpokit.rewards.sandbox import run_program\n"
            f"run_program('import time\\nprint(1, flush=True)\\ntime.sleep(60)', timeout=60, max_file_bytes={token})",
        ],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path)},  # its working directory, left behind
    )
    deadline = time.monotonic() + 60  # the trainer imports grpokit first
    while not processes_with(f"\0{token}\0") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(f"\0{token}\0"), "the program never started"
    trainer.kill()
    trainer.wait()
    deadline = time.monotonic() + 5
    while processes_with(f"\0{token}\0") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(f"\0{token}\0") == []
    # The killed trainer's lock stays behind, and its run's memory cgroup where it had one...
    (lock,) = tmp_path.iterdir()
    assert lock.name.startswith(f"grpokit-sandbox-{trainer.pid}-") and lock.name.endswith(".lock")
    owner = lock.name[len("grpokit-sandbox-") : -len(".lock")]
    hierarchy, _ = _cgroup.find("grpokit-sandbox-probe")
    groups = [] if hierarchy is None else [p for p in os.listdir(hierarchy.parent) if owner in p]
    assert groups == ([] if hierarchy is None else [f"grpokit-sandbox-{owner}-0"])
    # ...until the next trainer's first program: it removes what trainers that are gone left (and its own lock at
    # its exit)
    code = "from grpokit.rewards.sandbox import run_program\nassert run_program('print(2)').stdout == '2\\n'"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path)}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0
    assert list(tmp_path.iterdir()) == []
    if hierarchy is not None:
        assert [p for p in os.listdir(hierarchy.parent) if owner in p] == []


# ------------------------------------------------------------------------------------------------------- bombs


@pytest.mark.parametrize("layer", LAYERS)
def test_fork_bomb(layer):
    source = """
    import os
    started = 0
    for _ in range(50):
        try:
            if os.fork() == 0:
                os._exit(0)
            started += 1
        except OSError as e:
            print("fork", e.errno)
            break
    print("started", started)
    """
    result = attack(layer, source)
    refusal = None if layer == "full" else errno.EPERM  # the hook's PermissionError, else seccomp's EPERM
    assert result.stdout == f"fork {refusal}\nstarted 0\n"


@pytest.mark.parametrize("layer", LAYERS)
def test_memory_bomb(layer):
    source = """
    import threading
    hoard = []
    def grab():
        while True:
            hoard.append(bytearray(64 << 20))
    threads = [threading.Thread(target=grab) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    x = bytearray(1 << 30)
    """
    result = attack(layer, source, memory_mb=256)
    assert result.status == "memory" and "MemoryError" in result.stderr


@pytest.mark.parametrize("layer", LAYERS)
def test_writing_to_memory_backed_folders_fails(layer):
    """/dev and / are read-only tmpfs (the working directory is the only writable one, see test_sandbox_kernel)."""
    source = """
    for path in ("/dev/shm/fill", "/dev/fill", "/fill", "/usr/fill"):
        try:
            open(path, "wb").write(b"x")
            print("WROTE", path)
        except OSError as e:
            print(path, e.errno)
    open("/dev/null", "wb").write(b"still fine")
    """
    result = attack(layer, source)
    if layer == "full":
        assert result.status == "refused"
    else:
        assert result.status == "ok" and "WROTE" not in result.stdout
        assert all(line.endswith(f" {errno.EROFS}") for line in result.stdout.splitlines()), result.stdout


@pytest.mark.parametrize("layer", LAYERS)
def test_cpu_bomb_with_threads_is_stopped_at_the_cpu_limit(layer):
    source = """
    import threading
    def spin():
        while True:
            pass
    for _ in range(4):
        threading.Thread(target=spin, daemon=True).start()
    spin()
    """
    start = time.monotonic()
    result = attack(layer, source, timeout=8, cpu_seconds=1)
    assert result.status == "timeout" and time.monotonic() - start < 6


@pytest.mark.parametrize("layer", LAYERS)
def test_output_bomb_through_the_raw_descriptor(layer):
    source = "import os\nwhile True:\n    os.write(1, b'y' * 65536)"
    result = attack(layer, source, timeout=5, max_output_bytes=4096)
    assert (result.status, result.stdout, result.truncated) == ("output_limit", "y" * 4096, True)


# ----------------------------------------------------------------------------- an honest program still scores


def test_honest_programs_score_next_to_hostile_ones(tmp_path, victim):
    proc, secret = victim
    (tmp_path / "keep.txt").write_text("keep")
    honest = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    killer = f"```python\nimport os, signal\nos.kill({proc.pid}, signal.SIGKILL)\nprint(3)\n```"
    reader = f"```python\nprint(open('/proc/{proc.pid}/environ').read())\n```"
    writer = f"```python\nimport os\nos.remove({str(tmp_path / 'keep.txt')!r})\nprint(3)\n```"
    info = {"language": "python", "test_cases": [{"input": "1 2\n", "output": "3\n"}]}
    reward = code(timeout=5)
    assert reward([honest, killer, reader, writer], verification_info=[info] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert proc.poll() is None and (tmp_path / "keep.txt").read_text() == "keep"


# ----------------------------------------------------------------------------------- where there is no boundary


@pytest.fixture
def no_bwrap(monkeypatch):
    """As on a machine without bubblewrap (the one-time check runs again)."""
    monkeypatch.setattr(sandbox, "_BOUNDARY", {})
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)


@pytest.mark.parametrize(
    "build",
    [lambda: code(), lambda: sandbox.run_program("print(1)")],
    ids=["code reward", "run_program"],
)
def test_without_bwrap_code_rewards_refuse_in_one_line(no_bwrap, build):
    with pytest.raises(sandbox.SandboxUnavailable) as caught:
        build()
    message = str(caught.value)
    assert "\n" not in message and "apt-get install bubblewrap" in message and "GRPOKIT_UNSAFE_SANDBOX=1" in message
    assert "needs bubblewrap (`bwrap`), which is not installed" in message


def test_bwrap_that_cannot_create_namespaces_is_named(monkeypatch):
    monkeypatch.setattr(sandbox, "_BOUNDARY", {})
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: "/bin/false")  # a "bwrap" that fails, as one would
    with pytest.raises(sandbox.SandboxUnavailable, match=r"code: bubblewrap \(/bin/false\) cannot set up the sandbox"):
        code()


def test_the_unsafe_mode_runs_with_a_warning_once(no_bwrap, monkeypatch, caplog):
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    monkeypatch.setattr(sandbox, "_WARNED_UNSAFE", threading.Event())
    with caplog.at_level("WARNING", logger="grpokit.rewards"):
        first, second = run_program("print(1)"), run_program("import os\nprint(os.getppid() > 1)")
    assert (first.stdout, second.stdout) == ("1\n", "True\n")  # its parent is the trainer: no PID namespace
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["warning"]
    assert "WITHOUT the sandbox's kernel boundary" in caplog.records[0].getMessage()
