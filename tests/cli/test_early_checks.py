"""Settings that used to fail only after the model loaded are one line before anything loads or is written:
report_to names and packages, flash attention, Liger kernels."""

import importlib.util
import os
import subprocess
import sys

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


def run_hiding(tmp_path, hidden: list[str], *args) -> tuple[int, list[str]]:
    """`python -m grpokit ARGS` in a subprocess where the `hidden` packages cannot be imported (as if not installed:
    a sitecustomize sets their sys.modules entries to None); (exit code, error lines)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(f"import sys\nfor name in {hidden!r}:\n    sys.modules[name] = None\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "grpokit", *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )
    return result.returncode, [line for line in result.stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize(
    "flags, hidden, expected",
    [
        (["--report_to", "tensorboard"], ["tensorboard", "tensorboardX"], "error: report_to='tensorboard': tensorboard is not installed"),
        (["--use_liger_kernel", "true"], ["liger_kernel"], "error: use_liger_kernel=True: liger-kernel is not installed"),
        (
            ["--attn_implementation", "flash_attention_2"],
            [],
            "error: attn_implementation='flash_attention_2': needs a CUDA GPU and the flash-attn package",
        ),
        (
            ["--reward_funcs", "accuracy", "format"],
            ["math_verify"],
            "error: reward_funcs: 'accuracy' check(s) answers with math-verify, which is not installed: pip install "
            "'grpokit[math]' (or math-verify)",
        ),
        (["--dataset_name", "promts.jsonl"], [], "error: dataset_name='promts.jsonl': no such file or folder; did you mean 'prompts.jsonl'?"),
    ],
)  # fmt: skip
def test_train_refuses_before_loading_or_writing(tmp_path, tiny_model_dir, flags, hidden, expected, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1=", "solution": "2"}\n')
    out = tmp_path / "run"
    base = ["--model_name_or_path", tiny_model_dir, "--dataset_name", "prompts.jsonl", "--reward_funcs", "tag_count"]
    code, errors = run_hiding(tmp_path, hidden, "train", *base, "--output_dir", out, *flags)
    assert code == 2 and len(errors) == 1 and errors[0].startswith(expected), errors
    assert not out.exists()  # nothing loaded, nothing written


@pytest.mark.parametrize("written", ["absolute", "bare"])
def test_a_local_model_path_that_does_not_exist(tmp_path, monkeypatch, written):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-model").mkdir()
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1="}\n')
    out = tmp_path / "run"
    typo = str(tmp_path / "tiny-modle") if written == "absolute" else "tiny-modle"
    near = str(tmp_path / "tiny-model") if written == "absolute" else "tiny-model"
    code, errors = run_hiding(tmp_path, [], "train", "--model_name_or_path", typo, "--dataset_name", "d.jsonl",
                              "--reward_funcs", "tag_count", "--output_dir", out)  # fmt: skip
    assert code == 2 and errors == [f"error: model_name_or_path={typo!r}: does not exist; did you mean {near!r}?"]
    assert not out.exists()


@pytest.mark.parametrize("command", [["--model_name_or_path", "m", "--dataset_name", "d.jsonl"], ["--demo"]])
def test_a_mistyped_flag_is_refused_before_transformers_or_torch_load(command):
    """The light path (as `config validate`) judges the flags first: the refusal comes before the seconds of heavy
    imports, for a run and for the demo (before it writes its model)."""
    code = (
        "import sys\nfrom grpokit.cli.commands import _main\n"
        f"rc = _main(['train', *{command!r}, '--learnig_rate', '1e-5'])\n"
        "print(rc, sorted(m for m in ('transformers', 'torch', 'datasets') if m in sys.modules))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRPOKIT_SUPERVISED": os.devnull}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.stdout == "2 []\n", result.stderr
    assert result.stderr == "error: --learnig_rate (cli): unknown argument; did you mean --learning_rate?\n"


def test_errors_come_in_file_order_and_a_misspelt_tool_module_gets_a_suggestion(run, tmp_path, monkeypatch):
    """Problems of lines 3, 5, 7 and 8 of a recipe, found in another order by the checks, print in file order (a
    second file's after the first's; the command line's last); the tool module `my_toolz` is `my_tools.py` here."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_tools.py").write_text(
        'def lookup(key: str) -> str:\n    """Look.\n\n    Args:\n        key: k\n    """\n'
    )
    (tmp_path / "r.yaml").write_text(
        "model_name_or_path: m\n"
        "reward_funcs: [accuracy]\n"
        "tools: [my_toolz.lookup]\n"
        "per_device_train_batch_size: 4\n"
        "num_generations: 7\n"
        "bf16: false\n"
        "learning_rate: -1\n"
        "beta: -2\n"
    )
    (tmp_path / "s.yaml").write_text("epsilon: -1\n")
    code, errors = run("config", "validate", "--config", "r.yaml", "--config", "s.yaml", "--temperature", "-1")
    assert code == 2
    assert [e.split(" (")[1].split(")")[0] for e in errors] == [
        "yaml:r.yaml:3",
        "yaml:r.yaml:5",
        "yaml:r.yaml:7",
        "yaml:r.yaml:8",
        "yaml:s.yaml:1",
        "cli",
    ]
    assert errors[0].endswith(
        "no module named 'my_toolz' in the working directory or on sys.path; did you mean 'my_tools'?"
    )
