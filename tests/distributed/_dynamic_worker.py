"""Run under `accelerate launch` by test_dynamic_sampling_ddp.py: 2 optimizer steps of GRPOTrainer with dynamic
sampling on 8 prompts (p0..p7), unshuffled, groups of 2, one group per process per round. Only GOOD prompts have
rewards that differ. Each process writes dynamic-rank<R>.json in the working directory: its distributed type and
process count, the prompts of each round it scored, the prompts of each batch it trained on, and the logged
dynamic-sampling metrics."""

import json
import os

import datasets
from transformers import TrainerCallback

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.tiny import build_model, build_tokenizer

GOOD = ("p1", "p4", "p7")
ROUNDS, TRAINED, LOGGED = [], [], []


def reward(prompts, completions, **kwargs):
    ROUNDS.append(list(prompts))
    return [float(i) if p in GOOD else 1.0 for i, p in enumerate(prompts)]


class Logged(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "dynamic_sampling/rounds" in logs:
            LOGGED.append({k: v for k, v in logs.items() if k.startswith("dynamic_sampling/")})


class Spy(GRPOTrainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        TRAINED.append(self.processing_class.batch_decode(inputs["prompt_ids"], skip_special_tokens=True))
        return super().compute_loss(model, inputs, *args, **kwargs)


if __name__ == "__main__":
    args = GRPOConfig(
        output_dir="run",
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=2,
        logging_steps=1,
        shuffle_dataset=False,
        dynamic_sampling=True,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        disable_tqdm=True,
    )
    tokenizer = build_tokenizer()
    trainer = Spy(
        build_model(tokenizer),
        reward,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": [f"p{i}" for i in range(8)]}),
        processing_class=tokenizer,
        callbacks=[Logged()],
    )
    trainer.train()
    state = trainer.accelerator.state
    with open(f"dynamic-rank{trainer.accelerator.process_index}.json", "w") as fh:
        json.dump(
            {
                "distributed_type": str(state.distributed_type),
                "num_processes": state.num_processes,
                "world_size_env": os.environ.get("WORLD_SIZE"),
                "rounds": ROUNDS,
                "trained": TRAINED,
                "logged": LOGGED,
            },
            fh,
        )
