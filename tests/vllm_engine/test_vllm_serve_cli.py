"""`grpokit vllm-serve`: the command line it builds, and the one-line error without vLLM (no server started)."""

from __future__ import annotations

import importlib.util
import json
import sys

from grpokit import cli
from grpokit.cli import vllm_serve


def _command(argv, monkeypatch, *, cuda=False, plugins=None):
    monkeypatch.setattr(vllm_serve, "default_backend", lambda: "nccl" if cuda else "gloo")
    if plugins is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", plugins)
    args, extra = vllm_serve.build_parser().parse_known_args(argv)
    return vllm_serve.build_command(args, extra)


def _value(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_command_has_what_training_needs(monkeypatch):
    cmd, env = _command(["/models/m", "--port", "9000", "--no-enable-prefix-caching", "--enforce-eager"], monkeypatch)
    assert cmd[0] == sys.executable and cmd[3:5] == ["serve", "/models/m"]
    assert _value(cmd, "--host") == "127.0.0.1"
    assert _value(cmd, "--port") == "9000"
    assert json.loads(_value(cmd, "--weight-transfer-config")) == {"backend": "gloo"}
    assert _value(cmd, "--logprobs-mode") == "processed_logprobs"
    assert "--no-enable-prefix-caching" in cmd and cmd[-1] == "--enforce-eager"  # passed through
    assert "--tensor-parallel-size" not in cmd  # vLLM's defaults unless given
    assert env == {"VLLM_SERVER_DEV_MODE": "1"}


def test_command_backend_and_options(monkeypatch):
    argv = ["m", "--host", "0.0.0.0", "--tensor-parallel-size", "2", "--data-parallel-size", "2"]
    argv += ["--gpu-memory-utilization", "0.5", "--max-model-len", "1024", "--dtype", "bfloat16"]
    cmd, _ = _command(argv, monkeypatch, cuda=True)
    assert json.loads(_value(cmd, "--weight-transfer-config")) == {"backend": "nccl"}
    assert _value(cmd, "--host") == "0.0.0.0"
    assert [_value(cmd, f) for f in ("--tensor-parallel-size", "--data-parallel-size")] == ["2", "2"]
    assert [_value(cmd, f) for f in ("--gpu-memory-utilization", "--max-model-len", "--dtype")] == [
        "0.5",
        "1024",
        "bfloat16",
    ]
    cmd, _ = _command(["m", "--weight-transfer-backend", "gloo"], monkeypatch, cuda=True)
    assert json.loads(_value(cmd, "--weight-transfer-config")) == {"backend": "gloo"}


def test_vllm_plugins_keeps_the_gloo_plugin(monkeypatch):
    _, env = _command(["m"], monkeypatch, plugins="lora_filesystem_resolver")
    assert env["VLLM_PLUGINS"] == "lora_filesystem_resolver,grpokit_gloo_weight_transfer"


def test_without_vllm_one_line_and_exit_2(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert cli.main(["vllm-serve", "some/model"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install" in err


def test_help_says_it_binds_localhost(capsys):
    try:
        cli.main(["vllm-serve", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "127.0.0.1" in out and "rewrite the model's weights" in out
