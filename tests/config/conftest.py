"""Helpers for the configuration tests: run the CLI in-process, write YAML files, keep the environment clean."""

import logging
import sys
from dataclasses import dataclass

import pytest

from grpokit.cli import main


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def errors(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error: ")]


@pytest.fixture(autouse=True)
def _single_process(monkeypatch, tmp_path_factory):
    # The batch geometry depends on WORLD_SIZE (set by accelerate/torchrun); the tests assume one process.
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # Nor an accelerate default config file of the machine's user (`accelerate launch`'s count, which the config
    # commands check at): accelerate looks for it under HF_HOME.
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))


def _point_log_handlers_at(stream) -> None:
    """Libraries (transformers, torch, huggingface_hub) create their log handlers lazily, on the stream that was
    sys.stderr then: under pytest, possibly an earlier test's capture, closed since. Point them at the current one,
    so that a library's warning is captured with the output it belongs to instead of failing with 'Logging error'."""
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler and handler.stream not in (sys.__stderr__, sys.__stdout__):
                handler.stream = stream  # not setStream(): that flushes the old stream, which may be closed
                if "flush" in vars(handler):  # transformers binds its handler's flush to that stream's flush
                    handler.flush = stream.flush


@pytest.fixture
def cli(capsys):
    """`cli("config", "validate", ...)` runs `grpokit.cli.main` in-process (the console script's code path)."""

    def run(*args) -> CliResult:
        capsys.readouterr()
        _point_log_handlers_at(sys.stderr)
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # a code path that exits instead of returning still counts
            code = exc.code
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture
def write(tmp_path):
    """`write("name.yaml", text)` writes a file under tmp_path and returns its path as a string."""

    def _write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    return _write


@pytest.fixture
def clean_env(monkeypatch):
    """`clean_env("VAR", ...)`: these variables are unset now and restored (or removed) after the test, so that the
    `env:` section of a config, which sets them in this process, leaves nothing behind."""

    def _clean(*names):
        for name in names:
            monkeypatch.setenv(name, "placeholder")  # recorded, so that teardown restores the original state
            monkeypatch.delenv(name)

    return _clean
