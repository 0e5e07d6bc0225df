"""End-to-end training on the tiny model: every loss type, the KL term, reuse of generations, rewards of every kind,
LoRA, conversational prompts, and the metrics TRL logs."""

import asyncio
import math

import pytest
import torch
from _trainer_helpers import changed, last_log_with, parameters, text_reward

from grpokit import GRPOTrainer
from grpokit.algorithms import LOSS_TYPES

ROLLOUT_METRICS = [
    "num_tokens",
    "reward",
    "reward_std",
    "rewards/text_reward/mean",
    "rewards/text_reward/std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "entropy",
]
CLIP_METRICS = ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_two_steps_for_every_loss_type(loss_type, tiny_model, tiny_tokenizer, dataset, make_args):
    args = make_args(loss_type=loss_type, importance_sampling_level="sequence" if loss_type == "luspo" else "token")
    trainer = GRPOTrainer(tiny_model, text_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    before = parameters(trainer.model)
    trainer.train()

    assert trainer.state.global_step == 2
    assert changed(before, trainer.model)
    logged = last_log_with(trainer, "reward")
    for name in ROLLOUT_METRICS:
        assert name in logged, name
    if loss_type in ("grpo", "dr_grpo", "dapo", "bnpo", "luspo"):
        assert all(name in logged for name in CLIP_METRICS)
    assert "kl" not in logged  # beta = 0 by default
    assert math.isfinite(logged["loss"])


def test_beta_zero_has_no_reference_model(tiny_model, tiny_tokenizer, dataset, make_args):
    trainer = GRPOTrainer(
        tiny_model, text_reward, args=make_args(beta=0.0), train_dataset=dataset, processing_class=tiny_tokenizer
    )
    assert trainer.ref_model is None
    trainer.train()
    assert "ref_logps" not in trainer._buffered_inputs[0]


def test_beta_positive_trains_against_a_frozen_reference(tiny_model, tiny_tokenizer, dataset, make_args):
    trainer = GRPOTrainer(
        tiny_model, text_reward, args=make_args(beta=0.1), train_dataset=dataset, processing_class=tiny_tokenizer
    )
    assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
    ref_before = parameters(trainer.ref_model)
    trainer.train()
    assert not changed(ref_before, trainer.ref_model)
    assert "ref_logps" in trainer._buffered_inputs[0]
    kl = [entry["kl"] for entry in trainer.state.log_history if "kl" in entry]
    assert len(kl) == 2 and kl[0] == pytest.approx(0.0, abs=1e-6) and kl[1] > 0  # the policy moved away in step 2


class CountingGenerator:
    """Wraps the trainer's generator to count generation rounds."""

    def __init__(self, inner):
        self.inner, self.calls, self.pushes = inner, 0, []
        self.last_sync_seconds = 0.0

    def generate(self, prompt_ids):
        self.calls += 1
        return self.inner.generate(prompt_ids)

    def sync_weights(self, model):
        self.pushes.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        self.inner.sync_weights(model)


@pytest.mark.parametrize(
    "overrides, generations, off_policy",
    [
        # 4 optimizer steps of 1 micro-step; each round is trained on twice: 2 rounds, off-policy second pass
        ({"num_iterations": 2, "max_steps": 4}, 2, True),
        # each round feeds 2 micro-batches of 4 rows, one per optimizer step: 2 rounds for 4 steps
        ({"steps_per_generation": 2, "max_steps": 4}, 2, True),
        # 2 accumulated micro-steps per optimizer step, one round each: no reuse across steps, on-policy
        ({"gradient_accumulation_steps": 2, "steps_per_generation": 2, "max_steps": 2}, 2, False),
    ],
)
def test_generation_rounds_are_reused(
    overrides, generations, off_policy, tiny_model, tiny_tokenizer, dataset, make_args
):
    args = make_args(**overrides)
    trainer = GRPOTrainer(tiny_model, text_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    trainer.generator = counting = CountingGenerator(trainer.generator)
    before = parameters(trainer.model)
    trainer.train()
    assert counting.calls == generations
    assert ("old_logps" in trainer._buffered_inputs[0]) == off_policy
    assert changed(before, trainer.model)


@pytest.mark.parametrize(
    "overrides, pushes",
    [
        ({"steps_per_generation": 2, "max_steps": 4}, 2),  # rounds at steps 0 and 2: one push each
        ({"num_iterations": 2, "max_steps": 4}, 2),  # a round is trained on twice: no push for the second pass
        ({"max_steps": 3}, 3),  # one round per optimizer step
    ],
)
def test_weights_are_pushed_once_per_round_when_the_policy_changed(
    overrides, pushes, tiny_model, tiny_tokenizer, dataset, make_args
):
    """With a vLLM-style backend (`use_vllm`), the policy is pushed when a round starts and the policy changed since
    the last push (the first round always), never per micro-step; what is pushed is the policy at that moment."""
    args = make_args(**overrides)
    trainer = GRPOTrainer(tiny_model, text_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    trainer.generator = counting = CountingGenerator(trainer.generator)
    trainer.args.use_vllm = True  # the push logic only; generation stays transformers'
    trainer.train()
    assert len(counting.pushes) == pushes == counting.calls
    first, last = counting.pushes[0], counting.pushes[-1]
    assert any(not torch.equal(first[k], last[k]) for k in first)  # later pushes carry the trained weights
    logged = [row for row in trainer.state.log_history if "timing/vllm_weight_sync" in row]
    assert logged, "push time is logged"


def test_async_reward_and_none_rewards(tiny_model, tiny_tokenizer, dataset, make_args):
    calls = []

    async def slow_length(completions, **kwargs):
        await asyncio.sleep(0.01)
        calls.append(len(completions))
        return [float(len(c)) for c in completions]

    def sometimes_none(completions, answer, **kwargs):  # dataset column `answer` arrives as a keyword
        assert len(answer) == len(completions)
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    trainer = GRPOTrainer(
        tiny_model,
        [slow_length, sometimes_none],
        args=make_args(reward_weights=[1.0, 0.5]),
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
    )
    trainer.train()
    assert calls == [4, 4]
    logged = last_log_with(trainer, "reward")
    assert logged["rewards/sometimes_none/mean"] == pytest.approx(1.0)  # the Nones are left out, not zeros
    assert "rewards/slow_length/mean" in logged


def test_every_reward_none_gives_zero_advantages(tiny_model, tiny_tokenizer, dataset, make_args):
    def no_opinion(completions, **kwargs):
        return [None] * len(completions)

    trainer = GRPOTrainer(
        tiny_model, no_opinion, args=make_args(max_steps=1), train_dataset=dataset, processing_class=tiny_tokenizer
    )
    trainer.train()
    assert torch.equal(trainer._buffered_inputs[0]["advantages"], torch.zeros(4))
    assert math.isnan(last_log_with(trainer, "reward")["reward"])  # logged as NaN, as TRL does


def test_reward_model_from_a_local_directory(tiny_model, tiny_tokenizer, dataset, make_args, tmp_path):
    from grpokit.tiny import build_reward_model

    build_reward_model(tiny_tokenizer).save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")

    trainer = GRPOTrainer(
        tiny_model,
        [str(tmp_path / "rm"), text_reward],
        args=make_args(),
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
    )
    assert trainer.reward_func_names == ["rm", "text_reward"]
    trainer.train()
    logged = last_log_with(trainer, "reward")
    assert math.isfinite(logged["rewards/rm/mean"]) and logged["rewards/rm/std"] > 0


def test_lora(tiny_model, tiny_tokenizer, dataset, make_args):
    from peft import LoraConfig

    trainer = GRPOTrainer(
        tiny_model,
        text_reward,
        args=make_args(beta=0.1),
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    assert trainer.ref_model is None  # the reference is the model with its adapter disabled
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = parameters(trainer.model)
    trainer.train()
    assert changed({n: before[n] for n in trainable}, trainer.model)
    assert not changed({n: p for n, p in before.items() if n not in trainable}, trainer.model)
    assert last_log_with(trainer, "kl")["kl"] > 0  # adapter-on vs adapter-off log-probabilities differ


def test_conversational_prompts(tiny_model, tiny_tokenizer, chat_dataset, make_args):
    seen = {}

    def record(prompts, completions, **kwargs):
        seen["prompts"], seen["completions"] = prompts, completions
        return [float(len(c[0]["content"])) for c in completions]

    trainer = GRPOTrainer(
        tiny_model, record, args=make_args(), train_dataset=chat_dataset, processing_class=tiny_tokenizer
    )
    trainer.train()
    assert seen["prompts"][0][0] == {"role": "system", "content": "be brief"}
    assert seen["completions"][0][0]["role"] == "assistant"
    prompt_ids = trainer._buffered_inputs[0]["prompt_ids"][0]
    text = tiny_tokenizer.decode(prompt_ids[prompt_ids != tiny_tokenizer.pad_token_id])
    assert text.startswith("<|system|>be brief<eos><|user|>") and text.endswith("<eos><|assistant|>")


def test_string_rewards_resolve_to_built_ins(tiny_model, tiny_tokenizer, dataset, make_args):
    trainer = GRPOTrainer(
        tiny_model,
        ["tag_count", {"name": "soft_overlong_punishment", "kwargs": {}}],
        args=make_args(max_steps=1),
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
    )
    assert trainer.reward_func_names[0] == "tag_count"
    trainer.train()
    assert "rewards/tag_count/mean" in last_log_with(trainer, "reward")


def test_model_given_as_a_path(tiny_model_dir, dataset, make_args):
    trainer = GRPOTrainer(
        tiny_model_dir,
        text_reward,
        args=make_args(max_steps=1, model_init_kwargs={"dtype": "float32"}),
        train_dataset=dataset,
    )
    assert trainer.model.dtype == torch.float32
    assert trainer.processing_class.padding_side == "left"
    trainer.train()
