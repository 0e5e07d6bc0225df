"""`VLLMServerGenerator` against a fake `vllm serve` (stdlib HTTP, no vLLM needed): the configuration checks'
one-line errors and the shape of a completion request."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grpokit.generation.vllm_server import VLLMServerError, VLLMServerGenerator

MODEL = "/models/policy"


class FakeServer:
    def __init__(self, *, dev_mode=True, backend="gloo", logprobs_mode="processed_logprobs"):
        self.dev_mode, self.backend, self.logprobs_mode = dev_mode, backend, logprobs_mode
        self.requests: list[dict] = []
        self.authorizations: list[str | None] = []  # the Authorization header of every request, in order
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, payload):
                body = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                fake.authorizations.append(self.headers.get("Authorization"))
                if self.path == "/health":
                    return self._send(200, {})
                if self.path == "/v1/models":
                    return self._send(200, {"data": [{"id": MODEL, "root": MODEL}]})
                if self.path.startswith("/server_info") and fake.dev_mode:
                    transfer = {"backend": fake.backend} if fake.backend else None
                    config = {
                        "weight_transfer_config": transfer,
                        "model_config": {"logprobs_mode": fake.logprobs_mode},
                    }
                    return self._send(200, {"vllm_config": config})
                if self.path == "/get_world_size" and fake.dev_mode:
                    return self._send(200, {"world_size": 1})
                return self._send(404, {"detail": "Not Found"})

            def do_POST(self):  # noqa: N802
                fake.authorizations.append(self.headers.get("Authorization"))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                choices = []
                for prompt in body["prompt"]:
                    for j in range(body["n"]):
                        # completion: [prompt's first id, 10 + j, 1 (EOS), 7]
                        ids = [prompt[0], 10 + j, 1, 7]
                        lps = [-0.5, -1.0 - j, -0.25, -3.0]
                        choices.append({"index": len(choices), "token_ids": ids, "logprobs": {"token_logprobs": lps}})
                return self._send(200, {"choices": choices})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake(request):
    server = FakeServer(**getattr(request, "param", {}))
    yield server
    server.close()


def _generator(url, **kwargs):
    args = dict(
        base_url=url,
        timeout=5,
        group_port=1,
        sampling={"temperature": 1.0, "top_k": 0, "min_p": 0.0, "max_tokens": 4, "logprobs": 0, "n": 1},
        num_generations=2,
        eos_token_ids=[1],
        model_name=MODEL,
    )
    args.update(kwargs)
    return VLLMServerGenerator(**args)


def _one_line_error(fake, **kwargs) -> str:
    with pytest.raises(VLLMServerError) as info:
        _generator(fake.url, **kwargs)
    message = str(info.value)
    assert "\n" not in message and fake.url in message
    return message


@pytest.mark.parametrize("fake", [{"dev_mode": False}], indirect=True)
def test_without_dev_endpoints(fake):
    message = _one_line_error(fake)
    assert "VLLM_SERVER_DEV_MODE=1" in message and "--weight-transfer-config" in message


@pytest.mark.parametrize("fake", [{"backend": None}], indirect=True)
def test_without_weight_transfer_engine(fake):
    assert "--weight-transfer-config" in _one_line_error(fake)


@pytest.mark.parametrize("fake", [{"logprobs_mode": "raw_logprobs"}], indirect=True)
def test_raw_logprobs(fake):
    message = _one_line_error(fake)
    assert "raw_logprobs" in message and "--logprobs-mode processed_logprobs" in message


def test_wrong_model(fake):
    message = _one_line_error(fake, model_name="other/model")
    assert "other/model" in message and MODEL in message


def test_request_shape_and_rows(fake):
    generator = _generator(fake.url)
    out = generator.generate([[5, 6], [5, 6], [9], [9]])
    (request,) = fake.requests
    assert request["prompt"] == [[5, 6], [9]]  # each prompt once
    assert request["n"] == 2 and request["logprobs"] == 0 and request["return_token_ids"] is True
    assert request["model"] == MODEL and request["top_k"] == 0 and request["max_tokens"] == 4
    assert out.completion_ids == [[5, 10, 1], [5, 11, 1], [9, 10, 1], [9, 11, 1]]  # cut after EOS 1
    assert out.logprobs == [[-0.5, -1.0, -0.25], [-0.5, -2.0, -0.25], [-0.5, -1.0, -0.25], [-0.5, -2.0, -0.25]]


def test_greedy_asks_once_and_repeats(fake):
    generator = _generator(fake.url, sampling={"temperature": 0.0, "max_tokens": 4})
    out = generator.generate([[5], [5]])
    assert fake.requests[0]["n"] == 1  # vLLM refuses n > 1 with greedy sampling
    assert out.completion_ids == [[5, 10, 1], [5, 10, 1]]


def test_rows_not_in_groups_get_one_completion_each(fake):
    """The tool loop's turns (one sequence per rollout, any number of them) are not groups of one prompt: each row
    is asked one completion (n=1), in order."""
    out = _generator(fake.url).generate([[5], [5], [6]])
    assert fake.requests[-1]["prompt"] == [[5], [5], [6]] and fake.requests[-1]["n"] == 1
    assert out.completion_ids == [[5, 10, 1], [5, 10, 1], [6, 10, 1]]
    out = _generator(fake.url).generate([[5], [6]])
    assert fake.requests[-1]["prompt"] == [[5], [6]] and fake.requests[-1]["n"] == 1
    assert out.completion_ids == [[5, 10, 1], [6, 10, 1]] and out.logprobs == [[-0.5, -1.0, -0.25]] * 2
    greedy = _generator(fake.url, sampling={"temperature": 0.0, "max_tokens": 4}).generate([[7]])
    assert fake.requests[-1]["n"] == 1 and greedy.completion_ids == [[7, 10, 1]]


def test_every_request_carries_the_token(fake, monkeypatch):
    monkeypatch.setenv("GRPOKIT_VLLM_TOKEN", "s3cret")
    _generator(fake.url).generate([[5, 6], [5, 6]])
    assert len(fake.authorizations) >= 3  # the checks at start and the completion request
    assert set(fake.authorizations) == {"Bearer s3cret"}


def test_without_a_token_no_header_is_sent(fake, monkeypatch):
    monkeypatch.delenv("GRPOKIT_VLLM_TOKEN", raising=False)
    _generator(fake.url).generate([[5, 6], [5, 6]])
    assert set(fake.authorizations) == {None}
