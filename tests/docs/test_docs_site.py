"""The documentation site builds from docs/ with Sphinx, warnings as errors: a broken link to a page or to a heading
anchor, a page outside every table of contents, or a docstring autodoc cannot read fails the build."""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import config_reference  # noqa: E402  (docs/_ext: the generator of the configuration reference)


def build(source: Path, out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html", str(source), str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    done = build(DOCS, tmp_path / "html")
    assert done.returncode == 0, done.stderr[-5000:]
    assert "WARNING" not in done.stderr and "ERROR" not in done.stderr, done.stderr[-5000:]
    pages = {p.relative_to(tmp_path / "html").as_posix() for p in (tmp_path / "html").rglob("*.html")}
    expected = {str(p.relative_to(DOCS).with_suffix(".html")) for p in DOCS.rglob("*.md") if "_build" not in p.parts}
    assert expected <= pages
    check_the_sites_parts(tmp_path / "html")


def check_the_sites_parts(html: Path) -> None:
    """What a reader gets beyond the pages: the version, a copy button and wrapping code blocks on every page, the
    source of the API's modules, each configuration dataclass's field help, an index that is an introduction."""
    import grpokit

    index = (html / "index.html").read_text()
    assert f"<title>grpokit {grpokit.__version__}</title>" in index
    assert "copybutton.js" in index and "custom.css" in index
    assert "white-space: pre-wrap" in (html / "_static" / "custom.css").read_text()
    assert (html / "_modules" / "grpokit" / "config" / "grpo_config.html").is_file()  # viewcode: [source] links
    api = (html / "reference" / "api.html").read_text()
    assert "viewcode-link" in api
    # field help under each dataclass: GRPOConfig's own fields, ScriptArguments' (TRL's) included
    import dataclasses

    from grpokit import GRPOConfig, ScriptArguments

    for cls, name in ((GRPOConfig, "num_generations"), (ScriptArguments, "dataset_name")):
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        default = "None" if field.default is None else str(field.default)
        entry = f'{name}</span></code> (default <code class="docutils literal notranslate"><span class="pre">{default}'
        assert entry in api, name
        assert field.metadata["help"].split(".")[0] in api, name
    main = index.split('<article role="main"', 1)[1].split("</article>", 1)[0]
    assert "toctree-l1" not in main  # the tables of contents are the sidebar's, not repeated as lists
    assert "how-to/agents.html" in main  # the introduction links where to go


def test_a_broken_link_fails_the_build(tmp_path):
    """The check the site relies on: with -W a link to a missing heading is an error, not a silent dead link."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "conf.py").write_text(
        'extensions = ["myst_parser"]\nsource_suffix = {".md": "markdown"}\nmyst_heading_anchors = 3\n'
    )
    (source / "index.md").write_text(
        textwrap.dedent("""\
        # Title

        ## A heading

        [fine](#a-heading) and [broken](#no-such-heading)
        """)
    )
    done = build(source, tmp_path / "html")
    assert done.returncode != 0
    assert "no-such-heading" in done.stderr


def test_the_configuration_reference_is_current():
    """docs/reference/configuration.md is generated from the dataclasses (and rewritten on every build); the copy in
    the repository, which GitHub shows, must be the current one: python docs/_ext/config_reference.py rewrites it."""
    committed = (DOCS / config_reference.TARGET).read_text()
    assert committed == config_reference.render(), "stale: run python docs/_ext/config_reference.py"


def test_the_reference_lists_every_field_once():
    from grpokit.cli.help import train_fields

    text = config_reference.render()
    headings = [line[len("### `") : -1] for line in text.splitlines() if line.startswith("### `")]
    assert sorted(headings) == sorted(train_fields())
    assert "### `num_generations`\n\n`INT` · default `8`" in text
    # a grpokit-only field says so; a field TRL has does not
    assert "### `max_nonfinite_steps`\n\n`INT` · default `3` · *grpokit only*" in text
    assert "*grpokit only*" not in text.split("### `num_generations`")[1].split("###")[0]
    # recipes that set a field are named with their value
    assert "dapo (`0.28`)" in text.split("### `epsilon_high`")[1].split("###")[0]
