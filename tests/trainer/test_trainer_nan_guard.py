"""The NaN guard on real short runs of the tiny model: a step with a non-finite loss or gradient norm is skipped
(weights and AdamW state bit-identical), counted and warned about; N in a row stop the run with the last finite
weights; save_model refuses non-finite weights."""

import logging

import pytest
import torch
from _trainer_helpers import text_reward
from transformers import TrainerCallback

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.nan_guard import NonFiniteTrainingError, NonFiniteWeightsError


class Snapshots(TrainerCallback):
    """Weights and optimizer state after every optimizer step, by global step (0: before training)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.weights, self.optim = {}, {}

    def take(self, step):
        model, optimizer = self.trainer.model, self.trainer.optimizer
        self.weights[step] = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.optim[step] = {
            (n, key): value.clone()
            for n, p in model.named_parameters()
            for key, value in (optimizer.state[p].items() if optimizer is not None else ())
        }

    def on_train_begin(self, args, state, control, **kwargs):
        self.take(0)

    def on_step_end(self, args, state, control, **kwargs):
        self.take(state.global_step)


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def poison(trainer, how: str, bad_steps) -> None:
    """Make optimizer steps `bad_steps` (1-based) non-finite: `loss` NaN loss with finite gradients, `grad` finite
    loss with a NaN gradient, `both` a NaN loss whose gradients are NaN too."""
    bad = lambda: trainer.state.global_step + 1 in bad_steps  # noqa: E731 (the step being computed)
    if how == "grad":
        param = next(trainer.model.parameters())
        param.register_hook(lambda g: g * float("nan") if bad() else g)
        return
    compute_loss = trainer.compute_loss

    def poisoned(model, inputs, *args, **kwargs):
        loss = compute_loss(model, inputs, *args, **kwargs)
        if not bad():
            return loss
        return loss + float("nan") if how == "loss" else loss * float("nan")

    trainer.compute_loss = poisoned


def make_trainer(tiny_model, tiny_tokenizer, dataset, make_args, **overrides):
    trainer = GRPOTrainer(
        tiny_model, text_reward, args=make_args(**overrides), train_dataset=dataset, processing_class=tiny_tokenizer
    )
    snapshots = Snapshots(trainer)
    trainer.add_callback(snapshots)
    return trainer, snapshots


def rows(trainer, key):
    return {e["step"]: e[key] for e in trainer.state.log_history if key in e}


@pytest.mark.parametrize(
    "how, what", [("both", "loss and grad norm (nan)"), ("loss", "loss;"), ("grad", "grad norm (nan)")]
)
def test_a_nonfinite_step_is_skipped_and_the_run_goes_on(
    how, what, tiny_model, tiny_tokenizer, dataset, make_args, caplog
):
    trainer, snap = make_trainer(tiny_model, tiny_tokenizer, dataset, make_args, max_steps=3)
    poison(trainer, how, {2})
    with caplog.at_level(logging.WARNING, logger="grpokit.trainer"):
        trainer.train()

    assert trainer.state.global_step == 3
    assert not same(snap.weights[1], snap.weights[0])
    assert same(snap.weights[2], snap.weights[1])  # step 2: no update, bit for bit
    assert same(snap.optim[2], snap.optim[1])  # nor of the AdamW moments and step count
    assert not same(snap.weights[3], snap.weights[2])  # step 3 trains again
    state = trainer.optimizer.state[next(trainer.model.parameters())]
    assert state["step"].item() == 2  # steps 1 and 3 were applied
    assert trainer.lr_scheduler.last_epoch == 3  # the schedule advances on a skipped step (aligned with the steps)
    assert rows(trainer, "nonfinite_steps_skipped") == {1: 0, 2: 1, 3: 0}  # per log row
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    warnings = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert len(warnings) == 1 and "step 2: non-finite " + what in warnings[0], warnings
    assert "1 in a row, the run stops at 3" in warnings[0]


def test_nonfinite_steps_in_a_row_stop_with_the_last_finite_weights(tiny_model, tiny_tokenizer, dataset, make_args):
    trainer, snap = make_trainer(tiny_model, tiny_tokenizer, dataset, make_args, max_steps=10, max_nonfinite_steps=3)
    poison(trainer, "both", set(range(3, 11)))
    with pytest.raises(NonFiniteTrainingError) as caught:
        trainer.train()

    error = caught.value
    assert (error.first_step, error.last_step, error.last_good_step) == (3, 5, 2)
    assert str(error).startswith(
        "max_nonfinite_steps=3: 3 optimizer steps in a row (steps 3 to 5) had a non-finite loss or gradient norm"
    )
    assert "the model keeps the last finite weights (those after step 2)" in str(error)
    assert trainer.state.global_step == 4  # steps 3 and 4 were skipped; step 5 stopped the run
    model_now = {n: p.detach() for n, p in trainer.model.named_parameters()}
    assert same(model_now, snap.weights[2]) and not same(snap.weights[2], snap.weights[1])
    assert same(snap.optim[4], snap.optim[2])
    assert all(p.grad is None for p in trainer.model.parameters())  # the bad gradients are gone


def test_max_nonfinite_steps_none_never_stops(tiny_model, tiny_tokenizer, dataset, make_args):
    trainer, snap = make_trainer(tiny_model, tiny_tokenizer, dataset, make_args, max_steps=4, max_nonfinite_steps=None)
    poison(trainer, "both", {2, 3, 4})
    trainer.train()
    assert trainer.state.global_step == 4
    assert same(snap.weights[4], snap.weights[1])
    assert rows(trainer, "nonfinite_steps_skipped") == {1: 0, 2: 1, 3: 1, 4: 1}


def test_the_metric_sums_the_skips_of_a_logging_interval(tiny_model, tiny_tokenizer, dataset, make_args):
    trainer, _ = make_trainer(tiny_model, tiny_tokenizer, dataset, make_args, max_steps=4, logging_steps=2)
    poison(trainer, "both", {1, 2})
    trainer.train()
    assert rows(trainer, "nonfinite_steps_skipped") == {2: 2, 4: 0}
    assert "nonfinite_steps_skipped" not in trainer.state.log_history[-1]  # not in the end-of-training summary


def test_save_model_refuses_nonfinite_weights(tiny_model, tiny_tokenizer, dataset, make_args, tmp_path):
    trainer, _ = make_trainer(tiny_model, tiny_tokenizer, dataset, make_args)
    names = [n for n, _ in trainer.model.named_parameters()]
    params = dict(trainer.model.named_parameters())
    with torch.no_grad():
        params[names[1]][0] = float("nan")
        params[names[-1]].fill_(float("inf"))
    out = tmp_path / "saved"
    with pytest.raises(NonFiniteWeightsError) as caught:
        trainer.save_model(str(out))
    message = str(caught.value)
    assert "\n" not in message
    assert (
        message == f"refusing to save non-finite weights to {out}: 2 tensors with NaN or inf ({names[1]}, {names[-1]})"
    )
    assert not (out / "model.safetensors").exists()

    with torch.no_grad():
        params[names[1]][0] = 0.0
        params[names[-1]].fill_(0.0)
    trainer.save_model(str(out))  # finite again: saved
    assert (out / "model.safetensors").is_file()


def test_save_model_names_the_first_three_and_counts_the_rest(
    tiny_model, tiny_tokenizer, dataset, make_args, tmp_path
):
    trainer, _ = make_trainer(tiny_model, tiny_tokenizer, dataset, make_args)
    params = list(trainer.model.named_parameters())
    with torch.no_grad():
        for _, p in params[:5]:
            p.fill_(float("nan"))
    with pytest.raises(NonFiniteWeightsError, match=r"5 tensors with NaN or inf \(.*, .*, .* and 2 more\)"):
        trainer.save_model(str(tmp_path / "saved"))


@pytest.mark.parametrize("value", [0, -1])
def test_max_nonfinite_steps_must_be_positive(value, tmp_path):
    with pytest.raises(ValueError, match="max_nonfinite_steps"):
        GRPOConfig(output_dir=str(tmp_path), max_nonfinite_steps=value)


def test_the_default_stops_after_three():
    assert GRPOConfig.__dataclass_fields__["max_nonfinite_steps"].default == 3


def test_under_a_grad_scaler_only_the_scaler_skips_overflows():
    # fp16's GradScaler flow, on CPU: scale, backward, unscale_, norm, the guard, scaler.step, scaler.update.
    from grpokit.nan_guard import NaNGuard

    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1000)
    guard = NaNGuard(3, grad_scaler=True)
    overflow = {"on": False}
    model.weight.register_hook(lambda g: g * float("inf") if overflow["on"] else g)

    def step(poison):
        loss = poison(model(torch.ones(2, 3)).sum())
        guard.note_loss(loss)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        what = guard.verdict(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
        if what is not None:
            for p in model.parameters():
                p.grad = None
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        return what, scaler.get_scale(), optimizer.state[model.weight]["step"].item()

    assert step(lambda loss: loss) == (None, 256.0, 1)
    assert step(lambda loss: loss * float("nan")) == ("loss and grad norm (nan)", 128.0, 1)  # counted once
    assert step(lambda loss: loss + float("nan")) == ("loss", 128.0, 1)  # finite gradients: the guard skips
    overflow["on"] = True
    assert step(lambda loss: loss) == (None, 64.0, 1)  # an overflow: the scaler's business, not counted
    overflow["on"] = False
    assert step(lambda loss: loss) == (None, 64.0, 2)


def test_no_weight_push_after_skipped_steps(tiny_model, tiny_tokenizer, dataset, make_args):
    """With a vLLM-style backend the policy is pushed at each round whose weights changed: after steps 2 and 3 were
    skipped (non-finite), the engine still holds step 1's weights: the rounds of steps 3 and 4 push nothing; step 5's does."""
    trainer, snap = make_trainer(tiny_model, tiny_tokenizer, dataset, make_args, max_steps=5)
    pushed = []

    class Engine:
        last_sync_seconds = 0.0

        def __init__(self, inner):
            self.inner = inner

        def generate(self, prompt_ids):
            return self.inner.generate(prompt_ids)

        def sync_weights(self, model):
            pushed.append((trainer.state.global_step, {n: p.detach().clone() for n, p in model.named_parameters()}))

    trainer.generator = Engine(trainer.generator)
    trainer.args.use_vllm = True  # the push logic only; generation stays transformers'
    poison(trainer, "loss", {2, 3})
    trainer.train()
    assert [step for step, _ in pushed] == [0, 1, 4]  # rounds at steps 2 and 3 (after skips) push nothing
    assert same(pushed[1][1], snap.weights[1]) and same(snap.weights[3], snap.weights[1])
    assert same(pushed[2][1], snap.weights[4]) and not same(snap.weights[4], snap.weights[1])
