"""Shared-prefix scoring against the plain forward pass: same log-probabilities, entropies and gradients (float32),
and the plain pass wherever the shared one would not be right."""

import pytest
import torch

from grpokit.scoring import score_tokens
from grpokit.scoring.prefix import prompt_groups, shared_prefix_model

PAD = 0


def test_prompt_groups_by_hand():
    ids = torch.tensor([[5, 6], [7, 8], [5, 6], [9, 9], [7, 8]])
    unique_index, inverse = prompt_groups(ids, None)
    assert unique_index.tolist() == [0, 1, 3]  # first row of each prompt, in row order
    assert inverse.tolist() == [0, 1, 0, 2, 1]
    # The same ids with different padding are different prompts.
    mask = torch.tensor([[1, 1], [1, 1], [0, 1], [1, 1], [1, 1]])
    unique_index, inverse = prompt_groups(ids, mask)
    assert unique_index.tolist() == [0, 1, 2, 3] and inverse.tolist() == [0, 1, 2, 3, 1]


def grpo_batch(prompt_len=7, completion_len=5, groups=3, group_size=4, seed=0, shuffle=True, pad=True):
    """Groups of completions of left-padded prompts, rows shuffled (as in a micro-batch) unless `shuffle` is False,
    completions right-padded."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(7, 90, (groups, prompt_len), generator=generator)
    prompt_mask = torch.ones(groups, prompt_len, dtype=torch.long)
    if pad:
        prompt_mask[1, :3] = 0
        prompt_mask[2, :1] = 0
    rows = torch.randperm(groups * group_size, generator=generator)
    if not shuffle:
        rows = torch.arange(groups * group_size)
    prompt_ids = (prompts * prompt_mask).repeat_interleave(group_size, 0)[rows]
    prompt_mask = prompt_mask.repeat_interleave(group_size, 0)[rows]
    lengths = torch.randint(1, completion_len + 1, (groups * group_size,), generator=generator)
    completion_mask = (torch.arange(completion_len) < lengths[:, None]).long()
    completion_ids = torch.randint(7, 90, (groups * group_size, completion_len), generator=generator) * completion_mask
    return torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), completion_mask


def scores_and_grads(model, ids, mask, completion_mask, **kwargs):
    model.zero_grad()
    scores = score_tokens(model, ids, mask, completion_mask.size(1), temperature=0.8, compute_entropy=True, **kwargs)
    active = completion_mask.bool()
    loss = scores.logps[active].sum()
    if scores.entropies.requires_grad:
        loss = loss + 0.3 * scores.entropies[active].sum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return scores.logps[active].detach(), scores.entropies[active].detach(), grads


def assert_same(a, b):
    assert torch.allclose(a[0], b[0], atol=1e-5), (a[0] - b[0]).abs().max()
    assert torch.allclose(a[1], b[1], atol=1e-5), (a[1] - b[1]).abs().max()
    assert a[2].keys() == b[2].keys()
    for name in a[2]:
        assert torch.allclose(a[2][name], b[2][name], rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("chunk_size", [None, 5])  # 5 rows: micro-batches that split groups
@pytest.mark.parametrize("entropy_grad", [True, False])
@pytest.mark.parametrize("prompt_len", [7, 1])  # long prompts: shared; short ones: one fused pass over every row
def test_same_numbers_and_gradients_as_the_plain_pass(tiny_model, chunk_size, entropy_grad, prompt_len):
    ids, mask, completion_mask = grpo_batch(prompt_len=prompt_len)
    assert shared_prefix_model(tiny_model) is tiny_model
    plain = scores_and_grads(tiny_model, ids, mask, completion_mask, share_prefix=False, entropy_grad=entropy_grad)
    shared = scores_and_grads(tiny_model, ids, mask, completion_mask, chunk_size=chunk_size, entropy_grad=entropy_grad)
    assert_same(plain, shared)


@pytest.mark.parametrize(
    "batch, group_size", [("in order", 4), ("shuffled", 4), ("uneven", 1), ("one-token prompts", 4)]
)
def test_prompts_read_once_per_group_in_attention(tiny_model, monkeypatch, batch, group_size):
    """Llama-family models on CPU: the completion pass's own attention reads each prompt once per group when the
    rows hold whole groups (sorted into group order if shuffled), once per row when the groups are uneven (a
    micro-batch that splits them); the same numbers and gradients as the plain pass either way."""
    import grpokit.fastpath.prefix_attention as prefix_attention

    assert shared_prefix_model(tiny_model) is tiny_model  # its one-time check against the plain pass, done here
    group_sizes = []
    original = prefix_attention.grouped_attention
    monkeypatch.setattr(prefix_attention, "grouped_attention", lambda *a: group_sizes.append(a[-1]) or original(*a))
    ids, mask, completion_mask = grpo_batch(shuffle=batch == "shuffled")
    if batch == "one-token prompts":  # one pass even when prompts are too short for the model's own two passes
        ids, mask, completion_mask = grpo_batch(prompt_len=1, pad=False)
    if batch == "uneven":  # 4, 3 and 2 rows of the three groups
        rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 8, 9])
        ids, mask, completion_mask = ids[rows], mask[rows], completion_mask[rows]
    plain = scores_and_grads(tiny_model, ids, mask, completion_mask, share_prefix=False)
    assert group_sizes == []
    shared = scores_and_grads(tiny_model, ids, mask, completion_mask)
    assert group_sizes == [group_size] * tiny_model.config.num_hidden_layers
    assert_same(plain, shared)


def test_the_models_own_attention_past_the_scores_budget(tiny_model, monkeypatch):
    import grpokit.fastpath.prefix_attention as prefix_attention

    monkeypatch.setattr(prefix_attention, "SCORES_BUDGET", 10)
    monkeypatch.setattr(prefix_attention, "grouped_attention", None)  # would raise if called
    ids, mask, completion_mask = grpo_batch(shuffle=False)
    assert_same(
        scores_and_grads(tiny_model, ids, mask, completion_mask, share_prefix=False),
        scores_and_grads(tiny_model, ids, mask, completion_mask),
    )


def test_single_token_completions(tiny_model):
    ids, mask, completion_mask = grpo_batch(completion_len=1)
    assert_same(
        scores_and_grads(tiny_model, ids, mask, completion_mask, share_prefix=False),
        scores_and_grads(tiny_model, ids, mask, completion_mask),
    )


def test_lora_adapter_is_shared_too(tiny_model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert shared_prefix_model(model) is model.get_base_model()
    ids, mask, completion_mask = grpo_batch()
    assert_same(
        scores_and_grads(model, ids, mask, completion_mask, share_prefix=False),
        scores_and_grads(model, ids, mask, completion_mask),
    )
    with model.disable_adapter(), torch.no_grad():  # the reference policy of a PEFT run (no trainable weights)
        plain = score_tokens(model, ids, mask, 5, share_prefix=False).logps
        shared = score_tokens(model, ids, mask, 5).logps
    active = completion_mask.bool()
    assert torch.allclose(plain[active], shared[active], atol=1e-5)


def _scaled_logits_model(tiny_tokenizer):
    """A causal LM whose logits are not `lm_head(hidden state)` (like models with a logit scale or soft-capping)."""
    from transformers import Qwen2ForCausalLM

    from grpokit.tiny import build_model

    class Scaled(Qwen2ForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 2.0
            return out

    model = build_model(tiny_tokenizer)
    scaled = Scaled(model.config)
    scaled.load_state_dict(model.state_dict())
    return scaled


def test_plain_pass_when_the_logits_are_not_the_lm_head(tiny_tokenizer, caplog):
    model = _scaled_logits_model(tiny_tokenizer)
    assert shared_prefix_model(model) is None
    assert "disagrees" in caplog.text
    ids, mask, completion_mask = grpo_batch()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -6:-1]
        expected = torch.log_softmax(logits / 0.8, -1).gather(-1, ids[:, -5:, None])[..., 0]
    scores = score_tokens(model, ids, mask, 5, temperature=0.8)
    active = completion_mask.bool()
    assert torch.allclose(scores.logps[active], expected[active], atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, recomputed",
    [
        ({"gradient_checkpointing_kwargs": {"use_reentrant": False}}, [0, 1]),
        ({"gradient_checkpointing_kwargs": {"use_reentrant": True}}, [0, 1]),
        ({"every_n_layers": 2}, [0]),  # transformers checkpoints layers 0, 2, ...: the others run once
    ],
)
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")  # its new name: transformers 5.20+
def test_one_pass_under_activation_checkpointing(tiny_model, monkeypatch, kwargs, recomputed):
    """Under transformers' activation checkpointing the one-pass route still runs (the same scores and gradients as
    the plain pass without checkpointing), and each checkpointed layer runs again in backward through the layer's
    own checkpoint function (its kwargs, `every_n_layers`): two MLP calls for those layers, one for the others
    (counted as they start: the recomputation stops once it has what backward needs)."""
    import grpokit.fastpath.prefix_attention as prefix_attention

    assert tiny_model.config.num_hidden_layers == 2
    tiny_model.train()  # no dropout in the tiny model: training mode changes nothing else
    ids, mask, completion_mask = grpo_batch()
    plain = scores_and_grads(tiny_model, ids, mask, completion_mask, share_prefix=False)
    tiny_model.gradient_checkpointing_enable(**kwargs)
    assert shared_prefix_model(tiny_model) is tiny_model
    calls = [0, 0]
    for index, layer in enumerate(tiny_model.model.layers):
        layer.mlp.register_forward_pre_hook(lambda *args, index=index: calls.__setitem__(index, calls[index] + 1))
    group_sizes = []
    original = prefix_attention.grouped_attention
    monkeypatch.setattr(prefix_attention, "grouped_attention", lambda *a: group_sizes.append(a[-1]) or original(*a))
    checkpointed = scores_and_grads(tiny_model, ids, mask, completion_mask)
    assert group_sizes == [4] * (2 + len(recomputed))  # the one-pass attention, again for each recomputed layer
    assert calls == [2 if index in recomputed else 1 for index in range(2)]
    assert_same(plain, checkpointed)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
def test_plain_pass_under_activation_checkpointing_where_one_pass_cannot_run(tiny_model, monkeypatch):
    import grpokit.scoring.prefix as prefix

    monkeypatch.setattr(prefix, "grouped_attention_model", lambda lm: False)  # e.g. not a Llama-family model
    tiny_model.gradient_checkpointing_enable()
    tiny_model.train()
    assert shared_prefix_model(tiny_model) is None  # the model's own two passes need the KV cache checkpointing drops
    tiny_model.eval()
    assert shared_prefix_model(tiny_model) is tiny_model


def test_plain_pass_for_an_lm_head_with_its_own_forward(tiny_model):
    from grpokit.models import cast_lm_head_to_fp32

    cast_lm_head_to_fp32(tiny_model)
    assert shared_prefix_model(tiny_model) is None


def test_plain_pass_for_prompt_learning_and_wrapped_models(tiny_model):
    from peft import PromptTuningConfig, get_peft_model

    prompt_tuned = get_peft_model(tiny_model, PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    assert shared_prefix_model(prompt_tuned) is None
    assert shared_prefix_model(torch.nn.Sequential(tiny_model)) is None


def test_router_loss_uses_the_plain_pass(tiny_model, monkeypatch):
    import grpokit.scoring as scoring

    calls = []

    def plain(model, ids, mask, logits_to_keep, *args):
        calls.append(ids.size(0))
        return torch.zeros(ids.size(0), logits_to_keep), None, torch.tensor(0.5)

    monkeypatch.setattr(scoring, "_score_plain", plain)
    ids, mask, completion_mask = grpo_batch()
    scores = score_tokens(tiny_model, ids, mask, 5, compute_aux_loss=True, chunk_size=6)
    assert calls == [6, 6] and scores.aux_loss.item() == 0.5
    score_tokens(tiny_model, ids, mask, 5)
    assert calls == [6, 6]  # without the router loss: the shared-prefix pass


def test_shared_prefix_under_bf16_autocast(tiny_tokenizer, bf16_accelerator):
    """Mixed precision (accelerate's autocast wrapper, as `bf16=True` trains on CPU): the numerical check allows bf16
    rounding, so the shared-prefix pass still serves, and its log-probabilities follow the plain pass's."""
    from grpokit.scoring.prefix import _VERIFIED
    from grpokit.tiny import build_model

    model = bf16_accelerator.prepare_model(build_model(tiny_tokenizer))
    ids, mask, completion_mask = grpo_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert shared_prefix_model(model) is model and _VERIFIED[model]
        shared = score_tokens(model, ids, mask, 5).logps
        plain = score_tokens(model, ids, mask, 5, share_prefix=False).logps
    active = completion_mask.bool()
    assert torch.allclose(shared[active], plain[active], atol=5e-2)
