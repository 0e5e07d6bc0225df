"""Helpers for end-to-end trainer tests: a tiny prompt dataset and a fast, CPU-only GRPOConfig."""

import pytest
from _trainer_helpers import PROMPTS


@pytest.fixture
def dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS, "answer": [p[::-1] for p in PROMPTS]})


@pytest.fixture
def chat_dataset():
    from datasets import Dataset

    return Dataset.from_dict(
        {"prompt": [[{"role": "system", "content": "be brief"}, {"role": "user", "content": p}] for p in PROMPTS]}
    )


@pytest.fixture
def make_args(tmp_path):
    """GRPOConfig for quick CPU runs: 2 steps, 4 rows per step, groups of 2, completions of at most 8 tokens."""

    def make(**overrides):
        from grpokit import GRPOConfig

        values = dict(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=8,
            max_steps=2,
            learning_rate=1e-2,  # large enough that two steps visibly move a tiny model
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            save_strategy="no",
            seed=0,
        )
        values.update(overrides)
        return GRPOConfig(**values)

    return make
