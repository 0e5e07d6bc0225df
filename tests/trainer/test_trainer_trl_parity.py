"""Numbers from TRL 1.16's GRPOTrainer (data/trl_1_16_reference.json), reproduced by ours.

How the reference was made: TRL's trainer on the tiny model of `grpokit.tiny.save_tiny` (seed 0), 3 prompts x 2
generations, with its generation replaced by the fixed completions below and two reward functions returning the
fixed rewards below (None included). For each case the file holds what TRL computed from that batch: advantages,
completion mask, token count; then, with old (and reference) log-probabilities perturbed by fixed noise (stored),
the loss of `compute_loss`, the norm of its gradient, the summed log-probabilities and entropies, and the metrics
it logged. Here the same batch goes through our rollout and loss.
"""

import json
import math
import os

import pytest
import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.generation import Generated
from grpokit.scoring import score_tokens

REFERENCE = json.load(open(os.path.join(os.path.dirname(__file__), "data", "trl_1_16_reference.json")))
VARIANTS = {
    "plain": {},
    "beta": {"beta": 0.1},
    "seq": {
        "importance_sampling_level": "sequence",
        "beta": 0.05,
        "delta": 1.5,
        "epsilon_high": 0.28,
        "top_entropy_quantile": 0.5,
        "off_policy_mask_threshold": 0.01,
        "entropy_coef": 0.01,
    },
    "iter": {
        "num_iterations": 2,
        "gradient_accumulation_steps": 1,
        "mask_truncated_completions": True,
        "temperature": 0.7,
    },
}
PROMPTS = ["ab", "cde", "fghij"]


def make_reward(i):
    def reward(prompts, completions, **kwargs):
        return [row[i] for row in REFERENCE["rewards"]]

    reward.__name__ = f"r{i}"
    return reward


class FixedCompletions:
    def generate(self, prompt_ids):
        return Generated([list(ids) for ids in REFERENCE["completions"]])

    def sync_weights(self, model):
        pass


@pytest.mark.parametrize("case", sorted(REFERENCE["cases"]))
def test_same_numbers_as_trl(case, tiny_model_dir, tmp_path):
    expected = REFERENCE["cases"][case]
    loss_type, variant = case.split("/")
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=6,
        num_generations=2,
        max_completion_length=8,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        loss_type=loss_type,
        reward_weights=[1.0, 0.5],
        **VARIANTS[variant],
    )
    trainer = GRPOTrainer(tiny_model_dir, [make_reward(0), make_reward(1)], args=args, train_dataset=_dataset())
    trainer.generator = FixedCompletions()
    trainer.model.train()
    rows = [{"prompt": p} for p in PROMPTS for _ in range(2)]
    inputs = trainer._rollout(rows, "train").micro_batches(1, shuffle=False)[0]
    assert inputs["advantages"].tolist() == pytest.approx(expected["advantages"], abs=1e-5)
    assert inputs["completion_mask"].tolist() == expected["completion_mask"]
    assert inputs["num_items_in_batch"].item() == expected["num_items_in_batch"]
    assert ("old_logps" in inputs) == (variant == "iter")  # off-policy only when a round is reused after a step

    inputs["old_logps"] = torch.tensor(expected["old_logps"])
    if "ref_logps" in expected:
        inputs["ref_logps"] = torch.tensor(expected["ref_logps"])
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    rollout_metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    trainer._metrics["train"].clear()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grad_norm = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]).norm()
    assert loss.item() == pytest.approx(expected["loss"], abs=1e-5)
    assert grad_norm.item() == pytest.approx(expected["grad_norm"], rel=1e-4)

    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        scores = score_tokens(
            trainer.model,
            ids,
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1),
            inputs["completion_ids"].size(1),
            temperature=args.temperature,
            compute_entropy=True,
        )
    active = inputs["completion_mask"].bool()
    assert scores.logps[active].sum().item() == pytest.approx(expected["logps_sum"], rel=1e-5)
    assert scores.entropies[active].sum().item() == pytest.approx(expected["entropies_sum"], rel=1e-5)

    ours = rollout_metrics | {name: values[-1] for name, values in trainer._metrics["train"].items()}
    # The same metric names, no more, no fewer (step_time, a timing, is logged by training_step, not called here).
    assert set(ours) == set(expected["metrics"]) - {"step_time"}
    for name, value in ours.items():
        if expected["metrics"][name] is None:
            assert math.isnan(value), name
        else:
            assert value == pytest.approx(expected["metrics"][name], abs=1e-5), name


def _dataset():
    from datasets import Dataset

    return Dataset.from_dict({"prompt": PROMPTS})
