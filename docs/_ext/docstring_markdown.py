"""Sphinx extension: grpokit's docstrings are written in light Markdown (code spans in backticks, `*` and `|` as
plain characters, a parameter's description continued on an indented line), which reStructuredText reads
differently. Before autodoc (and napoleon, which runs after this) parse a docstring, this hook:

- turns each Markdown code span, of any number of backticks, into a reST literal;
- makes `*` and `|` outside code spans plain characters (reST: emphasis, substitutions);
- joins an indented continuation line onto the line it continues, unless that line opens a section (`Args:`) or is inside a doctest (reST would read the indentation as a definition list or a quote).
"""

import re

_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def _literal(match: re.Match) -> str:
    text = match.group(2).strip() if len(match.group(1)) > 1 else match.group(2)
    if "`" in text or text != text.strip() or not text:
        return ":literal:`" + text.replace("\\", "\\\\").replace("`", "\\`") + "`"
    return f"``{text}``"


def _convert(line: str) -> str:
    out, last = [], 0
    for match in _SPAN.finditer(line):
        out.append(re.sub(r"([*|])", r"\\\1", line[last : match.start()]))
        before = line[match.start() - 1] if match.start() else " "
        after = line[match.end()] if match.end() < len(line) else " "
        # reST ends a literal only before a space or punctuation: "``Model``s" needs an escaped space.
        out.append(("\\ " if before.isalnum() else "") + _literal(match) + ("\\ " if after.isalnum() else ""))
        last = match.end()
    out.append(re.sub(r"([*|])", r"\\\1", line[last:]))
    return "".join(out)


_SECTION = re.compile(r"^\s*[A-Z][\w ]{0,30}:\s*$")  # Args:, Returns:, Example: (napoleon's sections)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _join_continuations(lines: list[str]) -> list[str]:
    joined: list[str] = []
    for line in lines:
        previous = joined[-1] if joined else ""
        continues = (
            line.strip()
            and previous.strip()
            and _indent(line) > _indent(previous)
            and not _SECTION.match(previous)
            and not previous.lstrip().startswith((">>>", "..."))
        )
        if continues:
            joined[-1] = previous.rstrip() + " " + line.strip()
        else:
            joined.append(line)
    return joined


def _markdown_to_rest(app, what, name, obj, options, lines):
    if what == "class" and lines and lines[0].startswith(getattr(obj, "__name__", "?") + "("):
        lines[:] = []  # the signature dataclasses write when a class has no docstring: the reference lists the fields
        return
    converted = [_convert(line) for line in _join_continuations(list(lines))]
    lines[:] = converted


def setup(app):
    app.connect("autodoc-process-docstring", _markdown_to_rest, priority=400)
    return {"version": "1", "parallel_read_safe": True}
