"""`grpokit train` with `tools` / `environment_factory` in the configuration: checked before anything loads, then
imported and handed to `GRPOTrainer(tools=..., environment_factory=...)`. GRPOTrainer is replaced by a fake that
records its arguments and stops, so no model loads or trains."""

import json
import sys

import pytest

import grpokit.trainer
from grpokit.cli import main


class TrainerReached(Exception):
    """Raised by the fake GRPOTrainer: the run got as far as constructing the trainer."""


@pytest.fixture
def fake_trainer(monkeypatch):
    calls = []

    def fake(**kwargs):
        calls.append(kwargs)
        raise TrainerReached

    monkeypatch.setattr(grpokit.trainer, "GRPOTrainer", fake)
    return calls


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """The user's module `agcli_tools` in tmp_path, which records in `imported.log` that it was imported."""
    log = tmp_path / "imported.log"
    (tmp_path / "agcli_tools.py").write_text(
        f"open({str(log)!r}, 'a').write(__name__ + '\\n')\n"
        "def search(query: str) -> str:\n    return query\n\n\n"
        "def lookup(key: str) -> str:\n    return key\n\n\n"
        "class Counter:\n    def reset(self):\n        return None\n\n\n"
        "class Maze:\n    def reset(self):\n        return None\n"
    )
    (tmp_path / "agcli_boom.py").write_text(
        "raise RuntimeError('boom at import')\ndef search(q: str) -> str:\n    return q\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield log
    for name in ("agcli_tools", "agcli_boom"):
        sys.modules.pop(name, None)


@pytest.fixture
def run(capsys):
    def _run(*args):
        capsys.readouterr()
        code = main([str(a) for a in args])
        _, err = capsys.readouterr()
        return code, [line for line in err.splitlines() if line.startswith("error: ")]

    return _run


def recipe(tmp_path, model_dir, **fields):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "environment": "maze"}) + "\n" for i in range(4)))
    values = {
        "model_name_or_path": str(model_dir),
        "dataset_name": str(data),
        "reward_funcs": ["tag_count"],
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "max_completion_length": 8,
        "max_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "output_dir": str(tmp_path / "run"),
        **fields,
    }
    path = tmp_path / "agent.yaml"
    path.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items()))
    return path


def test_train_hands_the_imported_callables_to_the_trainer(tmp_path, tiny_model_dir, user_code, fake_trainer):
    path = recipe(tmp_path, tiny_model_dir, tools=["agcli_tools:search", "agcli_tools.lookup"],
                  environment_factory="agcli_tools:Counter", max_tool_calling_iterations=2)  # fmt: skip
    with pytest.raises(TrainerReached):
        main(["train", "--config", str(path)])
    module = sys.modules["agcli_tools"]
    (kwargs,) = fake_trainer
    assert kwargs["tools"] == [module.search, module.lookup]
    assert kwargs["environment_factory"] is module.Counter
    assert kwargs["args"].max_tool_calling_iterations == 2
    assert user_code.read_text() == "agcli_tools\n"  # imported once, when training started


def test_train_hands_a_mapping_of_environments(tmp_path, tiny_model_dir, user_code, fake_trainer):
    path = recipe(
        tmp_path, tiny_model_dir, environment_factory={"maze": "agcli_tools.Maze", "count": "agcli_tools:Counter"}
    )
    with pytest.raises(TrainerReached):
        main(["train", "--config", str(path)])
    module = sys.modules["agcli_tools"]
    (kwargs,) = fake_trainer
    assert kwargs["environment_factory"] == {"maze": module.Maze, "count": module.Counter}
    assert "tools" not in kwargs


def test_command_line_tools(tmp_path, tiny_model_dir, user_code, fake_trainer):
    path = recipe(tmp_path, tiny_model_dir)
    with pytest.raises(TrainerReached):
        main(["train", "--config", str(path), "--tools", "agcli_tools:search", "agcli_tools:lookup"])
    module = sys.modules["agcli_tools"]
    (kwargs,) = fake_trainer
    assert kwargs["tools"] == [module.search, module.lookup] and "environment_factory" not in kwargs


def test_without_agent_fields_the_call_is_unchanged(tmp_path, tiny_model_dir, user_code, fake_trainer):
    path = recipe(tmp_path, tiny_model_dir)
    with pytest.raises(TrainerReached):
        main(["train", "--config", str(path)])
    (kwargs,) = fake_trainer
    assert set(kwargs) == {
        "model",
        "reward_funcs",
        "args",
        "train_dataset",
        "eval_dataset",
        "peft_config",
        "quantization_config",
    }  # the run's records are the trainer's own callback (grpokit.records), not one the command passes
    assert kwargs["quantization_config"] is None  # no load_in_4bit / load_in_8bit: an unquantised model
    assert not user_code.exists()


def test_an_environment_may_own_the_reward(tmp_path, tiny_model_dir, user_code, fake_trainer):
    # No reward_funcs: the environment's get_reward may be the reward (TRL's rule); GRPOTrainer judges that.
    path = recipe(tmp_path, tiny_model_dir, reward_funcs=None, environment_factory="agcli_tools:Counter")
    with pytest.raises(TrainerReached):
        main(["train", "--config", str(path)])
    (kwargs,) = fake_trainer
    assert kwargs["reward_funcs"] == [] and kwargs["environment_factory"] is sys.modules["agcli_tools"].Counter


def test_an_import_that_fails_is_one_line(tmp_path, tiny_model_dir, user_code, fake_trainer, run):
    path = recipe(tmp_path, tiny_model_dir, tools=["agcli_tools:search", "agcli_boom:search"])
    code, errors = run("train", "--config", path)
    assert code == 2 and errors == [
        "error: tools: entry 1: 'agcli_boom:search': importing module 'agcli_boom' failed: RuntimeError: boom at import"
    ]
    assert fake_trainer == []
    path = recipe(tmp_path, tiny_model_dir, environment_factory={"maze": "agcli_boom.search"})
    code, errors = run("train", "--config", path)
    assert code == 2 and errors == [
        "error: environment_factory: entry 'maze': 'agcli_boom.search': importing module 'agcli_boom' failed: "
        "RuntimeError: boom at import"
    ]
    assert fake_trainer == [] and not (tmp_path / "run").exists()


def test_train_refuses_before_importing_or_loading(tmp_path, tiny_model_dir, user_code, fake_trainer, run):
    path = recipe(tmp_path, tiny_model_dir, tools=["agcli_tools:serch"], max_tool_calling_iterations=3)
    code, errors = run("train", "--config", path)
    assert code == 2 and errors == [
        f"error: tools (yaml:{path}:11): entry 0: 'agcli_tools:serch': module 'agcli_tools' "
        f"({tmp_path / 'agcli_tools.py'}) defines no 'serch' at its top level; did you mean 'search'?"
    ]
    path = recipe(tmp_path, tiny_model_dir, max_tool_calling_iterations=3)
    code, errors = run("train", "--config", path)
    assert code == 2 and errors == [
        f"error: max_tool_calling_iterations=3 (yaml:{path}:11): caps the tool-calling loop and has no effect "
        "without tools; set tools or environment_factory, or remove it"
    ]
    assert fake_trainer == [] and not user_code.exists() and not (tmp_path / "run").exists()
