"""transformers' continuous batching as a generation backend (`use_transformers_continuous_batching`): the same
completions as grpokit's transformers backend, the same EOS and length contract, and the settings it refuses.

The tiny tokenizer is character level: id 1 is <eos>. The tiny model's weights are scaled by 4 so that greedy decoding
gives varied tokens (the random-init model repeats one token) and one prompt ends at once with EOS.
"""

import contextlib
import logging

import pytest
import torch

from grpokit import GRPOConfig
from grpokit.config.rules import ConfigError
from grpokit.generation import TransformersGenerator, build_generator, is_truncated
from grpokit.generation.base import GenerationError
from grpokit.generation.continuous import ContinuousBatchingGenerator, _group_size

EOS = 1
TEXTS = ["hello", "hi there", "abc", "the quick brown fox"]


@pytest.fixture(scope="module")
def sharp_model():
    from grpokit.tiny import build_model, build_tokenizer

    model = build_model(build_tokenizer(), seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4)
    return model


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    return [tiny_tokenizer(t)["input_ids"] for t in TEXTS]


def _build(tokenizer, model, eos_token_ids=(EOS,), vision_model=False, **fields):
    args = GRPOConfig("unused", report_to="none", **{"max_completion_length": 8, **fields})
    return build_generator(
        args,
        policy=lambda: contextlib.nullcontext(model),
        model_path=None,
        dtype=torch.float32,
        tokenizer=tokenizer,
        eos_token_ids=list(eos_token_ids),
        vision_model=vision_model,
    )


GREEDY = {"generation_kwargs": {"do_sample": False}}


def test_the_factory_builds_it(tiny_tokenizer, sharp_model):
    generator = _build(tiny_tokenizer, sharp_model, use_transformers_continuous_batching=True)
    assert isinstance(generator, ContinuousBatchingGenerator)
    assert isinstance(_build(tiny_tokenizer, sharp_model), TransformersGenerator)


def test_greedy_completions_equal_grpokits_transformers_backend(tiny_tokenizer, sharp_model, prompts):
    # Prompts of different lengths (the transformers backend left-pads them), each repeated twice like a GRPO group.
    rows = [p for p in prompts for _ in range(2)]
    reference = _build(tiny_tokenizer, sharp_model, **GREEDY).generate(rows)
    continuous = _build(tiny_tokenizer, sharp_model, use_transformers_continuous_batching=True, **GREEDY)
    out = continuous.generate(rows)
    assert out.completion_ids == reference.completion_ids
    assert out.logprobs is None  # not asked for (return_logprobs)
    # The contract, by hand: the last prompt ends at once with <eos>; the others run to max_completion_length.
    assert [len(ids) for ids in out.completion_ids] == [8, 8, 8, 8, 8, 8, 1, 1]
    assert out.completion_ids[6] == [EOS]
    assert len({tuple(ids) for ids in out.completion_ids[:6]}) == 3  # three different completions


def test_eos_stops_a_completion_and_lengths_follow(tiny_tokenizer, sharp_model, prompts):
    # Greedy "hi there" gives 8 tokens; declaring its 3rd token an EOS must end it there, EOS included.
    (full,) = _build(tiny_tokenizer, sharp_model, **GREEDY).generate([prompts[1]]).completion_ids
    eos = full[2]
    assert eos not in full[:2]
    generator = _build(
        tiny_tokenizer, sharp_model, eos_token_ids=(EOS, eos), use_transformers_continuous_batching=True, **GREEDY
    )
    out = generator.generate([prompts[1], prompts[3]])
    assert out.completion_ids == [full[:3], [EOS]]
    assert [is_truncated(ids, [EOS, eos], 0) for ids in out.completion_ids] == [False, False]


def test_max_length_is_respected_when_sampling(tiny_tokenizer, sharp_model, prompts):
    generator = _build(
        tiny_tokenizer,
        sharp_model,
        eos_token_ids=(),  # nothing ends a completion early: every one has exactly max_completion_length tokens
        use_transformers_continuous_batching=True,
        transformers_continuous_batching_config={"return_logprobs": True},
    )
    rows = [p for p in prompts[:2] for _ in range(4)]  # two groups of 4: sent as 2 prompts, 4 sequences each
    out = generator.generate(rows)
    assert [len(ids) for ids in out.completion_ids] == [8] * 8
    assert [len(lp) for lp in out.logprobs] == [8] * 8
    assert all(lp <= 0.0 for row in out.logprobs for lp in row)
    # Each group's completions are sampled on their own (first tokens included), not copies of one.
    assert len({tuple(ids) for ids in out.completion_ids[:4]}) == 4


def test_sampling_logprobs_are_those_of_the_sampling_distribution(tiny_tokenizer, sharp_model, prompts):
    generator = _build(
        tiny_tokenizer,
        sharp_model,
        eos_token_ids=(),
        use_transformers_continuous_batching=True,
        transformers_continuous_batching_config={"return_logprobs": True},
        max_completion_length=1,
        temperature=0.5,
    )
    out = generator.generate([prompts[0]])
    with torch.no_grad():
        logits = sharp_model(torch.tensor([prompts[0]])).logits[0, -1]
    expected = torch.log_softmax(logits / 0.5, dim=-1)[out.completion_ids[0][0]].item()
    assert out.logprobs[0][0] == pytest.approx(expected, abs=1e-4)


def test_the_model_keeps_its_training_mode(tiny_tokenizer, sharp_model, prompts):
    generator = _build(tiny_tokenizer, sharp_model, use_transformers_continuous_batching=True, **GREEDY)
    sharp_model.train()
    generator.generate(prompts[:1])
    assert sharp_model.training  # generate_batch switches it to eval mode
    sharp_model.eval()
    generator.generate(prompts[:1])
    assert not sharp_model.training


def test_groups_are_found():
    assert _group_size([[1], [1], [2], [2]]) == 2
    assert _group_size([[1], [1], [1], [1], [2], [2]]) == 2  # two groups of the same prompt in a row
    assert _group_size([[1], [2], [2]]) == 1
    assert _group_size([[1]] * 3) == 3


def test_refusals_in_one_line(tmp_path):
    def problems(**fields):
        with pytest.raises(ConfigError) as error:
            GRPOConfig(str(tmp_path), report_to="none", use_transformers_continuous_batching=True, **fields)
        return str(error.value).splitlines()

    assert problems(repetition_penalty=1.1) == [
        "repetition_penalty=1.1: transformers' continuous batching drops the repetition penalty (its processor needs "
        "each row's history); set it to 1.0, or turn use_transformers_continuous_batching off"
    ]
    assert problems(cache_implementation="static") == [
        "cache_implementation='static': has no effect with use_transformers_continuous_batching (it pages its own KV "
        "cache); leave it unset"
    ]
    (line,) = problems(generation_kwargs={"min_new_tokens": 4, "top_k": 3, "no_repeat_ngram_size": 2})
    assert line.startswith(
        "generation_kwargs={'min_new_tokens': 4, 'top_k': 3, 'no_repeat_ngram_size': 2}: transformers' continuous "
        "batching does not apply min_new_tokens, no_repeat_ngram_size (it honours "
    )
    (line,) = problems(generation_kwargs={"repetition_penalty": 1.2})
    assert line.startswith("repetition_penalty=1.2: ")
    # Accepted: what it honours, and the repetition penalty left at 1.
    GRPOConfig(
        str(tmp_path),
        report_to="none",
        use_transformers_continuous_batching=True,
        generation_kwargs={"top_k": 3, "min_p": 0.1, "do_sample": False, "repetition_penalty": 1.0},
    )


def test_vllm_with_it_is_refused(tmp_path, tiny_tokenizer, sharp_model):
    from grpokit.config.rules import continuous_batching_problems

    args = GRPOConfig(str(tmp_path), report_to="none", use_transformers_continuous_batching=True)
    assert [p.line() for p in continuous_batching_problems({**vars(args), "use_vllm": True})] == [
        "use_transformers_continuous_batching=True: use_transformers_continuous_batching and use_vllm are two "
        "generation backends; keep one"
    ]
    args.use_vllm = True  # set afterwards: GRPOConfig refuses use_vllm where vLLM is not installed
    with pytest.raises(ValueError, match="^use_transformers_continuous_batching and use_vllm are two generation"):
        build_generator(
            args,
            policy=contextlib.nullcontext,
            model_path=None,
            dtype=torch.float32,
            tokenizer=tiny_tokenizer,
            eos_token_ids=[EOS],
        )


def test_a_vision_language_model_is_refused(tiny_tokenizer, sharp_model):
    with pytest.raises(
        ValueError, match="^use_transformers_continuous_batching does not take a vision-language model"
    ):
        _build(tiny_tokenizer, sharp_model, vision_model=True, use_transformers_continuous_batching=True)


def test_an_unknown_setting_is_refused(tiny_tokenizer, sharp_model):
    with pytest.raises(ValueError) as error:
        _build(
            tiny_tokenizer,
            sharp_model,
            use_transformers_continuous_batching=True,
            transformers_continuous_batching_config={"page_size": 16, "pagesize": 16},
        )
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        "transformers_continuous_batching_config: 'pagesize' is not a setting of transformers' "
        "ContinuousBatchingConfig (known: "
    )


def test_the_settings_reach_transformers(tiny_tokenizer, sharp_model, prompts):
    generator = _build(
        tiny_tokenizer,
        sharp_model,
        use_transformers_continuous_batching=True,
        transformers_continuous_batching_config={"page_size": 16, "max_batch_tokens": 64},
    )
    config = generator._cb_config([prompts[0]], copies=2)
    assert (config.page_size, config.max_batch_tokens) == (16, 64)
    # The cache holds the round: 2 rows of 5 prompt + 8 new tokens in pages of 16, one spare page each.
    assert config.num_blocks == 2 * (1 + 1)
    generator = _build(tiny_tokenizer, sharp_model, use_transformers_continuous_batching=True)
    # A batch holds the round's prompts: 40 prompts of 5 tokens (transformers' default is 8192 tokens).
    assert generator._cb_config([prompts[0]] * 40, copies=2).max_batch_tokens == 200
    assert generator._cb_config([prompts[0]], copies=2).max_batch_tokens == 64  # at least 64
    sized = _build(
        tiny_tokenizer,
        sharp_model,
        use_transformers_continuous_batching=True,
        transformers_continuous_batching_config={"max_memory_percent": 0.3},
    )._cb_config([prompts[0]], copies=2)
    assert (sized.num_blocks, sized.max_memory_percent) == (None, 0.3)  # the user's sizing is kept


def test_a_missing_continuous_batching_is_named_with_the_version(tiny_tokenizer, sharp_model, monkeypatch):
    import sys

    import transformers

    monkeypatch.setitem(sys.modules, "transformers.generation.continuous_batching", None)  # as if absent
    monkeypatch.setattr(transformers, "__version__", "5.7.0")
    with pytest.raises(
        ValueError,
        match=r"needs transformers' continuous batching \(transformers >= 5\.8\); "
        r"transformers 5\.7\.0 is installed$",
    ):
        _build(tiny_tokenizer, sharp_model, use_transformers_continuous_batching=True)


def test_a_model_without_generate_batch_is_named(tiny_tokenizer):
    class Plain(torch.nn.Module):
        training = True

    from transformers import GenerationConfig

    generator = ContinuousBatchingGenerator(Plain(), GenerationConfig(), eos_token_ids=[EOS])
    with pytest.raises(GenerationError, match="needs a transformers model with `generate_batch`; Plain has none"):
        generator.generate([[5, 6]])


def test_the_settings_without_it_are_named_in_a_warning(tiny_tokenizer, sharp_model, caplog):
    with caplog.at_level(logging.WARNING, logger="grpokit.generation.factory"):
        _build(tiny_tokenizer, sharp_model, transformers_continuous_batching_config={"page_size": 16})
    assert (
        "transformers_continuous_batching_config has no effect without use_transformers_continuous_batching: true"
        in caplog.text
    )
