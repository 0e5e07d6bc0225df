"""TRL 1.16's helpers on grpokit's GRPOTrainer, against hand-worked values and the formulas of TRL's code: the entropy
and off-policy masks (called on the class, as TRL's own tests do), the entropy-bonus predicate, the construction
warnings, `reward_processing_classes`. The `_generate` hook has its trainer tests in tests/trainer."""

import logging
from types import SimpleNamespace

import pytest
import torch

from grpokit import GRPOTrainer
from grpokit.algorithms.entropy_control import EntropyCoefficient
from grpokit.trl_compat import TOKEN_SUMMED_LOSSES, TRLCompatMixin, construction_warnings


def text_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


# ------------------------------------------------------------------------------------------------ entropy mask


class _Processes:
    """An accelerator of `world` processes seen from process 0: the others hold `others` (1-D entropies each)."""

    def __init__(self, others=()):
        self.others = list(others)
        self.num_processes = 1 + len(self.others)

    def pad_across_processes(self, tensor, dim, pad_index):
        length = max(len(t) for t in [tensor, *self.others])
        return torch.cat([tensor, torch.full((length - len(tensor),), pad_index)])

    def gather(self, tensor):
        length = len(tensor)
        padded = [torch.cat([t, torch.full((length - len(t),), -1e9)]) for t in self.others]
        return torch.cat([tensor, *padded])


def entropy_mask(entropies, mask, threshold, others=()):
    # What TRL's tests do: the method called on the class with a stand-in holding only an accelerator.
    trainer = SimpleNamespace(accelerator=_Processes(others))
    return GRPOTrainer.get_high_entropy_mask(trainer, entropies, mask, threshold)


ENTROPIES = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])  # 1.1 and 1.2 are padding


@pytest.mark.parametrize(
    ("threshold", "kept"),
    [
        # Active entropies 0.1..1.0 (10 of them); quantile q sits at position 9q, interpolated linearly.
        (0.8, [0.9, 1.0]),  # 7.2 -> 0.8 + 0.2 * 0.1 = 0.82
        (0.5, [0.6, 0.7, 0.8, 0.9, 1.0]),  # 4.5 -> 0.55
        (0.0, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),  # 0.1: every active token
        (1.0, [1.0]),  # 1.0: the largest active one only; padding 1.1, 1.2 never
    ],
)
def test_the_entropy_mask_ranks_active_tokens_only(threshold, kept):
    keep = entropy_mask(ENTROPIES, MASK, threshold)
    assert keep.dtype == torch.bool and keep.shape == (2, 6)
    assert sorted(round(v, 1) for v in ENTROPIES[keep].tolist()) == kept


def test_the_entropy_mask_is_empty_without_active_tokens():
    assert not entropy_mask(ENTROPIES, torch.zeros_like(MASK), 0.5).any()


def test_the_entropy_mask_ranks_over_every_process():
    # Process 1 holds 2.0, 3.0: the pool is 0.1..1.0, 2.0, 3.0 (12 values). q = 0.8 sits at 8.8 -> 0.9 + 0.8 * 0.1
    # = 0.98: here only 1.0 is kept (0.9 would be, ranked over this process alone).
    keep = entropy_mask(ENTROPIES, MASK, 0.8, others=[torch.tensor([2.0, 3.0])])
    assert ENTROPIES[keep].tolist() == [1.0]


def test_the_entropy_mask_equals_trl_formula_on_random_inputs():
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        entropies = torch.rand(4, 7, generator=generator) * 3
        mask = (torch.rand(4, 7, generator=generator) > 0.3).long()
        threshold = torch.rand(1, generator=generator).item()
        # TRL 1.16: quantile of the active entropies; keep (entropies * mask >= it) & mask.
        expected = (entropies * mask >= torch.quantile(entropies[mask.bool()], threshold)) & mask.bool()
        assert torch.equal(entropy_mask(entropies, mask, threshold), expected)


# ------------------------------------------------------------------------------------------------ off-policy mask


def test_the_off_policy_mask_drops_negative_advantage_far_from_the_sampler():
    advantages = torch.tensor([[1.0], [-1.0], [-1.0]])
    sampling = torch.zeros(3, 4)
    logps = torch.tensor([[-2.0] * 4, [-0.5] * 4, [-2.0] * 4])  # KL sampling - current: 2.0, 0.5, 2.0
    keep = GRPOTrainer.get_off_policy_mask(advantages, logps, sampling, torch.ones(3, 4), 1.0)
    # Positive advantage: kept whatever the KL; 0.5 <= 1.0: kept; negative and 2.0 > 1.0: dropped.
    assert keep.tolist() == [[1.0], [1.0], [0.0]]


def test_the_off_policy_mask_ignores_padding_and_follows_the_mask_dtype():
    logps = torch.tensor([[-2.0, -2.0, -1e4, 1e4]])  # padding holds absurd values
    mask = torch.tensor([[1, 1, 0, 0]])
    keep = GRPOTrainer.get_off_policy_mask(torch.tensor([[-1.0]]), logps, torch.zeros(1, 4), mask, 1.0)
    assert keep.tolist() == [[0]] and keep.dtype == mask.dtype  # mean KL (2 + 2) / 2 = 2.0 > 1.0


def test_the_off_policy_mask_counts_unscored_sampler_tokens_as_zero_kl():
    # KL per token: 3.0 and NaN (the sampler could not score it) -> 0: mean 1.5 over 2 active tokens.
    sampling = torch.tensor([[0.0, float("nan")]])
    logps = torch.tensor([[-3.0, -1.0]])
    keep = [
        GRPOTrainer.get_off_policy_mask(torch.tensor([[-1.0]]), logps, sampling, torch.ones(1, 2), t)
        for t in (1.4, 1.5)
    ]
    assert [k.item() for k in keep] == [0.0, 1.0]


def test_the_off_policy_mask_equals_trl_formula_on_random_inputs():
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        advantages = torch.randn(5, 1, generator=generator)
        logps, sampling = -torch.rand(5, 6, generator=generator) * 3, -torch.rand(5, 6, generator=generator) * 3
        mask = (torch.rand(5, 6, generator=generator) > 0.2).float()
        mean_kl = ((sampling - logps) * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
        expected = ((advantages >= 0) | (mean_kl <= 0.5)).float()
        assert torch.equal(GRPOTrainer.get_off_policy_mask(advantages, logps, sampling, mask, 0.5), expected)


# ------------------------------------------------------------------------------------------------ entropy bonus


@pytest.mark.parametrize(
    ("coef", "adaptive", "enabled"), [(0.0, False, False), (0.01, False, True), (0.0, True, True), (-0.1, False, True)]
)
def test_the_entropy_bonus_predicate(coef, adaptive, enabled):
    # TRL: entropy_coef != 0.0 or use_adaptive_entropy (adaptive keeps the term while its coefficient is at 0).
    trainer = SimpleNamespace(_entropy_control=EntropyCoefficient(coef=coef, adaptive=adaptive))
    assert TRLCompatMixin._entropy_bonus_enabled.fget(trainer) is enabled


# ------------------------------------------------------------------------------------------------ warnings

SEQUENCE_WARNING = (
    "loss sums per-token contributions, which effectively weights each sequence by its completion length"
)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_the_sequence_level_warning_names_token_summed_losses(loss_type, level):
    warned = any(SEQUENCE_WARNING in line for line in construction_warnings(loss_type, level))
    assert warned is (level == "sequence" and loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"))
    assert TOKEN_SUMMED_LOSSES == ("bnpo", "dr_grpo", "dapo", "cispo")


def test_luspo_and_vespo_warn_about_their_level():
    assert "luspo" in construction_warnings("luspo", "token")[0] and construction_warnings("luspo", "sequence") == []
    assert "VESPO" in construction_warnings("vespo", "sequence")[0] and construction_warnings("vespo", "token") == []


def build(tiny_model, tiny_tokenizer, args, rewards=text_reward, **kwargs):
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": ["ab", "cde", "fghi", "jk"]})
    return GRPOTrainer(
        tiny_model, rewards, args=args, train_dataset=dataset, processing_class=tiny_tokenizer, **kwargs
    )


def make_args(tmp_path, **overrides):
    from grpokit import GRPOConfig

    values = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_completion_length=8)
    values.update(report_to="none", use_cpu=True, bf16=False, save_strategy="no", **overrides)
    return GRPOConfig(**values)


@pytest.mark.parametrize(("loss_type", "warned"), [("dapo", True), ("grpo", False)])
def test_the_trainer_logs_the_sequence_level_warning(tiny_model, tiny_tokenizer, tmp_path, caplog, loss_type, warned):
    # TRL logs it with logger.warning (not warnings.warn) when the trainer is built.
    args = make_args(tmp_path, loss_type=loss_type, importance_sampling_level="sequence")
    with caplog.at_level(logging.WARNING, logger="grpokit.trl_compat"):
        build(tiny_model, tiny_tokenizer, args)
    lines = [r.getMessage() for r in caplog.records if r.name == "grpokit.trl_compat"]
    assert any(f"the `'{loss_type}'` {SEQUENCE_WARNING}" in line for line in lines) is warned


# ------------------------------------------------------------------------------------------------ trainer attributes


def test_reward_processing_classes_one_per_reward(tiny_model, tiny_tokenizer, tmp_path):
    from grpokit.tiny import build_reward_model, build_tokenizer

    build_reward_model(tiny_tokenizer).save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")
    reward_tokenizer = build_tokenizer()  # an object of its own, to tell it from the policy's
    rewards = [text_reward, str(tmp_path / "rm"), build_reward_model(tiny_tokenizer)]
    trainer = build(
        tiny_model,
        tiny_tokenizer,
        make_args(tmp_path),
        rewards=rewards,
        reward_processing_classes=[None] * 2 + [reward_tokenizer],
    )
    # TRL: None for a plain function, the model's own tokenizer when none is passed, the one passed otherwise.
    classes = trainer.reward_processing_classes
    assert len(classes) == 3 and classes[0] is None and classes[2] is reward_tokenizer
    assert classes[1] is not None and classes[1] is not tiny_tokenizer and classes[1].pad_token_id is not None
    assert classes is trainer.rewards.processing_classes  # what scoring reads
    assert trainer._entropy_bonus_enabled is False  # entropy_coef 0, not adaptive: TRL's default


def test_a_single_reward_processing_class_is_a_list_of_one(tiny_model, tiny_tokenizer, tmp_path):
    from grpokit.tiny import build_reward_model, build_tokenizer

    reward_tokenizer = build_tokenizer()
    trainer = build(
        tiny_model,
        tiny_tokenizer,
        make_args(tmp_path, entropy_coef=0.01),
        rewards=build_reward_model(tiny_tokenizer),
        reward_processing_classes=reward_tokenizer,
    )
    assert len(trainer.reward_processing_classes) == 1 and trainer.reward_processing_classes[0] is reward_tokenizer
    assert trainer._entropy_bonus_enabled is True


# ------------------------------------------------------------------------------------------------ all-None rewards


def never_scores(completions, **kwargs):
    return [None] * len(completions)


def test_rewards_that_are_all_none_warn_as_trl_and_train_on(tiny_model, tiny_tokenizer, tmp_path, caplog):
    # TRL 1.16 logs "All reward functions returned None for the following kwargs:" and keeps training (advantages 0).
    # Four rounds in a row score nothing: grpokit's old default (stop after 3) ended this run with a RewardError.
    trainer = build(
        tiny_model, tiny_tokenizer, make_args(tmp_path, max_steps=4, logging_steps=1), rewards=never_scores
    )
    assert trainer.args.max_unscorable_rounds is None
    with caplog.at_level(logging.WARNING, logger="grpokit.trainer"):
        trainer.train()
    assert trainer.state.global_step == 4
    lines = [r.getMessage() for r in caplog.records if r.name == "grpokit.trainer"]
    trl_lines = [
        line for line in lines if line.startswith("All reward functions returned None for the following kwargs: ")
    ]
    assert len(trl_lines) == 1  # once, where TRL repeats it every batch
    assert "(sample 0 of this round; 4 of its 4 completions unscored, advantage 0)" in trl_lines[0]
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert losses == [0.0] * 4  # zero advantages, beta 0: nothing to learn, as in TRL


def test_the_stop_stays_available_as_a_safety(tiny_model, tiny_tokenizer, tmp_path):
    from grpokit.rollout.rewards import RewardError

    args = make_args(tmp_path, max_steps=4, max_unscorable_rounds=2)
    trainer = build(tiny_model, tiny_tokenizer, args, rewards=never_scores)
    with pytest.raises(RewardError, match=r"in 2 generation rounds in a row \(max_unscorable_rounds=2\)"):
        trainer.train()
    assert trainer.state.global_step == 1  # the second round stops before its step


def test_trl_warning_names_the_first_unscored_completion_of_a_partly_scored_round():
    from grpokit.rollout.rewards import UnscorableRounds

    nan = float("nan")
    lines = []
    watcher = UnscorableRounds(None, ["a", "b"], lines.append)
    rollout = SimpleNamespace(
        rewards=torch.tensor([[1.0, nan], [nan, nan], [nan, 2.0], [nan, nan]]),
        prompts=["p0", "p1", "p2", "p3"],
        completions=["c0", "c1", "c2", "c3"],
        unscorable=False,
    )
    watcher.check(rollout, "train")
    watcher.check(rollout, "train")
    assert lines == [
        "All reward functions returned None for the following kwargs: {'prompt': 'p1', 'completion': 'c1'} (sample 1 "
        "of this round; 2 of its 4 completions unscored, advantage 0): at least one reward function must score each "
        "completion for it to teach anything; warned once"
    ]


# ------------------------------------------------------------------------------------------------ refusals TRL matches


def test_too_few_reward_processing_classes_match_trl_phrase(tiny_model, tiny_tokenizer, tmp_path):
    # TRL's test: pytest.raises(ValueError, match="must match"), one tokenizer for two reward functions.
    with pytest.raises(ValueError, match="must match") as refused:
        build(
            tiny_model,
            tiny_tokenizer,
            make_args(tmp_path),
            rewards=[text_reward, text_reward],
            reward_processing_classes=[tiny_tokenizer],
        )
    assert str(refused.value) == (
        "got 1 reward_processing_classes for 2 reward functions: the counts must match; pass one per reward function "
        "(None for callables)"
    )


# ------------------------------------------------------------------------------------------------ rollout_func dispatch


def _trainer_by_hand():
    """A trainer built as TRL 1.16's own `TestGRPORolloutDispatch` builds one: `object.__new__`, then only an
    accelerator without `unwrap_model`, bare args, a model without a config, and a decoding processing class."""
    from unittest.mock import MagicMock

    trainer = object.__new__(GRPOTrainer)
    trainer.accelerator = SimpleNamespace(device=torch.device("cpu"), is_main_process=True, gather=lambda t: t)
    trainer.args = SimpleNamespace(report_to=[])
    trainer.model = SimpleNamespace(training=True)
    trainer.state = SimpleNamespace(global_step=2, num_input_tokens_seen=0)
    trainer.processing_class = SimpleNamespace(batch_decode=MagicMock(return_value=["decoded"]))
    trainer.tools = None
    return trainer


def test_rollout_func_is_dispatched_on_a_trainer_built_by_hand():
    trainer = _trainer_by_hand()
    calls = []
    trainer.rollout_func = lambda prompts, owner: calls.append((prompts, owner)) or {
        "prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[-0.1]], "env_mask": [[1]],
    }  # fmt: skip
    result = trainer._generate(["prompt"])
    assert (result[0], result[1], result[2], result[4]) == ([[1]], [[2]], [[1]], [[-0.1]])
    assert calls == [(["prompt"], trainer)]


def test_rollout_func_missing_keys_is_one_line_on_a_trainer_built_by_hand():
    trainer = _trainer_by_hand()
    trainer.rollout_func = lambda prompts, owner: {"prompt_ids": [[1]], "completion_ids": [[2]]}
    with pytest.raises(ValueError, match=r"rollout_func must return keys \['logprobs'\]"):
        trainer._generate(["prompt"])
