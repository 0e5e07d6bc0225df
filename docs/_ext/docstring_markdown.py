"""Sphinx extension: grpokit's docstrings write code as Markdown code spans (`name`); reStructuredText would read
those as cited titles. Each single-backtick span becomes a literal (``name``) before autodoc's parser sees it."""

import re

_SPAN = re.compile(r"(?<![`:\w])`([^`\n]+)`(?![`_\w])")


def _literal_spans(app, what, name, obj, options, lines):
    for i, line in enumerate(lines):
        lines[i] = _SPAN.sub(r"``\1``", line)


def setup(app):
    app.connect("autodoc-process-docstring", _literal_spans, priority=400)
    return {"version": "1", "parallel_read_safe": True}
