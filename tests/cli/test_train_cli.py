"""The real `grpokit train` command, run in a subprocess on a tiny local model and a local jsonl dataset."""

import json
import os
import subprocess
import sys

import pytest


def run_grpokit(*args, cwd=None, timeout=600):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(
        [sys.executable, "-m", "grpokit", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def write_recipe(tmp_path, model_dir, **overrides):
    data = tmp_path / "data.jsonl"
    rows = [{"prompt": f"{i}+{i}=", "solution": str(2 * i)} for i in range(8)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {
        "model_name_or_path": model_dir,
        "dataset_name": str(data),
        "reward_funcs": ["tag_count", {"name": "soft_overlong_punishment", "kwargs": {"soft_punish_cache": 4}}],
        "reward_weights": [1.0, 0.5],
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 8,
        "max_steps": 2,
        "logging_steps": 1,
        "learning_rate": 1.0e-3,
        "gradient_checkpointing": False,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "log_completions": True,
        "output_dir": str(tmp_path / "run"),
        **overrides,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in recipe.items()) + "\n")
    return path


def test_train_writes_every_output(tmp_path, tiny_model_dir):
    recipe = write_recipe(tmp_path, tiny_model_dir)
    result = run_grpokit("train", "--config", str(recipe))
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "resolved_config.yaml",
        "metrics.jsonl",
        "reward_curve.png",
        "completions.jsonl",
    ):
        assert (run / name).is_file(), name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "reward" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for key in (
        "reward",
        "reward_std",
        "rewards/tag_count/mean",
        "rewards/soft_overlong_punishment/mean",
        "completions/mean_length",
        "loss",
    ):
        assert key in train_rows[0], key
    completions = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert completions and "completion" in completions[0]
    # The resolved config is re-runnable: it validates and resolves to the same values.
    again = run_grpokit("config", "show", "--format", "json", "--config", str(run / "resolved_config.yaml"))
    first = run_grpokit("config", "show", "--format", "json", "--config", str(recipe))
    assert again.returncode == 0, again.stderr
    assert {k: v["value"] for k, v in json.loads(again.stdout).items()} == {
        k: v["value"] for k, v in json.loads(first.stdout).items()
    }
    assert "grpokit" in (run / "resolved_config.yaml").read_text().splitlines()[1]
    # One writer: each record once (the trainer's recorder), one progress line per log instead of the log dicts.
    assert [line[:12] for line in result.stdout.splitlines() if line.startswith("step ")] == [
        "step     1/2",
        "step     2/2",
    ]
    assert "{'loss'" not in result.stdout
    assert "# python" not in (run / "resolved_config.yaml").read_text()  # the command's sources: yaml, cli


def test_plot_redraws_from_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "reward": s / 10, "reward_std": 0.1, "loss": 0.01} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_grpokit("plot", str(run))
    assert result.returncode == 0, result.stderr
    assert (run / "reward_curve.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ({"dataset_prompt_column": "question"}, "no prompt column 'question'"),
        ({"reward_funcs": [{"name": "cosine", "kwargs": {"max_lenn": 5}}], "reward_weights": None}, "max_len"),
        ({"reward_funcs": ["acuracy"], "reward_weights": None}, "did you mean 'accuracy'"),
        ({"use_vllm": True}, "use_vllm=True"),
        ({"dataset_name": "nobody/no-such-dataset"}, "offline"),
        # evaluation asked on a single local file: the two ways to give eval data
        ({"eval_strategy": "steps", "eval_steps": 1}, "set dataset_test_split to a local eval file"),
    ],
)
def test_bad_inputs_fail_in_one_line(tmp_path, tiny_model_dir, overrides, expected):
    recipe = write_recipe(tmp_path, tiny_model_dir, **overrides)
    result = run_grpokit("train", "--config", str(recipe))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors and expected in errors[0], result.stderr


def test_bad_row_is_named(tmp_path, tiny_model_dir):
    recipe = write_recipe(tmp_path, tiny_model_dir)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"prompt": "  "}) + "\n")
    result = run_grpokit("train", "--config", str(recipe))
    assert result.returncode == 2
    assert "error: train row 1: prompt is empty" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_runs_end_to_end_briefly(tmp_path):
    result = run_grpokit(
        "train", "--demo", "--max_steps", "2", "--logging_steps", "1", "--output_dir", str(tmp_path / "demo")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "demo: mean reward" in result.stdout
    assert not (tmp_path / "demo" / "completions.jsonl").exists()  # the demo does not set log_completions
    assert (tmp_path / "demo" / "reward_curve.png").is_file()
    assert "resolved config:" in result.stdout


def test_a_failing_reward_stops_with_one_line_and_saves_nothing_untrained(tmp_path, tiny_model_dir):
    (tmp_path / "my_rewards.py").write_text(
        "def picky(prompts, completions, **kwargs):\n"
        "    return [float('nope') if '+' in prompt else 1.0 for prompt in prompts]\n"
    )
    recipe = write_recipe(tmp_path, tiny_model_dir, reward_funcs=["my_rewards.picky"], reward_weights=None)
    result = run_grpokit("train", "--config", str(recipe), cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'picky'" in errors[0] and "sample 0" in errors[0], result.stderr[-2000:]
    assert errors[0].endswith("(no step was trained: nothing saved)")  # the first round failed: nothing to keep
    assert not (tmp_path / "run" / "interrupted-step-0").exists()


def test_eval_rows_line_and_plot(tmp_path, tiny_model_dir):
    from grpokit.cli.plot import curve_series, read_metrics

    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(4)))
    recipe = write_recipe(
        tmp_path,
        tiny_model_dir,
        eval_strategy="steps",
        eval_steps=2,
        max_steps=4,
        dataset_test_split=str(tmp_path / "eval.jsonl"),
        log_completions=False,
    )
    result = run_grpokit("train", "--config", str(recipe))
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r] == [1, 2, 3, 4]
    eval_rows = [r for r in rows if "eval_reward" in r]
    assert [r["step"] for r in eval_rows] == [2, 4]
    for row in eval_rows:  # rows of their own: TRL's eval_ names only
        assert "eval_loss" in row and "eval_reward_std" in row and "reward" not in row and "loss" not in row
    eval_lines = [line for line in result.stdout.splitlines() if line.startswith("eval ")]
    assert [line.split("|")[0].split()[-1] for line in eval_lines] == ["2/4", "4/4"], result.stdout
    assert all("| reward " in line and "| loss " in line for line in eval_lines)
    assert curve_series(read_metrics(str(run)))["eval_reward"]["step"] == [2, 4]
    assert (run / "reward_curve.png").is_file()
    assert "%|" not in result.stderr  # no tqdm bar of datasets / transformers between the progress lines


def test_resolved_config_reruns_from_the_run_folder(tmp_path, tiny_model_dir):
    # Relative paths in the recipe, run from tmp_path; the resolved config holds them absolute, so it resolves the
    # same from the run folder (cwd of the subprocess: a real path, hence samefile).
    model = os.path.relpath(tiny_model_dir, tmp_path)
    write_recipe(tmp_path, model, dataset_name="data.jsonl", output_dir="run", max_steps=1)
    result = run_grpokit("train", "--config", "recipe.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    header = (run / "resolved_config.yaml").read_text().splitlines()[0]
    assert "re-run with: grpokit train --config /" in header
    assert os.path.samefile(header.split("--config ", 1)[1], run / "resolved_config.yaml")
    check = run_grpokit("config", "validate", "--config", "resolved_config.yaml", cwd=run)
    assert check.returncode == 0 and check.stdout.strip().endswith("ok"), check.stdout + check.stderr
    shown = run_grpokit("config", "show", "--format", "json", "--config", "resolved_config.yaml", cwd=run)
    values = {k: v["value"] for k, v in json.loads(shown.stdout).items()}
    assert os.path.samefile(values["model_name_or_path"], tiny_model_dir)
    assert os.path.samefile(values["dataset_name"], tmp_path / "data.jsonl")
    assert os.path.samefile(values["output_dir"], run)
    assert all(os.path.isabs(values[k]) for k in ("model_name_or_path", "dataset_name", "output_dir"))


def test_qlora_from_the_command(tmp_path, tiny_model_dir):
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    recipe = write_recipe(
        tmp_path,
        tiny_model_dir,
        max_steps=1,
        use_peft=True,
        lora_r=4,
        lora_target_modules=["q_proj", "v_proj"],
        load_in_4bit=True,
        beta=0.04,
    )
    result = run_grpokit("train", "--config", str(recipe))
    assert result.returncode == 0, result.stderr[-2000:]
    files = set(os.listdir(tmp_path / "run"))
    assert {"adapter_model.safetensors", "adapter_config.json"} <= files and "model.safetensors" not in files


def test_the_4bit_fields_become_trl_s_bitsandbytes_config():
    pytest.importorskip("bitsandbytes")
    import torch

    from grpokit import ModelConfig
    from grpokit.cli.train import _quantization_config

    assert _quantization_config(ModelConfig()) is None
    four = _quantization_config(
        ModelConfig(
            use_peft=True,
            load_in_4bit=True,
            bnb_4bit_quant_type="fp4",
            use_bnb_nested_quant=True,
            bnb_4bit_quant_storage="bfloat16",
            dtype="bfloat16",
        )
    )
    assert (four.load_in_4bit, four.load_in_8bit, four.bnb_4bit_quant_type) == (True, False, "fp4")
    assert (four.bnb_4bit_use_double_quant, four.bnb_4bit_quant_storage) == (True, torch.bfloat16)
    assert four.bnb_4bit_compute_dtype == torch.bfloat16  # computes in the load dtype, as TRL
    assert _quantization_config(
        ModelConfig(use_peft=True, load_in_4bit=True, dtype="auto")
    ).bnb_4bit_compute_dtype == (torch.float32)
    eight = _quantization_config(ModelConfig(use_peft=True, load_in_8bit=True))
    assert (eight.load_in_8bit, eight.load_in_4bit) == (True, False)
