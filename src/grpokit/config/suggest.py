"""'Did you mean' suggestions."""

from __future__ import annotations

import difflib


def closest(word: str, candidates, *, cutoff: float = 0.6) -> str | None:
    """The candidate nearest to `word`, or None when nothing is close enough."""
    candidates = list(candidates)
    lowered = {c.lower(): c for c in candidates}
    if word.lower() in lowered:
        return lowered[word.lower()]
    matches = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=cutoff)
    if matches:
        return lowered[matches[0]]
    # A typo'd key is often a prefix or a part of the real one (`num_gen`, `generations`).
    parts = [c for c in candidates if c.startswith(word) or word in c]
    return min(parts, key=len) if len(word) >= 4 and parts else None


class UnknownArgumentError(TypeError):
    """Keyword arguments a class does not take (a TypeError, as Python raises for them), one line each with the
    nearest valid name: `GRPOConfig.__init__() got an unexpected keyword argument 'num_generation'; did you mean
    'num_generations'?`. A key TRL or transformers renamed names its new name and why."""

    def __init__(self, owner: str, unknown, known, more: list[str] | None = None):
        from .migrations import RENAMED_KEYS

        known = list(known)
        lines = []
        for name in unknown:
            line = f"{owner}() got an unexpected keyword argument {name!r}"
            new, why = RENAMED_KEYS.get(name, (None, ""))
            near = new if new in known else closest(name, known)
            if near is not None:
                line += f"; did you mean {near!r}?" + (f" ({why})" if new == near and why else "")
            lines.append(line)
        self.lines = lines + list(more or [])  # the other problems of the same call, found at the same time
        super().__init__("\n".join(self.lines))
