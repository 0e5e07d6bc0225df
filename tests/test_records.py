"""The run's records (metrics.jsonl rows, progress lines, closing message) and the reward plot's series."""

import json
from types import SimpleNamespace

import pytest

from grpokit.cli.plot import curve_series
from grpokit.cli.records import RunRecorder, closing_message, library_progress_bars
from grpokit.records.recorder import LOSS_NOTE


def _log(recorder, step, logs, max_steps=4):
    state = SimpleNamespace(is_world_process_zero=True, global_step=step, max_steps=max_steps)
    recorder.on_log(SimpleNamespace(log_completions=False), state, None, logs=logs)


def test_eval_logs_are_rows_of_their_own_with_one_line(tmp_path, capsys):
    recorder = RunRecorder(str(tmp_path))
    _log(recorder, 2, {"loss": 0.5, "reward": 0.25, "reward_std": 0.1, "epoch": 0.5})
    _log(recorder, 2, {"eval_loss": 0.125, "eval_reward": 0.75, "eval_reward_std": 0.2, "eval_runtime": 0.1})
    _log(recorder, 4, {"train_runtime": 3.0, "train_loss": 0.5})  # the end-of-training summary: no row
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 2, "loss": 0.5, "reward": 0.25, "reward_std": 0.1, "epoch": 0.5},
        {"step": 2, "eval_loss": 0.125, "eval_reward": 0.75, "eval_reward_std": 0.2, "eval_runtime": 0.1},
    ]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step     2/4 | reward 0.250 ± 0.100 | loss +0.5000 |")
    assert lines[1] == LOSS_NOTE  # once, under the first progress line with a loss
    assert lines[2] == "eval  step     2/4 | reward 0.750 ± 0.200 | loss +0.1250"
    assert lines[3] == "done in 3s"
    _log(recorder, 4, {"loss": 0.0, "reward": 0.5, "reward_std": 0.1, "epoch": 1.0})
    assert LOSS_NOTE not in capsys.readouterr().out


def test_curve_series_keeps_train_and_eval_apart():
    rows = [
        {"step": 1, "reward": 0.1, "reward_std": 0.01, "loss": 0.3},
        {"step": 2, "reward": 0.2, "loss": 0.2},
        {"step": 2, "eval_reward": 0.5, "eval_reward_std": 0.05, "eval_loss": 0.1},
    ]
    series = curve_series(rows)
    assert series["reward"] == {"step": [1, 2], "mean": [0.1, 0.2], "std": [0.01, 0.0]}
    assert series["loss"] == {"step": [1, 2], "value": [0.3, 0.2]}
    assert series["eval_reward"] == {"step": [2], "mean": [0.5], "std": [0.05]}
    assert curve_series(rows[:2])["eval_reward"] == {"step": [], "mean": [], "std": []}  # a run without eval


@pytest.mark.parametrize("adapter, first", [(False, "model and tokenizer:"), (True, "LoRA adapter and tokenizer:")])
def test_closing_message_names_what_was_saved(adapter, first):
    lines = closing_message("out", "out/reward_curve.png", adapter=adapter).splitlines()
    assert lines[0] == ""
    assert lines[1].startswith(first) and lines[1].endswith(" out/")
    assert [line.split()[-1] for line in lines[2:]] == [
        "out/resolved_config.yaml",
        "out/metrics.jsonl",
        "out/reward_curve.png",
    ]
    assert len({line.rindex(" ") for line in lines[1:]}) == 1  # the paths in one column


@pytest.fixture
def restore_progress_bars():
    import datasets
    import transformers.utils.logging as transformers_logging

    before = (transformers_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled())
    yield
    for on, module, enable, disable in (
        (before[0], transformers_logging, "enable_progress_bar", "disable_progress_bar"),
        (before[1], datasets, "enable_progress_bars", "disable_progress_bars"),
    ):
        getattr(module, enable if on else disable)()


@pytest.mark.parametrize(
    "sources, value, env, on",
    [
        ({}, None, None, False),  # the default: off
        ({"disable_tqdm": "yaml:r.yaml:3"}, True, None, False),
        ({"disable_tqdm": "cli"}, False, None, True),  # asked for explicitly
        ({}, None, "0", True),  # the libraries' own switch: left alone
    ],
)
def test_library_progress_bars(monkeypatch, restore_progress_bars, sources, value, env, on):
    import datasets
    import transformers.utils.logging as transformers_logging

    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    if env is None:
        monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", env)
        transformers_logging.enable_progress_bar()
        datasets.enable_progress_bars()
    library_progress_bars(SimpleNamespace(sources=sources, values={"disable_tqdm": value}))
    assert transformers_logging.is_progress_bar_enabled() is on
    assert datasets.is_progress_bar_enabled() is on
