"""A prompt longer than the model's positions (with room for the completion) stops `grpokit train` with one line
naming it and the field that fixes it; `max_prompt_length` cuts such prompts on purpose and the run trains."""

import json

from test_train_cli import write_recipe

from grpokit.cli import main


def _recipe(tmp_path, model_dir, **overrides):
    recipe = write_recipe(tmp_path, model_dir, log_completions=False, **overrides)
    rows = [{"prompt": "1+1="}, {"prompt": "x" * 600 + "=", "solution": "?"}]  # the tiny model has 512 positions
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    return recipe


def test_a_prompt_beyond_the_window_is_one_line(tmp_path, tiny_model_dir, capsys):
    code = main(["train", "--config", str(_recipe(tmp_path, tiny_model_dir)), "--max_steps", "1"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 1
    (line,) = errors
    assert line.startswith("error: a prompt of ") and "with max_completion_length=8 needs " in line
    assert "more than the model's 512 (max_position_embeddings): set max_prompt_length to at most 504" in line
    assert not (tmp_path / "run" / "model.safetensors").exists()  # nothing trained, nothing saved


def test_max_prompt_length_cuts_them_and_trains(tmp_path, tiny_model_dir, capsys):
    recipe = _recipe(tmp_path, tiny_model_dir, max_prompt_length=504)
    assert main(["train", "--config", str(recipe), "--max_steps", "1"]) == 0
    assert (tmp_path / "run" / "model.safetensors").exists()
