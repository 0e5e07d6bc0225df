"""Every code block of the documentation (docs/**/*.md and README.md) runs here, page by page, in order, in a fresh
folder per page: what a reader copies works as written.

A block is run according to its language, unless the HTML comment on the line just before it says otherwise:

- ```` ```bash ```` runs with `bash -e -o pipefail` and must exit 0; ```` ```python ```` runs with this interpreter.
- ```` ```yaml ```` must parse (`yaml.safe_load`).
- ```` ```text ```` is an illustration, not code: it is not run.
- `<!-- docs-test: file NAME -->`: the block is written to NAME in the page's folder (later blocks use it); a
  YAML block is also parsed, a Python one compiled.
- `<!-- docs-test: validate -->` (YAML): `grpokit config validate --config` accepts it (a recipe for a model this
  machine does not have: checked without a download).
- `<!-- docs-test: expect-fail -->`: the block must exit non-zero (an example of an error).
- `<!-- docs-test: output -->` (text): each of its lines appears, in order, in what the previous block printed
  (`...` inside a line matches anything): an excerpt, for output that is not the same from run to run or machine to
  machine (timings, a library's warnings).
- `<!-- docs-test: output-whole -->` (text): what the previous block printed, all of it, line for line (`...` inside
  a line matches anything; blank lines count too): for deterministic output, such as error lines.
- `<!-- docs-test: vllm -->`: needs vLLM; where it is not installed the block is only syntax-checked (the vLLM
  stage of `.ci/run` runs the pages that have such blocks).
- `<!-- docs-test: skip REASON -->`: not run (a GPU, several machines, the install itself), only syntax-checked;
  the reason is required.

The page's folder has `examples/` and `benchmarks/` of the checkout beside it, as a clone would.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LANGUAGES = {"bash", "python", "yaml", "text"}
MARKER = re.compile(r"^<!-- docs-test: (\S+)(?: (.*?))? -->$")
KINDS = {"file", "validate", "expect-fail", "output", "output-whole", "vllm", "skip"}
BLOCK_TIMEOUT_S = 600
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@dataclasses.dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    kind: str | None = None
    arg: str | None = None

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    found = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts]
    return sorted(found) + [ROOT / "README.md"]


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def blocks(path: Path) -> list[Block]:
    """The page's fenced blocks (MyST directives such as ```` ```{toctree} ```` excluded), each with its marker."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^(\s*)(`{3,})(.*)$", line)
        if not fence:
            i += 1
            continue
        indent, ticks, info = fence.groups()
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks and lines[j].startswith(indent)), None
        )
        assert end is not None, f"{page_id(path)}:{i + 1}: a code fence that never closes"
        language = info.strip()
        if not language.startswith("{"):
            assert indent == "", f"{page_id(path)}:{i + 1}: an indented code block (keep blocks at column 0)"
            code = "\n".join(lines[i + 1 : end]) + "\n"
            block = Block(page_id(path), i + 1, language, code)
            marker = MARKER.match(lines[i - 1]) if i > 0 else None
            if marker:
                block.kind, block.arg = marker.groups()
            found.append(block)
        i = end + 1
    return found


def check_block(block: Block) -> None:
    """What is true of a block wherever it runs: a known language, a known marker used where it means something."""
    assert block.language in LANGUAGES, f"{block.where()}: language {block.language!r}, not one of {LANGUAGES}"
    if block.kind is not None:
        assert block.kind in KINDS, f"{block.where()}: unknown marker {block.kind!r}"
    if block.kind == "skip":
        assert block.arg, f"{block.where()}: a skipped block must say why"
    if block.kind == "file":
        assert block.arg and "/" not in block.arg, f"{block.where()}: file needs a plain file name"
    if block.kind == "validate":
        assert block.language == "yaml", f"{block.where()}: validate is for YAML blocks"
    if block.kind in ("output", "output-whole"):
        assert block.language == "text", f"{block.where()}: {block.kind} is for text blocks"
    if block.language == "text":
        assert block.kind in (None, "output", "output-whole"), f"{block.where()}: a text block is never run"


def syntax_check(block: Block, folder: Path) -> None:
    if block.language == "python":
        compile(block.code, block.where(), "exec")
    elif block.language == "bash":
        done = subprocess.run(["bash", "-n"], input=block.code, text=True, capture_output=True)
        assert done.returncode == 0, f"{block.where()}: {done.stderr.strip()}"
    elif block.language == "yaml":
        yaml.safe_load(block.code)


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    return env


def run(block: Block, folder: Path, command: list[str]) -> str:
    done = subprocess.run(
        command, cwd=folder, env=environment(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    output = done.stdout + done.stderr
    failed = done.returncode != 0
    if failed != (block.kind == "expect-fail"):
        tail = "\n".join(output.splitlines()[-40:])
        expected = "to fail" if block.kind == "expect-fail" else "to succeed"
        pytest.fail(
            f"{block.where()}: expected {expected}, exit {done.returncode}\n{block.code}\n--- output ---\n{tail}"
        )
    return output


def matches(expected: str, output: str) -> bool:
    """Each line of `expected` in `output`, in order; `...` inside a line matches anything."""
    position = 0
    for line in expected.splitlines():
        if not line.strip():
            continue
        pattern = ".*?".join(re.escape(piece) for piece in line.strip().split("..."))
        found = re.compile(pattern).search(output, position)
        if not found:
            return False
        position = found.end()
    return True


def matches_whole(expected: str, output: str) -> bool:
    """`output`'s lines are `expected`'s, one for one (trailing whitespace and trailing blank lines aside); `...` inside
    a line matches anything."""
    want, got = (text.rstrip("\n").splitlines() for text in (expected, output))
    if len(want) != len(got):
        return False
    return all(
        re.fullmatch(".*?".join(re.escape(piece) for piece in w.rstrip().split("...")), g.rstrip())
        for w, g in zip(want, got, strict=True)
    )


def run_page(path: Path, folder: Path) -> list[str]:
    """Runs the page's blocks in order in `folder`; returns what was only syntax-checked, with why."""
    for name in ("examples", "benchmarks"):
        (folder / name).symlink_to(ROOT / name)
    checked_only, last_output = [], None
    for n, block in enumerate(blocks(path)):
        check_block(block)
        if block.kind == "skip" or (block.kind == "vllm" and not HAVE_VLLM):
            syntax_check(block, folder)
            checked_only.append(f"{block.where()}: {block.arg or 'needs vLLM'}")
            continue
        if block.kind in ("output", "output-whole"):
            assert last_output is not None, f"{block.where()}: output of what? no block ran before it"
            compare = matches if block.kind == "output" else matches_whole
            assert compare(block.code, last_output), (
                f"{block.where()}: the previous block did not print this:\n{block.code}\n--- it printed ---\n"
                + "\n".join(last_output.splitlines()[-40:])
            )
            continue
        if block.kind == "file":
            syntax_check(block, folder)
            (folder / block.arg).write_text(block.code)
            continue
        if block.language == "yaml":
            syntax_check(block, folder)
            if block.kind == "validate":
                file = folder / f"_block{n}.yaml"
                file.write_text(block.code)
                last_output = run(
                    block, folder, [sys.executable, "-m", "grpokit", "config", "validate", "--config", file.name]
                )
            continue
        if block.language == "text":
            continue
        if block.language == "python":
            script = folder / f"_block{n}.py"
            script.write_text(block.code)
            last_output = run(block, folder, [sys.executable, script.name])
        else:
            last_output = run(block, folder, ["bash", "-e", "-o", "pipefail", "-c", block.code])
    return checked_only


PAGES = pages()


def test_the_docs_have_pages_and_blocks():
    names = {page_id(p) for p in PAGES}
    assert {"docs/index.md", "docs/getting-started.md", "README.md"} <= names
    assert sum(len(blocks(p)) for p in PAGES) > 50


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_page(path, tmp_path, capsys):
    if not blocks(path):
        pytest.skip("no code blocks")
    checked_only = run_page(path, tmp_path)
    with capsys.disabled():
        for line in checked_only:
            print(f"\n  syntax-checked only: {line}", end="")


def test_markers_are_parsed_and_enforced(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- docs-test: file a.py -->\n```python\nVALUE = 6 * 7\n```\n\n"
        "```python\nfrom a import VALUE\nprint('value', VALUE)\n```\n\n"
        "<!-- docs-test: output -->\n```text\nvalue ...2\n```\n\n"
        "<!-- docs-test: expect-fail -->\n```bash\nexit 3\n```\n\n"
        "<!-- docs-test: skip needs a GPU -->\n```bash\nnvidia-smi\n```\n"
    )
    found = blocks(page)
    assert [(b.language, b.kind, b.arg) for b in found] == [
        ("python", "file", "a.py"),
        ("python", None, None),
        ("text", "output", None),
        ("bash", "expect-fail", None),
        ("bash", "skip", "needs a GPU"),
    ]
    folder = tmp_path / "run"
    folder.mkdir()
    assert run_page(page, folder) == [f"{page}:24: needs a GPU"]


@pytest.mark.parametrize(
    ("printed", "kind", "expected"),
    [("echo hello", "output", "goodbye"), ("echo one; echo two", "output-whole", "one")],  # a line it printed missing
)
def test_a_wrong_output_block_fails(tmp_path, printed, kind, expected):
    page = tmp_path / "page.md"
    page.write_text(f"```bash\n{printed}\n```\n\n<!-- docs-test: {kind} -->\n```text\n{expected}\n```\n")
    folder = tmp_path / "run"
    folder.mkdir()
    with pytest.raises(AssertionError, match="did not print"):
        run_page(page, folder)


def test_matches():
    assert matches("step 10/40 | reward\nstep 40/40", "step 10/40 | reward 0.1\nstep 40/40 | reward 0.5")
    assert not matches("step 40/40\nstep 10/40", "step 10/40\nstep 40/40")  # order counts
    assert matches("error: ... did you mean", "error: x; did you mean y")


def test_matches_whole():
    printed = "error: a (cli): wrong\nerror: b (yaml:r.yaml:3): wrong too\n"
    assert matches_whole("error: a (cli): wrong\nerror: b (...): wrong too", printed)
    assert not matches_whole("error: a (cli): wrong", printed)  # a line it printed is missing
    assert not matches_whole("error: a (cli): wrong\nerror: b (...): wrong too\nerror: c", printed)
    assert not matches_whole("error: a (cli): wrong\nerror: b: wrong too", printed)  # each line whole
