"""The column decode step against the model's own forward pass: the same next-token logits step after step (Qwen2 and
Llama, grouped-query attention, biases, left padding, prompts kept once per group or per row), the same greedy tokens
through `generate`, and the model's own forward for what the step does not follow."""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import grpokit.fastpath.column_step as column
import grpokit.generation.decoding as decoding
from grpokit.fastpath.kv_cache import (
    BufferedLayer,
    GroupedLayer,
    buffered_cache,
    cache_kwarg,
    grouped_cache,
    ungrouped,
)
from grpokit.generation import TransformersGenerator
from grpokit.tiny import build_model

PAD, EOS = 0, 1


def lively(model, seed=0):
    """Large random weights, so that logits differ clearly between positions and tokens."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.3)
    return model.eval()


def llama_with_biases():
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,  # no grouped-query attention (the Qwen2 model has it)
        attention_bias=True,
        mlp_bias=True,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def cache_arg(model, cache):
    return {cache_kwarg(model.forward): cache}


def model_step(model, tokens, positions, mask, cache):
    """The model's own next-token logits `(n, V)` for one new token per row, appending to `cache`."""
    return model(
        input_ids=tokens[:, None],
        attention_mask=mask,
        position_ids=positions[:, None],
        **cache_arg(model, cache),
        use_cache=True,
    ).logits[:, -1]


def prefill(model, ids, mask):
    cache = DynamicCache(config=model.config)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **cache_arg(model, cache))
    return cache, positions[:, -1]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("grouped", [False, True])
def test_logits_equal_the_models_step_after_step(tiny_tokenizer, arch, grouped):
    model = lively(build_model(tiny_tokenizer) if arch == "qwen2" else llama_with_biases())
    vocab = model.config.vocab_size
    torch.manual_seed(1)
    prompts = torch.randint(2, vocab, (2, 9))
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[1, :4] = 0  # the second prompt is left-padded
    cache, last = prefill(model, prompts, prompt_mask)
    rows = torch.tensor([0, 0, 0, 1, 1, 1])  # two groups of three
    ours = grouped_cache(cache, 3, capacity=20) if grouped else buffered_cache(cache, rows, capacity=20)
    assert isinstance(ours.layers[0], GroupedLayer if grouped else BufferedLayer)
    theirs = buffered_cache(cache, rows, capacity=20)
    step = column.ColumnStep(model)
    mask, positions = prompt_mask[rows], last[rows]
    tokens = torch.randint(2, vocab, (6,))
    with torch.no_grad():
        for _ in range(4):
            mask, positions = torch.nn.functional.pad(mask, (0, 1), value=1), positions + 1
            got = step(tokens, positions, mask, ours)
            expected = model_step(model, tokens, positions, mask, theirs)
            assert got.shape == expected.shape == (6, vocab)
            assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
            assert expected.std() > 1  # logits that tell tokens apart
            tokens = expected.argmax(-1)
    assert ours.layers[0].get_seq_length() == theirs.layers[0].get_seq_length() == 13


def test_ungrouped_cache_holds_each_rows_prompt_and_tokens(tiny_tokenizer):
    model = lively(build_model(tiny_tokenizer))
    prompts = torch.randint(2, 50, (2, 5))
    cache, _ = prefill(model, prompts, torch.ones_like(prompts))
    grouped = grouped_cache(cache, 2, capacity=9)
    new = torch.randn(4, 2, 1, 8)  # (rows, kv heads, 1 position, head dim)
    grouped.layers[0].update(new, -new)
    rows = ungrouped(grouped)
    keys, values = rows.layers[0].keys, rows.layers[0].values
    assert keys.shape == (4, 2, 6, 8)
    assert torch.equal(keys[:, :, :5], cache.layers[0].keys[[0, 0, 1, 1]])
    assert torch.equal(keys[:, :, 5:], new) and torch.equal(values[:, :, 5:], -new)
    rows.batch_select_indices(torch.tensor([3, 0]))  # per-row buffers can now lose rows
    assert torch.equal(rows.layers[0].keys[:, :, :5], cache.layers[0].keys[[1, 0]])
    assert rows.layers[0].key_buffer.size(2) == 9  # the room to grow is kept


def generate(model, prompts, eos, *, share_prefix):
    config = model.generation_config
    config.update(max_new_tokens=6, do_sample=False, pad_token_id=PAD, eos_token_id=eos)
    generator = TransformersGenerator(model, config, pad_token_id=PAD, eos_token_ids=eos, share_prefix=share_prefix)
    return generator.generate([list(p) for p in prompts]).completion_ids


def test_greedy_generation_with_grouped_prompts_equals_plain_generate(tiny_tokenizer, monkeypatch):
    """Prompts long enough to be kept once per group; rows that end early make the cache per-row mid-generation."""
    model = lively(build_model(tiny_tokenizer))
    torch.manual_seed(2)
    long_prompt = torch.randint(2, 90, (column.GROUPED_PROMPT_MIN + 6,)).tolist()
    prompts = [long_prompt] * 4 + [long_prompt[:-3]] * 4  # left-padded second group
    plain = generate(model, prompts, [EOS], share_prefix=False)
    eos = [plain[0][2]]  # ends the first group's rows after three tokens
    assert eos[0] not in plain[4][:3]
    caches = []
    original = column.ColumnStep.cache
    monkeypatch.setattr(column.ColumnStep, "cache", lambda *a, **k: caches.append(original(*a, **k)) or caches[-1])
    expected = generate(model, prompts, eos, share_prefix=False)
    got = generate(model, prompts, eos, share_prefix=True)
    assert got == expected
    assert {len(c) for c in expected} == {3, 6}  # the first group ends early, the second runs to the limit
    assert len(caches) == 1 and isinstance(caches[0].layers[0], GroupedLayer)


def test_the_models_own_forward_for_what_the_step_does_not_follow(tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    from grpokit.tiny import build_reward_model

    model = build_model(tiny_tokenizer)
    assert column.unsupported_reason(model) is None
    assert isinstance(decoding.decode_step(model), decoding._ColumnDecodeStep)
    assert "architecture" in column.unsupported_reason(build_reward_model(tiny_tokenizer))
    hook = model.model.layers[0].register_forward_hook(lambda *args: None)
    assert "hook" in column.unsupported_reason(model)
    hook.remove()
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    assert "nn.Linear" in column.unsupported_reason(lora.get_base_model())
    assert isinstance(decoding.decode_step(lora), decoding._ModelDecodeStep)


def test_the_step_under_activation_checkpointing(tiny_tokenizer):
    """Activation checkpointing hooks the embedding (`enable_input_require_grads`): the step still follows the model,
    whose generation runs without gradients; any other hook there still sends the model to its own forward."""
    model = build_model(tiny_tokenizer)
    model.enable_input_require_grads()  # what `gradient_checkpointing_enable` and PEFT with it add
    assert column.unsupported_reason(model) is None
    assert isinstance(decoding.decode_step(model), decoding._ColumnDecodeStep)
    hook = model.model.embed_tokens.register_forward_hook(lambda *args: None)
    assert "hook or patched forward on Embedding" in column.unsupported_reason(model)
    hook.remove()


def test_under_bf16_autocast_the_step_reads_bf16_weights_and_follows_the_wrapped_forward(
    tiny_tokenizer, monkeypatch, bf16_accelerator
):
    """accelerate's mixed-precision wrapper on the model: refused outside autocast (the step would run in float32),
    taken inside it on a CPU with bf16 units, with every weight cast once when the step is built; logits as the
    wrapped forward's (bf16). On a CPU without bf16 units the wrapped forward runs, as before."""
    import grpokit.fastpath.cpu as cpu

    model = bf16_accelerator.prepare_model(lively(build_model(tiny_tokenizer)))
    assert "patched forward" in column.unsupported_reason(model)
    torch.manual_seed(3)
    prompts = torch.randint(2, model.config.vocab_size, (2, 9))
    mask = torch.ones_like(prompts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        monkeypatch.setattr(cpu, "has_bf16_units", lambda: False)
        assert "patched forward" in column.unsupported_reason(model)
        monkeypatch.setattr(cpu, "has_bf16_units", lambda: True)
        assert column.unsupported_reason(model) is None
        cache, last = prefill(model, prompts, mask)
        step = column.ColumnStep(model)
        assert step.layers[0].qkv_weight.dtype == step.lm_head.weight.dtype == torch.bfloat16
        assert model.lm_head.weight.dtype == torch.float32  # the model's own weights stay as they are
        rows = torch.tensor([0, 0, 1, 1])
        ours, theirs = buffered_cache(cache, rows, capacity=12), buffered_cache(cache, rows, capacity=12)
        mask, positions = torch.nn.functional.pad(mask[rows], (0, 1), value=1), last[rows] + 1
        tokens = torch.randint(2, model.config.vocab_size, (4,))
        with torch.no_grad():
            got = step(tokens, positions, mask, ours).float()
            expected = model_step(model, tokens, positions, mask, theirs)
    # bf16 products: both round to 8 bits of mantissa, in slightly different places
    assert torch.allclose(got, expected, atol=0.1 * expected.abs().max().item())
    assert not torch.allclose(got, expected, atol=1e-6)  # computed in bf16 indeed, not float32
