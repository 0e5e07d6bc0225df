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
    assert _value(cmd, "--block-size") == "32"  # no CUDA: blocks small enough for a group to share its prompt


def test_block_size_is_vllms_on_gpu_and_the_users_when_given(monkeypatch):
    assert "--block-size" not in _command(["m"], monkeypatch, cuda=True)[0]
    cmd, _ = _command(["m", "--block-size", "64"], monkeypatch)
    assert cmd.count("--block-size") == 1 and _value(cmd, "--block-size") == "64"


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


def _hide_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))


def test_beyond_loopback_without_a_token_is_refused(monkeypatch, capsys):
    monkeypatch.delenv("GRPOKIT_VLLM_TOKEN", raising=False)
    assert cli.main(["vllm-serve", "some/model", "--host", "0.0.0.0"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert (
        line.startswith("error: vllm-serve: --host 0.0.0.0 listens beyond loopback") and "GRPOKIT_VLLM_TOKEN" in line
    )


def test_beyond_loopback_with_a_token_warns_once(monkeypatch, capsys, tmp_path):
    _hide_vllm(monkeypatch)  # stops right after the checks instead of starting vLLM
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    assert cli.main(["vllm-serve", "m", "--host", "10.1.2.3", "--token-file", str(token_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "warning: vllm-serve listens beyond loopback (10.1.2.3:8000); every route requires the token"
    assert "pip install" in err[1] and "s3cret" not in "\n".join(err)


def test_a_missing_token_file_is_one_line(monkeypatch, capsys, tmp_path):
    assert cli.main(["vllm-serve", "m", "--host", "0.0.0.0", "--token-file", str(tmp_path / "none")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: vllm-serve: --token-file {tmp_path / 'none'}: No such file or directory"


def test_a_token_puts_every_route_behind_it(monkeypatch):
    monkeypatch.setenv("GRPOKIT_VLLM_TOKEN", "from-env")
    cmd, env = _command(["m", "--enforce-eager"], monkeypatch)
    assert _value(cmd, "--middleware") == "grpokit.generation.vllm_auth.RequireToken"
    assert env["GRPOKIT_VLLM_TOKEN"] == "from-env" and "from-env" not in cmd  # never on the command line
    assert cmd[-1] == "--enforce-eager"
    monkeypatch.delenv("GRPOKIT_VLLM_TOKEN")
    cmd, env = _command(["m"], monkeypatch)
    assert "--middleware" not in cmd and "GRPOKIT_VLLM_TOKEN" not in env  # loopback without a token: as before


def test_enable_lora_mounts_the_runtime_adapter_routes(monkeypatch):
    cmd, env = _command(["/models/m", "--enable-lora", "--max-lora-rank", "8", "--max-loras", "3"], monkeypatch)
    assert cmd[-5:] == ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "3"]
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    _, env = _command(["/models/m"], monkeypatch)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in env
