"""The sampler/learner log-probability gap of `bf16=True` on CPU, on SmolLM2-135M-Instruct.

    python benchmarks/bench_bf16_gap.py

With `bf16=True` (mixed precision over float32 weights) grpokit samples on a bfloat16 copy of the weights (the column
decode step, built once per `generate` call under the trainer's autocast) and trains under autocast (the shared-prefix
scoring pass). The two compute the same function in bf16 with different kernels and batch shapes, so their
log-probabilities of the same tokens differ a little. This samples 16 completions of 32 tokens (2 prompts x 8, as
`bench_grpo.py`'s `real-short-bf16`), then computes each sampled token's log-probability three ways:

    sampler   the decode path itself, teacher-forced: the prompt prefilled by the model's forward under autocast,
              then one column step per completion token (what produced the sampling distribution)
    learner   `score_tokens` under autocast (what the loss sees)
    fp32      `score_tokens` without autocast (the float32 policy)

and prints mean / max |difference| per token, and the mean per-sequence importance ratio exp(sum(learner - sampler))
a correction would apply. On the transformers backend the loss's old log-probabilities are the learner's own
(on-policy), as in TRL; this measures what that leaves out.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_grpo  # noqa: E402


def main():
    import torch
    from datasets import Dataset
    from transformers import DynamicCache

    from grpokit.fastpath.column_step import ColumnStep
    from grpokit.fastpath.kv_cache import buffered_cache, cache_kwarg
    from grpokit.scoring import score_tokens

    torch.set_num_threads(bench_grpo.THREADS)
    torch.manual_seed(0)
    workload = bench_grpo.WORKLOADS["real-short-bf16"]
    model, tokenizer = bench_grpo.load(bench_grpo.build_model_dir(workload, ""), real=True)
    prompts = bench_grpo.prompts_for(workload, 2, tokenizer=tokenizer)
    with tempfile.TemporaryDirectory() as out:
        values = bench_grpo.config_values(out, 1, bf16=True)
        trainer = bench_grpo.make_trainer(
            "grpokit", model, tokenizer, Dataset.from_dict({"prompt": prompts}), values, bench_grpo.PhaseTimer()
        )
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts for _ in range(8)]
    completions = torch.tensor(trainer.generator.generate(prompt_ids).completion_ids)  # (16, 32): all forced to 32
    prompt = torch.tensor(prompt_ids)  # (16, 6): equal lengths, no padding
    ids, mask = (
        torch.cat([prompt, completions], 1),
        torch.ones(16, prompt.size(1) + completions.size(1), dtype=torch.long),
    )
    policy = trainer.accelerator.unwrap_model(trainer.model)
    length = completions.size(1)

    with torch.no_grad():
        fp32 = score_tokens(policy, ids, mask, length).logps
        with trainer.accelerator.autocast():
            learner = score_tokens(policy, ids, mask, length).logps
            cache = DynamicCache(config=policy.config)
            positions = torch.arange(prompt.size(1)).expand(16, -1)
            logits = policy(input_ids=prompt, position_ids=positions, **{cache_kwarg(policy.forward): cache}).logits
            step = ColumnStep(policy)
            rows = buffered_cache(cache, torch.arange(16), capacity=ids.size(1))
            sampler, last = [], logits[:, -1].float()
            for t in range(length):
                sampler.append(torch.log_softmax(last, -1).gather(1, completions[:, t : t + 1])[:, 0])
                if t + 1 < length:
                    position = torch.full((16,), prompt.size(1) + t)
                    last = step(completions[:, t], position, mask[:, : prompt.size(1) + t + 1], rows).float()
            sampler = torch.stack(sampler, 1)

    def gap(a, b):
        d = (a - b).abs()
        return f"mean {d.mean():.2e}, max {d.max():.2e}"

    ratio = torch.exp((learner - sampler).sum(1))
    print(f"SmolLM2-135M-Instruct, bf16=True, 16 completions x {length} tokens, {torch.get_num_threads()} threads")
    print(f"|sampler - learner| per token: {gap(sampler, learner)}")
    print(f"|learner - fp32|    per token: {gap(learner, fp32)}")
    print(f"|sampler - fp32|    per token: {gap(sampler, fp32)}")
    print(
        f"sequence ratio exp(sum(learner - sampler)): mean {ratio.mean():.4f}, min {ratio.min():.4f}, "
        f"max {ratio.max():.4f}"
    )


if __name__ == "__main__":
    main()
