"""Server-mode vLLM generation against a real `grpokit vllm-serve` (vLLM's CPU build), one server per module.

Runs only where vLLM is installed (the vLLM venv); the main suite skips it:
    HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest tests/vllm_engine/test_vllm_server.py -q -p no:cacheprovider -x
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm.distributed.weight_transfer")

import torch  # noqa: E402
from _serve import free_port as _free_port  # noqa: E402
from _serve import running_server  # noqa: E402
from _threads import ThreadCollectives  # noqa: E402

from grpokit.generation.tokens import cut_after_eos  # noqa: E402
from grpokit.generation.vllm_common import sampling_kwargs  # noqa: E402
from grpokit.generation.vllm_server import VLLMServerError, VLLMServerGenerator  # noqa: E402

MAX_TOKENS = 8
NUM_GENERATIONS = 2
PROMPTS = [
    "hello world",
    "abc",
    # longer than a KV block, so the prefix cache holds full blocks of it between rounds
    "The quick brown fox jumps over the lazy dog; " * 4,
]


def _greedy_args(**overrides):
    args = dict(
        repetition_penalty=1.0,
        temperature=0.0,
        top_p=1.0,
        top_k=None,
        min_p=None,
        max_completion_length=MAX_TOKENS,
        vllm_structured_outputs_regex=None,
        generation_kwargs=None,
    )
    args.update(overrides)
    return SimpleNamespace(**args)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def model_dir(demo_dir):
    # The demo's initial model (head_dim 32: vLLM's CPU attention supports head sizes 32, 64, ...; tied embeddings),
    # so that the last test can train the demo against this server.
    from grpokit.demo import prepare_demo

    return prepare_demo(demo_dir)[0]


# The server of this module requires a token on every route (`grpokit vllm-serve` with GRPOKIT_VLLM_TOKEN set): the
# trainer-side code under test, run in this process and in the `grpokit train` subprocesses, sends it from the same
# variable.
TOKEN = "test-token-7f3a"


@pytest.fixture(scope="module", autouse=True)
def token():
    previous = os.environ.get("GRPOKIT_VLLM_TOKEN")
    os.environ["GRPOKIT_VLLM_TOKEN"] = TOKEN
    yield TOKEN
    if previous is None:
        del os.environ["GRPOKIT_VLLM_TOKEN"]
    else:
        os.environ["GRPOKIT_VLLM_TOKEN"] = previous


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory, token):
    """`grpokit vllm-serve` on a free port; stopped (terminate, then kill, the whole process group) at the end."""
    with running_server(model_dir, tmp_path_factory.mktemp("server") / "vllm.log", token=token) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return [tokenizer(p)["input_ids"] for p in PROMPTS]


def _hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@torch.no_grad()
def _hf_greedy(model, prompt_ids, eos_token_ids):
    """transformers' greedy completion (cut after EOS) and the log-softmax of each chosen token."""
    out = []
    for prompt in prompt_ids:
        ids = torch.tensor([prompt])
        full = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False)
        completion = cut_after_eos(full[0, len(prompt) :].tolist(), eos_token_ids)
        seq = torch.tensor([prompt + completion])
        logits = model(seq).logits[0, len(prompt) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
        out.append((completion, logprobs.tolist()))
    return out


def _generator(server, tokenizer, model_dir, *, dist=None, eos_token_ids=None, **kwargs):
    kwargs.setdefault("model_name", model_dir)
    return VLLMServerGenerator(
        base_url=server.url,
        timeout=30,
        group_port=kwargs.pop("group_port", _free_port()),
        sampling=sampling_kwargs(_greedy_args()),
        num_generations=NUM_GENERATIONS,
        eos_token_ids=eos_token_ids or [tokenizer.eos_token_id],
        **({"dist": dist} if dist is not None else {}),
        **kwargs,
    )


def _repeat(prompts):
    return [p for p in prompts for _ in range(NUM_GENERATIONS)]


def _assert_matches(generated, reference, *, atol=1e-4):
    """`generated` (rows grouped by NUM_GENERATIONS) equals `reference` (one per prompt); returns the largest
    logprob gap."""
    assert len(generated.completion_ids) == len(reference) * NUM_GENERATIONS
    gap = 0.0
    for row, (ids, logprobs) in enumerate(zip(generated.completion_ids, generated.logprobs, strict=True)):
        ref_ids, ref_logprobs = reference[row // NUM_GENERATIONS]
        assert ids == ref_ids, f"row {row}: vLLM {ids} != transformers {ref_ids}"
        assert len(logprobs) == len(ids)
        diff = max((abs(a - b) for a, b in zip(logprobs, ref_logprobs, strict=True)), default=0.0)
        assert diff <= atol, f"row {row}: logprob gap {diff}"
        gap = max(gap, diff)
    return gap


# ---------------------------------------------------------------------------------------------------------------


def test_register_is_idempotent_and_config_accepts_gloo():
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    from grpokit.generation import vllm_gloo

    vllm_gloo.register()
    vllm_gloo.register()
    assert WeightTransferEngineFactory._registry["gloo"]() is vllm_gloo.GlooWeightTransferEngine
    assert WeightTransferTrainerFactory._registry["gloo"]() is vllm_gloo.GlooTrainerWeightTransferEngine
    assert WeightTransferConfig(backend="gloo").backend == "gloo"


def test_bucket_plan_round_trip():
    from grpokit.generation.vllm_gloo import _aligned, _nbytes, plan_buckets

    dtypes = [torch.float32, torch.bfloat16, torch.int64, torch.float16]
    shapes = [[3, 5], [7], [], [1000]]
    buckets = plan_buckets(dtypes, shapes, bucket_bytes=200)
    assert [i for b in buckets for i in b] == [0, 1, 2, 3]
    assert buckets[-1] == [3]  # larger than a bucket: alone
    for bucket in buckets[:-1]:
        assert sum(_aligned(_nbytes(dtypes[i], shapes[i])) for i in bucket) <= 200


def test_greedy_matches_transformers(server, tokenizer, model_dir, prompt_ids):
    eos = [tokenizer.eos_token_id]
    generator = _generator(server, tokenizer, model_dir)
    reference = _hf_greedy(_hf_model(model_dir), prompt_ids, eos)
    generated = generator.generate(_repeat(prompt_ids))
    gap = _assert_matches(generated, reference)
    print(f"\ngreedy: {len(prompt_ids)} prompts x {NUM_GENERATIONS}, largest logprob gap vs transformers {gap:.2e}")

    # A further EOS id cuts the completion right after its first occurrence, logprobs alike.
    first = reference[0][0]
    stop = first[min(2, len(first) - 1)]
    cut = _generator(server, tokenizer, model_dir, eos_token_ids=[*eos, stop]).generate(_repeat(prompt_ids[:1]))
    expected = cut_after_eos(first, [*eos, stop])
    assert cut.completion_ids == [expected] * NUM_GENERATIONS
    assert [len(lp) for lp in cut.logprobs] == [len(expected)] * NUM_GENERATIONS


def test_groups_spanning_processes(server, tokenizer, model_dir, prompt_ids):
    """Two "processes" (threads behind a collective): 3 prompts x 2 rows split 3 / 3, so the second prompt's group
    spans both; each gets exactly its rows, and only the main one talks to the server."""
    rows = _repeat(prompt_ids)
    single = _generator(server, tokenizer, model_dir).generate(rows)
    collectives = ThreadCollectives(2)
    results, errors = [None, None], []
    generators = [None, None]

    def run(rank, share):
        try:
            generators[rank] = _generator(server, tokenizer, model_dir, dist=collectives[rank])
            results[rank] = generators[rank].generate(share)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
            collectives.abort()

    threads = [threading.Thread(target=run, args=(r, s)) for r, s in ((0, rows[:3]), (1, rows[3:]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert results[0].completion_ids + results[1].completion_ids == single.completion_ids
    # the same tokens; their logprobs up to float rounding (vLLM's batches and prefix cache differ between calls)
    for split, whole in zip(results[0].logprobs + results[1].logprobs, single.logprobs, strict=True):
        assert split == pytest.approx(whole, abs=1e-5)


def test_sync_weights_updates_server(server, tokenizer, model_dir, prompt_ids):
    eos = [tokenizer.eos_token_id]
    generator = _generator(server, tokenizer, model_dir)
    model = _hf_model(model_dir)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    before = _hf_greedy(model, prompt_ids, eos)
    # Fill the prefix cache with KV computed with the original weights.
    _assert_matches(generator.generate(_repeat(prompt_ids)), before)
    times = []
    try:
        for seed in (1, 2):
            torch.manual_seed(seed)
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(torch.randn_like(param) * 0.5)
            reference = _hf_greedy(model, prompt_ids, eos)
            assert [r[0] for r in reference] != [b[0] for b in before], "the perturbation must change greedy output"
            generator.sync_weights(model)
            times.append(generator.last_sync_seconds)
            _assert_matches(generator.generate(_repeat(prompt_ids)), reference)
    finally:
        model.load_state_dict(original)
        generator.sync_weights(model)  # leave the server as it started
        generator.close()
    _assert_matches(_generator(server, tokenizer, model_dir).generate(_repeat(prompt_ids)), before)
    assert all(t is not None and t > 0 for t in times)
    print(f"\npush times: first (with group init) {times[0]:.3f}s, second {times[1]:.3f}s")


def test_qlora_push_sends_the_dequantised_base(server, tokenizer, model_dir, prompt_ids):
    """A 4-bit base with a LoRA adapter: the metadata and the tensors sent are the dense weights (the checkpoint's
    shapes and dtype), and the server then generates what the QLoRA policy does."""
    pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    from transformers import BitsAndBytesConfig

    from grpokit.models import load_policy, prepare_quantized

    eos = [tokenizer.eos_token_id]
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    model = load_policy(model_dir, {"dtype": "float32"}, False, quantization)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(model, config)
    prepare_quantized(model)
    for name, param in model.named_parameters():
        if ".lora_" in name:  # float32: the engine then matches the policy to float32 rounding
            param.data = param.data.float()
    model.eval()
    reference = _hf_greedy(model, prompt_ids, eos)
    generator = _generator(server, tokenizer, model_dir)
    try:
        generator.sync_weights(model)
        _assert_matches(generator.generate(_repeat(prompt_ids)), reference)
    finally:
        generator.sync_weights(_hf_model(model_dir))  # leave the server as it started
        generator.close()


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/update_weights")],
)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong"])
def test_every_route_needs_the_token(server, method, path, authorization):
    headers = {"Content-Type": "application/json", **({"Authorization": authorization} if authorization else {})}
    request = urllib.request.Request(server.url + path, data=b"{}" if method == "POST" else None, headers=headers)
    request.method = method
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 401


def test_unreachable_server_is_one_line():
    port = _free_port()
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        VLLMServerGenerator(
            base_url=f"http://127.0.0.1:{port}",
            timeout=2,
            group_port=_free_port(),
            sampling={},
            num_generations=2,
            eos_token_ids=[1],
        )
    message = str(info.value)
    assert "\n" not in message
    assert f"http://127.0.0.1:{port}" in message and "grpokit vllm-serve" in message
    assert time.monotonic() - start < 15


def test_wrong_model_name_is_one_line(server, tokenizer, model_dir):
    with pytest.raises(VLLMServerError) as info:
        _generator(server, tokenizer, model_dir, model_name="Qwen/Qwen2.5-0.5B-Instruct")
    message = str(info.value)
    assert "\n" not in message
    assert "Qwen/Qwen2.5-0.5B-Instruct" in message and model_dir in message and server.url in message


def test_demo_trains_against_the_server(server, tokenizer, demo_dir, prompt_ids):
    """The README's server-mode command: the demo trains with the server generating (reward rises, the trainer's and
    vLLM's logprobs agree), and afterwards the server generates what the saved model generates under transformers."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "grpokit", "train", "--demo", "--output_dir", demo_dir, "--max_steps", "120"]
    command += ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_port", str(server.port)]
    command += ["--vllm_group_port", str(_free_port())]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    rows = [json.loads(line) for line in open(os.path.join(demo_dir, "metrics.jsonl"))]
    rows = [r for r in rows if "reward" in r]
    assert len(rows) == 12
    # A random policy scores ~0.01 (one digit in ten, per character); 120 steps of the demo's 400 lift it clearly
    # above that. How far varies from run to run: the server's batching makes its sampling differ after the first
    # rounds, and this small policy's learning amplifies it (seen: the last 3 logs averaging 0.07 to 0.25). So the
    # whole second half is compared with the start, not the last rows with a fixed level.
    first, late = rows[0]["reward"], sum(r["reward"] for r in rows[6:]) / 6
    assert first < 0.05 and late > 3 * first, [r["reward"] for r in rows]
    assert all(r["sampling/sampling_logp_difference/max"] < 1e-4 for r in rows)
    # The server holds the weights of the last round; one more push of the final (saved) weights, then compare.
    trained = _hf_model(demo_dir)
    generator = _generator(server, tokenizer, os.path.join(demo_dir, "initial_model"))
    generator.sync_weights(trained)
    _assert_matches(generator.generate(_repeat(prompt_ids)), _hf_greedy(trained, prompt_ids, [tokenizer.eos_token_id]))


def test_server_gone_mid_run_is_one_line(server, tokenizer, model_dir, prompt_ids, tmp_path):
    """Last in the module: it stops the shared server while a training run uses it. The run stops with one line
    naming the server and saves the weights trained so far; the generator's own error is one line too."""
    generator = _generator(server, tokenizer, model_dir)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "grpokit", "train", "--demo", "--output_dir", str(out), "--max_steps", "5000"]
    command += ["--model_name_or_path", model_dir, "--logging_steps", "1"]
    command += ["--vllm_server_host", "127.0.0.1"]
    command += ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_port", str(server.port)]
    command += ["--vllm_group_port", str(_free_port())]
    run = subprocess.Popen(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stderr=subprocess.PIPE, text=True)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
            assert run.poll() is None and time.monotonic() < deadline, "the run ended or stalled before step 3"
            time.sleep(0.5)
        server.stop()
        _, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and server.url in errors[0] and "saved to" in errors[0], stderr[-2000:]
    saved = [p for p in out.iterdir() if p.name.startswith("interrupted-step-")]
    assert len(saved) == 1 and (saved[0] / "model.safetensors").exists()
    with pytest.raises(RuntimeError) as info:
        generator.generate(_repeat(prompt_ids[:1]))
    message = str(info.value)
    assert "\n" not in message and server.url in message


# ---------------------------------------------------------------------------------------------------------------
