"""The local sandbox: outputs, limits, refused operations, cleanup, parallel runs.

Each program is tiny; limits are short (1-2 s) so that the whole file runs in seconds.
"""

from __future__ import annotations

import doctest
import os
import signal
import sys
import tempfile
import textwrap
import time

import pytest

from grpokit.rewards import sandbox
from grpokit.rewards.sandbox import run_many, run_program


def run(source: str, stdin: str = "", **kwargs):
    kwargs.setdefault("timeout", 2)
    return run_program(textwrap.dedent(source), stdin, **kwargs)


# ------------------------------------------------------------------------------------------------ how programs end


def test_passing_program_reads_stdin_and_prints():
    result = run("a, b = map(int, input().split())\nprint(a + b)", "2 3\n")
    assert (result.status, result.returncode, result.stdout, result.stderr) == ("ok", 0, "5\n", "")
    assert result.ok and not result.truncated and 0 < result.seconds < 2


def test_raising_program_is_an_error_with_its_own_traceback():
    result = run("x = 1\nprint('before')\nx / 0")
    assert (result.status, result.returncode, result.stdout) == ("error", 1, "before\n")
    assert 'File "solution.py", line 3' in result.stderr
    assert result.stderr.endswith("ZeroDivisionError: division by zero\n")
    assert "<string>" not in result.stderr  # the bootstrap's frames are left out


def test_exit_code_is_kept():
    assert (run("import sys; sys.exit(3)").status, run("import sys; sys.exit(3)").returncode) == ("error", 3)
    assert run("import sys; sys.exit(0)").status == "ok"


def test_infinite_loop_is_killed_at_the_wall_clock_timeout():
    start = time.monotonic()
    # a CPU limit well above the wall clock: otherwise the default one (the timeout, rounded up) can fire first
    result = run("while True:\n    pass", timeout=1, cpu_seconds=10)
    assert result.status == "timeout" and result.returncode == -signal.SIGKILL
    assert 1.0 <= result.seconds and time.monotonic() - start < 3


def test_cpu_limit_stops_a_busy_program_before_the_wall_clock():
    result = run("while True:\n    pass", timeout=10, cpu_seconds=1)
    assert result.status == "timeout" and result.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
    assert result.seconds < 5


def test_sleeping_program_times_out_without_using_cpu():
    result = run("import time\nprint('start', flush=True)\ntime.sleep(30)", timeout=1)
    assert (result.status, result.stdout) == ("timeout", "start\n")


def test_memory_limit():
    result = run("x = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=256)
    assert (result.status, result.stdout) == ("memory", "")
    assert "MemoryError" in result.stderr


def test_memory_limit_none_allows_a_moderate_allocation():
    assert run("x = bytearray(300 * 1024**2)\nprint(len(x))", memory_mb=None).stdout == f"{300 * 1024**2}\n"


def test_huge_output_is_capped_and_stops_the_program():
    start = time.monotonic()
    result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", max_output_bytes=1000, timeout=5)
    assert (result.status, result.stdout, result.truncated) == ("output_limit", "x" * 1000, True)
    assert time.monotonic() - start < 3  # killed at the cap, not at the timeout


def test_huge_stderr_is_capped_too():
    result = run("import sys\nsys.stderr.write('e' * 5000)", max_output_bytes=100)
    assert (result.status, len(result.stderr), result.truncated) == ("output_limit", 100, True)


def test_large_stdin_is_fed_entirely():
    result = run("import sys\nprint(len(sys.stdin.read()))", "a" * 3_000_000, timeout=5)
    assert (result.status, result.stdout) == ("ok", "3000000\n")


def test_program_ignoring_its_stdin_is_fine():
    assert run("print('done')", "a" * 3_000_000).stdout == "done\n"


def test_main_module_semantics():
    result = run(
        """
        import typing
        T = typing.TypeVar("T")
        if __name__ == "__main__":
            print(__file__, sorted(n for n in globals() if not n.startswith("__")))
        """
    )
    assert result.stdout == "solution.py ['T', 'typing']\n"


def test_threads_are_allowed():
    source = "import threading\nt = threading.Thread(target=lambda: print('in thread'))\nt.start()\nt.join()"
    assert run(source).stdout == "in thread\n"


# ------------------------------------------------------------------------------------------------ refused operations


@pytest.mark.parametrize(
    "spawn",
    [
        "os.fork()",
        "os.system('true')",
        "import subprocess; subprocess.run(['true'])",
        "os.posix_spawn('/bin/true', ['true'], {})",
        "os.execv('/bin/true', ['true'])",
        "import _posixsubprocess; _posixsubprocess.fork_exec()",
        "import ctypes",
        "import multiprocessing; multiprocessing.Process(target=print).start()",
    ],
)
def test_child_processes_are_refused_and_none_survives(tmp_path, spawn):
    marker = tmp_path / "child-was-here"
    # If a child were started, it would write the marker after a pause (with the hook gone: via a new interpreter).
    source = f"""
    import os, sys, time
    {spawn}
    time.sleep(0.5)
    open({str(marker)!r}, "w").write("alive")
    """
    result = run(source)
    assert result.status == "refused" and "PermissionError: sandbox:" in result.stderr, result.stderr
    time.sleep(1.0)
    assert not marker.exists()


def test_a_forked_child_is_killed_with_the_group(tmp_path):
    """Below the audit hook: a program that forks anyway loses its child when it ends (the group is killed)."""
    marker = tmp_path / "child-was-here"
    source = f"""
    import os, time
    if os.fork() == 0:
        time.sleep(1.0)
        open({str(marker)!r}, "w").write("alive")
        os._exit(0)
    print("parent done")
    """
    reason, code, out, *_ = sandbox._execute(
        [sys.executable, "-c", textwrap.dedent(source)],
        b"",
        cwd=str(tmp_path),
        env=sandbox._environment(str(tmp_path)),
        timeout=5,
        max_output_bytes=1000,
    )
    assert (reason, code, out) == ("exited", 0, b"parent done\n")
    time.sleep(1.5)
    assert not marker.exists()


def test_a_child_holding_the_pipes_does_not_delay_the_result(tmp_path):
    source = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\nprint('parent done')"
    start = time.monotonic()
    reason, code, out, *_ = sandbox._execute(
        [sys.executable, "-c", source],
        b"",
        cwd=str(tmp_path),
        env=sandbox._environment(str(tmp_path)),
        timeout=10,
        max_output_bytes=1000,
    )
    assert (reason, code, out) == ("exited", 0, b"parent done\n")
    assert time.monotonic() - start < 3


def test_socket_to_localhost_is_refused():
    source = "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', 80))\nprint('connected')"
    result = run(source)
    assert (result.status, result.stdout) == ("refused", "")
    assert "sandbox: socket.__new__ is not allowed" in result.stderr


def test_dns_is_refused():
    assert run("import socket\nsocket.getaddrinfo('localhost', 80)").status == "refused"


def test_a_caught_refusal_lets_the_program_go_on():
    source = "import socket\ntry:\n    socket.socket()\nexcept PermissionError:\n    print('no network')"
    assert (run(source).status, run(source).stdout) == ("ok", "no network\n")


def test_limits_cannot_be_raised():
    result = run("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))")
    assert result.status == "refused"


def test_killing_other_processes_is_refused():
    assert run("import os, signal\nos.kill(os.getppid(), signal.SIGTERM)").status == "refused"


# -------------------------------------------------------------------------------------------- files and environment


def test_files_stay_in_a_working_directory_of_the_run_gone_afterwards(tmp_path, monkeypatch):
    """The working directory is a tmpfs of the run's own: nothing lands on the trainer's disk, and the next run
    starts empty (but for its program)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the trainer's temporary files would go
    source = """
    import os
    with open("notes.txt", "w") as f:
        f.write("hello")
    os.mkdir("sub")
    with open(os.path.join("sub", "deep.txt"), "w") as f:
        f.write("deep")
    os.rename("notes.txt", "renamed.txt")
    print(os.getcwd())
    print(open("renamed.txt").read(), sorted(os.listdir(".")))
    """
    result = run(source)
    workdir, listing = result.stdout.splitlines()
    assert result.status == "ok" and listing == "hello ['renamed.txt', 'solution.py', 'sub']"
    assert workdir == "/sandbox" and not os.path.exists(workdir)
    assert run("import os\nprint(os.listdir('.'))").stdout == "['solution.py']\n"
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.parametrize(
    "operation",
    [
        "open(TARGET, 'w').write('x')",
        "open(TARGET, 'a').write('x')",
        "os.close(os.open(TARGET, os.O_WRONLY | os.O_CREAT))",
        "os.remove(EXISTING)",
        "os.rename(EXISTING, TARGET)",
        "os.symlink(EXISTING, 'link'); open('link', 'w').write('x')",
        "os.chmod(EXISTING, 0o777)",
        "os.mkdir(TARGET)",
        "import shutil; shutil.rmtree(os.path.dirname(EXISTING))",
    ],
)
def test_writes_outside_the_working_directory_are_refused(tmp_path, operation):
    existing = tmp_path / "existing.txt"
    existing.write_text("keep me")
    target = tmp_path / "target.txt"
    source = f"import os\nTARGET, EXISTING = {str(target)!r}, {str(existing)!r}\n{operation}"
    result = run(source)
    assert result.status == "refused" and "sandbox:" in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.txt"]
    assert existing.read_text() == "keep me"


def test_reading_outside_is_allowed():
    assert run("import os\nprint(len(open(os.__file__).readline()) > 0)").stdout == "True\n"


def test_file_size_limit():
    result = run("with open('big.bin', 'wb') as f:\n    f.write(b'x' * 5000)", max_file_bytes=1000)
    assert result.status == "error" and "File too large" in result.stderr


def test_minimal_environment(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = run("import os\nprint(sorted(os.environ))\nprint(os.environ['HOME'] == os.getcwd())")
    # PWD: bubblewrap sets it to the working directory it starts the program in
    assert result.stdout == "['HOME', 'LANG', 'LC_ALL', 'PATH', 'PWD', 'TMPDIR']\nTrue\n"


def test_utf8_input_and_output():
    assert run("print(input()[::-1])", "héllo ✓\n").stdout == "✓ olléh\n"


# ----------------------------------------------------------------------------------------- arguments, parallel runs


def test_other_languages_are_refused():
    with pytest.raises(ValueError, match=r"language 'cpp' cannot run in the local sandbox, which runs python only"):
        run_program("int main() {}", language="cpp")
    with pytest.raises(ValueError, match="language 'javascript'"):
        run_many([{"source": "1", "language": "javascript"}])


@pytest.mark.parametrize(
    "kwargs", [{"timeout": 0}, {"timeout": float("nan")}, {"memory_mb": 0}, {"max_output_bytes": -1}]
)
def test_bad_limits(kwargs):
    with pytest.raises(ValueError, match="sandbox: `"):
        run_program("print(1)", **kwargs)


def test_run_many_keeps_input_order_and_runs_in_parallel():
    # The first program is the slowest: results must still come back in input order.
    jobs = [{"source": f"import time\ntime.sleep({0.6 - 0.2 * i})\nprint({i})", "timeout": 5} for i in range(3)]
    start = time.monotonic()
    results = run_many(jobs, workers=3)
    elapsed = time.monotonic() - start
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]
    assert elapsed < 1.2  # 0.6 + 0.4 + 0.2 = 1.2 s one after another
    assert run_many([]) == []
    with pytest.raises(ValueError, match="needs a 'source'"):
        run_many([{"stdin": ""}])
    with pytest.raises(ValueError, match="`workers`"):
        run_many(jobs, workers=0)


def test_docstring_examples():
    failures, attempted = doctest.testmod(sandbox)
    assert attempted and not failures
