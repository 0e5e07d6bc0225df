"""The documented torch line installs PyTorch's CPU build on a machine whose pip sees both PyPI and PyTorch's CPU
index: checked with pip itself (`pip install --dry-run --report`) against two local indexes that stand in for them,
one serving `torch 2.13.0` (PyPI's build: CUDA on Linux), the other `torch 2.13.0+cpu`. No network: the indexes are
folders, and pip runs isolated from this machine's own configuration (which points at a folder of CPU wheels)."""

import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
DOCUMENTS = ["README.md", "docs/getting-started.md", "docs/how-to/vllm.md", ".ci/run"]


def _index(root: Path, version: str) -> str:
    """A one-project simple index at ROOT serving an empty wheel of torch VERSION; its file:// URL."""
    project = root / "torch"
    project.mkdir(parents=True)
    name = f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(project / name, "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    (project / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>')
    return root.as_uri()


def _torch_lines() -> list[tuple[str, list[str]]]:
    """Each documented `pip install torch==...` command: (document, its arguments after `pip install`)."""
    found = []
    for document in DOCUMENTS:
        for line in (ROOT / document).read_text().splitlines():
            for command in re.findall(r"pip install (?:-q )?(torch==[^&|#`\\]*)", line):
                found.append((document, shlex.split(command)))
    return found


def test_every_documented_torch_line_names_the_cpu_index_and_one_pin():
    lines = _torch_lines()
    assert {document for document, _ in lines} == set(DOCUMENTS)
    pins = {arguments[0] for _, arguments in lines}
    assert pins == {"torch==2.13.0"}, pins
    # the CPU lines (every one that names an index) name PyTorch's CPU index as an extra index, never as the only one
    with_index = [(document, arguments) for document, arguments in lines if len(arguments) > 1]
    assert {document for document, _ in with_index} == set(DOCUMENTS)  # each document has its CPU line
    assert all(arguments[1:] == ["--extra-index-url", CPU_INDEX] for _, arguments in with_index)


def test_pip_takes_the_cpu_build_with_the_readmes_line(tmp_path):
    """README's line against plain PyPI (here a local index serving `torch 2.13.0`) plus the CPU index it names (here
    one serving `2.13.0+cpu`). PEP 440: `torch==2.13.0` matches `2.13.0+cpu` too (a pin without a local label ignores
    it), and the local label sorts above the plain version, so pip picks the CPU build. Without the CPU index the
    line would install PyPI's build."""
    pypi = _index(tmp_path / "pypi", "2.13.0")
    cpu = _index(tmp_path / "cpu", "2.13.0+cpu")
    arguments = next(arguments for document, arguments in _torch_lines() if document == "README.md")
    arguments = [cpu if a == CPU_INDEX else a for a in arguments]
    command = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet"]
    command += ["--no-cache-dir", "--report", "-", "--index-url", pypi, *arguments]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    chosen = [
        (item["metadata"]["version"], item["download_info"]["url"]) for item in json.loads(done.stdout)["install"]
    ]
    assert chosen == [("2.13.0+cpu", f"{cpu}/torch/torch-2.13.0%2Bcpu-py3-none-any.whl")]
