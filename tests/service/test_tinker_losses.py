"""Tinker's losses against values worked out by hand (grpokit.service.losses)."""

import math

import pytest
import torch

from grpokit.service.losses import LossInputError, check, tinker_loss

# Two tokens: learner log-probs, sampler log-probs, advantages. ratio = exp(logps - sampling) = [e^0.5, e^-1].
LOGPS = [-1.0, -2.0]
SAMPLING = [-1.5, -1.0]
ADV = [2.0, -1.0]
R1, R2 = math.exp(0.5), math.exp(-1.0)  # 1.6487, 0.3679


def _inputs(**extra):
    inputs = {
        "target_tokens": torch.tensor([3, 4]),
        "logprobs": torch.tensor(SAMPLING),
        "advantages": torch.tensor(ADV),
    }
    inputs.update({k: torch.tensor(v) for k, v in extra.items()})
    return inputs


def _loss_and_grad(loss_fn, inputs, config=None):
    logps = torch.tensor(LOGPS, requires_grad=True)
    loss = tinker_loss(loss_fn, logps, inputs, config or {})
    loss.backward()
    return loss.item(), logps.grad.tolist()


def test_cross_entropy_is_the_weighted_negative_log_likelihood_sum():
    inputs = {"target_tokens": torch.tensor([3, 4]), "weights": torch.tensor([1.0, 0.5])}
    loss, grad = _loss_and_grad("cross_entropy", inputs)
    assert loss == pytest.approx(1.0 * 1.0 + 0.5 * 2.0)  # -(1 * -1 + 0.5 * -2) = 2
    assert grad == pytest.approx([-1.0, -0.5])


def test_importance_sampling_sums_ratio_times_advantage():
    loss, grad = _loss_and_grad("importance_sampling", _inputs())
    assert loss == pytest.approx(-(R1 * 2.0 + R2 * -1.0))  # -(3.2974 - 0.3679) = -2.9295
    assert grad == pytest.approx([-R1 * 2.0, R2 * 1.0])  # d/dlogp of -ratio * A = -ratio * A


def test_ppo_clips_the_ratio_that_would_gain_and_keeps_the_pessimistic_term():
    # token 1: ratio 1.6487 > 1.2 with A = 2 > 0: min(3.297, 2.4) = 2.4, clipped: no gradient.
    # token 2: ratio 0.3679 < 0.8 with A = -1: min(-0.3679, -0.8) = -0.8, clipped: no gradient.
    loss, grad = _loss_and_grad("ppo", _inputs())
    assert loss == pytest.approx(-(2.4 - 0.8))
    assert grad == pytest.approx([0.0, 0.0])
    # Wider thresholds: neither is clipped, so ppo equals importance_sampling in value and gradient.
    wide = {"clip_low_threshold": 0.1, "clip_high_threshold": 3.0}
    ppo_loss, ppo_grad = _loss_and_grad("ppo", _inputs(), wide)
    is_loss, is_grad = _loss_and_grad("importance_sampling", _inputs())
    assert ppo_loss == pytest.approx(is_loss) and ppo_grad == pytest.approx(is_grad)


def test_cispo_weights_the_log_likelihood_by_the_clipped_detached_ratio():
    # weights clip(ratio, 0.8, 1.2) = [1.2, 0.8]; loss = -(1.2 * 2 * -1 + 0.8 * -1 * -2) = -(-2.4 + 1.6) = 0.8
    loss, grad = _loss_and_grad("cispo", _inputs())
    assert loss == pytest.approx(0.8)
    assert grad == pytest.approx([-1.2 * 2.0, -0.8 * -1.0])  # the weight is detached: d/dlogp = -w * A


def test_dro_subtracts_the_quadratic_penalty_on_the_log_ratio():
    # -(A * logp - beta / 2 * (logp - q)^2): token 1: 2 * -1 - 0.05 * 0.25; token 2: -1 * -2 - 0.05 * 1
    loss, grad = _loss_and_grad("dro", _inputs(), {"beta": 0.1})
    assert loss == pytest.approx(-((-2.0 - 0.0125) + (2.0 - 0.05)))
    assert grad == pytest.approx([-(2.0 - 0.1 * 0.5), -(-1.0 - 0.1 * -1.0)])


def test_weights_silence_tokens_in_every_loss():
    for loss_fn, config in [("importance_sampling", {}), ("ppo", {}), ("cispo", {}), ("dro", {"beta": 0.1})]:
        _, grad = _loss_and_grad(loss_fn, _inputs(weights=[0.0, 1.0]), config)
        assert grad[0] == 0.0, loss_fn


@pytest.mark.parametrize(
    "loss_fn, names, config, says",
    [
        ("gspo", {"target_tokens"}, {}, "not served"),
        ("stable_reinforce", {"target_tokens"}, {}, "not served"),
        ("nll", {"target_tokens"}, {}, "unknown loss_fn 'nll'"),
        ("ppo", {"target_tokens", "advantages"}, {}, "needs loss_fn_inputs logprobs"),
        ("cross_entropy", {"target_tokens", "advantages"}, {}, "takes no loss_fn_inputs advantages"),
        ("ppo", {"target_tokens", "logprobs", "advantages"}, {"clip_low": 0.9}, "takes no loss_fn_config clip_low"),
    ],
)
def test_bad_requests_get_one_line_naming_the_problem(loss_fn, names, config, says):
    with pytest.raises(LossInputError, match=says) as info:
        check(loss_fn, names, config)
    assert "\n" not in str(info.value)


def test_dro_without_beta_and_crossed_thresholds_are_refused():
    with pytest.raises(LossInputError, match="beta"):
        tinker_loss("dro", torch.tensor(LOGPS), _inputs(), {})
    with pytest.raises(LossInputError, match="clip_low_threshold <= 1"):
        tinker_loss("ppo", torch.tensor(LOGPS), _inputs(), {"clip_low_threshold": 1.1})
