"""vLLM's importance-sampling correction computed in the loss step when updates are on-policy: the same weights, loss,
gradients and `sampling/*` metrics as TRL's separate no-grad pass, which is skipped; off-policy the pass still runs."""

import copy
import math

import pytest
import torch
from _trainer_helpers import text_reward
from transformers import TrainerCallback

import grpokit.trainer as trainer_module
from grpokit import GRPOTrainer
from grpokit.dist import LOCAL
from grpokit.generation import Generated
from grpokit.rollout.correction import LossStepCorrection, correction_in_loss_step
from grpokit.rollout.rollout import RolloutSettings

SAMPLING_METRICS = [
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
]

# grpokit's own: logged whenever the backend gives sampling logprobs, with or without a correction
SAMPLER_METRICS = [
    "sampler/logprob_gap",
    "sampler/logprob_bias",
    "sampler/ratio/p05",
    "sampler/ratio/p50",
    "sampler/ratio/p95",
]
FRACTION = {"token_truncate": "sampler/clipped_fraction", "sequence_mask": "sampler/masked_fraction"}


class SamplerWithLogprobs:
    """The trainer's generator, reporting a sampler's logprobs as vLLM does: a fixed -4.5 per token, so that the
    weights exp(old - sampling) of this ~100-token vocabulary model spread around 1 and some reach the clip."""

    def __init__(self, inner):
        self.inner, self.last_sync_seconds = inner, 0.0

    def generate(self, prompt_ids):
        out = self.inner.generate(prompt_ids)
        return Generated(out.completion_ids, [[-4.5] * len(ids) for ids in out.completion_ids])

    def sync_weights(self, model):
        pass


def run(tiny_model, tokenizer, dataset, args, separate_pass: bool, monkeypatch):
    """One optimizer step with the vLLM-style correction on; the losses, the weights handed to the loss, the gradients
    before the optimizer step, and the trainer. `separate_pass` forces TRL's no-grad pass after generation."""
    if separate_pass:
        monkeypatch.setattr(trainer_module, "correction_in_loss_step", lambda *a, **k: False)
    trainer = GRPOTrainer(tiny_model, text_reward, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.generator = SamplerWithLogprobs(trainer.generator)
    trainer.args.use_vllm = True  # the correction's settings; generation stays transformers'
    seen = {"ratio": [], "loss": [], "grads": None}
    policy_loss = trainer_module.policy_loss

    def recorded_loss(*args, **kwargs):
        result = policy_loss(*args, **kwargs)
        seen["ratio"].append(kwargs["importance_sampling_ratio"].clone())
        seen["loss"].append(result.loss.detach().clone())
        return result

    monkeypatch.setattr(trainer_module, "policy_loss", recorded_loss)

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            seen["grads"] = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    trainer.add_callback(Grads())
    trainer.train()
    monkeypatch.undo()
    return seen, trainer


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_mask"])
def test_on_policy_correction_from_the_training_forward_equals_the_separate_pass(
    mode, tiny_model, tiny_tokenizer, dataset, make_args, monkeypatch
):
    # One round of 8 rows in 2 micro-batches, both inside one optimizer step: on-policy.
    overrides = dict(
        max_steps=1,
        steps_per_generation=2,
        gradient_accumulation_steps=2,
        vllm_importance_sampling_mode=mode,
        vllm_importance_sampling_clip_min=0.5 if mode == "sequence_mask" else None,
        vllm_importance_sampling_clip_max=3.0 if mode == "token_truncate" else 1e6,
    )
    model_copy = copy.deepcopy(tiny_model)
    fast, fast_trainer = run(tiny_model, tiny_tokenizer, dataset, make_args(**overrides), False, monkeypatch)
    slow, slow_trainer = run(model_copy, tiny_tokenizer, dataset, make_args(**overrides), True, monkeypatch)

    # The shortcut skipped the no-grad pass (no old log-probabilities, no weights in the round); the forced one ran it.
    assert not {"old_logps", "importance_sampling_ratio"} & set(fast_trainer._buffered_inputs[0])
    assert {"old_logps", "importance_sampling_ratio"} <= set(slow_trainer._buffered_inputs[0])
    assert len(fast["ratio"]) == len(slow["ratio"]) == 2
    for a, b in zip(fast["ratio"], slow["ratio"], strict=True):
        assert a.shape == b.shape == ((4, 1) if mode == "sequence_mask" else b.shape)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any((r != 1).any() for r in fast["ratio"])  # the weights are not trivially 1
    for a, b in zip(fast["loss"], slow["loss"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert fast["grads"].keys() == slow["grads"].keys() and fast["grads"]
    for name, grad in fast["grads"].items():
        torch.testing.assert_close(grad, slow["grads"][name], rtol=1e-4, atol=1e-6)
    fast_log = next(e for e in fast_trainer.state.log_history if SAMPLING_METRICS[0] in e)
    slow_log = next(e for e in slow_trainer.state.log_history if SAMPLING_METRICS[0] in e)
    for name in SAMPLING_METRICS + SAMPLER_METRICS + [FRACTION[mode]]:
        assert fast_log[name] == pytest.approx(slow_log[name], rel=1e-5, abs=1e-6), name
    assert fast_log["loss"] == pytest.approx(slow_log["loss"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [
        {"steps_per_generation": 2, "max_steps": 2},  # a round trained over 2 optimizer steps: off-policy
        {"num_iterations": 2, "max_steps": 2},  # each round trained on twice, one optimizer step each: off-policy
        {"num_iterations": 2, "gradient_accumulation_steps": 2, "max_steps": 1},  # twice in one step: not taken
    ],
)
def test_the_separate_pass_runs_when_the_shortcut_does_not_apply(
    overrides, tiny_model, tiny_tokenizer, dataset, make_args, monkeypatch
):
    seen, trainer = run(tiny_model, tiny_tokenizer, dataset, make_args(**overrides), False, monkeypatch)
    assert {"old_logps", "importance_sampling_ratio"} <= set(trainer._buffered_inputs[0])
    assert all(r is not None for r in seen["ratio"])
    logged = next(e for e in trainer.state.log_history if SAMPLING_METRICS[0] in e)
    assert all(math.isfinite(logged[name]) for name in SAMPLING_METRICS)


def test_when_the_loss_step_may_compute_the_correction():
    plain, dropping = torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1))
    assert correction_in_loss_step("train", False, 1, plain)
    assert not correction_in_loss_step("train", True, 1, plain)  # weights change between generation and loss
    assert not correction_in_loss_step("train", False, 2, plain)  # a micro-batch trained on twice
    assert not correction_in_loss_step("train", False, 1, dropping)  # a second forward draws other masks
    assert correction_in_loss_step("eval", True, 2, dropping)  # evaluation: no update, dropout off


def test_loss_step_correction_by_hand():
    """Token diffs old - sampling: row 0 (0, 0.5), row 1 (-0.5, masked); token_truncate, clip_max 3."""
    settings = RolloutSettings(
        num_generations=2, importance_sampling_mode="token_truncate", importance_sampling_clip_max=3.0
    )
    old = torch.tensor([[-1.0, -2.0], [-1.5, -0.5]])
    sampling = torch.tensor([[-1.0, -2.5], [-1.0, -0.5]])
    mask = torch.tensor([[1, 1], [1, 0]])
    correction = LossStepCorrection(LOCAL)
    first, metrics = correction.weights(old[:1], sampling[:1], mask[:1], settings, parts=2)
    assert metrics == {}
    torch.testing.assert_close(first, torch.tensor([[1.0, math.exp(0.5)]]))
    second, metrics = correction.weights(old[1:], sampling[1:], mask[1:], settings, parts=2)
    torch.testing.assert_close(second, torch.tensor([[math.exp(-0.5), 1.0]]))
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(1 / 3)
    assert metrics["sampling/sampling_logp_difference/max"] == pytest.approx(0.5)
    assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-0.5))
    assert metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(
        (1 + math.exp(0.5) + math.exp(-0.5)) / 3
    )
    assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(math.exp(0.5))
    # the round is over: the next call starts a new one
    _, metrics = correction.weights(old[:1], sampling[:1], mask[:1], settings, parts=1)
    assert metrics["sampling/sampling_logp_difference/mean"] == pytest.approx(0.25)


def test_the_sampler_metrics_are_logged_without_a_correction(tiny_model, tiny_tokenizer, dataset, make_args):
    """vllm_importance_sampling_correction off: no weights, no TRL `sampling/*` metrics, but the `sampler/*` ones,
    from the training forward's log-probabilities against the sampler's fixed -4.5: the gap is the mean |old + 4.5|,
    the bias its signed mean, and the ratio's quantiles are ordered."""
    args = make_args(max_steps=1, vllm_importance_sampling_correction=False)
    trainer = GRPOTrainer(tiny_model, text_reward, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    trainer.generator = SamplerWithLogprobs(trainer.generator)
    trainer.args.use_vllm = True
    seen = []
    original = trainer._loss_step_correction.weights

    def recorded(logps, sampling_logps, loss_mask, settings, parts):
        seen.append((logps.detach().clone(), loss_mask.clone()))
        return original(logps, sampling_logps, loss_mask, settings, parts)

    trainer._loss_step_correction.weights = recorded
    trainer.train()
    logged = next(e for e in trainer.state.log_history if "sampler/logprob_gap" in e)
    assert not any(name.startswith("sampling/") for name in logged)
    assert "sampler/masked_fraction" not in logged and "sampler/clipped_fraction" not in logged
    deltas = torch.cat([(logps + 4.5)[mask.bool()] for logps, mask in seen])
    assert logged["sampler/logprob_gap"] == pytest.approx(deltas.abs().mean().item(), rel=1e-4)
    assert logged["sampler/logprob_bias"] == pytest.approx(deltas.mean().item(), rel=1e-4, abs=1e-6)
    assert logged["sampler/ratio/p05"] <= logged["sampler/ratio/p50"] <= logged["sampler/ratio/p95"]


def test_kl_rejection_zeroes_a_whole_sequence_and_is_counted():
    """Token diffs: row 0 (0, 0.5), row 1 (-0.5, masked). k3 means: row 0 (0 + 0.148721) / 2 = 0.074361, row 1
    exp(-0.5) - 0.5 = 0.106531: a threshold of 0.09 rejects row 1 only, every token of it."""
    settings = RolloutSettings(
        num_generations=2,
        importance_sampling_mode="token_truncate",
        importance_sampling_clip_max=3.0,
        sampler_kl_threshold=0.09,
    )
    old = torch.tensor([[-1.0, -2.0], [-1.5, -0.5]])
    sampling = torch.tensor([[-1.0, -2.5], [-1.0, -0.5]])
    mask = torch.tensor([[1, 1], [1, 0]])
    weights, metrics = LossStepCorrection(LOCAL).weights(old, sampling, mask, settings, parts=1)
    torch.testing.assert_close(weights, torch.tensor([[1.0, math.exp(0.5)], [0.0, 0.0]]))
    assert metrics["sampler/kl_rejected_fraction"] == pytest.approx(0.5)
    assert "sampler/veto_fraction" not in metrics
    assert metrics["sampler/clipped_fraction"] == pytest.approx(0.0)  # exp(0.5) and exp(-0.5) inside (0, 3]


def test_the_sampler_metrics_are_token_means_over_every_process():
    """Two processes: this one's token differences (0, 0.5, -0.5; the 4th masked), the other's a single token of
    2.0 (what the fake collective hands back). Over all 4 tokens: gap (0 + 0.5 + 0.5 + 2) / 4 = 0.75, bias
    (0 + 0.5 - 0.5 + 2) / 4 = 0.5 (a mean of the two processes' means would give 1.17 and 1.0); the median ratio is
    exp of the middle of (-0.5, 0, 0.5, 2): exp(0.25)."""

    class TwoProcesses:
        process_index, num_processes = 0, 2

        def gather(self, tensor):  # the other process's sums: 1 token, |d| 2, d 2, 1 sequence, 0 outside
            return torch.cat([tensor, torch.tensor([[1.0, 2.0, 2.0, 1.0, 0.0]], dtype=tensor.dtype)])

        def gather_padded(self, tensor, pad_value):
            return torch.cat([tensor, torch.tensor([2.0], dtype=tensor.dtype)])

    settings = RolloutSettings(num_generations=2)  # no correction: the sampler/* metrics alone
    old = torch.tensor([[-1.0, -2.0], [-1.5, -0.5]])
    sampling = torch.tensor([[-1.0, -2.5], [-1.0, -0.5]])
    mask = torch.tensor([[1, 1], [1, 0]])
    weights, metrics = LossStepCorrection(TwoProcesses()).weights(old, sampling, mask, settings, parts=1)
    assert weights is None and not any(name.startswith("sampling/") for name in metrics)
    assert metrics["sampler/logprob_gap"] == pytest.approx(0.75)
    assert metrics["sampler/logprob_bias"] == pytest.approx(0.5)
    assert metrics["sampler/ratio/p50"] == pytest.approx(math.exp(0.25))
