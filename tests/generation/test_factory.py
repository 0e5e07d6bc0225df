"""`build_generator`: the one place a backend is chosen from a `GRPOConfig`."""

import contextlib

import pytest
import torch

from grpokit import GRPOConfig
from grpokit.generation import TransformersGenerator, build_generator


def _build(args, tiny_tokenizer, model_path=None):
    return build_generator(
        args,
        policy=contextlib.nullcontext,
        model_path=model_path,
        dtype=torch.float32,
        tokenizer=tiny_tokenizer,
        eos_token_ids=[tiny_tokenizer.eos_token_id],
    )


def test_transformers_backend_without_use_vllm(tiny_tokenizer, tmp_path):
    args = GRPOConfig(str(tmp_path), temperature=0.7, max_completion_length=5, generation_kwargs={"top_k": 3})
    generator = _build(args, tiny_tokenizer)
    assert isinstance(generator, TransformersGenerator)
    config = generator.generation_config
    assert (config.temperature, config.max_new_tokens, config.do_sample) == (0.7, 5, True)
    assert config.top_k == 3  # generation_kwargs win over the fields, as in TRL
    assert generator.pad_token_id == tiny_tokenizer.pad_token_id


def test_colocated_vllm_needs_the_policy_path(tiny_tokenizer, tmp_path):
    args = GRPOConfig(str(tmp_path), report_to="none")
    args.use_vllm = True  # set afterwards: GRPOConfig refuses use_vllm where vLLM is not installed
    with pytest.raises(ValueError, match="needs the policy's checkpoint path"):
        _build(args, tiny_tokenizer)
