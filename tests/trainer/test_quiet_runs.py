"""An ordinary CPU run says nothing it need not: no DeepSpeed accelerator line, no pin_memory warning, no peft
FutureWarning about `is_gradient_checkpointing`."""

import os
import subprocess
import sys
import warnings

import pytest
import torch
from _trainer_helpers import text_reward

from grpokit import GRPOTrainer


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed's line is about a machine without a GPU")
def test_deepspeed_does_not_announce_the_cpu():
    pytest.importorskip("deepspeed")
    code = "import grpokit, deepspeed\nfrom deepspeed.accelerator import get_accelerator\nget_accelerator()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Setting accelerator to CPU" not in result.stdout + result.stderr


def test_bitsandbytes_kernel_fetch_is_not_announced():
    """bitsandbytes, imported with transformers' Trainer, logs a failed Hub fetch of a CPU inference kernel on
    AVX512-BF16 machines (elsewhere it tries nothing, and there is nothing to drop)."""
    pytest.importorskip("bitsandbytes")
    code = "import grpokit, transformers.trainer, bitsandbytes"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "gemm_4bit_forward" not in result.stderr and "quantization-bitsandbytes" not in result.stderr


def test_a_lora_run_on_cpu_warns_about_nothing(tiny_model_dir, dataset, make_args):
    peft = pytest.importorskip("peft")
    args = make_args(max_steps=1, gradient_checkpointing=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = GRPOTrainer(
            tiny_model_dir, text_reward, args=args, train_dataset=dataset, peft_config=peft.LoraConfig(r=4)
        )
        trainer.train()
    messages = [str(w.message) for w in seen]
    assert not [m for m in messages if "pin_memory" in m or "is_gradient_checkpointing" in m], messages
    assert trainer.args.dataloader_pin_memory is False  # nothing to pin memory for on the CPU


def test_a_tied_lm_head_is_not_a_missing_key(tiny_model):
    from torch.nn.modules.module import _IncompatibleKeys

    from grpokit.checkpoints import without_tied_keys

    assert tiny_model.lm_head.weight is tiny_model.model.embed_tokens.weight  # tie_word_embeddings
    loaded = without_tied_keys(tiny_model, _IncompatibleKeys(["lm_head.weight"], []))
    assert loaded.missing_keys == [] and loaded.unexpected_keys == []
    # a key really missing stays, and so does lm_head when its embedding is missing too (nothing loaded it)
    both = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    assert without_tied_keys(tiny_model, _IncompatibleKeys(both, ["x"])).missing_keys == both


def test_a_python_run_shows_no_loading_or_saving_bars(tiny_model_dir, tmp_path):
    """A script that loads the policy from a path and saves it: transformers' "Loading weights" and "Writing model
    shards" bars stay off around what the trainer loads and saves (its progress is one line per log)."""
    code = f"""
from datasets import Dataset
from grpokit import GRPOConfig, GRPOTrainer
args = GRPOConfig(output_dir={str(tmp_path / "out")!r}, per_device_train_batch_size=2, num_generations=2,
                  max_completion_length=4, max_steps=1, report_to="none", save_strategy="no", use_cpu=True)
trainer = GRPOTrainer(model={str(tiny_model_dir)!r}, reward_funcs=lambda completions, **k: [1.0] * len(completions),
                      args=args, train_dataset=Dataset.from_dict({{"prompt": ["ab", "cd"]}}))
trainer.train()
trainer.save_model()
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for switch in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):  # (the test suite's own switch is off here)
        env.pop(switch, None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert "Loading weights" not in result.stderr and "Writing model shards" not in result.stderr, result.stderr[
        -2000:
    ]
