"""The shared-prefix decoding loop against plain `generate`: the same tokens under greedy decoding (every generation
setting still applied), sampling from the right distribution, finished rows leaving the batch, and plain `generate`
for what the loop does not do."""

import pytest
import torch
from transformers import GenerationConfig

import grpokit.generation.decoding as decoding
from grpokit.generation import TransformersGenerator

PAD, EOS = 0, 1
# Three prompts of different lengths (left-padded), repeated as GRPO groups, not all of the same size.
PROMPTS = [[20, 21, 22]] * 3 + [[23]] * 3 + [[24, 25]] * 2


@pytest.fixture
def lively_model(tiny_model):
    """The tiny model with large random weights: its greedy completions vary (at the usual init they repeat one
    token). Completions of the three prompts, greedy, 8 tokens: [62 12 28 71 56 94 12 65], [56 56 39 64 86 17 84 18],
    [98 40 25 98 90 25 11 78]."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in tiny_model.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.5)
    return tiny_model


def config(**overrides):
    values = dict(max_new_tokens=8, do_sample=False, pad_token_id=PAD, eos_token_id=[EOS], disable_compile=True)
    return GenerationConfig(**{**values, **overrides})


def generate(model, generation_config, *, share_prefix, prompts=PROMPTS, eos=(EOS,)):
    generator = TransformersGenerator(
        model, generation_config, pad_token_id=PAD, eos_token_ids=list(eos), share_prefix=share_prefix
    )
    return generator.generate([list(p) for p in prompts]).completion_ids


def eos_ids_ending_groups_early(model):
    """EOS ids that end the greedy completions of the first two groups at different steps (2 and 5 tokens)."""
    completions = generate(model, config(), share_prefix=False)
    eos = [completions[0][1], completions[3][4]]
    assert eos == [12, 86]
    return eos


def test_greedy_tokens_equal_plain_generate(lively_model):
    eos = eos_ids_ending_groups_early(lively_model)
    plain = generate(lively_model, config(eos_token_id=eos), share_prefix=False, eos=eos)
    shared = generate(lively_model, config(eos_token_id=eos), share_prefix=True, eos=eos)
    assert shared == plain
    assert sorted({len(c) for c in plain}) == [2, 5, 8]  # groups end at different steps


def test_each_prompt_is_prefilled_once_and_finished_rows_leave_the_batch(lively_model):
    eos = eos_ids_ending_groups_early(lively_model)
    rows = []
    hook = lively_model.register_forward_pre_hook(
        lambda m, args, kwargs: rows.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    generate(lively_model, config(eos_token_id=eos), share_prefix=True, eos=eos)
    hook.remove()
    assert rows[0] == (3, 3)  # the prefill: one row per distinct prompt
    assert [shape[0] for shape in rows[1:]] == [8] + [5] * 3 + [2] * 3  # tokens 2-8: rows leave as they end


@pytest.mark.parametrize(
    "setting",
    [
        {"repetition_penalty": 1.5},
        {"no_repeat_ngram_size": 2},
        {"min_new_tokens": 6},
        {"min_length": 7},  # prompts are 3 long, padded: at least 4 new tokens
        {"do_sample": True, "top_k": 1},  # sampling through the logits processors, here down to one token
        {"suppress_tokens": [30, 31, 32]},
    ],
)
def test_generation_settings_are_honoured(lively_model, setting):
    eos = eos_ids_ending_groups_early(lively_model)
    plain = generate(lively_model, config(eos_token_id=eos, **setting), share_prefix=False, eos=eos)
    shared = generate(lively_model, config(eos_token_id=eos, **setting), share_prefix=True, eos=eos)
    assert shared == plain


@pytest.mark.parametrize("length", [4, 5, 6, 9])
def test_minimum_length_in_place_as_transformers_does_it(length):
    from transformers.generation.logits_process import (
        MinLengthLogitsProcessor,
        MinNewTokensLengthLogitsProcessor,
        TemperatureLogitsWarper,
    )

    torch.manual_seed(length)
    input_ids, scores = torch.randint(0, 10, (3, length)), torch.randn(3, 10)
    eos = [2, 7, 12]  # 12 is past the vocabulary: never masked
    for processor, shorter_than in (
        (MinLengthLogitsProcessor(min_length=6, eos_token_id=eos), 6),  # masked at lengths 4 and 5
        (MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=2, min_new_tokens=3, eos_token_id=eos), 5),  # at 4
    ):
        expected = processor(input_ids, scores)
        got = decoding._in_place(processor)(input_ids, scores.clone())
        assert torch.equal(got, expected)
        masked = torch.isinf(got).nonzero()[:, 1].unique().tolist()
        assert masked == ([2, 7] if length < shorter_than else [])
    other = TemperatureLogitsWarper(0.5)
    assert decoding._in_place(other) is other


def test_sampling_is_reproducible_and_ends_at_eos(lively_model):
    sampled = []
    for _ in range(2):
        torch.manual_seed(3)
        sampled.append(generate(lively_model, config(do_sample=True, temperature=1.5), share_prefix=True))
    assert sampled[0] == sampled[1]
    for ids in sampled[0]:
        assert 1 <= len(ids) <= 8 and EOS not in ids[:-1]


def test_sample_draws_from_the_softmax():
    # p = [0.1, 0.2, 0.7, 0] (the last entry masked, as top-k/top-p leave it): frequencies over 40,000 draws.
    scores = torch.tensor([0.1, 0.2, 0.7, 0.0]).log().expand(40_000, 4)
    torch.manual_seed(0)
    counts = torch.bincount(decoding.sample(scores), minlength=4).float() / 40_000
    assert counts[3] == 0
    assert torch.allclose(counts[:3], torch.tensor([0.1, 0.2, 0.7]), atol=0.01)


@pytest.mark.parametrize("setting", [{"num_beams": 2}, {"cache_implementation": "static"}])
def test_plain_generate_for_what_the_loop_does_not_do(lively_model, monkeypatch, setting):
    refused = []
    original = decoding._check_supported

    def check(generation_config, kw):
        try:
            original(generation_config, kw)
        except decoding.Unsupported:
            refused.append(True)
            raise

    monkeypatch.setattr(decoding, "_check_supported", check)
    assert generate(lively_model, config(**setting), share_prefix=True) == generate(
        lively_model, config(**setting), share_prefix=False
    )
    assert refused == [True]


def test_lora_model(lively_model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(lively_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert generate(model, config(), share_prefix=True) == generate(model, config(), share_prefix=False)


@pytest.mark.parametrize("transposed", [True, False])
@pytest.mark.parametrize("rows", [3, decoding.FEW_ROWS + 1])
def test_few_rows_linear_equals_linear(monkeypatch, transposed, rows):
    layer = torch.nn.Linear(16, 24)
    x = torch.randn(rows, 1, 16)
    monkeypatch.setitem(decoding._TRANSPOSED_IS_FASTER, (rows, 16, 24, torch.float32), transposed)
    with torch.no_grad(), decoding.small_batch_linears(torch.nn.Sequential(layer)):
        out = layer(x)
    assert "forward" not in layer.__dict__  # restored
    assert out.shape == (rows, 1, 24) and out.is_contiguous()
    assert torch.allclose(out, torch.nn.functional.linear(x, layer.weight, layer.bias), atol=1e-6)
