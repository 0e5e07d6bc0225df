"""`GRPOTrainer._generate(prompts)`, TRL 1.16's hook: what it receives and returns, and that a subclass overriding it
generates every rollout (the backend is reached only through it)."""

import pytest
from _trainer_helpers import text_reward

from grpokit import GRPOTrainer


def build(cls, tiny_model, tiny_tokenizer, dataset, args, rewards=text_reward):
    return cls(tiny_model, rewards, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)


def test_the_default_hook_returns_trl_tuple(tiny_model, tiny_tokenizer, dataset, make_args):
    trainer = build(GRPOTrainer, tiny_model, tiny_tokenizer, dataset, make_args())
    output = trainer._generate(["ab", "ab", "cde", "cde"])
    prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images = output
    assert prompt_ids[0] == prompt_ids[1] == tiny_tokenizer("ab")["input_ids"]
    assert len(completion_ids) == 4 and all(1 <= len(ids) <= 8 for ids in completion_ids)  # max_completion_length
    assert completions == tiny_tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    # transformers samples from the training model itself: no sampler logprobs; no tools, no images.
    assert (tool_mask, logprobs, extra_fields, images, tool_images) == (None, None, {}, None, [])


class FixedCompletions(GRPOTrainer):
    """Generates without the backend: every completion is "xy" then EOS; tags each row for the rewards."""

    calls = []

    def _generate(self, prompts):
        self.calls.append(list(prompts))
        prompt_ids = [self.processing_class(p)["input_ids"] for p in prompts]
        completion_ids = [[*self.processing_class("xy")["input_ids"], self.processing_class.eos_token_id]] * len(
            prompts
        )
        completions = ["xy"] * len(prompts)
        return prompt_ids, completion_ids, None, completions, None, {"source": ["fixed"] * len(prompts)}, None, []


def test_an_overriding_subclass_generates_every_rollout(tiny_model, tiny_tokenizer, dataset, make_args):
    seen = []
    FixedCompletions.calls.clear()

    def reward(completions, source, **kwargs):
        seen.append((list(completions), list(source)))
        return [float(i % 2) for i in range(len(completions))]  # varied, so advantages are not all 0

    trainer = build(FixedCompletions, tiny_model, tiny_tokenizer, dataset, make_args(max_steps=1), rewards=reward)

    def unreachable(prompt_ids):
        raise AssertionError("the backend generated although _generate was overridden")

    trainer.generator.generate = unreachable
    trainer.train()
    # One round of 4 rows: 2 prompts, each repeated once per generation (num_generations=2), consecutive.
    assert len(FixedCompletions.calls) == 1
    prompts = FixedCompletions.calls[0]
    assert len(prompts) == 4 and prompts[0] == prompts[1] and prompts[2] == prompts[3]
    assert seen == [(["xy"] * 4, ["fixed"] * 4)]  # completions and the extra field reach the rewards
    expected = [*tiny_tokenizer("xy")["input_ids"], tiny_tokenizer.eos_token_id]
    batch = trainer._buffered_inputs[0]
    assert batch["completion_ids"].tolist() == [expected] * 4
    assert batch["completion_mask"].tolist() == [[1] * len(expected)] * 4


def test_an_extra_field_that_is_not_a_list_goes_to_every_row(tiny_model, tiny_tokenizer, dataset, make_args):
    class OneValue(GRPOTrainer):
        def _generate(self, prompts):
            output = list(super()._generate(prompts))
            output[5] = {"turns": 3}
            return tuple(output)

    seen = []

    def reward(completions, turns, **kwargs):
        seen.append(list(turns))
        return [0.0] * len(completions)

    build(OneValue, tiny_model, tiny_tokenizer, dataset, make_args(max_steps=1), rewards=reward).train()
    assert seen == [[3, 3, 3, 3]]


def test_a_tool_mask_from_an_override_masks_the_loss(tiny_model, tiny_tokenizer, dataset, make_args):
    """An override's tool mask reaches the rollout: tokens it marks 0 leave the loss's token count; a mask of the
    wrong length is one line."""

    class FirstTokenIsTool(GRPOTrainer):
        def _generate(self, prompts):
            prompt_ids, completion_ids, _, *rest = super()._generate(prompts)
            return prompt_ids, completion_ids, [[0] + [1] * (len(ids) - 1) for ids in completion_ids], *rest

    trainer = build(FirstTokenIsTool, tiny_model, tiny_tokenizer, dataset, make_args(max_steps=1))
    rows = [dataset[i] for i in range(4)]
    rollout = trainer._rollout(rows, "train")
    lengths = rollout.completion_mask.sum(dim=1)
    assert rollout.tool_mask[:, 0].tolist() == [0, 0, 0, 0]
    assert int(rollout.num_items_in_batch) == int(lengths.sum()) - 4
    assert rollout.metrics["completions/mean_length"] == (lengths.float().mean() - 1).item()

    class WrongLength(GRPOTrainer):
        def _generate(self, prompts):
            prompt_ids, completion_ids, _, *rest = super()._generate(prompts)
            return prompt_ids, completion_ids, [[1] for _ in completion_ids], *rest

    trainer = build(WrongLength, tiny_model, tiny_tokenizer, dataset, make_args(max_steps=1))
    with pytest.raises(ValueError, match=r"tool_mask \(or env_mask\) of completion 0: 1 values for \d+ completion"):
        trainer.train()
