"""Which command lines the console command supervises (runs in a watched child): training runs, bare `grpokit`
(the demo) included; never help, other commands, the supervised child itself, or a process a launcher started."""

import pytest

from grpokit.cli import supervise

LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "ACCELERATE_MIXED_PRECISION", "GRPOKIT_LAUNCHED")


@pytest.fixture(autouse=True)
def _plain_process(monkeypatch):
    for name in (*LAUNCHER_ENV, supervise.SUPERVISED_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], True),  # bare `grpokit` runs the demo
        (["train"], True),
        (["train", "--demo", "--max_steps", "2"], True),
        (["train", "--config", "r.yaml"], True),
        (["train", "--help"], False),
        (["train", "--help-all"], False),
        (["config", "validate", "--config", "r.yaml"], False),
        (["--version"], False),
        (["rewards"], False),
    ],
)
def test_what_is_supervised(argv, expected):
    assert supervise.wanted(argv) is expected


def test_not_in_the_child_or_under_a_launcher(monkeypatch):
    monkeypatch.setenv(supervise.SUPERVISED_ENV, "/tmp/marker")
    assert not supervise.wanted(["train"])
    monkeypatch.delenv(supervise.SUPERVISED_ENV)
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not supervise.wanted(["train"])
