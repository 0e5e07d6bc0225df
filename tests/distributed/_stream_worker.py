"""Run under `accelerate launch` by test_streaming_ddp.py: 3 steps of GRPOTrainer on a streaming dataset of 10
prompts (p0..p9), unshuffled, 2 generations; each process writes the prompts of each of its rounds to
stream-rank<R>.json in the working directory. Arguments: rows per process and generation batch, file-shards."""

import json
import os
import sys

import datasets

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.tiny import build_model, build_tokenizer

ROUNDS = []


def recorder(prompts, completions, **kwargs):
    ROUNDS.append(list(prompts))
    return [float(len(c)) for c in completions]


if __name__ == "__main__":
    rows, shards = int(sys.argv[1]), int(sys.argv[2])
    source = datasets.Dataset.from_dict({"prompt": [f"p{i}" for i in range(10)]})
    args = GRPOConfig(
        output_dir="run",
        per_device_train_batch_size=rows,
        num_generations=2,
        max_completion_length=4,
        max_steps=3,
        shuffle_dataset=False,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
    )
    tokenizer = build_tokenizer()
    trainer = GRPOTrainer(
        build_model(tokenizer),
        recorder,
        args=args,
        train_dataset=source.to_iterable_dataset(num_shards=shards),
        processing_class=tokenizer,
    )
    trainer.train()
    with open(f"stream-rank{os.environ.get('RANK', '0')}.json", "w") as fh:
        json.dump(ROUNDS, fh)
