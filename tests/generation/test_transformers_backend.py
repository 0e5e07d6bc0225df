"""Prompt encoding, completion cutting and padding, and the transformers generation backend, on hand-worked ids.

The tiny tokenizer is character level: ids 0-6 are <pad> <eos> <bos> <unk> <|system|> <|user|> <|assistant|>.
"""

import copy

import pytest
import torch

from grpokit.generation import (
    TransformersGenerator,
    cut_after_eos,
    decode_completions,
    encode_prompts,
    is_truncated,
    left_truncate,
    pad,
)

PAD, EOS, USER, ASSISTANT = 0, 1, 5, 6


def test_left_truncate_keeps_the_end():
    assert left_truncate([1, 2, 3, 4, 5], 3) == [3, 4, 5]
    assert left_truncate([1, 2], 3) == [1, 2]
    assert left_truncate([1, 2, 3], None) == [1, 2, 3]


def test_cut_after_the_first_eos():
    assert cut_after_eos([9, 8, EOS, PAD, PAD], [EOS]) == [9, 8, EOS]
    assert cut_after_eos([9, EOS, 8, EOS], [EOS]) == [9, EOS]  # everything after the first EOS goes
    assert cut_after_eos([9, 7, 8, EOS], [EOS, 7]) == [9, 7]  # any declared EOS id ends the completion
    assert cut_after_eos([9, 8, 7], [EOS]) == [9, 8, 7]  # no EOS: the whole (truncated) completion


def test_is_truncated():
    assert not is_truncated([9, EOS], [EOS], PAD)
    assert is_truncated([9, 8], [EOS], PAD)  # stopped by the length limit
    assert not is_truncated([9, PAD], [EOS], PAD)  # TRL counts a final pad as an ending
    assert is_truncated([], [EOS], PAD)


def test_pad_left_and_right_with_multiple():
    assert pad([[1, 2], [3]], value=0, side="left").tolist() == [[1, 2], [0, 3]]
    assert pad([[1, 2], [3]], value=0, side="right").tolist() == [[1, 2], [3, 0]]
    assert pad([[1, 2], [3]], value=9, side="right", multiple_of=4).tolist() == [[1, 2, 9, 9], [3, 9, 9, 9]]
    assert pad([[], [3]], value=0, side="left").tolist() == [[0], [3]]


def test_encode_text_prompts_left_truncated(tiny_tokenizer):
    ids = encode_prompts(tiny_tokenizer, ["hello", "hi"], max_prompt_length=3)
    assert [tiny_tokenizer.decode(row) for row in ids] == ["llo", "hi"]


def test_encode_conversational_prompts_left_truncated(tiny_tokenizer):
    prompt = [{"role": "user", "content": "hi"}]
    (full,) = encode_prompts(tiny_tokenizer, [prompt])
    i = tiny_tokenizer.convert_tokens_to_ids("i")
    h = tiny_tokenizer.convert_tokens_to_ids("h")
    assert full == [USER, h, i, EOS, ASSISTANT]  # <|user|>hi<eos><|assistant|>
    assert encode_prompts(tiny_tokenizer, [prompt], max_prompt_length=3) == [[i, EOS, ASSISTANT]]


def test_decode_completions(tiny_tokenizer):
    ids = [tiny_tokenizer.convert_tokens_to_ids(list("ok")) + [EOS]]
    assert decode_completions(tiny_tokenizer, ids, conversational=False) == ["ok"]
    assert decode_completions(tiny_tokenizer, ids, conversational=True) == [[{"role": "assistant", "content": "ok"}]]


class ScriptedModel(torch.nn.Module):
    """Stands in for a causal LM: `generate` appends a fixed completion block and records its inputs."""

    def __init__(self, completions):
        super().__init__()
        self.completions = torch.tensor(completions)
        self.seen = {}
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    @property
    def device(self):
        return self.anchor.device

    def generate(self, input_ids, attention_mask, generation_config):
        self.seen = {"input_ids": input_ids, "attention_mask": attention_mask, "config": generation_config}
        return torch.cat([input_ids, self.completions], dim=1)


def test_generator_left_pads_prompts_and_cuts_completions():
    model = ScriptedModel([[9, EOS, PAD, PAD], [8, 8, 8, 8], [7, 7, EOS, PAD]])
    generator = TransformersGenerator(model, generation_config="cfg", pad_token_id=PAD, eos_token_ids=[EOS])
    completions = generator.generate([[20, 21, 22], [23], [24, 25]]).completion_ids
    assert completions == [[9, EOS], [8, 8, 8, 8], [7, 7, EOS]]
    assert model.seen["input_ids"].tolist() == [[20, 21, 22], [PAD, PAD, 23], [PAD, 24, 25]]
    assert model.seen["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert model.seen["config"] == "cfg"


def test_generator_pads_prompts_to_a_multiple():
    model = ScriptedModel([[EOS], [EOS]])
    generator = TransformersGenerator(
        model, generation_config=None, pad_token_id=PAD, eos_token_ids=[EOS], pad_to_multiple_of=4
    )
    assert generator.generate([[20, 21, 22, 23, 24], [25]]).completion_ids == [[EOS], [EOS]]
    assert model.seen["input_ids"].shape == (2, 8)


def test_generator_with_the_tiny_model(tiny_model, tiny_tokenizer):
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=6, do_sample=True, pad_token_id=PAD, eos_token_id=[EOS], temperature=1.0, top_k=0
    )
    generator = TransformersGenerator(tiny_model, config, pad_token_id=PAD, eos_token_ids=[EOS])
    torch.manual_seed(0)
    completions = generator.generate([[20, 21], [22], [23, 24, 25]] * 4).completion_ids
    assert len(completions) == 12
    for ids in completions:
        assert 1 <= len(ids) <= 6
        assert EOS not in ids[:-1]  # nothing after an EOS survives
        assert ids[-1] == EOS or len(ids) == 6


@pytest.mark.parametrize("prompts", [["ab"], [[{"role": "user", "content": "ab"}]]])
def test_encode_without_limit_keeps_everything(tiny_tokenizer, prompts):
    (ids,) = encode_prompts(tiny_tokenizer, prompts, max_prompt_length=None)
    assert len(ids) == (2 if isinstance(prompts[0], str) else 5)


def test_chat_template_kwargs_reach_the_template(tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!{% endif %}"
    prompt = [{"role": "user", "content": "hi"}]
    (plain,) = encode_prompts(tokenizer, [prompt])
    (loud,) = encode_prompts(tokenizer, [prompt], chat_template_kwargs={"shout": True})
    assert tokenizer.decode(plain) == "hi" and tokenizer.decode(loud) == "hi!"
