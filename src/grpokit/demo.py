"""The built-in demo's task: a tiny model learns, with GRPO, to answer a digit prompt `7=` by repeating the digit.

Everything is built locally (a random-init model and a character tokenizer), so `grpokit train` with no arguments
runs offline. A random policy almost never emits the right digit (reward ~0.01); the policy reaches >= 0.6 in a few
minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import random

ANSWER_LENGTH = 4


def copy_digit_reward(prompts, completions, **kwargs) -> list[float]:
    """Fraction of the first 4 completion characters equal to the prompt's digit.

    >>> copy_digit_reward(["7="], ["77x7"])
    [0.75]
    """
    rewards = []
    for prompt, completion in zip(prompts, completions, strict=True):
        text = completion if isinstance(completion, str) else completion[0]["content"]
        digit = prompt.rstrip("=")[-1]
        rewards.append(sum(ch == digit for ch in text[:ANSWER_LENGTH]) / ANSWER_LENGTH)
    return rewards


def prepare_demo(workdir: str, *, rows: int = 4000, seed: int = 0) -> tuple[str, str]:
    """Write the initial tiny model and the prompt dataset under `workdir`; return (model dir, dataset file)."""
    from grpokit.tiny import save_tiny

    model_dir = os.path.join(workdir, "initial_model")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        save_tiny(model_dir, hidden_size=64, num_layers=2, num_heads=2, seed=seed)  # head_dim 32: vLLM CPU needs >= 32
    data_path = os.path.join(workdir, "digits.jsonl")
    rng = random.Random(seed)
    # Written aside and moved into place: under a launch, every process writes it (the first one first) while the
    # first may already be reading it; a reader sees the old file or the new one, never a half-written one.
    partial = f"{data_path}.{os.getpid()}.partial"
    with open(partial, "w", encoding="utf-8") as fh:
        for _ in range(rows):
            fh.write(json.dumps({"prompt": f"{rng.randrange(10)}="}) + "\n")
    os.replace(partial, data_path)
    return model_dir, data_path
