"""Dynamic sampling against the plain run on the built-in demo task (a tiny random-init model learns to repeat the
digit of prompts like `7=`; reward = fraction of its 4 answer characters equal to the digit).

    python benchmarks/bench_dynamic_sampling.py [--steps 100] [--seeds 0 1 2 3]

Three runs per seed, with the demo's settings (groups of 8, 32 completions per optimizer step, 4-token completions,
lr 3e-3 constant, loss dapo, fp32 CPU, 2 torch threads) and the same seed: `plain` and `dynamic_sampling` (defaults:
only groups with all-equal rewards dropped, at most 10 extra rounds) for `--steps` optimizer steps, then
`plain_same_generation`: the plain run given as many optimizer steps as the dynamic run generated rounds, i.e. the
same number of generated completions.

Printed per run: completions and completion tokens generated (every round, dropped groups included), the mean reward
over everything generated, reward per generated completion token (sum of all rewards / tokens generated), the mean
reward of the last 20% of the rounds scored, and the final reward: the mean reward of 8 sampled completions
(temperature 1) on each of the 10 digits with the final weights. `rounds` is generation rounds per optimizer step.
Wall time is printed too, not judged: it depends on what else runs on the machine. With several seeds, a last block
gives each run's mean over the seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def run(workdir: str, *, dynamic: bool, steps: int, seed: int, name: str) -> dict:
    import torch
    from datasets import Dataset

    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.demo import copy_digit_reward, prepare_demo

    torch.set_num_threads(2)
    model_dir, data_path = prepare_demo(workdir, seed=0)
    with open(data_path, encoding="utf-8") as fh:
        dataset = Dataset.from_list([json.loads(line) for line in fh])
    generated = {"completions": 0, "tokens": 0, "reward": 0.0, "per_step": []}

    def reward(prompts, completions, completion_ids, **kwargs):
        values = copy_digit_reward(prompts, completions)
        generated["completions"] += len(values)
        generated["tokens"] += sum(len(ids) for ids in completion_ids)
        generated["reward"] += sum(values)
        generated["per_step"].append(sum(values) / len(values))
        return values

    reward.__name__ = "copy_digit_reward"
    args = GRPOConfig(
        output_dir=os.path.join(workdir, name),
        num_generations=8,
        per_device_train_batch_size=32,
        max_completion_length=4,
        temperature=1.0,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        max_steps=steps,
        logging_steps=10,
        beta=0.0,
        loss_type="dapo",
        gradient_checkpointing=False,
        bf16=False,
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=seed,
        dynamic_sampling=dynamic,
    )
    trainer = GRPOTrainer(model_dir, reward, args=args, train_dataset=dataset)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start

    # final: 8 sampled completions for each digit, with the trained weights
    prompts = [f"{d}=" for d in range(10) for _ in range(8)]
    tok = trainer.processing_class
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    out = trainer.generator.generate(ids)
    texts = tok.batch_decode(out.completion_ids, skip_special_tokens=True)
    final = sum(copy_digit_reward(prompts, texts)) / len(prompts)
    tail = generated["per_step"][-max(1, len(generated["per_step"]) // 5) :]
    return {
        "run": name,
        "optimizer_steps": steps,
        "completions_generated": generated["completions"],
        "completion_tokens_generated": generated["tokens"],
        "mean_reward_generated": generated["reward"] / generated["completions"],
        "reward_per_generated_token": generated["reward"] / max(1, generated["tokens"]),
        "mean_reward_last_20pct_rounds": sum(tail) / len(tail),
        "final_reward": final,
        "mean_rounds_per_step": generated["completions"] / (steps * 32),
        "seconds": round(seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    options = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for seed in options.seeds:
            plans = [("plain", False, options.steps), ("dynamic_sampling", True, options.steps)]
            for name, dynamic, steps in plans:
                result = run(workdir, dynamic=dynamic, steps=steps, seed=seed, name=name)
                result["seed"] = seed
                results.append(result)
                print(json.dumps(result), flush=True)
            matched = results[-1]["completions_generated"] // 32  # the dynamic run's generation rounds
            result = run(workdir, dynamic=False, steps=matched, seed=seed, name="plain_same_generation")
            result["seed"] = seed
            results.append(result)
            print(json.dumps(result), flush=True)
    print()
    header = (
        f"{'run':<23}{'seed':>5}{'steps':>7}{'completions':>13}{'tokens':>9}{'reward/token':>14}"
        f"{'mean reward':>13}{'last 20%':>10}{'final':>8}{'rounds':>8}{'s':>8}"
    )
    print(header)
    for r in results:
        print(
            f"{r['run']:<23}{str(r['seed']):>5}{r['optimizer_steps']:>7}{r['completions_generated']:>13}"
            f"{r['completion_tokens_generated']:>9}{r['reward_per_generated_token']:>14.4f}"
            f"{r['mean_reward_generated']:>13.3f}{r['mean_reward_last_20pct_rounds']:>10.3f}{r['final_reward']:>8.3f}"
            f"{r['mean_rounds_per_step']:>8.2f}{r['seconds']:>8.1f}"
        )
    if len(options.seeds) > 1:
        print()
        for name in dict.fromkeys(r["run"] for r in results):
            mine = [r for r in results if r["run"] == name]
            mean = {k: sum(r[k] for r in mine) / len(mine) for k in mine[0] if k not in ("run", "seed")}
            print(
                f"{name:<23}{'mean':>5}{mean['optimizer_steps']:>7.0f}{mean['completions_generated']:>13.0f}"
                f"{mean['completion_tokens_generated']:>9.0f}{mean['reward_per_generated_token']:>14.4f}"
                f"{mean['mean_reward_generated']:>13.3f}{mean['mean_reward_last_20pct_rounds']:>10.3f}"
                f"{mean['final_reward']:>8.3f}{mean['mean_rounds_per_step']:>8.2f}{mean['seconds']:>8.1f}"
            )


if __name__ == "__main__":
    main()
