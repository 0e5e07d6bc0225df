"""Run by test_ddp.py, under `accelerate launch` (2 CPU processes) or alone: a few GRPO steps on a global batch of 16
completions, then each rank records what it really ran under and its final weights.

Generation is made deterministic (a completion is a function of its prompt and of its place in the prompt's group),
so one process and two see the same completions, and their final weights can be compared."""

import json
import os
import sys

import torch
from datasets import Dataset

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.demo import copy_digit_reward, prepare_demo
from grpokit.generation import Generated
from grpokit.models import ignore_boolean_buffers


class ScriptedCompletions:
    """Completion k of a prompt's group: four ids that depend on the prompt and on k, so rewards vary in a group."""

    def __init__(self, tokenizer):
        self.digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]

    def generate(self, prompt_ids):
        seen = {}
        out = []
        for prompt in prompt_ids:
            k = seen[tuple(prompt)] = seen.get(tuple(prompt), -1) + 1
            out.append([self.digits[(sum(prompt) * (j + 1) + k * (j + 2)) % 10] for j in range(4)])
        return Generated(out)

    def sync_weights(self, model):
        pass


def main(work: str, per_device: int) -> None:
    from accelerate import PartialState

    state = PartialState(cpu=True)
    with state.local_main_process_first():
        model_dir, _ = prepare_demo(work, rows=64)
    args = GRPOConfig(
        output_dir=os.path.join(work, "out"),
        per_device_train_batch_size=per_device,
        num_generations=8,
        max_completion_length=4,
        max_steps=3,
        logging_steps=1,
        learning_rate=1e-3,
        beta=0.04,  # a reference model too
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
    )
    data = Dataset.from_list([{"prompt": f"{i % 10}="} for i in range(64)])
    trainer = GRPOTrainer(model_dir, copy_digit_reward, args=args, train_dataset=data)
    trainer.generator = ScriptedCompletions(trainer.processing_class)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    policy.model.layers[0].register_buffer("flag", torch.ones(1, dtype=torch.bool))  # what DDP cannot broadcast
    ignored = ignore_boolean_buffers(policy)
    trainer.train()
    wrapped = trainer.model_wrapped
    record = {
        "distributed_type": str(trainer.accelerator.distributed_type),
        "num_processes": trainer.accelerator.num_processes,
        "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "wrapper": type(wrapped).__name__,
        "ignored": ignored,
        "ddp_ignores": sorted(getattr(wrapped, "parameters_to_ignore", None) or []),
        "weights": [p.detach().flatten().tolist() for p in policy.parameters()],
        "steps": trainer.state.global_step,
    }
    with open(os.path.join(work, f"rank{trainer.accelerator.process_index}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
