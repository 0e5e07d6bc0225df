"""Run under `accelerate launch` by test_vision_ddp.py: 2 steps of GRPOTrainer on a tiny LLaVA over two prompts, one
with an image and one without, so in every step one process's batch has no image and its vision tower gets no
gradient. Each process writes vision-rank<R>.json: its distributed type, process count, steps, whether its batches
had images, and its final weights' checksum."""

import json
import os

import datasets

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.tiny import build_vlm, random_image

HAD_IMAGES = []


def reward(completions, images=None, **kwargs):
    HAD_IMAGES.append(any(images or []))
    return [float(len(c[0]["content"]) % 3) for c in completions]


if __name__ == "__main__":
    rows = [
        {"prompt": [{"role": "user", "content": "Describe"}], "images": [random_image(0)]},
        {"prompt": [{"role": "user", "content": "Say hi"}], "images": []},
    ]
    args = GRPOConfig(
        output_dir="run",
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        max_steps=2,
        learning_rate=1e-2,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=1,
    )
    model, processor = build_vlm("llava")
    trainer = GRPOTrainer(
        model, reward, args=args, train_dataset=datasets.Dataset.from_list(rows), processing_class=processor
    )
    trainer.train()
    state = trainer.accelerator.state
    checksum = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
    with open(f"vision-rank{os.environ.get('RANK', '0')}.json", "w") as fh:
        json.dump(
            {
                "type": str(state.distributed_type),
                "processes": state.num_processes,
                "steps": trainer.state.global_step,
                "find_unused": args.ddp_find_unused_parameters,
                "had_images": HAD_IMAGES,
                "checksum": checksum,
            },
            fh,
        )
