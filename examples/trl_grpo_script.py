"""A GRPO training script written for TRL's `GRPOTrainer`, run with grpokit.

The import below is the only line that differs from the TRL version (`from trl import GRPOConfig, GRPOTrainer`).
Everything runs offline on a local model; make a tiny one with

    python -c "from grpokit.tiny import save_tiny; save_tiny('tiny-model')"
    python examples/trl_grpo_script.py --model_name_or_path tiny-model --output_dir runs/tiny --max_steps 4
"""

import argparse

import torch
from datasets import Dataset

from grpokit import GRPOConfig, GRPOTrainer


def reward_len(completions, **kwargs):
    """TRL's quick-start reward: completions close to 20 characters are best."""
    return [-abs(20 - len(completion[0]["content"])) / 20 for completion in completions]


def reward_mentions_answer(completions, answer, **kwargs):
    """Uses the dataset's `answer` column; None (no opinion) for empty completions."""
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion[0]["content"]
        rewards.append(None if not text else float(expected in text))
    return rewards


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--output_dir", default="grpo-output")
    parser.add_argument("--max_steps", type=int, default=4)
    cli = parser.parse_args()

    questions = [("What is 2 + 3?", "5"), ("Name a primary colour.", "red"), ("What is 10 - 4?", "6")]
    questions += [("Spell 'cat' backwards.", "tac"), ("How many legs has a spider?", "8")]
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": q}] for q, _ in questions] * 4,
            "answer": [a for _, a in questions] * 4,
        }
    )

    training_args = GRPOConfig(
        output_dir=cli.output_dir,
        max_steps=cli.max_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=16,
        learning_rate=1e-5,
        beta=0.04,
        loss_type="dapo",
        reward_weights=[1.0, 2.0],
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        report_to="none",
        gradient_checkpointing=False,
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),  # fp32 on a CPU-only machine
        log_completions=True,
        num_completions_to_print=4,
        seed=42,
    )
    trainer = GRPOTrainer(
        model=cli.model_name_or_path,
        reward_funcs=[reward_len, reward_mentions_answer],
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    main()
