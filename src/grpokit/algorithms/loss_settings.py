"""`LossSettings`: the knobs of the policy loss, one frozen dataclass built once from the config and handed as is to
the loss (`losses.policy_loss`) and to its diagnostics (`diagnostics.step_diagnostics`).

Every field but the two clip bounds has the name of the `GRPOConfig` field it comes from; `epsilon_low` is the
config's `epsilon`, and `epsilon_high` falls back to it when unset, as in TRL.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class LossSettings:
    loss_type: str  # one of losses.LOSS_TYPES
    epsilon_low: float = 0.2  # clip range [1 - epsilon_low, 1 + epsilon_high]; cispo caps its weight at epsilon_high
    epsilon_high: float = 0.2
    delta: float | None = None  # cap on the unclipped ratio of the PPO-clip losses (two-sided GRPO); None: off
    importance_sampling_level: str = "token"  # "token", or "sequence" (GSPO)
    sapo_temperature_pos: float = 1.0  # SAPO gate temperatures for A > 0 / A <= 0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0  # VESPO gamma parameters for A >= 0 / A < 0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    beta: float = 0.0  # KL coefficient; 0 adds no KL term
    use_bias_correction_kl: bool = True  # multiply the KL term by the importance ratio (TRL's default)
    max_completion_length: int | None = None  # dr_grpo's constant denominator per sequence (None: the batch's T)

    @classmethod
    def from_config(cls, args) -> LossSettings:
        """The loss settings of `args` (a `GRPOConfig`, or anything with its field names)."""
        renamed = {"epsilon_low": args.epsilon, "epsilon_high": _epsilon_high(args)}
        same_name = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.name not in renamed}
        return cls(**same_name, **renamed)


def _epsilon_high(args) -> float:
    return args.epsilon_high if args.epsilon_high is not None else args.epsilon
