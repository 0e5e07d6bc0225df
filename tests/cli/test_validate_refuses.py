"""Whatever `grpokit train` refuses from the configuration and the files it names, `grpokit config validate` refuses
too: a test walks the checks training runs before anything loads (`cli/preflight.py` check_train_args, `cli/train.py`
_train, `startup.py` check_before_loading), each either proved refused by validate (same line, exit 2, one line, in a
subprocess) or classified as about this machine, the run's own state, or what to train not being named yet."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

from grpokit.cli import main

# Something to train that is not local (a hub id is never checked on disk), so that only the case's problem is refused.
BASE = [
    "--model_name_or_path",
    "some-org/some-model",
    "--dataset_name",
    "some-org/some-data",
    "--reward_funcs",
    "format",
]
# open-r1's batch: 16 completions x processes x 4 steps in groups of 14 holds whole groups only at 7 | processes.
OPEN_R1 = ["--num_generations", "14", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "4"]


def _files(tmp_path):
    """A finished-looking output folder is not needed: the cases name files that are not there, next to ones that are
    (for the "did you mean" beside them)."""
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1="}\n')
    (tmp_path / "tiny-model").mkdir()


# case -> (extra arguments, the one error line, where it comes from in training)
CASES = {
    "geometry at one process (no count given)": (
        OPEN_R1,
        "error: num_generations=14 (cli): the generation batch 64 (per_device_train_batch_size x processes x "
        "steps_per_generation = 16 x 1 x 4) must be divisible by num_generations = 14, so that it holds whole groups; "
        "nearest valid: per_device_train_batch_size 14 or 21; generation_batch_size 112; num_generations 16; or 7, 14 "
        "or 21 processes",
        "TrlParser.resolve",
    ),
    "geometry at the accelerate config's count": (
        [*OPEN_R1, "--accelerate_config", "multi_cpu", "--num_processes", "2", "--use_cpu", "true"],
        "error: num_generations=14 (cli): the generation batch 128 (per_device_train_batch_size x processes x "
        "steps_per_generation = 16 x 2 x 4) must be divisible by num_generations = 14, so that it holds whole groups; "
        "nearest valid: per_device_train_batch_size 14 or 21; generation_batch_size 224; num_generations 16; or 7, 14 "
        "or 21 processes",
        "TrlParser.resolve",
    ),
    "missing local dataset file": (
        ["--dataset_name", "./dato.jsonl"],
        "error: dataset_name='./dato.jsonl': no such file or folder; did you mean './data.jsonl'?",
        "_local_data_problems",
    ),
    "missing mixture dataset": (
        ["--config", "mixture.yaml"],
        "error: datasets[0].path='missing.jsonl': no such file or folder",
        "_local_data_problems",
    ),
    "missing local eval file": (
        ["--dataset_test_split", "heldout.csv"],
        "error: dataset_test_split='heldout.csv': no such file or folder",
        "_local_data_problems",
    ),
    "missing local model folder": (
        ["--model_name_or_path", "./tiny-modle"],
        "error: model_name_or_path='./tiny-modle': does not exist; did you mean './tiny-model'?",
        "_local_path_problems",
    ),
    "missing checkpoint to resume": (
        ["--resume_from_checkpoint", "run/checkpoint-5", "--output_dir", "run"],
        "error: resume_from_checkpoint='run/checkpoint-5' (cli): no such folder",
        "check_resume",
    ),
    "DeepSpeed told to use the CPU": (
        ["--accelerate_config", "zero2", "--num_processes", "2", "--use_cpu", "true", "--num_generations", "2"],
        "error: use_cpu=True: accelerate turns DeepSpeed off when told to use the CPU (plain DDP would run); set "
        "use_cpu: false, DeepSpeed runs over gloo on a CPU machine without it",
        "engine_problems",
    ),
    "a setting not implemented": (
        ["--benchmarks", "aime24"],
        "error: benchmarks=['aime24']: open-r1's benchmarks run as Slurm jobs after training; run them yourself on "
        "the saved model",
        "unsupported_settings",
    ),
    "a tool-calling cap without tools": (
        ["--max_tool_calling_iterations", "2"],
        "error: max_tool_calling_iterations=2 (cli): caps the tool-calling loop and has no effect without tools; set "
        "tools or environment_factory, or remove it",
        "tool_loop_problems",
    ),
    "a reference sync without a reference model": (
        ["--sync_ref_model", "true", "--beta", "0"],
        "error: sync_ref_model=True (cli): needs a reference model, and beta=0 loads none; set beta > 0 (e.g. 0.04) "
        "or sync_ref_model: false",
        "reference_problems",
    ),
    "reward weights that do not match the rewards": (
        ["--reward_weights", "1.0", "2.0"],
        "error: reward_weights=[1.0, 2.0] (cli): has 2 weight(s) but there are 1 reward function(s); give 1 "
        "weight(s): the reward model's first (when set), then one per function, in order",
        "reward_weights",
    ),
}

# What training checks that validate leaves alone on purpose, and why.
MACHINE = "about this machine or installation (a note in validate, an error in train)"
RUN_STATE = "about the run's output folder, not the configuration (a finished run's resolved_config validates)"
NOT_NAMED = "what to train is not named yet: a partial config (a recipe, a fragment) is checked as far as it goes"
LAUNCHED = "about the processes a launcher really started (train only knows once launched)"
COUNT_FLAG = "validate takes --num_processes alone as the count to check at; train needs a launch for it"
NOT_REFUSED = {
    "hardware_problems": MACHINE,
    "_reward_dependency_problems": MACHINE,
    "machine_problems": MACHINE,
    "output_dir_problems": RUN_STATE,
    "model_name_or_path is not set": NOT_NAMED,
    "no reward": NOT_NAMED,
    "no training data": NOT_NAMED,
    "No reward source provided": NOT_NAMED,
    "launch_problems": LAUNCHED,
    "a launch needs accelerate_config too": COUNT_FLAG,
    "quantization_problems": "GRPOTrainer's quantization_config and peft_config arguments; the command's own form "
    "(load_in_4bit without use_peft, the quantisation set twice) is a config rule, refused by validate",
}


def _checks_in(function) -> set[str]:
    """The checks a function runs: the names of the functions it calls that find problems (`*_problems`,
    `unsupported_settings`, `check_resume`, the parser's resolve), and the messages it appends itself."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name.endswith("_problems") or name in ("unsupported_settings", "check_resume"):
                found.add(name)
            if name == "resolve" and "TrlParser" in ast.unparse(node.func):
                found.add("TrlParser.resolve")
            if name == "append" and node.args:
                text = ast.unparse(node.args[0])
                for key in list(NOT_REFUSED) + ["reward_weights"]:
                    if key in text:
                        found.add(key)
    return found


def test_every_check_of_training_is_walked():
    from grpokit import startup
    from grpokit.cli import preflight, train

    checks = (
        _checks_in(preflight.check_train_args) | _checks_in(train._train) | _checks_in(startup.check_before_loading)
    )
    walked = {case[2] for case in CASES.values()} | set(NOT_REFUSED)
    assert checks - walked == set()  # a new check of training must be refused by validate too, or said why not
    # and the walk is not empty: the checks named here are found where training runs them
    assert {"TrlParser.resolve", "_local_data_problems", "check_resume", "output_dir_problems"} <= checks
    assert {"engine_problems", "machine_problems"} <= _checks_in(train._train)


def _prepare(tmp_path):
    _files(tmp_path)
    (tmp_path / "mixture.yaml").write_text("datasets:\n  - path: missing.jsonl\n")


def _run_validate(tmp_path, args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(
        [sys.executable, "-m", "grpokit", "config", "validate", *BASE, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_refuses_it_in_one_line(tmp_path, case):
    _prepare(tmp_path)
    args, line, _ = CASES[case]
    result = _run_validate(tmp_path, args)
    errors = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert (result.returncode, result.stdout, errors) == (2, "", [line]), result.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_train_refuses_it_with_the_same_line(tmp_path, case, monkeypatch, capsys):
    _prepare(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args, line, _ = CASES[case]
    capsys.readouterr()
    code = main(["train", *BASE, "--output_dir", "out", *args])
    errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: ")]
    assert code == 2 and line in errors
    assert not os.path.exists(tmp_path / "out")  # refused before anything was written


def test_a_valid_config_is_still_ok(tmp_path):
    _prepare(tmp_path)
    result = _run_validate(tmp_path, ["--dataset_name", "data.jsonl", "--model_name_or_path", "./tiny-model"])
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr
    # the same geometry at a count that works: 16 x 7 x 4 = 448 = 32 groups of 14
    result = _run_validate(tmp_path, [*OPEN_R1, "--num_processes", "7"])
    assert (result.returncode, result.stdout) == (0, "ok\n"), result.stderr
