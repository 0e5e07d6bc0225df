"""Each GRPOConfig field the trainer implements has a visible effect in a short run on the tiny model."""

import json
import os

import pytest
import torch
from _trainer_helpers import PROMPTS, changed, last_log_with, parameters, text_reward

import grpokit.trainer as trainer_module
from grpokit import GRPOTrainer


def build(tiny_model, tiny_tokenizer, dataset, args, rewards=text_reward, **kwargs):
    return GRPOTrainer(
        tiny_model, rewards, args=args, train_dataset=dataset, processing_class=tiny_tokenizer, **kwargs
    )


@pytest.fixture
def loss_calls(monkeypatch):
    """Records the keyword arguments of every policy_loss call the trainer makes."""
    calls = []
    original = trainer_module.policy_loss

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", spy)
    return calls


def test_mask_truncated_completions(tiny_model, tiny_tokenizer, dataset, make_args):
    trainer = build(tiny_model, tiny_tokenizer, dataset, make_args(mask_truncated_completions=True, max_steps=1))
    trainer.train()
    batch = trainer._buffered_inputs[0]
    eos = tiny_tokenizer.eos_token_id
    for ids, mask in zip(batch["completion_ids"], batch["completion_mask"], strict=True):
        ended = (ids == eos).any()
        assert mask.sum() > 0 if ended else mask.sum() == 0


def test_top_entropy_quantile_keeps_the_high_entropy_half(tiny_model, tiny_tokenizer, dataset, make_args, loss_calls):
    build(tiny_model, tiny_tokenizer, dataset, make_args(top_entropy_quantile=0.5, max_steps=1)).train()
    keep = loss_calls[0]["entropy_mask"]
    assert keep is not None and keep.dtype == torch.bool
    assert 0.4 <= keep.float().sum().item() / 32 <= 0.6  # 4 completions x 8 tokens, all active (no early EOS)


def test_off_policy_mask_is_passed_when_set(tiny_model, tiny_tokenizer, dataset, make_args, loss_calls):
    args = make_args(off_policy_mask_threshold=0.5, num_iterations=2, max_steps=2)
    build(tiny_model, tiny_tokenizer, dataset, args).train()
    assert all(call["off_policy_mask"].shape == (4, 1) for call in loss_calls)


def test_entropy_bonus_and_adaptive_coefficient(tiny_model, tiny_tokenizer, dataset, make_args):
    # The tiny model's entropy (~4.6 nats) is below the target, so the coefficient rises by delta each step.
    args = make_args(use_adaptive_entropy=True, entropy_coef=0.0, entropy_target=10.0, entropy_coef_delta=0.005)
    trainer = build(tiny_model, tiny_tokenizer, dataset, args)
    trainer.train()
    assert trainer.entropy_coef == pytest.approx(0.01)
    logged = [entry["entropy_coef"] for entry in trainer.state.log_history if "entropy_coef" in entry]
    assert logged == pytest.approx([0.005, 0.01])
    assert "policy_loss" in last_log_with(trainer, "entropy_coef")


def test_fixed_entropy_coef_changes_the_loss(tiny_model, tiny_tokenizer, dataset, make_args, tiny_model_dir):
    from grpokit.tiny import build_model

    losses = {}
    for coef in (0.0, 0.5):
        model = build_model(tiny_tokenizer)
        trainer = build(model, tiny_tokenizer, dataset, make_args(entropy_coef=coef, max_steps=1))
        trainer.train()
        losses[coef] = last_log_with(trainer, "loss")["loss"]
    entropy = last_log_with(trainer, "entropy")["entropy"]
    assert losses[0.5] == pytest.approx(losses[0.0] - 0.5 * entropy, abs=1e-3)


def test_sync_ref_model(tiny_model, tiny_tokenizer, dataset, make_args):
    args = make_args(beta=0.1, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=1.0)
    trainer = build(tiny_model, tiny_tokenizer, dataset, args)
    before = parameters(trainer.ref_model)
    trainer.train()
    assert changed(before, trainer.ref_model)
    for (name, ref), policy in zip(trainer.ref_model.named_parameters(), trainer.model.parameters(), strict=True):
        assert torch.equal(ref, policy), name  # alpha = 1: the reference is the policy after every step


def test_disable_dropout(tiny_model, tiny_tokenizer, dataset, make_args):
    tiny_model.model.extra_dropout = torch.nn.Dropout(0.3)  # Qwen2 itself uses functional dropout only
    trainer = build(tiny_model, tiny_tokenizer, dataset, make_args(disable_dropout=True, beta=0.1))
    assert trainer.model.model.extra_dropout.p == 0.0
    assert trainer.ref_model.model.extra_dropout.p == 0.0


def test_cast_lm_head_to_fp32(tiny_tokenizer, dataset, make_args):
    from grpokit.tiny import build_model

    model = build_model(tiny_tokenizer).to(torch.bfloat16)
    trainer = build(model, tiny_tokenizer, dataset, make_args(cast_lm_head_to_fp32=True, max_steps=1))
    assert trainer.model.lm_head.weight.dtype == torch.float32
    ids = torch.tensor([[10, 11, 12]])
    assert trainer.model(input_ids=ids).logits.dtype == torch.float32
    assert trainer.model.model.embed_tokens(ids).dtype == torch.bfloat16  # tied table, output cast back
    trainer.train()


def test_no_shuffle_keeps_dataset_order(tiny_model, tiny_tokenizer, dataset, make_args):
    seen = []

    def record(prompts, completions, **kwargs):
        seen.extend(prompts)
        return text_reward(completions)

    build(tiny_model, tiny_tokenizer, dataset, make_args(shuffle_dataset=False), rewards=record).train()
    assert seen == [p for p in PROMPTS[:4] for _ in range(2)]


def test_pad_to_multiple_of(tiny_model, tiny_tokenizer, dataset, make_args):
    trainer = build(tiny_model, tiny_tokenizer, dataset, make_args(pad_to_multiple_of=16, max_steps=1))
    trainer.train()
    batch = trainer._buffered_inputs[0]
    assert batch["prompt_ids"].size(1) == 16 and batch["completion_ids"].size(1) == 16


def test_max_prompt_length_cuts_from_the_left(tiny_model, tiny_tokenizer, dataset, make_args):
    args = make_args(max_prompt_length=2, shuffle_dataset=False, max_steps=1)
    trainer = build(tiny_model, tiny_tokenizer, dataset, args)
    trainer.train()
    prompt_ids = trainer._buffered_inputs[0]["prompt_ids"]
    # Prompts "ab", "ab", "cde", "cde" (shuffled within the batch); "cde" keeps its end, "de".
    texts = sorted(tiny_tokenizer.decode(row) for row in prompt_ids)
    assert texts == ["ab", "ab", "de", "de"]


def test_generation_settings_reach_generate(tiny_model, tiny_tokenizer, dataset, make_args):
    args = make_args(
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        min_p=0.01,
        repetition_penalty=1.1,
        generation_kwargs={"max_new_tokens": 3},
    )
    trainer = build(tiny_model, tiny_tokenizer, dataset, args)
    config = trainer.generator.generation_config
    assert (config.temperature, config.top_p, config.top_k, config.min_p, config.repetition_penalty) == (
        0.7,
        0.9,
        5,
        0.01,
        1.1,
    )
    trainer.train()
    assert last_log_with(trainer, "reward")["completions/max_length"] <= 3  # generation_kwargs win


def test_evaluation_with_num_generations_eval(tiny_model, tiny_tokenizer, dataset, make_args):
    args = make_args(
        eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=3, num_generations_eval=3, max_steps=2
    )
    trainer = GRPOTrainer(
        tiny_model,
        text_reward,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset.select(range(2)),
        processing_class=tiny_tokenizer,
    )
    trainer.train()
    logged = last_log_with(trainer, "eval_loss")
    assert "eval_reward" in logged and "eval_completions/mean_length" in logged


def test_log_completions_prints_a_table(tiny_model, tiny_tokenizer, dataset, make_args, capsys):
    args = make_args(log_completions=True, num_completions_to_print=2, max_steps=1)
    trainer = build(tiny_model, tiny_tokenizer, dataset, args)
    trainer.train()
    out = capsys.readouterr().out
    assert out.count("completions at step") == 1  # not again at the end-of-training log
    table = out[out.index("completions at step 1") :].splitlines()
    assert table[2].split("|")[1:-1] == [" prompt ", " completion ", " text_reward ", " advantage "]
    assert table[3].startswith("+-") and table[4].startswith("| ") and table[5].startswith("| ")
    assert table[6].startswith("+-")  # num_completions_to_print=2 rows
    assert os.path.exists(os.path.join(args.output_dir, "completions", "completions_00001.parquet"))
    # the run's recorder (grpokit.records) wrote the batch's 4 completions to completions.jsonl and took them
    with open(os.path.join(args.output_dir, "completions.jsonl"), encoding="utf-8") as fh:
        assert [json.loads(line)["step"] for line in fh] == [1, 1, 1, 1]
    assert len(trainer.logged_completions) == 0


def test_reward_functions_can_log_metrics_and_columns(tiny_model, tiny_tokenizer, dataset, make_args):
    def chatty(completions, log_metric, log_extra, **kwargs):
        log_metric("chatty/calls", 1.0)
        log_extra("note", ["x"] * len(completions))
        return text_reward(completions)

    trainer = build(tiny_model, tiny_tokenizer, dataset, make_args(max_steps=1), rewards=chatty)
    trainer.train()
    assert last_log_with(trainer, "chatty/calls")["chatty/calls"] == 1.0
    assert list(trainer._completion_log.extra["note"]) == ["x"] * 4


def test_checkpoint_and_resume(tiny_model_dir, tiny_tokenizer, dataset, make_args):
    args = make_args(save_strategy="steps", save_steps=1, max_steps=2, use_adaptive_entropy=True, entropy_target=10.0)
    first = GRPOTrainer(tiny_model_dir, text_reward, args=args, train_dataset=dataset)
    first.train()
    checkpoint = os.path.join(args.output_dir, "checkpoint-2")
    assert os.path.exists(os.path.join(checkpoint, "entropy_ctrl_state.json"))

    args = make_args(save_strategy="no", max_steps=3, use_adaptive_entropy=True, entropy_target=10.0)
    second = GRPOTrainer(tiny_model_dir, text_reward, args=args, train_dataset=dataset)
    second.train(resume_from_checkpoint=checkpoint)
    assert second.state.global_step == 3
    assert second.entropy_coef == pytest.approx(first.entropy_coef + 0.005)  # restored, then one more step


def test_router_aux_loss_on_a_mixture_of_experts(tiny_tokenizer, dataset, make_args):
    from grpokit.tiny import build_moe

    model = build_moe(tiny_tokenizer, "mixtral")
    trainer = build(model, tiny_tokenizer, dataset, make_args(router_aux_loss_coef=0.01))
    assert trainer.aux_loss_enabled and trainer.router_aux_loss_coef == 0.01
    trainer.train()
    assert last_log_with(trainer, "aux_loss")["aux_loss"] > 0


@pytest.mark.parametrize("use_lora", [False, True])
def test_gradient_checkpointing(use_lora, tiny_model, tiny_tokenizer, dataset, make_args):
    from peft import LoraConfig

    peft_config = LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False) if use_lora else None
    args = make_args(gradient_checkpointing=True, max_steps=1)
    trainer = build(tiny_model, tiny_tokenizer, dataset, args, peft_config=peft_config)
    before = parameters(trainer.model)
    trainer.train()
    assert changed(before, trainer.model)
    assert trainer.accelerator.unwrap_model(trainer.model).is_activation_checkpointing  # restored after generation


def test_other_reward_aggregations(tiny_model, tiny_tokenizer, dataset, make_args):
    def second(completions, **kwargs):
        return [float(len(c)) for c in completions]

    args = make_args(multi_objective_aggregation="normalize_then_sum", scale_rewards="batch", max_steps=1)
    trainer = build(tiny_model, tiny_tokenizer, dataset, args, rewards=[text_reward, second])
    trainer.train()
    advantages = trainer._buffered_inputs[0]["advantages"]
    assert advantages.abs().sum() > 0 and abs(advantages.mean().item()) < 1e-4  # normalised over the whole batch


def test_default_config(tiny_model, tiny_tokenizer, dataset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output_dir is relative: keep it out of the checkout
    trainer = GRPOTrainer(tiny_model, text_reward, train_dataset=dataset, processing_class=tiny_tokenizer)
    assert trainer.args.output_dir.endswith("Qwen2ForCausalLM-GRPO")
    from grpokit.config.precision import bf16_supported

    assert trainer.args.bf16 is bf16_supported()  # the unset bf16 is resolved for this machine
