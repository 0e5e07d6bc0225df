"""grpokit's AsyncGRPOTrainer beside TRL 1.16's on CPU, on the same samples, through TRL's plug-in points.

    PYTHONPATH=/path/to/trl:/path/to/shared/reference python benchmarks/trl_async_side_by_side.py

Needs TRL 1.16 importable (never a grpokit dependency) and `trl_async_cpu.py` (the CPU stand-ins for TRL's
FlashAttention-3 kernel and peak-FLOPs lookup). One rollout worker and one weight transfer, both written to TRL's
protocols, serve both trainers: the transfer copies the weights it is sent into a plain copy of the model, and after
each sync the worker queues one batch whose `old_log_probs` that copy computes (the sampler is the current policy, as
at staleness 0; one batch is kept in reserve, so samples are one version old when trained) with fixed advantages.
With grpokit's correction set to TRL's unit (`token_truncate`, no cap), inside TRL's clip range the two objectives
coincide: TRL's loss is -ratio x advantage with ratio = pi / pi_sampler, grpokit's -weight x advantage with the same
ratio as a detached weight on the current policy's gradient (same value, same gradient); both average over the batch's
tokens. So with a small learning rate (ratios stay within 1 +- epsilon) the losses and weights must agree; the script
prints them step by step, and which of TRL's logged metric names grpokit logs too.
"""

from __future__ import annotations

import os
import queue
import sys
import tempfile

import torch

STEPS, PROMPTS = 3, ["ab", "cde", "fghi", "jk"]


class Sampler:
    """TRL's WeightTransferProtocol into a plain copy of the policy, and the RolloutWorkerProtocol fed by it."""

    def __init__(self, model_dir, tokenizer, sample_class):
        from transformers import AutoModelForCausalLM

        self.copy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer, self.sample_class = tokenizer, sample_class
        self.rollout_buffer, self.metrics_queue = queue.Queue(), queue.Queue()
        self.version, self.started, self.group = 0, False, 0

    def init_weight_transfer(self):
        pass

    def pause(self):
        pass

    @torch.no_grad()
    def send_weights(self, iterator):
        params = dict(self.copy.named_parameters())
        for name, tensor in iterator:
            name = name.removeprefix("module.")
            if name in params:
                params[name].copy_(tensor.float())

    def resume(self):
        pass

    def destroy(self):
        pass

    def start(self):
        self.started = True
        self._queue_batch()
        self._queue_batch()  # one in reserve: TRL's dataloader fetches the next batch before the step ends

    def update_model_version(self, version):
        self.version = version
        if self.started:
            self._queue_batch()

    def stop(self):
        pass

    def check_health(self, stale_after_s):
        pass

    @torch.no_grad()
    def _queue_batch(self):
        prompt_text = PROMPTS[self.group % len(PROMPTS)]
        prompt = self.tokenizer(prompt_text)["input_ids"]
        for i, advantage in enumerate([1.0, -1.0, 0.5, -0.5]):
            completion = [10 + 3 * i, 11 + i, 12, 13 + i]
            ids = torch.tensor([prompt + completion])
            logits = self.copy(ids).logits[0, len(prompt) - 1 : -1].float()
            logps = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
            self.rollout_buffer.put(
                self.sample_class(
                    prompt=prompt_text,
                    completion="c",
                    input_ids=__import__("numpy").asarray(prompt + completion),
                    completion_mask=__import__("numpy").asarray([0] * len(prompt) + [1] * len(completion)),
                    old_log_probs=__import__("numpy").asarray([0.0] * len(prompt) + logps.tolist(), dtype="float32"),
                    advantage=advantage,
                    model_version=self.version,
                    group_id=self.group,
                    metrics={"reward": advantage, "reward_std": 0.5},
                )
            )
        self.group += 1


def train(side, model_dir, tokenizer, work):
    from datasets import Dataset

    if side == "trl":
        import trl_async_cpu

        trl_async_cpu.patch()
        from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample
    else:
        from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, RolloutSample
    values = dict(
        output_dir=os.path.join(work, side),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=STEPS,
        learning_rate=2e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        seed=0,
        dtype="float32",
        token_budget=-1,
    )
    if side == "grpokit":  # TRL's clipped ratio to the sampler, inside the clip range: a token-level IS weight
        values.update(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=1e6)
    sampler = Sampler(model_dir, tokenizer, RolloutSample)
    trainer = AsyncGRPOTrainer(
        model_dir,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=AsyncGRPOConfig(**values),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        rollout_worker=sampler,
        weight_transfer=sampler,
    )
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    weights = {n.removeprefix("module."): p.detach().clone() for n, p in trainer.model.named_parameters()}
    return rows, weights


def main() -> int:
    try:
        import trl  # noqa: F401
        import trl_async_cpu  # noqa: F401
    except ImportError as error:
        print(f"trl_async_side_by_side: {error}; put TRL 1.16 and trl_async_cpu.py on PYTHONPATH")
        return 2
    from grpokit.tiny import save_tiny

    work = tempfile.mkdtemp(prefix="trl-async-")
    model_dir = save_tiny(os.path.join(work, "model"))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ours, our_weights = train("grpokit", model_dir, tokenizer, work)
    theirs, their_weights = train("trl", model_dir, tokenizer, work)
    print("step  grpokit loss   TRL loss     grpokit grad_norm  TRL grad_norm")
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True), 1):
        print(f"{step:4d}  {a['loss']:+.6e}  {b['loss']:+.6e}  {a['grad_norm']:.6e}       {b['grad_norm']:.6e}")
    gap = max((our_weights[n] - their_weights[n]).abs().max().item() for n in our_weights if n in their_weights)
    moved = max(p.abs().max().item() for p in our_weights.values())
    print(f"largest weight difference after {STEPS} steps: {gap:.2e}")
    names_trl = {k for row in theirs for k in row}
    names_ours = {k for row in ours for k in row}
    for name in ("ratio", "kl", "batch/trained_tokens_per_step", "batch/masked_token_frac", "sample/staleness_max"):
        pairs = ", ".join(
            f"{a.get(name, float('nan')):.6g} / {b.get(name, float('nan')):.6g}"
            for a, b in zip(ours, theirs, strict=True)
        )
        print(f"{name} (grpokit / TRL, per step): {pairs}")
    print(f"TRL's logged names grpokit logs too: {sorted(names_trl & names_ours)}")
    print(f"TRL's logged names grpokit does not log: {sorted(names_trl - names_ours)}")
    return 0 if moved > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
