"""`grpokit config ...` runs no user code: dotted reward paths are checked without importing them, factories are not
called; `config validate --import-rewards` (and training) import them, the working directory first, the same under
`python -m grpokit` and the `grpokit` console script."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

GRPOKIT_SCRIPT = os.path.join(os.path.dirname(sys.executable), "grpokit")
COMMANDS = [[sys.executable, "-m", "grpokit"]] + ([[GRPOKIT_SCRIPT]] if os.path.exists(GRPOKIT_SCRIPT) else [])


def _run(command, args, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _write(path, text):
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


@pytest.mark.parametrize("sub", ["validate", "show", "plan"])
def test_factory_mapping_naming_os_system_is_not_called(tmp_path, sub):
    sentinel = tmp_path / "SENTINEL"
    _write(
        tmp_path / "evil.yaml",
        f"model_name_or_path: m\nreward_funcs:\n  - name: os.system\n    kwargs: {{command: 'touch {sentinel}'}}\n",
    )
    result = _run(COMMANDS[0], ["config", sub, "--config", "evil.yaml"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert not sentinel.exists()


def test_diff_runs_no_reward_code(tmp_path):
    sentinel = tmp_path / "SENTINEL"
    for name in ("a", "b"):
        _write(
            tmp_path / f"{name}.yaml",
            f"reward_funcs:\n  - name: os.system\n    kwargs: {{command: 'touch {sentinel}'}}\n",
        )
    result = _run(COMMANDS[0], ["config", "diff", "a.yaml", "b.yaml"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no differences"
    assert not sentinel.exists()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "script" if c[0] == GRPOKIT_SCRIPT else "python-m")
def test_module_in_working_directory_is_found_but_only_imported_when_asked(tmp_path, command):
    sentinel = tmp_path / "IMPORTED"
    _write(
        tmp_path / "my_rewards.py",
        f"open({str(sentinel)!r}, 'w').close()\n\ndef brevity(completions, **kwargs):\n"
        "    return [-len(str(c)) for c in completions]\n",
    )
    _write(tmp_path / "r.yaml", "reward_funcs: [my_rewards.brevity]\n")
    checked = _run(command, ["config", "validate", "--config", "r.yaml"], tmp_path)
    assert (checked.returncode, checked.stdout.strip()) == (0, "ok"), checked.stderr
    assert not sentinel.exists()
    imported = _run(command, ["config", "validate", "--import-rewards", "--config", "r.yaml"], tmp_path)
    assert (imported.returncode, imported.stdout.strip()) == (0, "ok"), imported.stderr
    assert sentinel.exists()  # the module ran: found in the working directory under either command


def test_import_rewards_reports_a_missing_function(tmp_path):
    _write(tmp_path / "my_rewards.py", "def brevity(completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    _write(tmp_path / "r.yaml", "reward_funcs: [my_rewards.brevty]\n")
    assert _run(COMMANDS[0], ["config", "validate", "--config", "r.yaml"], tmp_path).returncode == 0
    result = _run(COMMANDS[0], ["config", "validate", "--import-rewards", "--config", "r.yaml"], tmp_path)
    assert result.returncode == 2
    assert "has no attribute 'brevty'; did you mean 'brevity'?" in result.stderr


def test_missing_module_is_one_line_without_importing(tmp_path):
    result = _run(COMMANDS[0], ["config", "validate", "--reward_funcs", "no_such_pkg.accuracy"], tmp_path)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert (
        "no module named 'no_such_pkg' in the working directory or on sys.path; did you mean 'accuracy'?" in lines[0]
    )


def test_check_reward_spec_without_import_leaves_sys_modules_alone(tmp_path, monkeypatch):
    from grpokit.rewards import check_reward_spec

    _write(tmp_path / "side_effect_mod.py", "raise SystemExit('must not run')\n")
    monkeypatch.chdir(tmp_path)
    assert check_reward_spec("side_effect_mod.fn", import_code=False) is None
    assert "side_effect_mod" not in sys.modules
    assert check_reward_spec("bad path.fn", import_code=False) == (
        "reward 'bad path.fn': not a valid dotted path 'package.module.function'"
    )
    # built-in names still resolve in full (grpokit's own code): a bad kwarg is found without importing anything
    assert "max_lenght" in check_reward_spec({"name": "cosine", "kwargs": {"max_lenght": 3}}, import_code=False)
