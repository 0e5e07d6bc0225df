"""The token middleware of `grpokit vllm-serve`, driven as an ASGI app by hand: no token, a wrong one and the right
one, on HTTP and websocket; lifespan events pass; without a token set it refuses to start."""

import asyncio

import pytest

from grpokit.generation.vllm_auth import RequireToken, auth_headers, is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "192.168.1.2", "my-host"])
def test_hosts_beyond_loopback(host):
    assert not is_loopback(host)


def test_auth_headers():
    assert auth_headers({"GRPOKIT_VLLM_TOKEN": "abc"}) == {"Authorization": "Bearer abc"}
    assert auth_headers({"GRPOKIT_VLLM_TOKEN": ""}) == {} and auth_headers({}) == {}


async def _inner(scope, receive, send):
    _inner.calls.append(scope["type"])
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"weights updated"})


def _call(app, scope_type, authorization=None):
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": f"{scope_type}.request"}

    headers = [(b"host", b"x")] + ([(b"authorization", authorization)] if authorization is not None else [])
    scope = {"type": scope_type, "path": "/update_weights", "headers": headers}
    asyncio.run(app(scope, receive, send))
    return sent


@pytest.fixture
def app(monkeypatch):
    monkeypatch.setenv("GRPOKIT_VLLM_TOKEN", "s3cret")
    _inner.calls = []
    return RequireToken(_inner)


@pytest.mark.parametrize("authorization", [None, b"Bearer wrong", b"s3cret", b"Bearer s3cret "])
def test_without_the_token_a_route_answers_401_and_vllm_never_sees_it(app, authorization):
    sent = _call(app, "http", authorization)
    assert sent[0]["status"] == 401 and b"missing or wrong token" in sent[1]["body"]
    assert _inner.calls == []


def test_with_the_token_the_request_reaches_vllm(app):
    sent = _call(app, "http", b"Bearer s3cret")
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"weights updated"
    assert _inner.calls == ["http"]


def test_websocket_without_the_token_is_closed(app):
    assert _call(app, "websocket") == [{"type": "websocket.close", "code": 1008}]
    assert _inner.calls == []


def test_lifespan_passes(app):
    _call(app, "lifespan")
    assert _inner.calls == ["lifespan"]


def test_no_token_no_server(monkeypatch):
    monkeypatch.delenv("GRPOKIT_VLLM_TOKEN", raising=False)
    with pytest.raises(RuntimeError, match="needs GRPOKIT_VLLM_TOKEN"):
        RequireToken(_inner)
