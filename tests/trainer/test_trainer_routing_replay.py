"""routing_replay end to end: a tiny Qwen3-MoE trained by GRPOTrainer records each round's routes, its micro-batches
carry them (padded like the tokens), the training forward replays them and logs routing/agreement; off-policy rounds
replay in the old-logprob pass too; a dense model and unsupported setups are refused in one line."""

import pytest
from _trainer_helpers import text_reward

import grpokit.scoring as scoring_module
import grpokit.trainer as trainer_module
from grpokit import GRPOConfig, GRPOTrainer, routing
from grpokit.tiny import build_moe, build_tokenizer


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe")
    tokenizer = build_tokenizer()
    build_moe(tokenizer, "qwen3_moe").save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _calls_with_routes(monkeypatch):
    """Every score_tokens call the trainer makes, as (routes given, agreement given)."""
    calls = []
    original = scoring_module.score_tokens

    def recorded(*args, **kwargs):
        calls.append((kwargs.get("routes") is not None, kwargs.get("agreement") is not None))
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "score_tokens", recorded)
    return calls


def test_the_training_forward_replays_the_rounds_routes(moe_dir, dataset, make_args, monkeypatch):
    calls = _calls_with_routes(monkeypatch)
    trainer = GRPOTrainer(moe_dir, text_reward, args=make_args(routing_replay=True), train_dataset=dataset)
    trainer.train()
    batch = trainer._buffered_inputs[0]
    prompt_routes, completion_routes = batch["prompt_routes"], batch["completion_routes"]
    assert prompt_routes.shape[:2] == batch["prompt_ids"].shape and prompt_routes.shape[2:] == (2, 2)
    assert completion_routes.shape[:2] == batch["completion_ids"].shape
    assert ((prompt_routes >= 0).all(-1) == batch["prompt_mask"].bool().unsqueeze(-1)).all()  # padding: -1
    assert ((completion_routes >= 0).all(-1).any(-1) <= batch["completion_mask"].bool()).all()
    assert calls and all(routes and agreement for routes, agreement in calls)  # on-policy: the loss step only
    logged = [e["routing/agreement"] for e in trainer.state.log_history if "routing/agreement" in e]
    assert len(logged) == 2 and all(0.99 <= value <= 1.0 for value in logged)  # same weights: routed alike


def test_an_off_policy_round_replays_in_the_old_logprob_pass_too(moe_dir, dataset, make_args, monkeypatch):
    calls = _calls_with_routes(monkeypatch)
    args = make_args(routing_replay=True, steps_per_generation=2, max_steps=2)  # a round over 2 optimizer steps
    GRPOTrainer(moe_dir, text_reward, args=args, train_dataset=dataset).train()
    assert (True, False) in calls  # the old log-probabilities: replayed, not counted
    assert (True, True) in calls  # the training forward


def test_a_dense_model_is_refused(tiny_model_dir, dataset, make_args):
    with pytest.raises(ValueError, match="routing_replay: Qwen2ForCausalLM has no mixture-of-experts router"):
        GRPOTrainer(tiny_model_dir, text_reward, args=make_args(routing_replay=True), train_dataset=dataset)


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"use_vllm": True}, "use_vllm"),
        ({"async_grpo": True}, "async_grpo"),
    ],
)
def test_unsupported_setups_are_refused_before_loading(tmp_path, overrides, named):
    with pytest.raises(ValueError, match=f"routing_replay=True: cannot be used with {named}"):
        GRPOConfig(output_dir=str(tmp_path), report_to="none", routing_replay=True, **overrides)


def test_agreement_counts_are_summed_over_processes_and_reset():
    class Two:  # two processes, the other with the same counts
        def sum(self, tensor):
            return tensor * 2

    agreement, metrics = routing.Agreement(replayed=10, same=7), {"routing/agreement": []}
    routing.log_agreement(agreement, Two(), metrics, "cpu")
    assert metrics["routing/agreement"] == [pytest.approx(0.7)] and agreement.replayed == agreement.same == 0
    routing.log_agreement(agreement, Two(), metrics, "cpu")  # nothing replayed since: nothing logged
    assert len(metrics["routing/agreement"]) == 1


def test_dynamic_sampling_assembles_the_routes_with_the_rows(moe_dir, dataset, make_args):
    """Groups of prompts of odd length score a constant (dropped); the refill rounds' rows are assembled with their
    routes, padded like their tokens (prompts on the left, completions on the right)."""

    def half_constant(prompts, completions, **kwargs):
        return [0.5 if len(p) % 2 else len(c) / 10 for p, c in zip(prompts, completions, strict=True)]

    args = make_args(routing_replay=True, dynamic_sampling=True, max_steps=1, max_completion_length=6)
    trainer = GRPOTrainer(moe_dir, half_constant, args=args, train_dataset=dataset)
    trainer.train()
    logged = next(e for e in trainer.state.log_history if "dynamic_sampling/rounds" in e)
    assert logged["dynamic_sampling/rounds"] > 1  # a refill round was assembled
    for batch in trainer._buffered_inputs:
        prompt_routes, completion_routes = batch["prompt_routes"], batch["completion_routes"]
        assert ((prompt_routes >= 0).all(-1) == batch["prompt_mask"].bool().unsqueeze(-1)).all()
        assert completion_routes.shape[:2] == batch["completion_ids"].shape
        assert ((completion_routes >= 0).all(-1).any(-1) <= batch["completion_mask"].bool()).all()


def test_a_round_generated_without_routes_is_refused(moe_dir, dataset, make_args):
    """routing_replay never trains a round silently without replay: a generation that recorded nothing (here the
    recorder taken off the backend, as a `_generate` override generating by itself would) stops in one line."""
    trainer = GRPOTrainer(moe_dir, text_reward, args=make_args(routing_replay=True), train_dataset=dataset)
    trainer.generator.route_recorder = None
    with pytest.raises(ValueError, match="routing_replay: this round's generation recorded no routed experts"):
        trainer.train()


@pytest.mark.parametrize("kept", [True, False])
def test_a_truncating_sampler_is_scored_over_its_kept_set_in_the_policys_passes(
    kept, tiny_model_dir, dataset, make_args, monkeypatch
):
    """top_k 5: the policy's passes (the off-policy round's old log-probabilities and the training forward) get the
    sampler's filters in transformers' order, the reference model's none; logprobs_over_kept_tokens false: none
    anywhere (TRL's whole vocabulary)."""
    from grpokit.algorithms.truncation import Truncation

    seen = []
    original = scoring_module.score_tokens
    monkeypatch.setattr(
        trainer_module, "score_tokens", lambda *a, **k: seen.append(k.get("truncation")) or original(*a, **k)
    )
    args = make_args(top_k=5, beta=0.04, steps_per_generation=2, logprobs_over_kept_tokens=kept)
    GRPOTrainer(tiny_model_dir, text_reward, args=args, train_dataset=dataset).train()
    if kept:
        assert seen.count(Truncation(top_k=5)) >= 3 and None in seen  # old pass + 2 training forwards; reference
        assert set(seen) == {Truncation(top_k=5), None}
    else:
        assert set(seen) == {None}
