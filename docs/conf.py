"""Sphinx configuration of grpokit's documentation site: Markdown pages (MyST), the Furo theme, the configuration
reference generated from the dataclasses (_ext/config_reference.py), the API reference from docstrings (autodoc, with
each dataclass's field help: _ext/dataclass_fields.py, and its source: viewcode), a copy button on code blocks, and
code blocks that wrap (_static/custom.css).
Build it as CI does, warnings as errors:

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import grpokit  # noqa: E402

project = "grpokit"
version = release = grpokit.__version__
author = "the grpokit authors"
copyright = "2026, the grpokit authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
    "docstring_markdown",
    "dataclass_fields",
    "config_reference",
]
# The copy button leaves out a shell prompt and Python's >>> / ... prompts.
copybutton_prompt_text = r"\$ |>>> |\.\.\. "
copybutton_prompt_is_regexp = True
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_ext", "README.md"]
root_doc = "index"

# MyST: anchors for headings down to ###, so links like page.md#a-heading are checked like page links.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings = []

# autodoc: members in source order, the class docstring plus __init__'s, type hints in the description.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "mixed"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"grpokit {version}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_show_sourcelink = True  # each page's Markdown source, from its footer
