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
