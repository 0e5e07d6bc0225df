"""`LossSettings`: built once from the config, handed as is to the loss and to its diagnostics."""

import dataclasses

import torch

from grpokit import GRPOConfig
from grpokit.algorithms import LOSS_TYPES, LossSettings, policy_loss
from grpokit.algorithms.diagnostics import loss_diagnostics, step_diagnostics


def test_from_config_reads_every_loss_field(tmp_path):
    args = GRPOConfig(str(tmp_path), loss_type="dapo", epsilon=0.1, delta=1.5, beta=0.04, vespo_k_neg=4.0)
    settings = LossSettings.from_config(args)
    assert (settings.loss_type, settings.delta, settings.beta, settings.vespo_k_neg) == ("dapo", 1.5, 0.04, 4.0)
    assert (settings.epsilon_low, settings.epsilon_high) == (0.1, 0.1)  # epsilon_high unset: epsilon
    assert LossSettings.from_config(GRPOConfig(str(tmp_path), epsilon_high=0.28)).epsilon_high == 0.28
    for field in dataclasses.fields(LossSettings):
        if field.name not in ("epsilon_low", "epsilon_high"):
            assert getattr(settings, field.name) == getattr(args, field.name)


def test_settings_and_keywords_give_the_same_loss_and_diagnostics():
    logps = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], requires_grad=True)
    old_logps = logps.detach() + torch.tensor([[0.1, -0.3, 0.2], [0.0, 0.4, -1.0]])
    ref_logps = logps.detach() + 0.2
    advantages, mask = torch.tensor([1.0, -2.0]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    for loss_type in LOSS_TYPES:
        knobs = dict(loss_type=loss_type, epsilon_high=0.28, beta=0.1)
        settings = LossSettings(**knobs)
        result = policy_loss(logps, old_logps, advantages, mask, settings=settings, ref_logps=ref_logps)
        alone = policy_loss(logps, old_logps, advantages, mask, ref_logps=ref_logps, **knobs)
        assert torch.equal(result.loss, alone)
        # The diagnostics read the loss's own ratio and KL; computing them afresh gives the same values.
        from_terms = step_diagnostics(result.terms, advantages, mask, settings)
        afresh = loss_diagnostics(logps, old_logps, advantages, mask, ref_logps=ref_logps, **knobs)
        assert from_terms.keys() == afresh.keys() and "kl" in from_terms
        for name, (values, reduction) in from_terms.items():
            assert reduction == afresh[name][1] and torch.equal(values, afresh[name][0])
