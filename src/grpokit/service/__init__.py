"""The Tinker API served locally: Thinking Machines' `tinker` SDK and its cookbook drive grpokit's model, LoRA
training and sampling through `grpokit tinker-serve MODEL` (the HTTP room: sessions, futures, wire format).

`engine.py` does the torch work, `losses.py` holds Tinker's losses, `wire.py` the protobuf/JSON shapes, `app.py` the
routes; `serve()` starts one. Needs the `tinker` extra (`pip install "grpokit[tinker]"`).
"""

from __future__ import annotations

import os

API_KEY_ENV = "GRPOKIT_TINKER_API_KEY"


def serve(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    state_dir: str | None = None,
    log_level: str = "info",
) -> None:
    """Serve `model` (a folder, a GGUF file or a Hub id) through the Tinker API until interrupted. Bound to 127.0.0.1
    unless `host` says otherwise, where an API key (`api_key` or $GRPOKIT_TINKER_API_KEY) is required."""
    import uvicorn

    from grpokit.generation.vllm_auth import is_loopback

    from .app import build_app
    from .engine import Engine

    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    if not is_loopback(host) and api_key is None:
        raise ValueError(
            f"--host {host} is reachable from other machines: set an API key (--api-key or "
            f"${API_KEY_ENV}) that clients pass as TINKER_API_KEY"
        )
    engine = Engine(model, state_dir or os.path.abspath("tinker-state"))
    uvicorn.run(build_app(engine, api_key=api_key), host=host, port=port, log_level=log_level)
