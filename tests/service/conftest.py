"""A grpokit Tinker server over a tiny model, started in this process on 127.0.0.1 (one per test module), and the
real `tinker` SDK pointed at it."""

import os
import socket
import threading
import time

import pytest

pytest.importorskip("tinker")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, engine, api_key=None):
        import uvicorn

        from grpokit.service.app import build_app

        self.engine = engine
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            build_app(engine, api_key=api_key), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start in 30 s"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def tinker_env():
    saved = {k: os.environ.get(k) for k in ("TINKER_API_KEY", "TINKER_TELEMETRY")}
    os.environ.update(TINKER_API_KEY="tml-local", TINKER_TELEMETRY="0")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory, tinker_env):
    from grpokit.service.engine import Engine

    server = Server(Engine(tiny_model_dir, str(tmp_path_factory.mktemp("tinker-state"))))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def service_client(served):
    import tinker

    return tinker.ServiceClient(base_url=served.url)


@pytest.fixture(scope="module")
def start_server():
    """`Server(engine, api_key=None)`, for a test that needs a second server (stop it when done); a fixture because
    `from conftest import ...` finds whichever conftest module the full suite imported first."""
    return Server
