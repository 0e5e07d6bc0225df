"""Shared pieces of the asynchronous-trainer tests: a TRL-style stub worker and transfer, a deterministic sampler."""

import queue

import numpy as np

from grpokit.experimental.async_grpo.async_rollout_worker import RolloutSample
from grpokit.generation import Generated

PROMPTS = ["ab", "cde", "fghi", "jk", "lmnop", "qr", "stu", "vwxyz"]


def text_reward(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [(sum(map(ord, t)) % 13) / 13 for t in texts]


def make_config(tmp_path, **overrides):
    from grpokit.experimental.async_grpo import AsyncGRPOConfig

    values = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-2,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        seed=0,
        use_vllm=False,
        shuffle_dataset=False,
        heartbeat_stale_after_s=60.0,
    )
    values.update(overrides)
    return AsyncGRPOConfig(**values)


class StubWorker:
    """TRL 1.16's `RolloutWorkerProtocol` as its own tests write it: `batch(version)` gives the samples to queue at
    start and after each weight sync; every call the trainer makes is recorded in `calls` (shared with the transfer)."""

    def __init__(self, batch, calls):
        self.rollout_buffer = queue.Queue()
        self.metrics_queue = queue.Queue()
        self.batch, self.calls, self.version = batch, calls, 0

    def start(self):
        self.calls.append("start")
        for sample in self.batch(self.version):
            self.rollout_buffer.put(sample)

    def update_model_version(self, model_version):
        self.calls.append(f"version {model_version}")
        self.version = model_version
        if "start" in self.calls:
            for sample in self.batch(model_version):
                self.rollout_buffer.put(sample)

    def stop(self):
        self.calls.append("stop")

    def check_health(self, stale_after_s):
        pass


class StubTransfer:
    def __init__(self, calls):
        self.calls = calls

    def init_weight_transfer(self):
        self.calls.append("init")

    def pause(self):
        self.calls.append("pause")

    def send_weights(self, iterator):
        self.calls.append(f"send {sum(1 for _ in iterator)}")

    def resume(self):
        self.calls.append("resume")

    def destroy(self):
        self.calls.append("destroy")


def sample(prompt_ids, completion_ids, *, version, group, advantage, sampler_logps, reward=0.5):
    """A RolloutSample as a TRL worker builds it (plain lists, TRL's fields only)."""
    return RolloutSample(
        prompt="p",
        completion="c",
        input_ids=list(prompt_ids) + list(completion_ids),
        completion_mask=[0] * len(prompt_ids) + [1] * len(completion_ids),
        old_log_probs=[0.0] * len(prompt_ids) + list(sampler_logps),
        advantage=advantage,
        model_version=version,
        group_id=group,
        metrics={"reward": reward, "reward_std": 0.1},
    )


class FixedSampler:
    """A generator whose completions depend only on the prompt and the row's place in its group, with a fixed
    sampler logprob per token: the same completions whichever trainer asks, whatever the weights."""

    def __init__(self, eos_id, logp=-4.5):
        self.eos_id, self.logp = eos_id, logp
        self.last_sync_seconds = 0.0

    def generate(self, prompt_ids, vision=None):
        completions = []
        for i, ids in enumerate(prompt_ids):
            base = (sum(ids) + 7 * (i % 2)) % 40 + 5
            completions.append([base, base + 1, base + 2 + i % 2, self.eos_id])
        return Generated(completions, [[self.logp] * len(c) for c in completions])

    def sync_weights(self, model):
        pass


def as_array(values, dtype):
    return np.asarray(values, dtype=dtype)
