"""AsyncGRPOTrainer on CPU without vLLM: TRL's plug-in points called in TRL's order, the staleness bound and its
correction (weights worked out from the model by hand), equivalence with the synchronous trainer at staleness 0."""

import math

import pytest
import torch
from _async_helpers import (
    PROMPTS,
    FixedSampler,
    StubTransfer,
    StubWorker,
    make_config,
    sample,
    text_reward,
)
from transformers import TrainerCallback

import grpokit.trainer as trainer_module
from grpokit.config.rules import ConfigError
from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from grpokit.scoring import score_tokens


@pytest.fixture
def dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS})


def stub_trainer(model, tokenizer, dataset, args, batch, calls=None, **kwargs):
    """An AsyncGRPOTrainer fed through TRL's plug-in points by stubs: `batch(version)` gives the samples of each batch;
    `calls` (a list) records the worker's and the transfer's calls in order."""
    calls = [] if calls is None else calls
    return AsyncGRPOTrainer(
        model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_worker=StubWorker(batch, calls),
        weight_transfer=StubTransfer(calls),
        **kwargs,
    )


def test_defaults_are_trls(tmp_path):
    """TRL 1.16's AsyncGRPOConfig defaults (read from its wheel), field by field."""
    config = AsyncGRPOConfig(str(tmp_path), report_to="none")
    expected = {
        "logging_steps": 1,
        "lr_scheduler_type": "constant",
        "ignore_data_skip": True,
        "learning_rate": 1e-6,
        "num_generations": 8,
        "max_completion_length": 2048,
        "temperature": 1.0,
        "top_p": 1.0,
        "repetition_penalty": 1.0,
        "epsilon": 0.2,
        "epsilon_high": None,
        "vllm_server_base_url": "http://localhost:8000",
        "vllm_server_timeout": 240.0,
        "request_timeout": 600,
        "weight_sync_timeout": 1800,
        "dtype": "float32",
        "token_budget": None,
        "fork_threshold_tokens": 1024,
        "max_inflight_tasks": -1,
        "max_staleness": 4,
        "queue_maxsize": 1024,
        "weight_sync_steps": 1,
        "heartbeat_stale_after_s": 300.0,
        "log_completions": False,
        "num_completions_to_print": None,
        "gradient_checkpointing": True,
    }
    actual = {name: getattr(config, name) for name in expected}
    actual["lr_scheduler_type"] = str(getattr(config.lr_scheduler_type, "value", config.lr_scheduler_type))
    assert actual == expected


def test_bad_async_values_are_refused_together(tmp_path):
    with pytest.raises(ConfigError) as caught:
        AsyncGRPOConfig(
            str(tmp_path), max_staleness=-1, weight_sync_steps=0, queue_maxsize=0, learning_rate=-1.0, report_to="none"
        )
    lines = str(caught.value).splitlines()
    assert sorted(line.split(":")[0] for line in lines) == [
        "learning_rate=-1.0",
        "max_staleness=-1",
        "queue_maxsize=0",
        "weight_sync_steps=0",
    ]


def test_the_pipelines_fields_are_refused_without_async_grpo(tmp_path):
    from grpokit import GRPOConfig

    with pytest.raises(ConfigError, match="max_staleness=1: has no effect without async_grpo: true"):
        GRPOConfig(str(tmp_path), max_staleness=1, report_to="none")


def test_fields_grpokit_does_not_implement_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="fork_threshold_tokens=512: grpokit's tool loop never re-tokenizes"):
        AsyncGRPOConfig(str(tmp_path), fork_threshold_tokens=512, report_to="none")
    with pytest.raises(ConfigError, match="num_iterations=2: the asynchronous trainer trains each sample once"):
        AsyncGRPOConfig(str(tmp_path), num_iterations=2, report_to="none")


def test_trls_stub_worker_and_transfer_are_called_in_trls_order(tmp_path, tiny_model, tiny_tokenizer, dataset):
    """A worker and a no-op transfer written for TRL's protocols: set-up, a first sync, start, then versions 1, 2,
    3 (one sync per step); the parameters move; rewards come from the samples."""
    calls = []
    prompt = tiny_tokenizer("ab")["input_ids"]

    def batch(version):
        return [
            sample(
                prompt,
                [10 + i, 11, 12],
                version=version,
                group=version,
                advantage=(-1.0) ** i,
                sampler_logps=[-4.0] * 3,
            )
            for i in range(4)
        ]

    args = make_config(tmp_path, max_steps=3)
    trainer = stub_trainer(tiny_model, tiny_tokenizer, dataset, args, batch, calls=calls)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    params = len(list(trainer.model.parameters()))
    sync = ["pause", f"send {params}", "resume"]
    assert calls == [
        "init",
        *sync,
        "version 1",
        "start",
        *sync,
        "version 2",
        *sync,
        "version 3",
        *sync,
        "version 4",
        "stop",
        "destroy",
    ]
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert [row["reward"] for row in logged] == [0.5, 0.5, 0.5]
    # the stub queues one batch of the new version at start and after each sync: every step trains a fresh one
    assert [row["sample/staleness_max"] for row in logged] == [0.0, 0.0, 0.0]


def test_samples_staler_than_max_staleness_are_dropped_and_counted(tmp_path, tiny_model, tiny_tokenizer, dataset):
    """At start and after each sync the stub queues a batch two versions old (dropped at max_staleness=1), then one a
    version old (trained)."""
    prompt = tiny_tokenizer("cde")["input_ids"]

    def batch(version):
        stale = [sample(prompt, [20, 21], version=version - 2, group=0, advantage=1.0, sampler_logps=[-3.0] * 2)] * 4
        old = [sample(prompt, [22, 23], version=version - 1, group=1, advantage=1.0, sampler_logps=[-3.0] * 2)] * 4
        return stale + old

    args = make_config(tmp_path, max_steps=2, max_staleness=1)
    trainer = stub_trainer(tiny_model, tiny_tokenizer, dataset, args, batch)
    trainer.train()
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert [row["sample/dropped_stale_total"] for row in logged] == [4.0, 4.0]
    assert [row["sample/staleness_max"] for row in logged] == [1.0, 1.0]


def test_stale_tokens_are_weighted_by_the_ratio_to_the_sampler(
    tmp_path, tiny_model, tiny_tokenizer, dataset, monkeypatch
):
    """Staleness forced to k=2: the importance weights the loss receives are min(pi_current / pi_sampler, cap) per
    token (token_truncate), with pi_current computed here from the model at that step."""
    prompt = tiny_tokenizer("fghi")["input_ids"]
    completions = [[30, 31, 32], [33, 34, 35], [36, 37, 38], [39, 40, 41]]
    sampler_logps = [[-4.0, -4.5, -3.5], [-5.0, -4.2, -4.4], [-3.9, -4.1, -6.0], [-4.6, -4.6, -2.0]]

    def batch(version):
        return [
            sample(prompt, c, version=max(version - 2, 0), group=version, advantage=(-1.0) ** i, sampler_logps=lp)
            for i, (c, lp) in enumerate(zip(completions, sampler_logps, strict=True))
        ]

    seen = []
    policy_loss = trainer_module.policy_loss

    def recorded(*args, **kwargs):
        seen.append(kwargs["importance_sampling_ratio"].detach().clone())
        return policy_loss(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", recorded)
    snapshots = []

    class Snapshot(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            snapshots.append({n: p.detach().clone() for n, p in model.named_parameters()})

    args = make_config(
        tmp_path,
        max_steps=3,
        max_staleness=2,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=1.5,
    )
    trainer = stub_trainer(tiny_model, tiny_tokenizer, dataset, args, batch, callbacks=[Snapshot()])
    trainer.train()
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert logged[-1]["sample/staleness_max"] == 2.0
    ids = torch.tensor([prompt + c for c in completions])
    for step, (weights, params) in enumerate(zip(seen, snapshots, strict=True)):
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                p.copy_(params[name])
            current = score_tokens(trainer.model, ids, torch.ones_like(ids), 3).logps
        expected = torch.clamp(torch.exp(current - torch.tensor(sampler_logps)), max=1.5)
        # the micro-batch's rows come in a random order: compare them as sorted rows
        rows = sorted(weights.tolist())
        assert torch.allclose(torch.tensor(rows), torch.tensor(sorted(expected.tolist())), atol=1e-5), step


def test_staleness_zero_trains_as_the_sync_trainer(tmp_path, tiny_tokenizer, dataset, monkeypatch):
    """Same model, same prompts, the same completions and sampler logprobs: the asynchronous trainer at
    max_staleness=0 and GRPOTrainer give the same losses at every step (to 1e-6)."""
    from grpokit import GRPOTrainer
    from grpokit.tiny import build_model

    def losses(make_trainer):
        seen = []
        policy_loss = trainer_module.policy_loss

        def recorded(*args, **kwargs):
            result = policy_loss(*args, **kwargs)
            seen.append(result.loss.item())
            return result

        monkeypatch.setattr(trainer_module, "policy_loss", recorded)
        trainer = make_trainer()
        trainer.train()
        monkeypatch.setattr(trainer_module, "policy_loss", policy_loss)
        return seen

    common = dict(max_steps=4, per_device_train_batch_size=4, num_generations=2, learning_rate=5e-2)

    def sync():
        args = make_config(tmp_path / "sync", **common)
        args = _as_sync_config(args)
        trainer = GRPOTrainer(
            build_model(tiny_tokenizer), text_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer
        )
        trainer.generator = FixedSampler(tiny_tokenizer.eos_token_id)
        trainer.args.use_vllm = True  # the correction's settings; generation is the fixed sampler
        return trainer

    def asynchronous():
        args = make_config(tmp_path / "async", max_staleness=0, **common)
        calls = []
        trainer = AsyncGRPOTrainer(
            build_model(tiny_tokenizer),
            text_reward,
            args=args,
            train_dataset=dataset,
            processing_class=tiny_tokenizer,
            weight_transfer=StubTransfer(calls),
        )
        trainer.generator = FixedSampler(tiny_tokenizer.eos_token_id)
        return trainer

    expected, actual = losses(sync), losses(asynchronous)
    assert len(expected) == len(actual) == 4
    assert all(math.isfinite(v) for v in expected)
    assert actual == pytest.approx(expected, abs=1e-6)


def _as_sync_config(async_args):
    from dataclasses import fields

    from grpokit import GRPOConfig

    own = {f.name for f in fields(GRPOConfig) if f.init}
    values = {f.name: getattr(async_args, f.name) for f in fields(async_args) if f.init and f.name in own}
    explicit = {
        "output_dir",
        "per_device_train_batch_size",
        "num_generations",
        "max_completion_length",
        "max_steps",
        "learning_rate",
        "report_to",
        "use_cpu",
        "bf16",
        "gradient_checkpointing",
        "save_strategy",
        "seed",
        "shuffle_dataset",
        "logging_steps",
        "lr_scheduler_type",
    }
    return GRPOConfig(**{k: v for k, v in values.items() if k in explicit})


TRL_STYLE_SCRIPT = '''
import itertools, queue
import numpy as np
from datasets import Dataset
from transformers import AutoTokenizer
from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer  # was: from trl.experimental...
from grpokit.experimental.async_grpo.async_rollout_worker import RolloutSample  # was: trl.experimental...


def reward_len(completions, **kwargs):
    return [len(c[0]["content"]) / 10 for c in completions]


class ScoredElsewhere:
    """A worker written for TRL's RolloutWorkerProtocol: scores with reward_len, queues a few samples per sync."""

    def __init__(self, tokenizer, dataset, num_generations, per_sync=6):
        self.rollout_buffer, self.metrics_queue = queue.Queue(), queue.Queue()
        self.version, self.per_sync = 0, per_sync
        self.samples = self._samples(tokenizer, dataset, num_generations)

    def _samples(self, tokenizer, dataset, n):
        for group, row in enumerate(itertools.cycle(dataset)):
            completions = [[{"role": "assistant", "content": "ok " * (i + 1)}] for i in range(n)]
            prompt_ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_dict=False)
            full = tokenizer.apply_chat_template([row["prompt"] + c for c in completions], return_dict=False)
            rewards = np.array(reward_len(completions))
            advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
            for i in range(n):
                completion_ids = full[i][len(prompt_ids):]
                yield RolloutSample(
                    prompt=row["prompt"], completion=completions[i], input_ids=prompt_ids + completion_ids,
                    completion_mask=[0] * len(prompt_ids) + [1] * len(completion_ids),
                    old_log_probs=[0.0] * len(prompt_ids) + [-0.5] * len(completion_ids),
                    advantage=float(advantages[i]), model_version=self.version, group_id=group,
                    metrics={"reward": float(rewards[i]), "reward_std": float(rewards.std())},
                )

    def _fill(self):
        for _ in range(self.per_sync):
            self.rollout_buffer.put(next(self.samples))

    def start(self):
        self._fill()

    def update_model_version(self, model_version):
        self.version = model_version
        self._fill()

    def stop(self):
        pass

    def check_health(self, stale_after_s):
        pass


class NoTransfer:
    def init_weight_transfer(self): pass
    def pause(self): pass
    def send_weights(self, iterator):
        for _ in iterator: pass
    def resume(self): pass
    def destroy(self): pass


dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": w}] for w in ["sum", "two", "and", "three"]]})
args = AsyncGRPOConfig(
    output_dir=OUTPUT_DIR, learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
    max_completion_length=8, token_budget=256, vllm_server_timeout=5.0, report_to="none",
)
trainer = AsyncGRPOTrainer(
    model=MODEL, reward_funcs=reward_len, args=args, train_dataset=dataset,
    rollout_worker=ScoredElsewhere(AutoTokenizer.from_pretrained(MODEL), dataset, num_generations=3),
    weight_transfer=NoTransfer(),
)
before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
trainer.train()
'''


def test_a_trl_async_script_runs_with_the_import_changed(tmp_path, tiny_model_dir):
    """A script written for TRL 1.16's AsyncGRPOTrainer (its own worker and no-op transfer, TRL's defaults: no
    max_steps, gradient checkpointing, token_budget set) trains with only its imports changed."""
    namespace = {"OUTPUT_DIR": str(tmp_path / "out"), "MODEL": str(tiny_model_dir)}
    exec(compile(TRL_STYLE_SCRIPT, "trl_style_async_script", "exec"), namespace)
    trainer, before = namespace["trainer"], namespace["before"]
    assert trainer.state.global_step == 12  # 3 epochs (TRL's default) x 4 prompts, one group of 3 a step
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert all(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters() if "embed" not in n)


def test_token_budget_drops_longer_samples(tmp_path, tiny_model, tiny_tokenizer, dataset):
    """token_budget=6: the prompt (2 tokens) with a 5-token completion is over it and dropped (counted); the batch
    fills with the 3-token ones."""
    prompt = tiny_tokenizer("ab")["input_ids"]
    assert len(prompt) == 2

    def batch(version):
        long = [
            sample(prompt, [20, 21, 22, 23, 24], version=version, group=0, advantage=1.0, sampler_logps=[-3.0] * 5)
        ]
        short = [
            sample(prompt, [25, 26, 27], version=version, group=1, advantage=(-1.0) ** i, sampler_logps=[-3.0] * 3)
            for i in range(4)
        ]
        return long + short

    trainer = stub_trainer(
        tiny_model, tiny_tokenizer, dataset, make_config(tmp_path, max_steps=2, token_budget=6), batch
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert [row["batch/dropped_oversize_total"] for row in logged] == [1.0, 1.0]
    assert [row["batch/row_tokens_max"] for row in logged] == [5.0, 5.0]


def test_dtype_loads_a_model_given_by_path(tmp_path, tiny_model_dir, dataset):
    calls = []
    args = make_config(tmp_path, dtype="bfloat16")
    trainer = AsyncGRPOTrainer(
        str(tiny_model_dir),
        text_reward,
        args=args,
        train_dataset=dataset,
        rollout_worker=StubWorker(lambda version: [], calls),
        weight_transfer=StubTransfer(calls),
    )
    assert trainer.model.dtype == torch.bfloat16


def test_a_plugged_worker_missing_part_of_the_protocol_is_one_line(tmp_path, tiny_model, tiny_tokenizer, dataset):
    class Half:
        rollout_buffer = None

        def start(self):
            pass

    with pytest.raises(TypeError) as caught:
        AsyncGRPOTrainer(
            tiny_model,
            args=make_config(tmp_path),
            train_dataset=dataset,
            processing_class=tiny_tokenizer,
            rollout_worker=Half(),
            weight_transfer=StubTransfer([]),
        )
    assert str(caught.value) == (
        "rollout_worker: Half lacks metrics_queue, stop, update_model_version, check_health of TRL's protocol"
    )


def test_a_sample_whose_mask_is_not_zeros_and_ones_is_one_line(tmp_path, tiny_model, tiny_tokenizer, dataset):
    from grpokit.experimental.async_grpo.samples import split

    bad = sample([1, 2], [3, 4], version=0, group=7, advantage=1.0, sampler_logps=[-1.0, -1.0])
    bad.completion_mask = [0, 0, 1, 2]
    with pytest.raises(
        ValueError, match="^rollout sample of group 7: completion_mask holds values other than 0 and 1$"
    ):
        split(bad)


def test_max_inflight_tasks_with_tools_is_refused(tmp_path, tiny_model, tiny_tokenizer, dataset):
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return key

    with pytest.raises(ValueError, match="^max_inflight_tasks=8: the tool loop runs a generation batch's rollouts"):
        AsyncGRPOTrainer(
            tiny_model,
            text_reward,
            args=make_config(tmp_path, max_inflight_tasks=8),
            train_dataset=dataset,
            processing_class=tiny_tokenizer,
            tools=[lookup],
        )


def test_rewards_read_extra_columns_under_trls_remove_unused_columns(tmp_path, tiny_model, tiny_tokenizer):
    """remove_unused_columns is True by default, as TRL's async config; a reward reading the dataset's `answer` column
    still gets each prompt's own value, row by row (the worker reads whole rows)."""
    from datasets import Dataset

    answers = {prompt: f"answer-{i}" for i, prompt in enumerate(PROMPTS)}
    seen = []

    def reward_from_answer(prompts, completions, answer, **kwargs):
        seen.extend(zip(prompts, answer, strict=True))
        return [float(len(a)) for a in answer]

    dataset = Dataset.from_dict({"prompt": PROMPTS, "answer": [answers[p] for p in PROMPTS]})
    args = make_config(tmp_path, max_steps=2)
    assert args.remove_unused_columns is True
    trainer = AsyncGRPOTrainer(
        tiny_model, reward_funcs=reward_from_answer, args=args, train_dataset=dataset, processing_class=tiny_tokenizer
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(seen) >= 8  # two steps of 4 completions at least
    assert all(answer == answers[prompt] for prompt, answer in seen)


def test_a_weight_push_that_stops_answering_fails_at_weight_sync_timeout(
    tmp_path, tiny_model, tiny_tokenizer, dataset
):
    """The transfer answers the first three pushes (versions 1-3, at train start and after steps 1 and 2) and hangs on
    the fourth, after step 3: the run stops about weight_sync_timeout later with one line naming the target and the
    version, the checkpoints of steps 1 and 2 intact, the stuck transfer not waited for at shutdown."""
    import json
    import threading
    import time

    from grpokit.experimental.async_grpo.trainer import WeightSyncError

    calls, release = [], threading.Event()
    prompt = tiny_tokenizer("ab")["input_ids"]

    class HangingTransfer(StubTransfer):
        def send_weights(self, iterator):
            super().send_weights(iterator)
            if self.calls.count("pause") == 4:
                release.wait(60)  # a server that stopped answering mid-push

        def destroy(self):
            release.wait(60)  # a shutdown stuck behind the push

    def batch(version):
        return [
            sample(
                prompt, [10 + i, 11], version=version, group=version, advantage=(-1.0) ** i, sampler_logps=[-4.0] * 2
            )
            for i in range(4)
        ]

    args = make_config(tmp_path, max_steps=5, weight_sync_timeout=2, save_strategy="steps", save_steps=1)
    trainer = AsyncGRPOTrainer(
        tiny_model,
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
        rollout_worker=StubWorker(batch, calls),
        weight_transfer=HangingTransfer(calls),
    )
    start = time.monotonic()
    try:
        with pytest.raises(WeightSyncError) as caught:
            trainer.train()
        elapsed = time.monotonic() - start
    finally:
        release.set()
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        "the weight sync of version 4 to the weight transfer HangingTransfer did not finish within "
        "weight_sync_timeout=2s"
    )
    assert 2 <= elapsed < 2 + 10 + 20  # the timeout, the shutdown's 10 s bound, three tiny steps
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    state = json.loads((out / "checkpoint-2" / "async_rollout_state.json").read_text())
    assert state["model_version"] == 3
    assert (out / "checkpoint-2" / "model.safetensors").is_file()
    assert "version 4" not in calls and trainer.state.global_step == 3


def test_a_weight_push_that_raises_is_one_line_naming_the_version(tmp_path, tiny_model, tiny_tokenizer, dataset):
    from grpokit.experimental.async_grpo.trainer import WeightSyncError

    class BrokenTransfer(StubTransfer):
        def send_weights(self, iterator):
            raise ConnectionResetError("peer gone\nmid-push")

    prompt = tiny_tokenizer("ab")["input_ids"]
    batch = lambda version: [  # noqa: E731
        sample(prompt, [10, 11], version=version, group=0, advantage=1.0, sampler_logps=[-4.0] * 2)
    ]
    trainer = AsyncGRPOTrainer(
        tiny_model,
        args=make_config(tmp_path, max_steps=2),
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
        rollout_worker=StubWorker(batch, []),
        weight_transfer=BrokenTransfer([]),
    )
    with pytest.raises(WeightSyncError) as caught:
        trainer.train()
    assert str(caught.value) == (
        "the weight sync of version 1 to the weight transfer BrokenTransfer failed: ConnectionResetError: peer gone "
        "mid-push"
    )


def _taken_prompts(trainer):
    """Wrap the trainer's queue reads: every sample it trains, in order."""
    taken, take = [], trainer._take_samples

    def recording(count):
        samples = take(count)
        taken.extend(samples)
        return samples

    trainer._take_samples = recording
    return taken


def test_dynamic_sampling_drops_groups_that_teach_nothing_and_refills(tmp_path, tiny_model, tiny_tokenizer, dataset):
    """Prompts of even length get the same reward on every completion (std 0: dropped), the others a reward that
    varies with the completion: only odd-length prompts are trained, every batch full, the drops counted."""

    def reward(prompts, completions, **kwargs):
        return [1.0 if len(p) % 2 == 0 else text_reward([c])[0] for p, c in zip(prompts, completions, strict=True)]

    args = make_config(tmp_path, max_steps=3, dynamic_sampling=True, dynamic_sampling_max_rounds=20, num_generations=4)
    trainer = AsyncGRPOTrainer(
        tiny_model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer
    )
    taken = _taken_prompts(trainer)
    trainer.train()
    assert trainer.state.global_step == 3
    assert len(taken) == 12  # 3 steps x 4 completions
    odd = {p for p in PROMPTS if len(p) % 2}
    assert {s.prompt for s in taken} <= odd
    groups = {}
    for s in taken:
        groups.setdefault(s.group_id, []).append(s.metrics["reward"])
    assert all(len(set(rewards)) > 1 for rewards in groups.values())  # every trained group's rewards differ
    logged = [row for row in trainer.state.log_history if "dynamic_sampling/groups_dropped" in row]
    assert logged and sum(row["dynamic_sampling/groups_dropped"] for row in logged) > 0
    assert not any(row.get("dynamic_sampling/groups_filled_total") for row in trainer.state.log_history)


def test_dynamic_sampling_fills_at_the_cap_with_advantage_zero(tmp_path, tiny_model, tiny_tokenizer, dataset, caplog):
    """Every group scores alike: after dynamic_sampling_max_rounds=1 extra round each batch is completed with the
    groups set aside, at advantage 0, with a warning; the run still ends at max_steps."""

    def constant(prompts, completions, **kwargs):
        return [0.5] * len(completions)

    args = make_config(tmp_path, max_steps=2, dynamic_sampling=True, dynamic_sampling_max_rounds=1)
    trainer = AsyncGRPOTrainer(
        tiny_model, reward_funcs=constant, args=args, train_dataset=dataset, processing_class=tiny_tokenizer
    )
    taken = _taken_prompts(trainer)
    with caplog.at_level("WARNING"):
        trainer.train()
    assert trainer.state.global_step == 2
    assert len(taken) == 8 and all(s.advantage == 0.0 for s in taken)
    assert "after 1 extra generation rounds (dynamic_sampling_max_rounds)" in caplog.text
    filled = sum(row.get("dynamic_sampling/groups_filled_total", 0.0) for row in trainer.state.log_history)
    assert filled >= 4  # two batches of two groups, all filler


def test_the_workers_own_copy_generates_with_continuous_batching(tmp_path, tiny_model, tiny_tokenizer, dataset):
    from grpokit.generation.continuous import ContinuousBatchingGenerator

    args = make_config(tmp_path, max_steps=2, use_transformers_continuous_batching=True)
    trainer = AsyncGRPOTrainer(
        tiny_model, reward_funcs=text_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer
    )
    assert isinstance(trainer.generator.inner, ContinuousBatchingGenerator)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_continuous_batching_with_a_vllm_server_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="use_transformers_continuous_batching=True: the rollout worker generates"):
        make_config(tmp_path, use_vllm=True, use_transformers_continuous_batching=True)


def test_evaluation_scores_held_out_prompts_with_one_policy_version(tmp_path, tiny_model, tiny_tokenizer, dataset):
    """eval_dataset at eval_steps, as in GRPOTrainer: the held-out prompts (and only they) are generated and scored,
    num_generations_eval completions each, logged as eval_* with the policy version that generated them (version s + 1
    after step s: one sync per step)."""
    from datasets import Dataset

    held_out = ["zz", "yyy"]
    scored = []

    def reward(prompts, completions, **kwargs):
        scored.append(list(prompts))
        return text_reward(completions)

    args = make_config(
        tmp_path,
        max_steps=2,
        eval_strategy="steps",
        eval_steps=1,
        per_device_eval_batch_size=3,
        num_generations_eval=3,
    )
    trainer = AsyncGRPOTrainer(
        tiny_model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        eval_dataset=Dataset.from_dict({"prompt": held_out}),
        processing_class=tiny_tokenizer,
    )
    trainer.train()
    evaluated = [row for row in trainer.state.log_history if "eval_loss" in row]
    assert [row["step"] for row in evaluated] == [1, 2]
    assert [row["eval_model_version"] for row in evaluated] == [2.0, 3.0]
    assert all("eval_reward" in row and "eval_completions/mean_length" in row for row in evaluated)
    eval_batches = [p for p in scored if set(p) & set(held_out)]
    assert [sorted(p) for p in eval_batches] == [["zz"] * 3, ["yyy"] * 3] * 2  # one prompt x 3 per eval batch
    assert not any(set(p) & set(held_out) and set(p) - set(held_out) for p in scored)


def test_rollout_func_generates_for_the_worker(tmp_path, tiny_model, tiny_tokenizer, dataset):
    """TRL's rollout_func(prompts, trainer) in the worker: its completions are trained (their sampler log-probabilities
    are its logprobs), its env_mask masks tokens, its extra keys reach the rewards as columns, row by row."""
    seen = []

    def rollout_func(prompts, trainer):
        ids = [tiny_tokenizer(p)["input_ids"] for p in prompts]
        completions = [[10 + len(p), 11, 12, tiny_tokenizer.eos_token_id] for p in prompts]
        return {
            "prompt_ids": ids,
            "completion_ids": completions,
            "logprobs": [[-2.0] * len(c) for c in completions],
            "env_mask": [[1, 0, 1, 1] for _ in prompts],
            "length": [len(p) for p in prompts],
        }

    def reward(prompts, completions, length, **kwargs):
        seen.extend(zip(prompts, length, strict=True))
        return [float(n % 3) for n in length]

    args = make_config(tmp_path, max_steps=2)
    trainer = AsyncGRPOTrainer(
        tiny_model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tiny_tokenizer,
        rollout_func=rollout_func,
    )
    taken = _taken_prompts(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    assert seen and all(length == len(prompt) for prompt, length in seen)
    for s in taken:
        prompt_len = len(tiny_tokenizer(s.prompt)["input_ids"])
        assert list(s.input_ids[prompt_len:]) == [10 + len(s.prompt), 11, 12, tiny_tokenizer.eos_token_id]
        assert list(s.completion_mask[prompt_len:]) == [1, 0, 1, 1]
        assert list(s.old_log_probs[prompt_len:]) == [-2.0] * 4
