"""Run by test_vllm_tensor_parallel.py under `accelerate launch` (2 CPU processes): trains a few steps with one vLLM
engine sharded over both processes, then checks that each rank gets back its own prompts' completions."""

import hashlib
import json
import os
import sys

import torch
from datasets import Dataset

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.demo import copy_digit_reward


@torch.no_grad()
def greedy(model, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def main(model_dir: str, out_dir: str) -> None:
    args = GRPOConfig(
        output_dir=out_dir,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_tensor_parallel_size=2,
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=4,
        max_steps=3,
        logging_steps=1,
        learning_rate=1e-2,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        beta=0.0,
    )
    data = Dataset.from_list([{"prompt": f"{i % 10}="} for i in range(64)])
    trainer = GRPOTrainer(model_dir, copy_digit_reward, args=args, train_dataset=data)
    engine_calls, process_states, engine_generate = [], [], trainer.generator.llm.generate

    def recorded(*args, **kwargs):  # what this rank's engine sampled, all of its group's prompts
        outputs = engine_generate(*args, **kwargs)
        engine_calls.append([list(sample.token_ids) for output in outputs for sample in output.outputs])
        return outputs

    def generate(prompts, *args, **kwargs):  # the process's own random state before each round
        process_states.append(hashlib.sha256(torch.random.get_rng_state().numpy().tobytes()).hexdigest())
        return generator_generate(prompts, *args, **kwargs)

    trainer.generator.llm.generate = recorded
    generator_generate, trainer.generator.generate = trainer.generator.generate, generate
    trainer.train()
    rank = trainer.accelerator.process_index
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    trainer.generator.sync_weights(model)
    trainer.generator.sampling.update(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = [[5, 6, 7]] if rank == 0 else [[8, 9], [10, 11, 12]]  # uneven shares: the slice must follow
    completions = trainer.generator.generate(prompts).completion_ids
    record = {
        "distributed_type": str(trainer.accelerator.distributed_type),
        "num_processes": trainer.accelerator.num_processes,
        "world_size": torch.distributed.get_world_size(),
        "completions": completions,
        "expected": [greedy(model, p, 6) for p in prompts],
        "rewards": [row["reward"] for row in trainer.state.log_history if "reward" in row],
        "engine_calls": engine_calls,
        "process_states": process_states,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
