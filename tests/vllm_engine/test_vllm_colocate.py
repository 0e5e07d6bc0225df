"""vLLM colocate mode against the real vLLM CPU build (run in the vLLM venv; skipped where vLLM is not installed).

One engine serves the whole module (an engine start costs seconds to a minute). Every push of weights is followed by
a check that the engine now computes what the policy computes: greedy completions equal transformers' greedy
`generate`, and the logprob vLLM reports for each sampled token equals the policy's log-softmax of logits / T.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("vllm")

from grpokit.generation.vllm_colocate import VLLMColocateGenerator  # noqa: E402
from grpokit.tiny import save_tiny  # noqa: E402

# The last prompt spans more than one KV block (128 tokens on CPU), so the prefix cache keeps it between pushes.
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [5 + i % 90 for i in range(140)]]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # head_dim 32: the smallest head size vLLM's CPU attention takes
    return save_tiny(tmp_path_factory.mktemp("policy"), hidden_size=64, num_layers=2, num_heads=2, seed=3)


@pytest.fixture(scope="module")
def generator(model_dir):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return VLLMColocateGenerator(
        enforce_eager=True,  # no compilation: the module's tests start fast
        model_path=model_dir,
        sampling={"temperature": 0.0, "max_tokens": MAX_TOKENS, "logprobs": 0, "ignore_eos": True},
        eos_token_ids=[],
        dtype="float32",
        max_model_length=256,
        max_num_seqs=16,
        seed=0,
    )


def load_policy(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


@torch.no_grad()
def hf_greedy(model, prompt):
    """Argmax decoding with the model's full forward at each step (EOS does not stop it, as with ignore_eos)."""
    ids = list(prompt)
    for _ in range(MAX_TOKENS):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def hf_logps(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def assert_engine_matches(generator, model, temperature=0.7, tolerance=1e-4):
    """Greedy output equal to transformers'; sampled tokens' logprobs equal to the policy's (fp32)."""
    generator.sampling.update(temperature=0.0)
    greedy = generator.generate(PROMPTS).completion_ids
    assert greedy == [hf_greedy(model, p) for p in PROMPTS]
    generator.sampling.update(temperature=temperature)
    sampled = generator.generate(PROMPTS * 2)
    gaps = [
        (torch.tensor(lp) - hf_logps(model, p, c, temperature)).abs().max().item()
        for p, c, lp in zip(PROMPTS * 2, sampled.completion_ids, sampled.logprobs, strict=True)
    ]
    assert max(gaps) < tolerance, gaps
    return max(gaps)


@torch.no_grad()
def perturb(model, seed, scale=0.05):
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=generator) * scale)


def test_engine_generates_what_the_pushed_policy_would(generator, model_dir):
    model = load_policy(model_dir)
    assert model.config.tie_word_embeddings  # the case where the CPU build's packed lm_head used to go stale
    generator.sync_weights(model)
    assert_engine_matches(generator, model)
    before = generator.generate(PROMPTS).completion_ids
    for seed in (1, 2):  # two pushes of new weights: each must take, the embedding / tied head included
        perturb(model, seed)
        generator.sync_weights(model)
        assert_engine_matches(generator, model)
    generator.sampling.update(temperature=0.0)
    assert generator.generate(PROMPTS).completion_ids != before  # the weights really changed what it generates


def test_lora_pushes_merged_weights_and_leaves_the_adapter_alone(generator, model_dir):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False
    )
    model = peft.get_peft_model(load_policy(model_dir), config)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    generator.sync_weights(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())  # nothing merged in place
    assert_engine_matches(generator, model)  # the engine holds base + B @ A * scale
    plain = load_policy(model_dir)
    generator.sampling.update(temperature=0.0)
    assert generator.generate(PROMPTS).completion_ids != [hf_greedy(plain, p) for p in PROMPTS]


def test_qlora_pushes_the_dequantised_base_with_the_adapter(generator, model_dir):
    """A 4-bit base with a LoRA adapter: the engine (started from the unquantised checkpoint) receives the base
    dequantised, adapter merged, and samples exactly what the QLoRA policy scores."""
    pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    from transformers import BitsAndBytesConfig

    from grpokit.models import load_policy as load_quantised
    from grpokit.models import prepare_quantized

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    model = load_quantised(model_dir, {"dtype": "float32"}, False, quantization)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False
    )
    model = peft.get_peft_model(model, config)
    prepare_quantized(model)  # adapters in bfloat16, as the trainer has them
    model.eval()
    generator.sync_weights(model)
    # In bfloat16 the policy's adapter path rounds its input to bfloat16 too, which a merged weight cannot do: the
    # same greedy tokens, log-probabilities about 1e-3 apart.
    assert_engine_matches(generator, model, tolerance=1e-2)
    # With the adapter in float32 the engine matches the policy to float32 rounding: the pushed base is exactly the
    # quantised one.
    for name, param in model.named_parameters():
        if ".lora_" in name:
            param.data = param.data.float()
    generator.sync_weights(model)
    assert_engine_matches(generator, model)


def test_later_pushes_of_a_model_send_only_the_layers_training_changes(generator, model_dir, monkeypatch):
    """The first push of a model sends every weight; the next ones (same model object) only the engine layers its
    trainable weights belong to (LoRA on q_proj and up_proj: fused qkv and gate_up, whole). The engine then computes
    what the merged model computes, the untouched layers kept from before."""
    peft = pytest.importorskip("peft")
    import grpokit.generation.vllm_colocate as colocate

    sent = []
    original = colocate.policy_weights

    def spy(model, only=None):
        sent.append(only)
        return original(model, only)

    monkeypatch.setattr(colocate, "policy_weights", spy)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"], init_lora_weights=False)
    model = peft.get_peft_model(load_policy(model_dir), config)
    generator.sync_weights(model)
    assert sent[-1] is None  # a model the engine has not held yet: everything
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.2)
    generator.sync_weights(model)
    assert sent[-1] is not None and {n.split(".")[-2] for n in sent[-1]} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "gate_proj",
        "up_proj",
    }
    assert_engine_matches(generator, model)


def test_a_group_is_one_request_with_n_and_samples_what_its_copies_would(generator, model_dir, monkeypatch):
    """Each run of equal consecutive prompts (a group) goes to vLLM once with n = its size: same completions in the
    same order, and the same sampled tokens and logprobs as sending the copies (same engine random state); with a
    per-request seed the copies are sent as they are."""
    import grpokit.generation.vllm_colocate as colocate

    # KV blocks of 32 tokens on CPU (vLLM's default 128 would keep a 128-token prompt from being shared)
    assert generator.llm.llm_engine.vllm_config.cache_config.block_size == 32
    generator.sync_weights(load_policy(model_dir))
    rows = [PROMPTS[0]] * 3 + [PROMPTS[1]] * 2 + [PROMPTS[3]] * 2 + [PROMPTS[0]]
    sent = []
    engine_generate = generator.llm.generate

    def spy(prompts, params, **kwargs):
        sent.append(
            [(len(p["prompt_token_ids"]), getattr(params, "n", None) or [q.n for q in params]) for p in prompts]
        )
        return engine_generate(prompts, params, **kwargs)

    monkeypatch.setattr(generator.llm, "generate", spy)
    generator.sampling.update(temperature=1.0)
    torch.manual_seed(11)
    grouped = generator.generate(rows)
    with monkeypatch.context() as m:
        m.setattr(colocate, "_repeat_runs", lambda prompts: [(i, 1) for i in range(len(prompts))])
        torch.manual_seed(11)
        copies = generator.generate(rows)
    assert [lengths for lengths, _ in sent[0]] == [5, 2, 140, 5]
    assert [n for _, n in sent[0]] == [[3, 2, 2, 1]] * 4  # one list of SamplingParams, one per request
    assert len(sent[1]) == len(rows)
    assert grouped.completion_ids == copies.completion_ids
    assert len(set(map(tuple, grouped.completion_ids[:3]))) > 1  # a group's samples differ
    for a, b in zip(grouped.logprobs, copies.logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-6)
    generator.sampling.update(seed=5)
    try:
        generator.generate(rows)
    finally:
        generator.sampling.pop("seed")
    assert len(sent[2]) == len(rows)


def test_vllm_does_not_detokenize_unless_stop_strings_need_the_text(generator, model_dir, monkeypatch):
    """Only token ids are used: requests go with detokenize=False and sample the same tokens and logprobs as with
    detokenize=True (same engine random state); `stop` strings, which vLLM matches on text, keep it on and still
    stop a completion."""
    generator.sync_weights(load_policy(model_dir))
    sent = []
    engine_generate = generator.llm.generate

    def spy(prompts, params, **kwargs):
        sent.append({q.detokenize for q in (params if isinstance(params, list) else [params])})
        return engine_generate(prompts, params, **kwargs)

    monkeypatch.setattr(generator.llm, "generate", spy)
    rows = [PROMPTS[0]] * 2 + [PROMPTS[2]]
    generator.sampling.update(temperature=1.0)
    torch.manual_seed(7)
    plain = generator.generate(rows)
    generator.sampling.update(detokenize=True)
    try:
        torch.manual_seed(7)
        texted = generator.generate(rows)
    finally:
        generator.sampling.pop("detokenize")
    assert sent == [{False}, {True}]
    assert plain.completion_ids == texted.completion_ids
    for a, b in zip(plain.logprobs, texted.logprobs, strict=True):
        assert a == pytest.approx(b, abs=1e-6)

    # the first completion's first token not seen before in it: with that as a stop string and the same random state,
    # the completion ends with it (vLLM keeps the token that completes a stop string)
    full = plain.completion_ids[0]
    cut = next(i for i in range(1, len(full)) if full[i] not in full[:i])
    generator.sampling.update(stop=[generator.llm.get_tokenizer().decode([full[cut]])])
    try:
        torch.manual_seed(7)
        stopped = generator.generate(rows).completion_ids
    finally:
        generator.sampling.pop("stop")
    assert sent[-1] == {True}
    assert stopped[0] == full[: cut + 1]


def test_import_grpokit_does_not_import_vllm():
    code = "import sys, grpokit, grpokit.generation, grpokit.trainer, grpokit.cli; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_demo_trains_with_vllm_colocate(tmp_path):
    """The README's command: the demo with vLLM generating; reward rises, logprobs match the trainer's (on-policy
    importance ratio 1 within 1e-4), weights were pushed each round."""
    # Not this process's torch.distributed rendezvous (the module's engine set it): the run makes its own.
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    command = [sys.executable, "-m", "grpokit", "train", "--demo", "--use_vllm", "true", "--max_steps", "120"]
    command += ["--vllm_enable_sleep_mode", "true"]  # the CPU build cannot sleep: one warning, no crash
    command += ["--output_dir", str(tmp_path / "out")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "vllm_enable_sleep_mode=True has no effect here: this vLLM platform cannot sleep" in result.stderr
    rows = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    rows = [r for r in rows if "reward" in r]
    assert len(rows) == 12
    # a random policy scores ~0.01 (one digit in ten, per character); 120 steps of the demo's 400 lift it well above
    first, last = rows[0]["reward"], sum(r["reward"] for r in rows[-3:]) / 3
    assert first < 0.05 and last > 0.1 and last > 5 * first, [r["reward"] for r in rows]
    for row in rows:
        assert abs(row["sampling/importance_sampling_ratio/min"] - 1) < 1e-4
        assert abs(row["sampling/importance_sampling_ratio/max"] - 1) < 1e-4
        assert row["sampling/sampling_logp_difference/max"] < 1e-4
        assert row["timing/vllm_weight_sync"] > 0


def test_dynamic_sampling_with_vllm_colocate(tmp_path):
    """Dynamic sampling generates its extra rounds through the same vLLM engine (weights pushed once per optimizer
    step): every round trained on holds 4 groups, kept or (at the cap) filled, and each round's vLLM logprobs match
    the trainer's (on-policy importance ratio 1 within 1e-4)."""
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env.update(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    command = [sys.executable, "-m", "grpokit", "train", "--demo", "--use_vllm", "true", "--max_steps", "4"]
    command += ["--logging_steps", "1", "--dynamic_sampling", "true", "--output_dir", str(tmp_path / "out")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "out" / "metrics.jsonl")]
    rows = [r for r in rows if "reward" in r]
    assert len(rows) == 4
    # the demo's random policy: most groups of 8 score all 0, so extra rounds are needed
    assert sum(r["dynamic_sampling/rounds"] for r in rows) > 4
    for row in rows:
        assert row["dynamic_sampling/groups_kept"] + row["dynamic_sampling/groups_filled"] == 4
        assert abs(row["sampling/importance_sampling_ratio/min"] - 1) < 1e-4
        assert abs(row["sampling/importance_sampling_ratio/max"] - 1) < 1e-4


def test_unsupported_head_size_is_one_line_before_the_engine_starts(tmp_path):
    from grpokit.generation import GenerationError

    path = save_tiny(tmp_path / "h16", hidden_size=64, num_heads=4)  # head size 16
    with pytest.raises(GenerationError, match=r"head size 16 is not one vLLM's CPU attention supports \(\[32, 64,"):
        VLLMColocateGenerator(model_path=path, sampling={}, eos_token_ids=[], dtype="float32")
