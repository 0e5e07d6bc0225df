"""`grpokit tinker-serve MODEL`: serve MODEL through the Tinker API (`grpokit.service`)."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Serve MODEL (a local folder, a GGUF file or a Hub id) through the Tinker API, so that the unmodified `tinker` SDK
and tinker-cookbook recipes train LoRA adapters on it and sample from them: point them at it with
base_url=http://HOST:PORT (or TINKER_BASE_URL) and any TINKER_API_KEY starting with "tml-". Listens on 127.0.0.1
unless --host is given; another host requires --api-key (or $GRPOKIT_TINKER_API_KEY), which clients then pass as
their TINKER_API_KEY."""


def main(argv) -> int:
    parser = argparse.ArgumentParser(prog="grpokit tinker-serve", description=DESCRIPTION)
    parser.add_argument("model", help="a local model folder, a .gguf file or a Hub id")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--api-key", default=None, help="the key clients must send (required off loopback)")
    parser.add_argument(
        "--state-dir", default=None, help="where saved weights and sampler weights go (default ./tinker-state)"
    )
    parser.add_argument("--log-level", default="info", help="uvicorn's log level (default info)")
    args = parser.parse_args(argv)
    try:
        import fastapi  # noqa: F401
        import tinker  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        print(
            f"error: grpokit tinker-serve needs the tinker extra: pip install 'grpokit[tinker]' ({e})", file=sys.stderr
        )
        return 2
    from grpokit.service import serve

    try:
        serve(
            args.model,
            host=args.host,
            port=args.port,
            api_key=args.api_key,
            state_dir=args.state_dir,
            log_level=args.log_level,
        )
    except (ValueError, OSError) as e:  # a bad MODEL (not found, unreachable hub), a host without a key, a busy port
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
