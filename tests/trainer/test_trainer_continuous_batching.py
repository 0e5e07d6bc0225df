"""Training with transformers' continuous batching as the generation backend (`use_transformers_continuous_batching`)."""

import math

from _trainer_helpers import changed, last_log_with, parameters, text_reward

from grpokit import GRPOTrainer
from grpokit.generation.continuous import ContinuousBatchingGenerator


def test_two_steps_generate_with_continuous_batching_and_change_the_weights(
    tiny_model, tiny_tokenizer, dataset, make_args, monkeypatch
):
    calls = []
    real = type(tiny_model).generate_batch
    monkeypatch.setattr(
        type(tiny_model), "generate_batch", lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
    )
    args = make_args(use_transformers_continuous_batching=True, top_k=5, min_p=0.05)
    trainer = GRPOTrainer(tiny_model, text_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    assert isinstance(trainer.generator, ContinuousBatchingGenerator)
    before = parameters(trainer.model)
    trainer.train()

    assert trainer.state.global_step == 2
    assert len(calls) == 2  # one generation round per step (4 rows: 2 prompts x 2 generations)
    assert changed(before, trainer.model)
    logged = last_log_with(trainer, "reward")
    assert 1 <= logged["completions/max_length"] <= 8  # max_completion_length
    assert math.isfinite(logged["loss"])
