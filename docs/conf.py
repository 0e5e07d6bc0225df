"""Sphinx configuration of grpokit's documentation site: Markdown pages (MyST), the Furo theme, the configuration
reference generated from the dataclasses (_ext/config_reference.py) and the API reference from docstrings (autodoc).
Build it as CI does, warnings as errors:

    sphinx-build -W --keep-going -b html docs docs/_build/html
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

project = "grpokit"
author = "the grpokit authors"
copyright = "2026, the grpokit authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "docstring_markdown",
    "config_reference",
]
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
html_title = "grpokit"
html_static_path = []
