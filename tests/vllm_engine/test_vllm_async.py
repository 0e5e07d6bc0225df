"""AsyncGRPOTrainer against a real `grpokit vllm-serve` (vLLM's CPU build), one server for the module: the worker
thread streams from the server while the trainer trains, the weights go in with pause(mode=keep) / gloo push /
resume, and a request in flight across a push finishes on the new weights, each token's logprob under the weights
that sampled it (what the importance-sampling correction reads, token by token).

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest tests/vllm_engine/test_vllm_async.py -q -p no:cacheprovider -x
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("vllm.distributed.weight_transfer")

import torch  # noqa: E402
from _serve import free_port, running_server  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from grpokit.demo import prepare_demo

    return prepare_demo(str(tmp_path_factory.mktemp("demo")))[0]


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    with running_server(model_dir, tmp_path_factory.mktemp("server") / "vllm.log") as running:
        yield running


def _dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"{i % 10}=" for i in range(32)]})


def _config(tmp_path, server, **overrides):
    from grpokit.experimental.async_grpo import AsyncGRPOConfig

    values = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=4,
        learning_rate=5e-2,
        report_to="none",
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        seed=0,
        vllm_server_base_url=server.url,
        vllm_group_port=free_port(),
        vllm_server_timeout=30.0,
        heartbeat_stale_after_s=120.0,
    )
    values.update(overrides)
    return AsyncGRPOConfig(**values)


def _reward(completions, **kwargs):
    """Differs within a group from the first step (the demo's own reward is 0 for a random model's completions)."""
    return [len(set(c)) / 8 for c in completions]


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_training_against_the_server(tmp_path, server, model_dir, max_staleness):
    """Samples stay within max_staleness; at 0 the server holds the trainer's weights at every step: importance
    ratios 1 up to vLLM-vs-transformers numerics, though the policy moves (lr 5e-2)."""
    from grpokit.experimental.async_grpo import AsyncGRPOTrainer

    args = _config(tmp_path, server, max_staleness=max_staleness)
    trainer = AsyncGRPOTrainer(model_dir, _reward, args=args, train_dataset=_dataset())
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == 4
    assert all(row["sample/staleness_max"] <= max_staleness for row in rows)
    assert all("sample/dropped_stale_total" not in row for row in rows)
    assert trainer.model_version == 5  # the first sync, then one per step
    assert all(row["perf/weight_sync_s"] > 0 for row in rows[1:])
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in trainer.model.named_parameters())
    assert moved > 1e-3
    if max_staleness == 0:
        for row in rows:
            assert row["sampling/sampling_logp_difference/max"] < 1e-3, row
    print(
        f"\nasync vs server, max_staleness={max_staleness}: "
        + ", ".join(
            f"step {i + 1}: staleness {r['sample/staleness_max']:g}, "
            f"logp gap {r['sampling/sampling_logp_difference/max']:.1e}"
            for i, r in enumerate(rows)
        )
    )


def test_lora_is_pushed_merged(tmp_path, server, model_dir, caplog):
    """A LoRA adapter trains against a server started without --enable-lora: one warning says so and how to push the
    adapter alone, and the server gets the base weights with the adapter merged at every sync: at staleness 0 its
    logprobs are the trainer's (gap < 1e-3) while the adapter moves the policy."""
    from peft import LoraConfig

    from grpokit.experimental.async_grpo import AsyncGRPOTrainer

    args = _config(tmp_path, server, max_staleness=0, learning_rate=0.5)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = AsyncGRPOTrainer(model_dir, _reward, args=args, train_dataset=_dataset(), peft_config=lora)
    with caplog.at_level("WARNING", logger="grpokit.generation.vllm_server"):
        trainer.train()
    warned = [r.getMessage() for r in caplog.records if "pushing merged weights" in r.getMessage()]
    assert warned == [
        f"pushing merged weights to the vLLM server at {server.url}, not the adapter: the vLLM server was started "
        f"without --enable-lora (start it with `grpokit vllm-serve MODEL --enable-lora --max-lora-rank 8 --max-loras "
        f"2` to push the adapter alone)"
    ]
    assert not trainer.generator.pushes_adapters
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == 4
    for row in rows:
        assert row["sampling/sampling_logp_difference/max"] < 1e-3, row
    moved = max(p.abs().max().item() for n, p in trainer.model.named_parameters() if "lora_B" in n)
    assert moved > 1e-3  # lora_B starts at 0: the adapter did change the policy the server had to follow


def test_a_request_in_flight_finishes_on_the_new_weights(server, model_dir):
    """A long request is in flight when the weights change (pause mode=keep, push, resume): it finishes, its first
    tokens' logprobs are the old weights', its last tokens' the new weights' (one switch), computed by transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.experimental.async_grpo import ServerWeightTransfer
    from grpokit.generation.vllm_server import VLLMServerGenerator

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    old = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        new.get_input_embeddings().weight.mul_(3.0)  # tied with the output layer: other logits, other logprobs
    generator = VLLMServerGenerator(
        base_url=server.url,
        timeout=30,
        group_port=free_port(),
        sampling={"temperature": 1.0, "max_tokens": 200, "ignore_eos": True, "seed": 0},
        num_generations=1,
        eos_token_ids=[-1],  # nothing cuts the completion
        model_name=model_dir,
    )
    transfer = ServerWeightTransfer(generator, lambda: new)
    prompt = tokenizer("12 + 34 =")["input_ids"]
    spans = []
    try:
        for delay in (0.3, 0.15, 0.6):
            with torch.no_grad():  # the server back on the old weights first
                transfer.policy = lambda: old
                transfer.pause()
                transfer.send_weights(iter(()))
                transfer.resume()
            result = {}

            def ask(result=result):
                result["out"] = generator.generate([prompt])

            thread = threading.Thread(target=ask)
            thread.start()
            time.sleep(delay)
            transfer.policy = lambda: new
            transfer.pause()
            transfer.send_weights(iter(()))
            transfer.resume()
            thread.join(timeout=120)
            ids, logprobs = result["out"].completion_ids[0], result["out"].logprobs[0]
            assert len(ids) == 200
            seq = torch.tensor([prompt + ids])
            with torch.no_grad():
                under = [
                    torch.log_softmax(m(seq).logits[0, len(prompt) - 1 : -1].float(), -1).gather(
                        1, torch.tensor(ids)[:, None]
                    )[:, 0]
                    for m in (old, new)
                ]
            served = torch.tensor(logprobs)
            is_old = (served - under[0]).abs() < 2e-3
            is_new = (served - under[1]).abs() < 2e-3
            assert bool((is_old | is_new).all())  # every token's logprob is one of the two policies'
            switch = int(is_old.long().argmin()) if not bool(is_old.all()) else len(ids)
            assert bool(is_old[:switch].all()) and bool(is_new[switch:].all())  # old, then new: one switch
            spans.append(switch)
            if 0 < switch < len(ids):
                break
    finally:
        transfer.destroy()
    assert any(0 < s < 200 for s in spans), f"no request spanned the push (switch points {spans})"
    print(f"\nin-flight request: tokens before the push {spans[-1]}, after {200 - spans[-1]}")
