"""A vision-language GRPO script written for TRL's `GRPOTrainer` (an `image` column and conversational prompts, as
TRL 1.16 takes them), run with grpokit.

The import below is the only line that differs from the TRL version (`from trl import GRPOConfig, GRPOTrainer`).
The processor (AutoProcessor) is loaded from the model's path. Everything runs offline on a local model; make a tiny
one with

    python -c "from grpokit.tiny import save_tiny_vlm; save_tiny_vlm('tiny-vlm', 'llava')"
    python examples/trl_vlm_script.py --model_name_or_path tiny-vlm --output_dir runs/tiny-vlm --max_steps 2
"""

import argparse

import numpy as np
from datasets import Dataset
from PIL import Image

from grpokit import GRPOConfig, GRPOTrainer


def colour_image(rgb):
    return Image.fromarray(np.full((32, 32, 3), rgb, dtype=np.uint8))


def reward_names_colour(completions, answer, **kwargs):
    """1 when the completion names the image's colour."""
    return [
        float(expected in completion[0]["content"].lower())
        for completion, expected in zip(completions, answer, strict=True)
    ]


def reward_short(completions, **kwargs):
    return [-len(completion[0]["content"]) / 64 for completion in completions]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path", default="Qwen/Qwen2.5-VL-3B-Instruct")
    parser.add_argument("--output_dir", default="grpo-vlm-output")
    parser.add_argument("--max_steps", type=int, default=2)
    cli = parser.parse_args()

    colours = {"red": (220, 20, 20), "green": (20, 200, 20), "blue": (20, 20, 220), "white": (250, 250, 250)}
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": "What colour is this image?"}] for _ in colours] * 2,
            "image": [colour_image(rgb) for rgb in colours.values()] * 2,
            "answer": list(colours) * 2,
        }
    )
    training_args = GRPOConfig(
        output_dir=cli.output_dir,
        max_steps=cli.max_steps,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        learning_rate=1e-5,
        beta=0.04,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        log_completions=True,
        num_completions_to_print=2,
        seed=42,
    )
    trainer = GRPOTrainer(
        model=cli.model_name_or_path,
        reward_funcs=[reward_names_colour, reward_short],
        args=training_args,
        train_dataset=dataset,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    main()
