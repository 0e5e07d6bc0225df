"""`produce_rollout` without a Trainer: a scripted generator, hand-picked rewards, hand-worked advantages."""

import math

import pytest
import torch

from grpokit.generation import Generated
from grpokit.rollout import RewardFunctions, RolloutSettings, produce_rollout

EOS = 1
# Two prompts x two generations; at most 3 tokens. Rows 1 and 3 hit the limit without EOS (truncated).
COMPLETIONS = [[10, EOS], [11, 12, 13], [14, EOS], [15, 16, 17]]
# Row 2 is unscorable (None). Group 0: rewards 1 and 3. Group 1: only row 3 (reward 2) is scorable.
REWARDS = [1.0, 3.0, None, 2.0]


class Scripted:
    def __init__(self):
        self.prompt_ids = None

    def generate(self, prompt_ids):
        self.prompt_ids = prompt_ids
        return Generated([list(c) for c in COMPLETIONS])


def fixed(completions, **kwargs):
    return list(REWARDS)


def rollout_for(tiny_tokenizer, **settings):
    rows = [{"prompt": p} for p in ["ab", "ab", "cde", "cde"]]
    generator = Scripted()
    calls = {}

    def scorer(name):
        def logps(input_ids, attention_mask, logits_to_keep):
            calls[name] = (input_ids.clone(), attention_mask.clone(), logits_to_keep)
            return torch.zeros(input_ids.size(0), logits_to_keep)

        return logps

    rollout = produce_rollout(
        rows,
        tokenizer=tiny_tokenizer,
        generator=generator,
        rewards=RewardFunctions([fixed]),
        settings=RolloutSettings(num_generations=2, **settings),
        eos_token_ids=[EOS],
        old_logps_fn=scorer("old"),
        ref_logps_fn=scorer("ref"),
    )
    return rollout, generator, calls


def test_masks_advantages_and_token_count(tiny_tokenizer):
    rollout, _, calls = rollout_for(tiny_tokenizer)
    assert rollout.completion_ids.tolist() == [[10, EOS, 0], [11, 12, 13], [14, EOS, 0], [15, 16, 17]]
    assert rollout.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]]
    assert rollout.num_items_in_batch.item() == 10
    # Group 0: mean 2, std sqrt(((1-2)^2 + (3-2)^2) / (2-1)) = sqrt(2); A = -+1 / (sqrt(2) + 1e-4) = -+0.70706.
    # Group 1: one scorable reward, std undefined (NaN): both advantages are 0.
    expected = [-1 / (math.sqrt(2) + 1e-4), 1 / (math.sqrt(2) + 1e-4), 0.0, 0.0]
    assert rollout.advantages.tolist() == pytest.approx(expected, abs=1e-6)
    # Both scorers see the whole sequence: prompt (2 or 3 tokens, left-padded to 3) then the 3 completion slots.
    input_ids, attention_mask, logits_to_keep = calls["old"]
    assert logits_to_keep == 3 and input_ids.shape == (4, 6)
    assert attention_mask.tolist()[0] == [0, 1, 1, 1, 1, 0]
    assert rollout.old_logps.shape == rollout.ref_logps.shape == (4, 3)


def test_truncated_completions_are_masked_out(tiny_tokenizer):
    rollout, _, calls = rollout_for(tiny_tokenizer, mask_truncated_completions=True)
    assert rollout.completion_mask.tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]]
    assert rollout.num_items_in_batch.item() == 4
    assert calls["ref"][1][1].tolist() == [0, 1, 1, 0, 0, 0]  # masked for attention too, as in TRL


def test_metrics(tiny_tokenizer):
    rollout, _, _ = rollout_for(tiny_tokenizer)
    m = rollout.metrics
    assert m["completions/mean_length"] == 2.5 and m["completions/min_length"] == 2
    assert m["completions/max_length"] == 3 and m["completions/clipped_ratio"] == 0.5
    assert (m["completions/mean_terminated_length"], m["completions/max_terminated_length"]) == (2, 2)
    assert m["reward"] == pytest.approx(2.0)  # mean of 1, 3, 2 (the None is left out)
    assert m["reward_std"] == pytest.approx(1.0)
    assert m["rewards/fixed/mean"] == pytest.approx(2.0)
    assert m["frac_reward_zero_std"] == 0.0  # group 0 varies, group 1's std is undefined
    assert rollout.num_tokens == (2 + 2 + 3 + 3) + 10
    assert rollout.prompts == ["ab", "ab", "cde", "cde"] and rollout.completions[0] == tiny_tokenizer.decode([10])


def test_prompts_are_cut_from_the_left(tiny_tokenizer):
    rollout, generator, _ = rollout_for(tiny_tokenizer, max_prompt_length=2)
    assert [tiny_tokenizer.decode(ids) for ids in generator.prompt_ids] == ["ab", "ab", "de", "de"]
    assert rollout.prompt_mask.tolist() == [[1, 1]] * 4


def test_micro_batches(tiny_tokenizer):
    rollout, _, _ = rollout_for(tiny_tokenizer)
    first, second = rollout.micro_batches(2, shuffle=False)
    assert first["completion_ids"].tolist() == rollout.completion_ids[:2].tolist()
    assert second["advantages"].tolist() == rollout.advantages[2:].tolist()
    assert first["num_items_in_batch"] is rollout.num_items_in_batch  # the global count goes with every slice
    shuffled = rollout.micro_batches(1)[0]
    order = [rollout.completion_ids.tolist().index(row) for row in shuffled["completion_ids"].tolist()]
    assert sorted(order) == [0, 1, 2, 3]
    assert shuffled["advantages"].tolist() == rollout.advantages[order].tolist()  # rows stay aligned
    with pytest.raises(ValueError, match="cannot be split into 3"):
        rollout.micro_batches(3)


def test_a_prompt_beyond_the_models_positions_is_refused_before_generating(tiny_tokenizer):
    from grpokit.generation import GenerationError

    # "ab" is 2 tokens: 2 + 3 = 5 positions fit; "cde" is 3 tokens: 3 + 3 = 6 do not
    with pytest.raises(GenerationError) as info:
        rollout_for(tiny_tokenizer, max_positions=5, max_completion_length=3)
    assert str(info.value) == (
        "a prompt of 3 tokens ('cde') with max_completion_length=3 needs 6 positions, more than the model's 5 "
        "(max_position_embeddings): set max_prompt_length to at most 2 (it keeps the end of each prompt), or shorten "
        "such prompts"
    )


def test_max_prompt_length_makes_them_fit(tiny_tokenizer):
    rollout, generator, _ = rollout_for(tiny_tokenizer, max_positions=5, max_completion_length=3, max_prompt_length=2)
    assert [len(ids) for ids in generator.prompt_ids] == [2, 2, 2, 2]
    rollout, generator, _ = rollout_for(tiny_tokenizer, max_positions=6, max_completion_length=3)  # 3 + 3 = 6 fits
    assert generator.prompt_ids is not None
