"""Run under `accelerate launch` (2 CPU processes, gloo) by test_agents_ddp.py: two steps of GRPOTrainer with an
`environment_factory`, tool calls forced on rank 0 only, so the two processes need different numbers of tool rounds.

Rank 0's backend is scripted: every first turn calls `bump(amount=3)`; in the turn after the first tool turn, its
first rollout calls `bump(amount=4)` again; every later turn is the real model's. Rank 1 generates everything with
the real model (a random tiny model writes no well-formed call), so it has no tool round of its own and only takes
part in rank 0's (a throwaway turn each). Each rank writes what it saw to rank{R}.json in the work folder.
"""

import json
import os
import sys

from datasets import Dataset

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.generation import Generated
from grpokit.tiny import build_model, build_tool_tokenizer

PER_DEVICE = 4
CALLS: list[int] = []  # this process's bump amounts, in order


class Counter:
    """An environment: a counter per rollout; its reward is 10 per call plus the counter's total."""

    def reset(self, **row):
        self.calls = 0
        self.total = 0
        return None

    def bump(self, amount: int) -> str:
        """Add to the counter.

        Args:
            amount: how much to add
        """
        CALLS.append(amount)
        self.calls += 1
        self.total += amount
        return str(self.total)

    def get_reward(self) -> float:
        return float(10 * self.calls + self.total)


def call(amount: int) -> str:
    return f'<tool_call>{{"name": "bump", "arguments": {{"amount": {amount}}}}}</tool_call><eos>'


class RankZeroCalls:
    """The trainer's backend on rank 0 with scripted turns (see the module's docstring); logs the number of rows of
    every `generate` call, on every rank."""

    def __init__(self, inner, tokenizer, rank: int):
        self.inner, self.tokenizer, self.rank = inner, tokenizer, rank
        self.tool_token = tokenizer.convert_tokens_to_ids("<|tool|>")
        self.sizes: list[int] = []
        self.tool_turns: list[list[int]] = []  # per call, how many tool turns each prompt holds

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompt_ids):
        self.sizes.append(len(prompt_ids))
        turns = [list(p).count(self.tool_token) for p in prompt_ids]
        self.tool_turns.append(turns)
        out = self.inner.generate(prompt_ids)
        if self.rank != 0:
            return out
        ids = [list(c) for c in out.completion_ids]
        for i, n in enumerate(turns):
            if n == 0:
                ids[i] = self.tokenizer.encode(call(3), add_special_tokens=False)
            elif n == 1 and i == 0:
                ids[i] = self.tokenizer.encode(call(4), add_special_tokens=False)
        return Generated(ids, out.logprobs)


def main() -> None:
    work = sys.argv[1]
    tokenizer = build_tool_tokenizer()
    model = build_model(tokenizer, seed=0)
    model.config.max_position_embeddings = 1024  # the tool's schema alone is a few hundred characters (tokens)
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(8)]
    args = GRPOConfig(
        output_dir=os.path.join(work, "out"),
        per_device_train_batch_size=PER_DEVICE,
        num_generations=2,
        max_completion_length=160,  # room for a second call after the first call and its tool turn
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=Dataset.from_list(rows),
        environment_factory=Counter,
    )
    rank = trainer.accelerator.process_index
    backend = RankZeroCalls(trainer.generator, tokenizer, rank)
    trainer.generator = backend
    trainer.train()
    loop = trainer.agent.last
    record = {
        "distributed_type": str(trainer.accelerator.distributed_type),
        "num_processes": trainer.accelerator.num_processes,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "steps": trainer.state.global_step,
        "calls": CALLS,
        "generate_sizes": backend.sizes,
        "tool_turns": backend.tool_turns,
        "last_batch": {
            "calls_per_rollout": [len(c) for c in loop.calls],
            "totals": [e.total for e in trainer.environments],
            "tool_mask_zeros": [mask.count(0) for mask in loop.tool_mask],
            "roles": [[m["role"] for m in c] for c in loop.completions],
        },
        "reward_func_names": list(trainer.reward_func_names),
        "logs": [row for row in trainer.state.log_history if "loss" in row],
    }
    with open(os.path.join(work, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
