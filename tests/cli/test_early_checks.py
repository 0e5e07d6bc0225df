"""Settings that used to fail only after the model loaded are one line before anything loads or is written:
report_to names and packages, flash attention, Liger kernels."""

import importlib.util

import pytest

from grpokit.cli import main


@pytest.fixture
def run(capsys):
    def _run(*args):
        capsys.readouterr()
        code = main([str(a) for a in args])
        _, err = capsys.readouterr()
        return code, [line for line in err.splitlines() if line.startswith("error: ")]

    return _run


def missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def test_unknown_report_to_is_a_config_error_with_a_suggestion(run):
    code, errors = run("config", "validate", "--report_to", "wandbb")
    assert code == 2 and len(errors) == 1
    assert errors[0].startswith("error: report_to=['wandbb'] (cli): 'wandbb' is not an integration transformers knows")
    assert errors[0].endswith("did you mean 'wandb'?")


@pytest.mark.parametrize(
    "flags, expected, needs_missing",
    [
        (
            ["--report_to", "tensorboard"],
            "error: report_to='tensorboard': tensorboard is not installed",
            "tensorboard",
        ),
        (
            ["--use_liger_kernel", "true"],
            "error: use_liger_kernel=True: liger-kernel is not installed",
            "liger_kernel",
        ),
        (
            ["--attn_implementation", "flash_attention_2"],
            "error: attn_implementation='flash_attention_2': needs a CUDA GPU and the flash-attn package",
            None,
        ),
    ],
)
def test_train_refuses_before_loading_or_writing(run, tmp_path, tiny_model_dir, flags, expected, needs_missing):
    if needs_missing and not missing(needs_missing):
        pytest.skip(f"{needs_missing} is installed here")
    out = tmp_path / "run"
    base = ["--model_name_or_path", tiny_model_dir, "--dataset_name", tmp_path / "no-data.jsonl"]
    code, errors = run("train", *base, "--reward_funcs", "tag_count", "--output_dir", out, *flags)
    assert code == 2 and len(errors) == 1 and errors[0].startswith(expected), errors
    assert not out.exists()  # nothing loaded, nothing written


def test_a_local_model_path_that_does_not_exist(run, tmp_path):
    (tmp_path / "tiny-model").mkdir()
    out = tmp_path / "run"
    typo = str(tmp_path / "tiny-modle")
    code, errors = run("train", "--model_name_or_path", typo, "--dataset_name", "d.jsonl", "--reward_funcs", "tag_count",
                       "--output_dir", out)  # fmt: skip
    assert code == 2 and errors == [
        f"error: model_name_or_path={typo!r}: does not exist; did you mean {str(tmp_path / 'tiny-model')!r}?"
    ]
    assert not out.exists()
