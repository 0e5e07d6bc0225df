"""LoRA adapter-only weight sync against a real `grpokit vllm-serve ... --enable-lora` (vLLM's CPU build), one server
for the module: both trainers load each adapter version under a new name and generate with it; the server's
logprobs are the trainer's; the versions carry on across a resume; a few kilobytes per sync instead of the model.

    HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest tests/vllm_engine/test_vllm_lora_sync.py -q -p no:cacheprovider -x
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

pytest.importorskip("vllm.distributed.weight_transfer")

from _serve import free_port, running_server  # noqa: E402

LORA_FLAGS = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "3"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from grpokit.demo import prepare_demo

    return prepare_demo(str(tmp_path_factory.mktemp("demo")))[0]


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    with running_server(model_dir, tmp_path_factory.mktemp("server") / "vllm.log", extra=LORA_FLAGS) as running:
        yield running


def _dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"{i % 10}=" for i in range(32)]})


def _reward(completions, **kwargs):
    return [len(set(c)) / 8 for c in completions]


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def _served(server) -> set[str]:
    with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as response:
        return {m["id"] for m in json.loads(response.read())["data"]}


def _common(tmp_path, server, **overrides):
    values = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        learning_rate=0.5,
        report_to="none",
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        vllm_server_base_url=server.url,
        vllm_group_port=free_port(),
        vllm_server_timeout=30.0,
    )
    values.update(overrides)
    return values


def test_the_async_trainer_pushes_adapter_versions_that_carry_on_across_a_resume(tmp_path, server, model_dir):
    """max_staleness 1: each sync loads `grpokit-<run>-v<version>` and the two newest stay loaded; no sample spans
    two versions (a request keeps the adapter it named); a resume from checkpoint-2 (version 3) loads v4 first, under
    a new run name. At staleness 0 (second leg) the server's logprobs are the trainer's policy's."""
    from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    values = _common(tmp_path, server, max_steps=3, max_staleness=1, save_strategy="steps", save_steps=2)
    values["heartbeat_stale_after_s"] = 120.0
    trainer = AsyncGRPOTrainer(
        model_dir, _reward, args=AsyncGRPOConfig(**values), train_dataset=_dataset(), peft_config=_lora()
    )
    trainer.train()
    generator = trainer.generator
    assert generator.pushes_adapters
    run = generator._adapters.run
    assert trainer.model_version == 4
    assert list(generator._adapters.loaded) == [f"grpokit-{run}-v3", f"grpokit-{run}-v4"]
    assert {f"grpokit-{run}-v3", f"grpokit-{run}-v4"} <= _served(server)
    assert f"grpokit-{run}-v2" not in _served(server)
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert all(row["sample/staleness_max"] <= 1 for row in rows)
    assert all(row.get("sample/spanning_versions_total", 0.0) == 0.0 for row in rows)
    assert 0 < generator.last_sync_bytes < 100_000  # the adapter (q and v, r=4), not the model

    values.update(max_steps=4, vllm_group_port=free_port())
    resumed = AsyncGRPOTrainer(
        model_dir, _reward, args=AsyncGRPOConfig(**values), train_dataset=_dataset(), peft_config=_lora()
    )
    resumed.train(resume_from_checkpoint=os.path.join(values["output_dir"], "checkpoint-2"))
    names = list(resumed.generator._adapters.loaded)
    new_run = resumed.generator._adapters.run
    # the sync at train start loads v4 (the checkpoint's version 3, plus one), steps 3 and 4 load v5 and v6
    assert new_run != run and names == [f"grpokit-{new_run}-v5", f"grpokit-{new_run}-v6"]
    assert resumed.model_version == 6 and resumed.state.global_step == 4

    values.update(max_steps=2, max_staleness=0, save_strategy="no", output_dir=str(tmp_path / "on-policy"))
    values["vllm_group_port"] = free_port()
    on_policy = AsyncGRPOTrainer(
        model_dir, _reward, args=AsyncGRPOConfig(**values), train_dataset=_dataset(), peft_config=_lora()
    )
    on_policy.train()
    for row in [row for row in on_policy.state.log_history if "loss" in row]:
        assert row["sampling/sampling_logp_difference/max"] < 1e-3, row
    moved = max(p.abs().max().item() for n, p in on_policy.model.named_parameters() if "lora_B" in n)
    assert moved > 1e-3  # the adapter did move the policy the server had to follow


def test_the_sync_trainer_pushes_the_adapter_alone(tmp_path, server, model_dir):
    """GRPOTrainer in server mode: one adapter version per round, the previous one unloaded; the server samples from
    the trainer's policy (logprob gap < 1e-3 at every step, the adapter moving it)."""
    from grpokit import GRPOConfig, GRPOTrainer

    values = _common(tmp_path, server, max_steps=3, use_vllm=True, vllm_mode="server", save_strategy="no")
    args = GRPOConfig(**values, logging_steps=1)
    trainer = GRPOTrainer(model_dir, _reward, args=args, train_dataset=_dataset(), peft_config=_lora())
    trainer.train()
    generator = trainer.generator
    assert generator.pushes_adapters
    run = generator._adapters.run
    assert list(generator._adapters.loaded) == [f"grpokit-{run}-v3"]
    assert f"grpokit-{run}-v2" not in _served(server)
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert len(rows) == 3
    for row in rows:
        assert row["sampling/sampling_logp_difference/max"] < 1e-3, row
    moved = max(p.abs().max().item() for n, p in trainer.model.named_parameters() if "lora_B" in n)
    assert moved > 1e-3


def test_a_server_that_stops_answering_mid_push_fails_at_weight_sync_timeout(tmp_path, server, model_dir):
    """(Last in the module: it freezes the server.) Full weights, no adapter: the server's processes are stopped
    (SIGSTOP) as the third push begins; the run ends about weight_sync_timeout later with one line naming the server
    and the version, checkpoint-1 intact. The server is let go again afterwards."""
    import re
    import signal
    import time

    from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from grpokit.experimental.async_grpo.trainer import WeightSyncError

    values = _common(tmp_path, server, max_steps=4, max_staleness=0, save_strategy="steps", save_steps=1)
    values.update(weight_sync_timeout=5, heartbeat_stale_after_s=120.0)
    trainer = AsyncGRPOTrainer(model_dir, _reward, args=AsyncGRPOConfig(**values), train_dataset=_dataset())
    pushes, frozen = [], []

    def start_pipeline(original=trainer._start_pipeline):
        original()
        send = trainer.weight_transfer.send_weights

        def freezing(pairs):
            pushes.append(1)
            if len(pushes) == 2:  # version 3, after step 2 (version 1 was the push at start)
                os.killpg(server.proc.pid, signal.SIGSTOP)
                frozen.append(time.monotonic())
            return send(pairs)

        trainer.weight_transfer.send_weights = freezing

    trainer._start_pipeline = start_pipeline
    try:
        with pytest.raises(WeightSyncError) as caught:
            trainer.train()
        waited = time.monotonic() - frozen[0]
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)
    message = str(caught.value)
    assert "\n" not in message
    # the deadline, or the push's own HTTP request bounded by the same timeout, whichever answers first
    assert re.fullmatch(
        rf"the weight sync of version 3 to the vLLM server at {re.escape(server.url)} (did not finish within "
        r"weight_sync_timeout=5s|failed: .*did not answer .*)",
        message,
    ), message
    assert 4.5 < waited < 30
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert json.loads((out / "checkpoint-1" / "async_rollout_state.json").read_text())["model_version"] == 2
