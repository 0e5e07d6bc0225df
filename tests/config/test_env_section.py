"""The YAML `env:` section: each bad key or value is one line naming it, and `grpokit config validate|show|plan`
leave their own process's environment as they found it (only training applies the section for good)."""

import os

import pytest

from grpokit.cli import main
from grpokit.config.parser import TrlParser
from grpokit.config.rules import ConfigError


def _problems(tmp_path, env_yaml: str) -> list[str]:
    path = tmp_path / "env.yaml"
    path.write_text("model_name_or_path: some/model\nenv:\n" + env_yaml)
    with pytest.raises(ConfigError) as info:
        TrlParser().resolve(["--config", str(path)])
    return [p.line() for p in info.value.problems]


def test_bad_variable_names_are_one_line_each(tmp_path):
    lines = _problems(tmp_path, '  "A=B": x\n  "": y\n  "NUL\\0NAME": z\n  GOOD_ONE: fine\n')
    # each key is credited to its own line (the file: 1 model_name_or_path, 2 env:, 3 "A=B", 4 "", 5 NUL NAME)
    at = f"yaml:{tmp_path / 'env.yaml'}"
    what = "is not a variable name (empty, or holding '=' or a NUL byte)"
    assert lines == [
        f"env.'A=B' ({at}:3): {what}",
        f"env.'' ({at}:4): {what}",
        f"env.'NUL\\x00NAME' ({at}:5): {what}",
    ]
    assert "A=B" not in os.environ and "GOOD_ONE" in os.environ  # the good one was applied: this is training's path
    del os.environ["GOOD_ONE"]


def test_a_nul_byte_in_a_value_is_one_line(tmp_path):
    lines = _problems(tmp_path, '  SOME_VAR: "a\\0b"\n')
    assert lines == [f"env.SOME_VAR (yaml:{tmp_path / 'env.yaml'}:3): holds a NUL byte, which no variable can"]
    assert "SOME_VAR" not in os.environ


@pytest.mark.parametrize("command", [["validate"], ["show"], ["plan"]])
def test_config_commands_leave_the_environment_alone(tmp_path, monkeypatch, capsys, command):
    monkeypatch.setenv("PATH", os.environ["PATH"])
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    before = dict(os.environ)
    path = tmp_path / "env.yaml"
    path.write_text(
        "model_name_or_path: some/model\nreward_funcs: [format]\n"
        "env:\n  LD_PRELOAD: /tmp/evil.so\n  PATH: /tmp/evil\n  TOKENIZERS_PARALLELISM: false\n"
    )
    assert main(["config", *command, "--config", str(path)]) == 0
    assert dict(os.environ) == before
    if command == ["show"]:  # what the section sets is still shown, with its source
        assert "LD_PRELOAD" in capsys.readouterr().out


def test_each_env_key_is_credited_to_its_own_line(tmp_path, cli):
    import json

    path = tmp_path / "env.yaml"
    path.write_text("# a comment\nenv:\n  FIRST_VAR: one\n\n  SECOND_VAR: 2\nmodel_name_or_path: some/model\n")
    shown = json.loads(cli("config", "show", "--format", "json", "--config", str(path)).out)
    assert shown["env.FIRST_VAR"] == {"value": "one", "source": f"yaml:{path}:3"}
    assert shown["env.SECOND_VAR"] == {"value": "2", "source": f"yaml:{path}:5"}
    assert shown["model_name_or_path"]["source"] == f"yaml:{path}:6"
