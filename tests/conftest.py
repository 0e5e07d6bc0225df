import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars left open at exit after a deliberately failing run

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from grpokit.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer):
    from grpokit.tiny import build_model

    return build_model(tiny_tokenizer)


@pytest.fixture
def bf16_accelerator():
    """An `Accelerator(cpu=True, mixed_precision="bf16")`, whatever accelerator state earlier tests left (accelerate
    keeps one per process and refuses another mixed precision), and that state cleared again afterwards."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    yield Accelerator(cpu=True, mixed_precision="bf16")
    AcceleratorState._reset_state()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny model + tokenizer saved on disk, usable as `model_name_or_path`."""
    from grpokit.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-model"))


def pytest_terminal_summary(terminalreporter):
    """Say how many vLLM test modules were skipped (the main venv has no vLLM; `.ci/run` runs them in .venv-vllm)."""
    skipped = [
        r
        for r in terminalreporter.stats.get("skipped", [])
        if str(getattr(r, "nodeid", "") or getattr(r, "fspath", "")).replace("\\", "/").startswith("tests/vllm_engine")
        or "/tests/vllm_engine/" in str(getattr(r, "fspath", ""))
    ]
    if skipped:
        terminalreporter.write_line(
            f"vLLM: {len(skipped)} test module(s) skipped (vLLM is not installed in this environment; .ci/run runs "
            "them in .venv-vllm)"
        )
