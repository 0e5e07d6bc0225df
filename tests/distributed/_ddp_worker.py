"""Run by test_ddp.py under `accelerate launch` (2 CPU processes): a few GRPO steps under DDP, then each rank
records what it really ran under and a fingerprint of its final weights."""

import json
import os
import sys

import torch
from datasets import Dataset

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.demo import copy_digit_reward, prepare_demo
from grpokit.models import ignore_boolean_buffers


def main(work: str) -> None:
    from accelerate import PartialState

    state = PartialState(cpu=True)
    with state.local_main_process_first():
        model_dir, _ = prepare_demo(work, rows=64)
    args = GRPOConfig(
        output_dir=os.path.join(work, "out"),
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=4,
        max_steps=3,
        logging_steps=1,
        learning_rate=1e-2,
        beta=0.04,  # a reference model too
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
    )
    data = Dataset.from_list([{"prompt": f"{i % 10}="} for i in range(64)])
    trainer = GRPOTrainer(model_dir, copy_digit_reward, args=args, train_dataset=data)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    policy.model.layers[0].register_buffer("flag", torch.ones(1, dtype=torch.bool))  # what DDP cannot broadcast
    ignored = ignore_boolean_buffers(policy)
    trainer.train()
    wrapped = trainer.model_wrapped
    record = {
        "distributed_type": str(trainer.accelerator.distributed_type),
        "num_processes": trainer.accelerator.num_processes,
        "world_size": torch.distributed.get_world_size(),
        "wrapper": type(wrapped).__name__,
        "ignored": ignored,
        "ddp_ignores": sorted(getattr(wrapped, "parameters_to_ignore", [])),
        "weights": [float(p.double().sum()) for p in policy.parameters()],
        "steps": trainer.state.global_step,
    }
    with open(os.path.join(work, f"rank{trainer.accelerator.process_index}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1])
