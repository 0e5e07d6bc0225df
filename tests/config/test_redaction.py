"""Secrets (`*_token` fields, secret-looking `env:` variables) never shown or written in clear: `config show` in every
format, `config diff`, resolved_config.yaml (which says where the value must come from instead), log records."""

import json
import logging
import os
import textwrap

import pytest

from grpokit.cli import main
from grpokit.config import redaction
from grpokit.config.parser import TrlParser
from grpokit.config.redaction import is_secret_env, is_secret_field, redact, redact_deep

TOKEN = "hf_ClearTextToken0123456789"
WANDB = "wandb-secret-key-abcdef"


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    for name in ("HF_TOKEN", "WANDB_API_KEY", "TOKENIZERS_PARALLELISM", "PGPASSWORD", "MY_TOKEN"):
        monkeypatch.delenv(name, raising=False)  # the env: sections below set them; restored after each test
    redaction._reset_for_tests()
    yield
    redaction._reset_for_tests()


@pytest.fixture
def secret_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            model_name_or_path: some/model
            hub_token: {TOKEN}
            learning_rate: 2.0e-5
            env:
              WANDB_API_KEY: {WANDB}
              TOKENIZERS_PARALLELISM: false
              PGPASSWORD: hunter2
            """
        )
    )
    return path


def test_which_names_are_secret():
    # Hand-checked: every *_token field, and env names containing TOKEN, KEY, SECRET or PASSWORD in any case.
    assert [n for n in ("hub_token", "token", "average_tokens_across_devices", "include_num_input_tokens_seen",
                        "max_completion_length", "my_api_key", "push_to_hub") if is_secret_field(n)] == [
        "hub_token", "token", "my_api_key"]  # fmt: skip
    names = ["HF_TOKEN", "hf_token", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD", "DB_PASSWD",
             "TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "HF_HOME"]  # fmt: skip
    assert [n for n in names if is_secret_env(n)] == [
        "HF_TOKEN",
        "hf_token",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "PGPASSWORD",
        "DB_PASSWD",
    ]


def test_config_show_redacts_in_every_format(secret_yaml, capsys):
    assert main(["config", "show", "--config", str(secret_yaml)]) == 0
    table = capsys.readouterr().out
    assert TOKEN not in table and WANDB not in table and "hunter2" not in table
    rows = {line.split()[0]: line.split()[1] for line in table.splitlines()[2:]}
    assert rows["hub_token"] == '"<redacted>"'
    assert rows["env.WANDB_API_KEY"] == '"<redacted>"'
    assert rows["env.PGPASSWORD"] == '"<redacted>"'
    assert rows["env.TOKENIZERS_PARALLELISM"] == '"false"'

    assert main(["config", "show", "--format", "json", "--config", str(secret_yaml)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["hub_token"] == {"value": "<redacted>", "source": f"yaml:{secret_yaml}:2"}
    # each env key on its own line (4 is `env:`)
    assert shown["env.WANDB_API_KEY"] == {"value": "<redacted>", "source": f"yaml:{secret_yaml}:5"}
    assert shown["env.TOKENIZERS_PARALLELISM"] == {"value": "false", "source": f"yaml:{secret_yaml}:6"}
    assert shown["learning_rate"]["value"] == 2e-5

    assert main(["config", "show", "--format", "yaml", "--config", str(secret_yaml)]) == 0
    text = capsys.readouterr().out
    assert TOKEN not in text and WANDB not in text and "hunter2" not in text
    lines = text.splitlines()
    assert f"# hub_token: <redacted: set HF_TOKEN or pass --hub_token>  # yaml:{secret_yaml}:2" in lines
    assert f"env:  # yaml:{secret_yaml}:5" in lines  # render.py credits the section to its first key's line
    assert f"  # WANDB_API_KEY: <redacted: set WANDB_API_KEY in the environment>  # yaml:{secret_yaml}:5" in lines
    assert f'  TOKENIZERS_PARALLELISM: "false"  # yaml:{secret_yaml}:6' in lines
    assert f"  # PGPASSWORD: <redacted: set PGPASSWORD in the environment>  # yaml:{secret_yaml}:7" in lines


def test_the_redacted_yaml_is_re_runnable(secret_yaml, tmp_path, capsys, monkeypatch):
    assert main(["config", "show", "--format", "yaml", "--config", str(secret_yaml)]) == 0
    again = tmp_path / "again.yaml"
    again.write_text(capsys.readouterr().out)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.setenv("HF_TOKEN", "from-the-shell")
    resolution = TrlParser().resolve(["--config", str(again)])
    assert resolution.values["hub_token"] is None  # comes from HF_TOKEN (or --hub_token) instead
    assert resolution.values["learning_rate"] == 2e-5
    assert resolution.values["model_name_or_path"] == "some/model"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"  # the non-secret env: entry is kept
    assert set(resolution.env) == {"TOKENIZERS_PARALLELISM"}


def test_config_diff_redacts(secret_yaml, tmp_path, capsys):
    other = tmp_path / "other.yaml"
    other.write_text("model_name_or_path: some/model\nhub_token: hf_AnotherToken9876543210\n")
    assert main(["config", "diff", str(secret_yaml), str(other)]) == 0
    out = capsys.readouterr().out
    assert TOKEN not in out and "hf_AnotherToken9876543210" not in out
    assert f'hub_token: "<redacted>" (yaml:{secret_yaml}:2) -> "<redacted>" (yaml:{other}:2)' in out.splitlines()


def test_values_seen_are_redacted_from_text_and_log_records(secret_yaml, caplog):
    TrlParser().resolve(["--config", str(secret_yaml)])
    assert redact(f"push with {TOKEN} and {WANDB}") == "push with <redacted> and <redacted>"
    assert redact("hunter2 is too short to hunt in text") == "hunter2 is too short to hunt in text"
    row = {"step": 3, "prompt": f"the key is {WANDB}", "rewards": {"r": 1.0}, "tags": [TOKEN]}
    assert redact_deep(row) == {"step": 3, "prompt": "the key is <redacted>", "rewards": {"r": 1.0},
                                "tags": ["<redacted>"]}  # fmt: skip
    with caplog.at_level(logging.WARNING):
        logging.getLogger("grpokit.test").warning("token %s in a log record", TOKEN)
    assert caplog.records[-1].getMessage() == "token <redacted> in a log record"


def test_a_config_built_in_python_registers_its_token(tmp_path):
    from grpokit import GRPOConfig

    GRPOConfig(str(tmp_path), hub_token="hf_PythonSideToken42", report_to="none")
    assert redact("x hf_PythonSideToken42 y") == "x <redacted> y"


def test_completions_table_and_parquet_are_redacted(tmp_path, capsys):
    """A completion (or prompt) that repeats a registered secret is neither printed nor written in clear."""
    import pandas as pd

    from grpokit.rollout.report import CompletionLog

    secret = "hf_abcdefghijklmnop"
    redaction.register(secret)
    log = CompletionLog(4)
    log.prompts.extend(["say the token", "2="])
    log.completions.extend([f"it is {secret}", "2222"])
    log.advantages.extend([0.5, -0.5])
    log.rewards["r"] = [1.0, 0.0]
    log._unreported = True
    table = log.report(3, str(tmp_path), None, False)
    assert secret not in table and secret not in capsys.readouterr().out and "<redacted>" in table
    frame = pd.read_parquet(tmp_path / "completions" / "completions_00003.parquet")
    assert list(frame["completion"]) == ["it is <redacted>", "2222"]
