"""Training stops with a clear error, naming the culprit, rather than continue on a silent default."""

import importlib.util

import pytest
from _trainer_helpers import text_reward

from grpokit import GRPOTrainer
from grpokit.rollout import RewardError


def test_raising_reward_names_the_function_and_the_sample(tiny_model, tiny_tokenizer, dataset, make_args):
    def picky(prompts, completions, **kwargs):
        for prompt in prompts:
            if prompt == "cde":
                raise KeyError("no answer for cde")
        return [1.0] * len(prompts)

    args = make_args(shuffle_dataset=False)  # prompts in order: ab ab cde cde ...; "cde" is sample 2
    trainer = GRPOTrainer(
        tiny_model, [text_reward, picky], args=args, train_dataset=dataset, processing_class=tiny_tokenizer
    )
    with pytest.raises(
        RewardError, match=r"reward function 'picky' raised KeyError: 'no answer for cde' on sample 2 \(prompt='cde'"
    ):
        trainer.train()


def test_wrong_length_reward_names_the_function(tiny_model, tiny_tokenizer, dataset, make_args):
    def short(completions, **kwargs):
        return [0.0] * (len(completions) - 1)

    trainer = GRPOTrainer(tiny_model, short, args=make_args(), train_dataset=dataset, processing_class=tiny_tokenizer)
    with pytest.raises(
        RewardError, match=r"reward function 'short' returned 3 rewards for 4 completions.*sample 0 \(prompt="
    ):
        trainer.train()


def test_unsupported_field_is_refused_before_the_model_loads(make_args, dataset):
    # The model path does not exist: had the trainer tried to load it, the error would be an OSError.
    with pytest.raises(ValueError, match="log_completions_hub_repo='me/x': uploading completions") as error:
        args = make_args(log_completions=True)
        args.log_completions_hub_repo = "me/x"
        GRPOTrainer("/nonexistent/model", text_reward, args=args, train_dataset=dataset)
    assert "GRPOTrainer cannot start" in str(error.value)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_use_vllm_without_vllm_names_the_install_command(make_args, dataset):
    with pytest.raises(ValueError, match=r"use_vllm=True: vLLM is not installed \(pip install 'grpokit\[vllm\]'"):
        GRPOTrainer("/nonexistent/model", text_reward, args=make_args(use_vllm=True), train_dataset=dataset)


def test_every_start_problem_is_listed_at_once(make_args, dataset):
    args = make_args(log_completions=True, log_completions_hub_repo="me/completions", reward_weights=[1.0, 2.0])
    args.sync_ref_model = True  # GRPOConfig itself refuses this with beta=0; set afterwards to reach the trainer
    with pytest.raises(ValueError) as error:
        GRPOTrainer("/nonexistent/model", text_reward, args=args, train_dataset=dataset)
    message = str(error.value)
    assert "log_completions_hub_repo='me/completions': uploading completions to the Hub is not supported" in message
    assert "reward_weights=[1.0, 2.0]: 2 weights for 1 reward functions" in message
    assert "sync_ref_model=True: needs a reference model, and beta=0 loads none" in message


QUANTISED_WITHOUT_ADAPTER = (
    "a quantised base model cannot be trained in full (its weights are frozen integers); pass peft_config (e.g. "
    "peft.LoraConfig) to train LoRA adapters on it (QLoRA)"
)


def test_quantization_without_an_adapter_is_refused_before_loading(make_args, dataset):
    with pytest.raises(ValueError) as error:
        GRPOTrainer(
            "/nonexistent/model",
            text_reward,
            args=make_args(),
            train_dataset=dataset,
            quantization_config={"load_in_4bit": True},
        )
    assert f"  quantization_config: {QUANTISED_WITHOUT_ADAPTER}" in str(error.value).splitlines()


def test_quantization_in_two_places_or_at_two_widths_is_refused_before_loading(make_args, dataset):
    peft = pytest.importorskip("peft")
    args = make_args(model_init_kwargs={"quantization_config": {"load_in_4bit": True}})
    with pytest.raises(ValueError) as error:
        GRPOTrainer(
            "/nonexistent/model",
            text_reward,
            args=args,
            train_dataset=dataset,
            quantization_config={"load_in_4bit": True},
            peft_config=peft.LoraConfig(r=4),
        )
    assert str(error.value).splitlines()[1:] == [
        "  quantization_config: given both as a GRPOTrainer argument and in model_init_kwargs; set it in one place"
    ]
    args = make_args(model_init_kwargs={"quantization_config": {"load_in_4bit": True, "load_in_8bit": True}})
    with pytest.raises(ValueError) as error:
        GRPOTrainer("/nonexistent/model", text_reward, args=args, train_dataset=dataset)
    lines = str(error.value).splitlines()
    assert "  model_init_kwargs['quantization_config']: load_in_4bit and load_in_8bit cannot both be true" in lines
    assert f"  model_init_kwargs['quantization_config']: {QUANTISED_WITHOUT_ADAPTER}" in lines


def test_quantization_without_bitsandbytes_is_refused_before_loading(make_args, dataset, monkeypatch):
    peft = pytest.importorskip("peft")
    from grpokit import startup

    monkeypatch.setattr(startup, "installed", lambda module: module != "bitsandbytes")
    with pytest.raises(ValueError) as error:
        GRPOTrainer(
            "/nonexistent/model",
            text_reward,
            args=make_args(),
            train_dataset=dataset,
            quantization_config={"load_in_8bit": True},
            peft_config=peft.LoraConfig(r=4),
        )
    assert str(error.value).splitlines()[1:] == [
        "  quantization_config: bitsandbytes is not installed (pip install 'grpokit[qlora]')"
    ]


def test_trl_only_constructor_arguments_are_refused(make_args, dataset):
    # A tool the model could not be told about is refused before the model loads (print has no type hints).
    with pytest.raises(ValueError, match="tool 'print' cannot be described to the model: .*missing a type hint"):
        GRPOTrainer("/nonexistent/model", text_reward, args=make_args(), train_dataset=dataset, tools=[print])
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        GRPOTrainer("/nonexistent/model", text_reward, args=make_args(), train_dataset=dataset, colour="red")


def test_no_reward_is_refused(make_args, dataset):
    with pytest.raises(
        ValueError, match="No reward source provided. Pass `reward_funcs`, or an `environment_factory`"
    ):
        GRPOTrainer("/nonexistent/model", None, args=make_args(), train_dataset=dataset)


def test_router_aux_loss_needs_a_mixture_of_experts(tiny_model, tiny_tokenizer, dataset, make_args):
    with pytest.raises(ValueError, match="router_aux_loss_coef=0.01: Qwen2ForCausalLM is not a Mixture-of-Experts"):
        GRPOTrainer(
            tiny_model,
            text_reward,
            args=make_args(router_aux_loss_coef=0.01),
            train_dataset=dataset,
            processing_class=tiny_tokenizer,
        )


def test_sync_ref_model_with_peft_is_refused(tiny_model, tiny_tokenizer, dataset, make_args):
    from peft import LoraConfig

    with pytest.raises(ValueError, match="sync_ref_model=True does not work with PEFT"):
        GRPOTrainer(
            tiny_model,
            text_reward,
            args=make_args(beta=0.1, sync_ref_model=True),
            train_dataset=dataset,
            processing_class=tiny_tokenizer,
            peft_config=LoraConfig(r=2, target_modules=["q_proj"]),
        )


def test_vllm_fields_without_use_vllm_are_named_at_start(make_args, dataset, tiny_model, tiny_tokenizer, caplog):
    """Not a silent no-op: a vLLM field set while generation runs on transformers is named in a warning."""
    args = make_args(vllm_mode="server", vllm_gpu_memory_utilization=0.5)
    with caplog.at_level("WARNING", logger="grpokit.trainer"):
        GRPOTrainer(tiny_model, text_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    messages = [r.getMessage() for r in caplog.records]
    assert "vllm_gpu_memory_utilization=0.5 has no effect without use_vllm: true" in messages
    assert "vllm_mode='server' has no effect without use_vllm: true" in messages


def test_a_code_reward_without_its_sandbox_is_refused_before_the_model_loads(make_args, dataset, monkeypatch):
    from grpokit.rewards import sandbox

    monkeypatch.setattr(sandbox, "_BOUNDARY", {})
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    # the model path does not exist: had the model loaded first, that would be the error
    with pytest.raises(ValueError, match=r"code: running model programs needs bubblewrap \(`bwrap`\)"):
        GRPOTrainer("/nonexistent/model", "code", args=make_args(), train_dataset=dataset)


def test_quantization_for_an_instantiated_model_is_named_as_ignored(
    tiny_model, tiny_tokenizer, dataset, make_args, caplog
):
    peft = pytest.importorskip("peft")
    with caplog.at_level("WARNING", logger="grpokit.models"):
        trainer = GRPOTrainer(
            tiny_model,
            text_reward,
            args=make_args(),
            train_dataset=dataset,
            processing_class=tiny_tokenizer,
            quantization_config={"load_in_4bit": True},
            peft_config=peft.LoraConfig(r=4),
        )
    assert "quantization_config is ignored: the model is already instantiated" in caplog.messages
    assert not getattr(trainer.model, "is_loaded_in_4bit", False)  # as TRL: the instance is trained as it is
