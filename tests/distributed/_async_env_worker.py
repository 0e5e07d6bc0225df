"""Run under `accelerate launch` (2 CPU processes, gloo) by test_async_ddp.py: two steps of AsyncGRPOTrainer with an
`environment_factory`. The worker thread (rank 0) holds an environment per row of each generation batch, both
processes' rows; its sampler is scripted: row i of a batch first calls `add(n=i + 1)`, then answers "ok". Each rank
writes what it trained to rank{R}.json in the work folder.

    _async_env_worker.py WORK
"""

import json
import os
import sys

from datasets import Dataset

from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from grpokit.generation import Generated
from grpokit.tiny import build_model, build_tool_tokenizer

MADE = []  # the environments this process made


class Counter:
    def __init__(self):
        MADE.append(self)

    def reset(self, **kwargs):
        self.total = 0

    def add(self, n: int) -> str:
        """Add n.

        Args:
            n: how much
        """
        self.total += n
        return str(self.total)

    def get_reward(self):
        return float(self.total)


def main(work: str) -> None:
    tok = build_tool_tokenizer()
    model = build_model(tok)
    model.config.max_position_embeddings = 1024
    args = AsyncGRPOConfig(
        output_dir=os.path.join(work, "run"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=200,
        max_steps=2,
        max_staleness=0,
        learning_rate=1e-2,
        report_to="none",
        use_vllm=False,
        bf16=False,
        gradient_checkpointing=False,
        save_strategy="no",
        shuffle_dataset=False,
        seed=0,
    )
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(8)]
    trainer = AsyncGRPOTrainer(
        model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok, environment_factory=Counter
    )
    rank = trainer.accelerator.process_index
    if trainer.accelerator.is_main_process:
        tool_id = tok.convert_tokens_to_ids("<|tool|>")

        def generate(prompt_ids, vision=None):
            out = []
            for i, ids in enumerate(prompt_ids):
                call = f'<tool_call>{{"name": "add", "arguments": {{"n": {i + 1}}}}}</tool_call><eos>'
                out.append(tok.encode("ok<eos>" if tool_id in ids else call, add_special_tokens=False))
            return Generated(out)

        trainer.generator.inner.generate = generate
    trainer.train()
    state = trainer.accelerator.state
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(
            {
                "distributed_type": str(state.distributed_type),
                "num_processes": state.num_processes,
                "steps": trainer.state.global_step,
                "environments_made": len(MADE),  # the factory's probe (pooled) included
                "logs": [row for row in trainer.state.log_history if "loss" in row],
            },
            fh,
        )


if __name__ == "__main__":
    main(sys.argv[1])
