"""The Tinker API's built-in losses, on the flat per-token tensors of one `forward_backward` request (torch only).

Every loss is a plain sum over tokens (no mean, no normalisation: the client scales its advantages and weights), as
Tinker defines them. Notation: `logps` the learner's log-probabilities of `target_tokens` (with gradient), `sampling`
the sampler's (`loss_fn_inputs["logprobs"]`), `A` the advantages, `w` the weights (1 where not given),
`ratio = exp(logps - sampling)`.

| loss_fn             | loss                                                               | loss_fn_config             |
|---------------------|--------------------------------------------------------------------|----------------------------|
| cross_entropy       | -sum(w * logps)                                                    | none                       |
| importance_sampling | -sum(w * ratio * A)                                                | none                       |
| ppo                 | -sum(w * min(ratio * A, clip(ratio, low, high) * A))               | clip_low/high_threshold    |
| cispo               | -sum(w * sg(clip(ratio, low, high)) * A * logps)                   | clip_low/high_threshold    |
| dro                 | -sum(w * (A * logps - beta / 2 * (logps - sampling) ** 2))         | beta (required)            |

(sg = stop-gradient; `low`, `high` default to 0.8 and 1.2.) `ppo` is grpokit's own clipped objective
(`grpokit.algorithms.losses`, loss type dapo with a denominator of 1): the same function GRPOTrainer trains with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from grpokit.algorithms.losses import policy_loss

DEFAULT_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


class LossInputError(ValueError):
    """A request's loss inputs or config do not fit the loss: one line naming what is wrong."""


def cross_entropy(logps: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    return -(inputs["weights"] * logps).sum()


def importance_sampling(logps: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    ratio = (logps - inputs["logprobs"]).exp()
    return -(inputs["weights"] * ratio * inputs["advantages"]).sum()


def ppo(logps: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    low, high = _clip(config)
    return policy_loss(
        logps.unsqueeze(0),
        inputs["logprobs"].unsqueeze(0),
        inputs["advantages"].unsqueeze(0),
        inputs["weights"].unsqueeze(0),
        loss_type="dapo",
        epsilon_low=1.0 - low,
        epsilon_high=high - 1.0,
        num_items_in_batch=1.0,
    )


def cispo(logps: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    low, high = _clip(config)
    weight = (logps - inputs["logprobs"]).exp().clamp(low, high).detach()
    return -(inputs["weights"] * weight * inputs["advantages"] * logps).sum()


def dro(logps: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    if "beta" not in config:
        raise LossInputError("dro needs loss_fn_config={'beta': ...} (the weight of its quadratic penalty)")
    penalty = 0.5 * float(config["beta"]) * (logps - inputs["logprobs"]) ** 2
    return -(inputs["weights"] * (inputs["advantages"] * logps - penalty)).sum()


LossFn = Callable[[Tensor, Mapping[str, Tensor], Mapping[str, float]], Tensor]

# name -> (function, the loss_fn_inputs it needs besides target_tokens, the loss_fn_config keys it reads)
LOSSES: dict[str, tuple[LossFn, tuple[str, ...], tuple[str, ...]]] = {
    "cross_entropy": (cross_entropy, (), ()),
    "importance_sampling": (importance_sampling, ("logprobs", "advantages"), ()),
    "ppo": (ppo, ("logprobs", "advantages"), tuple(DEFAULT_CLIP)),
    "cispo": (cispo, ("logprobs", "advantages"), tuple(DEFAULT_CLIP)),
    "dro": (dro, ("logprobs", "advantages"), ("beta",)),
}

# Named by the SDK, not served here: each is refused with this reason.
NOT_SERVED = {
    "gspo": "needs each sequence's boundaries inside a packed datum, which the request does not carry",
    "stable_reinforce": "needs the sampler's recorded stability information (record_stability_info), not kept here",
    "custom": "server-side custom losses are not served; the SDK runs forward_backward_custom on the client "
    "when the server does not announce them",
}


def check(loss_fn: str, input_names: set[str], config: Mapping[str, float]) -> None:
    """Raise `LossInputError` (one line) if `loss_fn` is not served or its inputs or config keys do not fit."""
    if loss_fn in NOT_SERVED:
        raise LossInputError(f"loss_fn {loss_fn!r} is not served by grpokit: it {NOT_SERVED[loss_fn]}")
    if loss_fn not in LOSSES:
        raise LossInputError(f"unknown loss_fn {loss_fn!r}; served: {', '.join(LOSSES)}")
    _, needed, config_keys = LOSSES[loss_fn]
    missing = [name for name in ("target_tokens", *needed) if name not in input_names]
    if missing:
        raise LossInputError(f"loss_fn {loss_fn!r} needs loss_fn_inputs {', '.join(missing)}")
    unknown = sorted(input_names - {"target_tokens", "weights", *needed})
    if unknown:
        raise LossInputError(f"loss_fn {loss_fn!r} takes no loss_fn_inputs {', '.join(unknown)}")
    extra = sorted(set(config) - set(config_keys))
    if extra:
        raise LossInputError(
            f"loss_fn {loss_fn!r} takes no loss_fn_config {', '.join(extra)}"
            + (f" (it reads {', '.join(config_keys)})" if config_keys else "")
        )


def tinker_loss(loss_fn: str, logps: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """The 0-dim loss of `loss_fn` over flat `(N,)` tensors: `logps` with gradient, `inputs` by name ("weights"
    defaulting to ones)."""
    check(loss_fn, set(inputs), config)
    inputs = dict(inputs)
    inputs.setdefault("weights", torch.ones_like(logps))
    return LOSSES[loss_fn][0](logps, inputs, config)


def _clip(config: Mapping[str, float]) -> tuple[float, float]:
    low = float(config.get("clip_low_threshold", DEFAULT_CLIP["clip_low_threshold"]))
    high = float(config.get("clip_high_threshold", DEFAULT_CLIP["clip_high_threshold"]))
    if not 0.0 <= low <= 1.0 <= high:
        raise LossInputError(
            f"clip thresholds must satisfy 0 <= clip_low_threshold <= 1 <= clip_high_threshold, got {low} and {high}"
        )
    return low, high
