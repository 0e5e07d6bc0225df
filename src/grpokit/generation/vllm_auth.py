"""The token between the trainer and `grpokit vllm-serve`: every route of the server, vLLM's weight-update routes
included, answers only requests that carry it.

vLLM's own `--api-key` guards only its `/v1` routes, while `/update_weights` and the other weight-transfer routes
rewrite the served model for anyone who reaches the port. `grpokit vllm-serve` therefore adds `RequireToken` as an ASGI
middleware (`vllm serve --middleware grpokit.generation.vllm_auth.RequireToken`) whenever a token is set, and refuses
to listen beyond loopback without one. The token travels in the environment (`GRPOKIT_VLLM_TOKEN`), never on a command
line that `ps` shows; the trainer sends it as `Authorization: Bearer <token>`. Nothing here imports vLLM.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Mapping

TOKEN_ENV = "GRPOKIT_VLLM_TOKEN"
MIDDLEWARE = "grpokit.generation.vllm_auth.RequireToken"


def token_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The shared token, or None when unset or empty."""
    value = (os.environ if env is None else env).get(TOKEN_ENV, "")
    return value or None


def auth_headers(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The header the trainer adds to every request to the server (none without a token)."""
    token = token_from_env(env)
    return {"Authorization": f"Bearer {token}"} if token else {}


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`; any other name counts as beyond."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class RequireToken:
    """ASGI middleware: an HTTP or websocket request without `Authorization: Bearer <GRPOKIT_VLLM_TOKEN>` gets 401
    and never reaches vLLM. Built without a token set, it refuses to start (fail closed)."""

    def __init__(self, app):
        token = token_from_env()
        if token is None:
            raise RuntimeError(f"{MIDDLEWARE} needs {TOKEN_ENV} set in the server's environment")
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": f"missing or wrong token: send 'Authorization: Bearer ${TOKEN_ENV}'"}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope) -> bool:
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        return hmac.compare_digest(given, self._expected)
