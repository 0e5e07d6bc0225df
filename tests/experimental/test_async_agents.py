"""Tools and environments run by the asynchronous trainer's worker thread: the tool loop, the tool mask in the loss,
TRL's tool metrics, the environments' own rewards."""

import json

import pytest
import torch
from _async_helpers import make_config

from grpokit.experimental.async_grpo import AsyncGRPOTrainer
from grpokit.generation import Generated
from grpokit.tiny import build_model, build_tool_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tool_tokenizer()


def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key
    """
    return "VAL"


class Counter:
    def reset(self, **kwargs):
        self.total = 0

    def add(self, n: int) -> str:
        """Add n.

        Args:
            n: how much
        """
        self.total += n
        return str(self.total)

    def get_reward(self):
        return float(self.total)


def call(name, arguments):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def chat_rows(n):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"q{i}"}]} for i in range(n)])


def scripted(trainer, tok, first_turn):
    """The worker's sampler generates `first_turn(row)` first, then "ok<eos>" after a tool turn; its logprobs are
    still scored by the sampler's copy of the policy."""
    tool_id = tok.convert_tokens_to_ids("<|tool|>")

    def generate(prompt_ids, vision=None):
        out = []
        for i, ids in enumerate(prompt_ids):
            text = "ok<eos>" if tool_id in ids else first_turn(i)
            out.append(tok.encode(text, add_special_tokens=False))
        return Generated(out)

    trainer.generator.inner.generate = generate


def make_trainer(tok, tmp_path, **kwargs):
    model = build_model(tok)
    model.config.max_position_embeddings = 1024
    args = make_config(tmp_path, max_steps=2, max_completion_length=200, max_staleness=0, **kwargs.pop("args", {}))
    return AsyncGRPOTrainer(model=model, processing_class=tok, args=args, **kwargs)


def test_tools_run_in_the_worker_and_their_turns_are_not_trained(tok, tmp_path):
    def reward(completions, **kwargs):
        return [float(sum(len(m["content"]) for m in c if m["role"] == "tool")) for c in completions]

    trainer = make_trainer(tok, tmp_path, reward_funcs=reward, train_dataset=chat_rows(4), tools=[lookup])
    scripted(trainer, tok, lambda i: (call("lookup", {"key": "k"}) if i % 2 == 0 else "hi") + "<eos>")
    seen = []
    compute = trainer.compute_loss

    def recorded(model, inputs, *args, **kwargs):
        seen.append({k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)})
        return compute(model, inputs, *args, **kwargs)

    trainer.compute_loss = recorded
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert [row["tools/call_frequency"] for row in rows] == [0.5, 0.5]  # one call in half the completions
    assert all(row["tools/failure_frequency"] == 0.0 for row in rows)
    tool_turn = tok.encode("<|tool|>VAL<eos><|assistant|>", add_special_tokens=False)
    for inputs in seen:
        masks = inputs["tool_mask"]
        called = [i for i in range(masks.size(0)) if (masks[i] == 0).any()]
        assert len(called) == 2
        for i in called:  # exactly the tool turn's tokens are left out of the loss
            assert int((masks[i] == 0).sum()) == len(tool_turn)
    # an agent run records its trajectories (completions.jsonl), the tool calls with the samples they belong to
    logged = [json.loads(line) for line in open(f"{trainer.args.output_dir}/completions.jsonl")]
    called = [row for row in logged if row.get("tool_calls")]
    assert called and called[0]["tool_calls"][0]["name"] == "lookup"
    assert any(m["role"] == "tool" and m["content"] == "VAL" for m in called[0]["completion"])


def test_an_environments_tools_and_reward(tok, tmp_path):
    trainer = make_trainer(tok, tmp_path, train_dataset=chat_rows(4), environment_factory=Counter)
    scripted(trainer, tok, lambda i: call("add", {"n": i + 1}) + "<eos>")
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    assert trainer.reward_func_names == ["Counter"]
    # batch rows 0..3 add 1..4: the environments' rewards, averaged
    assert [row["rewards/Counter/mean"] for row in rows] == [2.5, 2.5]
    assert [row["tools/call_frequency"] for row in rows] == [1.0, 1.0]


def test_image_prompts_train_through_the_worker(tmp_path):
    """A vision-language model (tiny LLaVA): the worker's copy generates from the images, the trainer scores with
    them; at staleness 0 the sampler's logprobs equal the trainer's (images included), and the vision tower moves."""
    import datasets

    from grpokit.tiny import build_vlm, random_image

    model, processor = build_vlm("llava")
    rows = [{"prompt": [{"role": "user", "content": f"Describe {i}"}], "image": random_image(i)} for i in range(4)]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = make_config(tmp_path, max_steps=2, max_staleness=0, max_completion_length=6, learning_rate=1e-2)
    trainer = AsyncGRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [float(len(c[0]["content"]) % 5) for c in completions],
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=processor,
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logged) == 2
    for row in logged:
        assert row["sampling/importance_sampling_ratio/min"] == pytest.approx(1.0, abs=1e-4)
        assert row["sampling/importance_sampling_ratio/max"] == pytest.approx(1.0, abs=1e-4)
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert any("vision" in n for n in changed)
    assert all(isinstance(s["prompt"], list) for s in trainer._completion_log.samples)  # text only in the records
