"""Run under `accelerate launch` (2 CPU processes, gloo) by test_async_ddp.py: three steps of AsyncGRPOTrainer, its
worker thread (local sampler) on rank 0. Each rank writes what it trained to rank{R}.json in the work folder.

    _async_worker.py WORK [MAX_STALENESS]
"""

import json
import os
import sys

from datasets import Dataset

from grpokit import sharding
from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from grpokit.tiny import build_model, build_tokenizer


def main(work: str, max_staleness: int) -> None:
    if os.environ.get("ACCELERATE_USE_FSDP") == "true":  # accelerate runs FSDP on CPU processes only with the shim
        import _fsdp_cpu_shim

        _fsdp_cpu_shim.install()
    tokenizer = build_tokenizer()
    args = AsyncGRPOConfig(
        output_dir=os.path.join(work, "run"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=6,
        max_steps=3,
        max_staleness=max_staleness,
        learning_rate=5e-2,
        report_to="none",
        use_vllm=False,
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        shuffle_dataset=False,
        seed=0,
    )
    dataset = Dataset.from_dict({"prompt": ["ab", "cde", "fghi", "jk", "lmnop", "qr", "stu", "vwxyz"]})
    trainer = AsyncGRPOTrainer(
        build_model(tokenizer),
        lambda completions, **kwargs: [len(c) / 6 for c in completions],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    slices = []
    take = trainer._next_batch

    def recorded():
        rollout = take()
        ids = rollout.prompt_ids[rollout.prompt_mask.bool()].tolist()
        slices.append({"rows": rollout.prompt_ids.size(0), "tokens": ids, "batch": rollout.prompts})
        return rollout

    trainer._next_batch = recorded
    trainer.train()
    state = trainer.accelerator.state
    rank = state.process_index
    with sharding.full_parameters(trainer.accelerator.unwrap_model(trainer.model)) as params:
        total = float(sum(p.detach().double().sum() for p in params))
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(
            {
                "distributed_type": str(state.distributed_type),
                "wrapper": type(trainer.model_wrapped).__name__,
                "partitioned": sharding.is_sharded(trainer.accelerator.unwrap_model(trainer.model)),
                "num_processes": state.num_processes,
                "steps": trainer.state.global_step,
                "slices": slices,
                "checksum": total,
                "model_version": trainer.model_version,
                "logs": [row for row in trainer.state.log_history if "loss" in row],
            },
            fh,
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
