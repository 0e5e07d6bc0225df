"""GRPOTrainer with TRL 1.16's agent arguments (`tools`, `environment_factory`, `rollout_func`) on a tiny model.

Generation is scripted (the generator's `generate` is replaced), so every completion, tool call and tool turn is
known in advance and the tool metrics and masks can be worked out by hand.
"""

import re

import pytest
import torch
from _trainer_helpers import last_log_with

from grpokit.config.support import NOT_IMPLEMENTED
from grpokit.generation import Generated
from grpokit.tiny import build_model, build_tokenizer, build_tool_tokenizer

CAP_NOT_ACCEPTED = pytest.mark.skipif(
    "max_tool_calling_iterations" in NOT_IMPLEMENTED,
    reason="max_tool_calling_iterations is still listed as not implemented in grpokit.config.support",
)


@pytest.fixture(scope="module")
def tok():
    return build_tool_tokenizer()


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key
    """
    return "VAL"


def boom(x: int) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise ValueError("bad")


def call(name, arguments):
    import json

    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def chat_rows(n, **columns):
    from datasets import Dataset

    rows = [
        {"prompt": [{"role": "user", "content": f"q{i}"}], **{k: v[i] for k, v in columns.items()}} for i in range(n)
    ]
    return Dataset.from_list(rows)


def tool_reward(completions, **kwargs):
    """The length of the tool results a completion saw: differs inside each group, so advantages are not 0."""
    return [float(sum(len(m["content"]) for m in c if m["role"] == "tool")) for c in completions]


def force(trainer, tok, first_turn, after="ok<eos>"):
    """Script generation: a sequence without a tool turn gets `first_turn(index, prompt text)`, one with a tool turn
    gets `after`. Returns the list of the first turns' prompts (ids) seen."""
    tool_id = tok.convert_tokens_to_ids("<|tool|>")
    prompts = []

    def generate(prompt_ids):
        if any(tool_id in ids for ids in prompt_ids):
            return Generated([enc(tok, after) for _ in prompt_ids])
        prompts.append([list(ids) for ids in prompt_ids])
        return Generated([enc(tok, first_turn(i, tok.decode(ids))) for i, ids in enumerate(prompt_ids)])

    trainer.generator.generate = generate
    return prompts


def capture_rollouts(trainer):
    rollouts = []
    record = trainer._record_rollout

    def wrapped(rollout, mode):
        rollouts.append(rollout)
        return record(rollout, mode)

    trainer._record_rollout = wrapped
    return rollouts


def capture_loss_inputs(trainer):
    seen = []
    compute = trainer.compute_loss

    def wrapped(model, inputs, *args, **kwargs):
        seen.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in inputs.items()})
        return compute(model, inputs, *args, **kwargs)

    trainer.compute_loss = wrapped
    return seen


def make_trainer(tok, make_args, dataset, **kwargs):
    from grpokit import GRPOTrainer

    args = make_args(**{"max_steps": 1, "max_completion_length": 200, **kwargs.pop("args", {})})
    model = build_model(tok)
    model.config.max_position_embeddings = 1024  # the tools' schemas alone are hundreds of characters (tokens)
    return GRPOTrainer(model=model, processing_class=tok, args=args, train_dataset=dataset, **kwargs)


# Four rollouts per step (two prompts x two generations), each position with its own first turn.
FIRST_TURNS = [
    call("lookup", {"key": "a"}) + call("lookup", {"key": "b"}) + "<eos>",  # 2 calls
    "hm" + call("lookup", {"key": "c"}) + call("boom", {"x": 1}) + "<eos>",  # 2 calls, 1 fails
    "hi<eos>",  # no call
    call("nope", {}) + "<eos>",  # 1 call to an unknown tool: fails
]
SUFFIXES = [
    "<|tool|>VAL<eos><|tool|>VAL<eos><|assistant|>",
    "<|tool|>VAL<eos><|tool|>{'error': 'bad'}<eos><|assistant|>",
    "",
    "<|tool|>{'error': 'Tool nope not found.'}<eos><|assistant|>",
]


def expected_rows(tok):
    """Per rollout: (completion ids, tool mask) as the tool loop must build them."""
    rows = []
    for first, suffix in zip(FIRST_TURNS, SUFFIXES, strict=True):
        first_ids, suffix_ids = enc(tok, first), enc(tok, suffix)
        after = enc(tok, "ok<eos>") if suffix else []
        rows.append((first_ids + suffix_ids + after, [1] * len(first_ids) + [0] * len(suffix_ids) + [1] * len(after)))
    return rows


def test_tool_metrics_and_tool_mask(tok, make_args, caplog):
    trainer = make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, tools=[lookup, boom])
    prompts = force(trainer, tok, lambda i, _: FIRST_TURNS[i])
    rollouts = capture_rollouts(trainer)
    with caplog.at_level("WARNING", logger="grpokit.trl_compat"):
        trainer.train()
    # The failures are named in the log: how many, the first one's tool, arguments, completion and error.
    assert '2 of 5 tool calls failed in this batch on process 0; the first: boom({"x": 1}) of completion 1: bad' in (
        caplog.text
    )

    (rollout,) = rollouts
    assert len(prompts) == 1 and len(prompts[0]) == 4
    for i, (ids, mask) in enumerate(expected_rows(tok)):
        width = rollout.completion_ids.size(1)
        assert rollout.completion_ids[i, : len(ids)].tolist() == ids
        assert rollout.completion_mask[i].tolist() == [1] * len(ids) + [0] * (width - len(ids))
        assert rollout.tool_mask[i].tolist() == mask + [1] * (width - len(mask))  # padding outside completion_mask
    model_tokens = [sum(mask) for _, mask in expected_rows(tok)]
    assert rollout.num_items_in_batch.item() == sum(model_tokens)
    assert rollout.loss_mask.sum().item() == sum(model_tokens)

    log = last_log_with(trainer, "tools/call_frequency")
    assert log["tools/call_frequency"] == pytest.approx(5 / 4)  # 2 + 2 + 0 + 1 calls over 4 completions
    assert log["tools/failure_frequency"] == pytest.approx(2 / 5)  # boom and nope
    assert log["completions/mean_length"] == pytest.approx(sum(model_tokens) / 4)  # tool turns not counted
    assert log["completions/max_length"] == max(model_tokens)
    assert rollout.completions[3] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "nope", "arguments": {}}}],
        },
        {"role": "tool", "name": "nope", "content": "{'error': 'Tool nope not found.'}"},
        {"role": "assistant", "content": "ok"},
    ]
    # The tools' schemas are rendered into the prompts.
    assert '"name": "lookup"' in tok.decode(prompts[0][0]) and '"name": "boom"' in tok.decode(prompts[0][0])


def test_no_calls_gives_zero_frequencies(tok, make_args):
    trainer = make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, tools=[lookup])
    force(trainer, tok, lambda i, _: "no call<eos>")
    trainer.train()
    log = last_log_with(trainer, "tools/call_frequency")
    assert (log["tools/call_frequency"], log["tools/failure_frequency"]) == (0.0, 0.0)


def test_loss_gradient_is_zero_on_tool_tokens(tok, make_args, monkeypatch):
    import grpokit.trainer as trainer_module

    captured = []
    original = trainer_module.policy_loss

    def spy(logps, old_logps, advantages, mask, **kwargs):
        record = {"mask": mask.detach().clone(), "num_items": kwargs["num_items_in_batch"], "advantages": advantages}
        logps.register_hook(lambda grad: record.__setitem__("grad", grad.detach().clone()))
        captured.append(record)
        return original(logps, old_logps, advantages, mask, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", spy)
    trainer = make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, tools=[lookup, boom])
    force(trainer, tok, lambda i, _: FIRST_TURNS[i])
    inputs = capture_loss_inputs(trainer)
    trainer.train()

    (record,) = captured
    (batch,) = inputs
    completion_mask, tool_mask = batch["completion_mask"], batch["tool_mask"]
    tool_positions = (completion_mask == 1) & (tool_mask == 0)
    assert tool_positions.sum().item() == sum(len(enc(tok, s)) for s in SUFFIXES)  # not vacuous
    assert (record["advantages"] != 0).any()
    grad = record["grad"]  # d loss / d per-token logps
    assert torch.all(grad[tool_positions] == 0)
    assert (grad[(completion_mask * tool_mask) == 1] != 0).any()
    assert torch.equal(record["mask"], completion_mask * tool_mask)
    model_tokens = sum(sum(mask) for _, mask in expected_rows(tok))
    assert batch["num_items_in_batch"].item() == model_tokens
    assert record["num_items"].item() == model_tokens  # one process, one micro-batch per generation


# ---- environments


class Counter:
    def reset(self, **row):
        self.total = 0
        self.row = row
        return f" (start {row['start']})"

    def add(self, n: int) -> int:
        """Add n to the total.

        Args:
            n: the amount
        """
        self.total += n
        return self.total

    def get_reward(self) -> float:
        return float(self.total)


class Echo:
    def reset(self, **row):
        self.said = []

    def echo(self, text: str) -> str:
        """Echo text back.

        Args:
            text: the text
        """
        self.said.append(text)
        return text

    async def get_reward(self) -> float:
        return 1.0 + len(self.said)


def test_environment_reset_tools_and_get_reward(tok, make_args):
    trainer = make_trainer(tok, make_args, chat_rows(2, start=[5, 6]), environment_factory=Counter)
    prompts = force(trainer, tok, lambda i, _: call("add", {"n": i + 1}) + "<eos>")
    rollouts = capture_rollouts(trainer)
    trainer.train()

    texts = [tok.decode(ids) for ids in prompts[0]]
    # each row's reset text ends its own last message
    ends = sorted(t[t.rindex("<|user|>") :] for t in texts)
    assert ends == ["<|user|>q0 (start 5)<eos><|assistant|>"] * 2 + ["<|user|>q1 (start 6)<eos><|assistant|>"] * 2
    assert '"name": "add"' in texts[0]
    log = last_log_with(trainer, "rewards/Counter/mean")
    assert log["rewards/Counter/mean"] == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert log["tools/call_frequency"] == 1.0 and log["tools/failure_frequency"] == 0.0
    (rollout,) = rollouts
    assert rollout.rewards[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert [c[1]["content"] for c in rollout.completions] == ["1", "2", "3", "4"]
    assert trainer.reward_func_names == ["Counter"]
    assert all(type(e) is Counter for e in trainer.environments) and len(trainer.environments) == 4
    assert len({id(e) for e in trainer.environments}) == 4
    assert "prompt" in trainer.environments[0].row and "start" in trainer.environments[0].row


def test_reward_functions_receive_the_environments(tok, make_args):
    seen = []

    def reward(completions, environments, **kwargs):
        seen.append(list(environments))
        return [-e.total for e in environments]

    trainer = make_trainer(
        tok, make_args, chat_rows(2, start=[0, 0]), reward_funcs=reward, environment_factory=Counter
    )
    force(trainer, tok, lambda i, _: call("add", {"n": 10 * (i + 1)}) + "<eos>")
    trainer.train()
    (environments,) = seen
    assert environments == trainer.environments
    assert [e.total for e in environments] == [10, 20, 30, 40]  # the tools ran before the rewards
    assert trainer.reward_func_names == ["reward", "Counter"]
    log = last_log_with(trainer, "rewards/reward/mean")
    assert log["rewards/reward/mean"] == pytest.approx(-25.0)
    assert log["rewards/Counter/mean"] == pytest.approx(25.0)


def test_routed_environments(tok, make_args):
    dataset = chat_rows(2, environment=["count", "echo"], start=[7, 7])
    trainer = make_trainer(tok, make_args, dataset, environment_factory={"count": Counter, "echo": Echo})
    turn = call("add", {"n": 3}) + call("echo", {"text": "yo"}) + "<eos>"
    prompts = force(trainer, tok, lambda i, _: turn)
    rollouts = capture_rollouts(trainer)
    trainer.train()

    (rollout,) = rollouts
    kinds = [type(e) for e in trainer.environments]
    assert sorted(k.__name__ for k in kinds) == ["Counter", "Counter", "Echo", "Echo"]
    for env, ids, completion, rewards in zip(
        trainer.environments, prompts[0], rollout.completions, rollout.rewards.tolist(), strict=True
    ):
        text = tok.decode(ids)
        tools = [m["content"] for m in completion if m["role"] == "tool"]
        if isinstance(env, Counter):  # its own tool only, and the reset text
            assert '"name": "add"' in text and '"name": "echo"' not in text and "(start 7)" in text
            assert tools == ["3", "{'error': 'Tool echo not found.'}"]
            assert rewards[0] == 3.0 and rewards[1] != rewards[1]  # Echo's reward: None (NaN) here
            assert "environment" not in env.row
        else:
            assert '"name": "echo"' in text and '"name": "add"' not in text and "(start" not in text
            assert tools == ["{'error': 'Tool add not found.'}", "yo"]
            assert rewards[0] != rewards[0] and rewards[1] == 2.0  # async get_reward: 1 + one echo
    assert trainer.reward_func_names == ["Counter", "Echo"]
    log = last_log_with(trainer, "rewards/Counter/mean")
    assert log["rewards/Counter/mean"] == pytest.approx(3.0)
    assert log["rewards/Echo/mean"] == pytest.approx(2.0)
    assert log["tools/call_frequency"] == pytest.approx(2.0)
    assert log["tools/failure_frequency"] == pytest.approx(0.5)


def test_routed_row_with_an_unknown_environment(tok, make_args):
    dataset = chat_rows(2, environment=["count", "elsewhere"], start=[0, 0])
    with pytest.raises(ValueError, match="environment='elsewhere'.*'count', 'echo'"):  # refused before training
        make_trainer(tok, make_args, dataset, environment_factory={"count": Counter, "echo": Echo})


# ---- rollout_func


def test_rollout_func_env_mask_and_extra_columns(tok, make_args):
    hints = []

    def rollout_func(prompts, trainer):
        n = len(prompts)
        completions = [enc(tok, "ab" + "T" * (i + 1) + "cd<eos>") for i in range(n)]
        return {
            "prompt_ids": [enc(tok, "<|user|>q<eos><|assistant|>") for _ in range(n)],
            "completion_ids": completions,
            "logprobs": [[-1.0] * len(c) for c in completions],
            "env_mask": [[1, 1] + [0] * (i + 1) + [1, 1, 1] for i in range(n)],
            "hint": [f"h{i}" for i in range(n)],
        }

    def reward(completions, hint, **kwargs):
        hints.append(list(hint))
        return [float(len(h) + i) for i, h in enumerate(hint)]

    trainer = make_trainer(tok, make_args, chat_rows(2), reward_funcs=reward, rollout_func=rollout_func)
    inputs = capture_loss_inputs(trainer)
    rollouts = capture_rollouts(trainer)
    trainer.train()

    assert hints == [["h0", "h1", "h2", "h3"]]
    (rollout,) = rollouts
    for i in range(4):
        length = 6 + i
        assert rollout.completion_mask[i].tolist() == [1] * length + [0] * (9 - length)
        assert rollout.tool_mask[i].tolist() == [1, 1] + [0] * (i + 1) + [1, 1, 1] + [1] * (3 - i)
    assert rollout.completions[0] == [{"role": "assistant", "content": "abTcd"}]
    (batch,) = inputs
    assert batch["num_items_in_batch"].item() == 4 * 5  # 5 model tokens per completion
    assert (batch["completion_mask"] * batch["tool_mask"]).sum().item() == 20
    assert last_log_with(trainer, "completions/mean_length")["completions/mean_length"] == 5.0


def test_rollout_func_missing_keys(tok, make_args):
    def rollout_func(prompts, trainer):
        return {"prompt_ids": [[1]] * len(prompts), "completion_ids": [[1]] * len(prompts)}

    trainer = make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, rollout_func=rollout_func)
    with pytest.raises(ValueError, match=re.escape("rollout_func must return keys ['logprobs'] in its output dict.")):
        trainer.train()


# ---- max_tool_calling_iterations


@CAP_NOT_ACCEPTED
def test_max_tool_calling_iterations_caps_the_rounds(tok, make_args):
    trainer = make_trainer(
        tok,
        make_args,
        chat_rows(2),
        reward_funcs=tool_reward,
        tools=[lookup],
        args={"max_tool_calling_iterations": 1},
    )
    turn = call("lookup", {"key": "k"}) + "<eos>"
    force(trainer, tok, lambda i, _: turn, after=turn)  # every turn calls again
    rollouts = capture_rollouts(trainer)
    trainer.train()
    log = last_log_with(trainer, "tools/call_frequency")
    assert log["tools/call_frequency"] == 1.0  # one round each: the second turn's call never runs
    assert all([m["role"] for m in c] == ["assistant", "tool", "assistant"] for c in rollouts[0].completions)


# ---- construction errors


def test_max_tool_calling_iterations_without_tools_is_refused(tok, make_args):
    with pytest.raises(ValueError, match="max_tool_calling_iterations=2: .*there are no tools"):
        make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, args={"max_tool_calling_iterations": 2})


def test_tools_need_a_tool_template(make_args):
    plain = build_tokenizer()
    with pytest.raises(ValueError, match="ignores tools"):
        make_trainer(plain, make_args, chat_rows(2), reward_funcs=tool_reward, tools=[lookup])


def test_tool_without_docstring_is_refused(tok, make_args):
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="'undocumented' cannot be described"):
        make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, tools=[undocumented])


def test_environment_without_reset_is_refused(tok, make_args):
    class NoReset:
        def get_reward(self):
            return 0.0

    with pytest.raises(ValueError, match="NoReset has no reset method"):
        make_trainer(tok, make_args, chat_rows(2), environment_factory=NoReset)


def test_rollout_func_with_tools_runs_the_tool_loop_on_its_turns(tok, make_args):
    """As TRL: a custom rollout writes the first turns; the tool loop runs their calls and generates the next turns
    through the trainer's backend; the rollout's env_mask is not used then (the tool mask is the loop's)."""

    def rollout_func(prompts, trainer):
        first = enc(tok, call("lookup", {"key": "a"}) + "<eos>")
        return {
            "prompt_ids": [enc(tok, "<|user|>hi<eos><|assistant|>")] * len(prompts),
            "completion_ids": [first] * len(prompts),
            "logprobs": None,
            "env_mask": [[1] * len(first)] * len(prompts),
            "source": ["custom"] * len(prompts),
        }

    seen = []

    def reward(completions, source, **kwargs):
        seen.append(list(source))
        return tool_reward(completions)

    trainer = make_trainer(
        tok, make_args, chat_rows(2), reward_funcs=reward, tools=[lookup], rollout_func=rollout_func
    )
    force(trainer, tok, lambda i, _: "never<eos>")  # only turns after a tool turn reach the backend: "ok<eos>"
    rollouts = capture_rollouts(trainer)
    trainer.train()
    (rollout,) = rollouts
    first, suffix, after = (
        enc(tok, t)
        for t in (
            call("lookup", {"key": "a"}) + "<eos>",
            "<|tool|>VAL<eos><|assistant|>",
            "ok<eos>",
        )
    )
    ids = first + suffix + after
    assert rollout.completion_ids[0, : len(ids)].tolist() == ids
    assert rollout.tool_mask[0, : len(ids)].tolist() == [1] * len(first) + [0] * len(suffix) + [1] * len(after)
    assert [m["role"] for m in rollout.completions[0]] == ["assistant", "tool", "assistant"]
    assert seen == [["custom"] * 4]
    assert last_log_with(trainer, "tools/call_frequency")["tools/call_frequency"] == 1.0


def test_no_reward_source(tok, make_args):
    with pytest.raises(ValueError, match="No reward source provided"):
        make_trainer(tok, make_args, chat_rows(2))
    with pytest.raises(ValueError, match="No reward source provided"):
        make_trainer(tok, make_args, chat_rows(2), environment_factory=_NoRewardEnv)


class _NoRewardEnv:
    def reset(self, **row):
        return None

    def act(self, x: int) -> int:
        """Act.

        Args:
            x: x
        """
        return x


def test_lora_with_tools(tok, make_args):
    """An adapter trains through the tool loop: the calls run, the tool turns are masked, only LoRA weights move."""
    from peft import LoraConfig

    trainer = make_trainer(
        tok,
        make_args,
        chat_rows(2),
        reward_funcs=tool_reward,
        tools=[lookup, boom],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    force(trainer, tok, lambda i, _: FIRST_TURNS[i])
    rollouts = capture_rollouts(trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    (rollout,) = rollouts
    for i, (_, mask) in enumerate(expected_rows(tok)):
        assert rollout.tool_mask[i, : len(mask)].tolist() == mask
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved and all("lora_" in n for n in moved)
    assert last_log_with(trainer, "tools/call_frequency")["tools/call_frequency"] == pytest.approx(5 / 4)


def test_resume_inside_a_round_keeps_the_trajectories(tok, make_args, tmp_path):
    """A checkpoint taken inside a generation round holds the round's micro-batches with their tool masks; the
    resumed run trains on them without generating again."""
    from grpokit import GRPOTrainer

    args = dict(max_steps=2, steps_per_generation=2, save_strategy="steps", save_steps=1)
    first = make_trainer(tok, make_args, chat_rows(4), reward_funcs=tool_reward, tools=[lookup, boom], args=args)
    force(first, tok, lambda i, _: FIRST_TURNS[i % 4])
    seen_first = capture_loss_inputs(first)
    first.train()
    checkpoint = tmp_path / "out" / "checkpoint-1"  # step 1 of the 2-step round
    assert checkpoint.is_dir()

    model = build_model(tok)
    model.config.max_position_embeddings = 1024
    second = GRPOTrainer(
        model=model,
        processing_class=tok,
        args=make_args(max_steps=2, max_completion_length=200, steps_per_generation=2),
        train_dataset=chat_rows(4),
        reward_funcs=tool_reward,
        tools=[lookup, boom],
    )
    generated = force(second, tok, lambda i, _: "never<eos>")
    seen_second = capture_loss_inputs(second)
    second.train(resume_from_checkpoint=str(checkpoint))
    assert generated == []  # the round came from the checkpoint
    (resumed,) = seen_second
    assert torch.equal(resumed["tool_mask"], seen_first[1]["tool_mask"])
    assert torch.equal(resumed["completion_ids"], seen_first[1]["completion_ids"])
    assert (resumed["tool_mask"] == 0).any()  # the tool turns came back masked


# ---- train_dataset, as TRL requires it


class OwnsTheData:
    """An environment that writes each rollout's prompt in reset (TRL: the dataset may then be omitted)."""

    made = 0

    def __init__(self):
        OwnsTheData.made += 1
        self.number = OwnsTheData.made

    def reset(self, **row):
        return f"task {self.number}"

    def get_reward(self) -> float:
        return float(self.number)


def test_train_dataset_is_required_without_an_environment(tok, make_args):
    with pytest.raises(ValueError, match=re.escape("`train_dataset` is required unless an `environment_factory` is")):
        make_trainer(tok, make_args, None, reward_funcs=tool_reward, tools=[lookup])


def test_an_environment_may_own_the_data(tok, make_args):
    """No dataset: one generation round of empty prompts (4 rows / 2 generations = 2), each completed by its
    environment's reset; max_steps sets the length."""
    trainer = make_trainer(tok, make_args, None, environment_factory=OwnsTheData, args={"max_steps": 2})
    assert trainer.train_dataset["prompt"] == [[{"role": "user", "content": ""}]] * 2
    prompts = force(trainer, tok, lambda i, _: "done<eos>")
    trainer.train()
    assert trainer.state.global_step == 2
    # Each round's 4 rollouts got their own instances (4 in the pool after the probe: numbers 1..4, reused).
    seen = [tok.decode(ids).split("<|user|>")[1].split("<eos>")[0] for round_ in prompts for ids in round_]
    assert sorted(seen[:4]) == sorted(seen[4:]) and len(set(seen[:4])) == 4 and seen[0].startswith("task ")


def test_without_a_dataset_routed_environments_or_no_max_steps_are_refused(tok, make_args):
    with pytest.raises(ValueError, match="A `dict` `environment_factory`.*requires a `train_dataset`"):
        make_trainer(tok, make_args, None, environment_factory={"a": OwnsTheData})
    with pytest.raises(ValueError, match="`max_steps` must be set to a positive value"):
        make_trainer(tok, make_args, None, environment_factory=OwnsTheData, args={"max_steps": -1})


def test_tool_timeout_reaches_the_tools(tok, make_args):
    """`tool_timeout` from the config bounds each call: a hanging tool ends with an error result, counted failed."""
    import threading

    release = threading.Event()

    def hang(x: int) -> str:
        """Never answers in time.

        Args:
            x: anything
        """
        release.wait(10)
        return "late"

    trainer = make_trainer(
        tok, make_args, chat_rows(2), reward_funcs=tool_reward, tools=[hang], args={"tool_timeout": 0.2}
    )
    force(trainer, tok, lambda i, _: call("hang", {"x": 1}) + "<eos>")
    rollouts = capture_rollouts(trainer)
    try:
        trainer.train()
    finally:
        release.set()
    assert all(
        c[1] == {"role": "tool", "name": "hang", "content": "{'error': 'timed out after 0.2 s'}"}
        for c in rollouts[0].completions
    )
    assert last_log_with(trainer, "tools/failure_frequency")["tools/failure_frequency"] == 1.0


# ---------------------------------------------------------------- hostile tools and environments, through train()


def test_an_async_tool_raising_system_exit_does_not_end_training(tok, make_args):
    async def leave(x: int) -> str:
        """Leaves.

        Args:
            x: anything
        """
        raise SystemExit(f"bye {x}")

    trainer = make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, tools=[leave])
    force(trainer, tok, lambda i, _: call("leave", {"x": i}) + "<eos>")
    rollouts = capture_rollouts(trainer)
    trainer.train()  # returns: the shared event loop did not die, nothing hangs
    assert [c[1]["content"] for c in rollouts[0].completions] == [f"{{'error': 'bye {i}'}}" for i in range(4)]


class Picky:
    """Its reset raises on the row whose prompt is q1."""

    def reset(self, **row):
        if row["prompt"][0]["content"] == "q1":
            raise RuntimeError("level q1 is corrupt")

    def get_reward(self):
        return 1.0

    def lookup(self, key: str) -> str:
        """Look a key up.

        Args:
            key: the key
        """
        return "VAL"


def test_a_reset_that_raises_fails_its_rollouts_and_training_goes_on(tok, make_args, caplog):
    trainer = make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, environment_factory=Picky)
    force(trainer, tok, lambda i, _: call("lookup", {"key": "k"}) + "<eos>")
    rollouts = capture_rollouts(trainer)
    with caplog.at_level("WARNING"):
        trainer.train()
    (rollout,) = rollouts
    prompts = [p[0]["content"] for p in rollout.prompts]
    failed = [i for i, p in enumerate(prompts) if p == "q1"]
    assert len(failed) == 2  # the two generations of row q1
    for i in range(4):  # the failed rollouts train no token; the others train their own turns
        trains = int((rollout.completion_mask[i] * rollout.tool_mask[i]).sum())
        assert (trains == 0) == (i in failed), (i, trains)
    assert rollout.rewards[:, 1].isnan().tolist() == [i in failed for i in range(4)]  # Picky's reward: None
    assert last_log_with(trainer, "tools/reset_failures")["tools/reset_failures"] == 2.0
    message = next(r.getMessage() for r in caplog.records if "failed to reset" in r.getMessage())
    assert "Picky on batch row" in message and "RuntimeError: level q1 is corrupt" in message


def test_a_round_where_every_reset_raises_stops_in_one_line(tok, make_args):
    class Broken(Picky):
        def reset(self, **row):
            raise RuntimeError("no levels at all")

    trainer = make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, environment_factory=Broken)
    force(trainer, tok, lambda i, _: "hi<eos>")
    with pytest.raises(ValueError) as info:
        trainer.train()
    message = str(info.value)
    assert "\n" not in message and message.startswith("every environment of this generation round failed to reset")
    assert "Broken.reset on batch row 0" in message and "RuntimeError: no levels at all" in message


def test_a_huge_tool_result_is_cut_before_it_is_rendered(tok, make_args):
    def dump(x: int) -> str:
        """Dumps a lot.

        Args:
            x: anything
        """
        return "A" * 20_000_000

    trainer = make_trainer(
        tok,
        make_args,
        chat_rows(2),
        reward_funcs=tool_reward,
        tools=[dump],
        args={"max_tool_result_chars": 40, "max_completion_length": 400},
    )
    force(trainer, tok, lambda i, _: call("dump", {"x": 1}) + "<eos>")
    rollouts = capture_rollouts(trainer)
    trainer.train()
    expected = "A" * 40 + "\n[tool result cut: 19999960 more characters]"
    assert [c[1]["content"] for c in rollouts[0].completions] == [expected] * 4


def test_a_tool_result_json_cannot_write_is_logged_as_its_text(tok, make_args, tmp_path):
    """log_completions writes the calls to completions.jsonl and the parquet table: a result holding a set and an
    object is recorded as the text the model saw."""
    import json

    class Opaque:
        def __repr__(self):
            return "<opaque>"

    def odd(x: int) -> dict:
        """Returns an odd object.

        Args:
            x: anything
        """
        return {"s": {1}, "o": Opaque()} if x % 2 else [Opaque(), {"type": "image", "image": Opaque()}]

    trainer = make_trainer(
        tok, make_args, chat_rows(2), reward_funcs=tool_reward, tools=[odd], args={"log_completions": True}
    )
    force(trainer, tok, lambda i, _: call("odd", {"x": i}) + "<eos>")
    trainer.train()
    out = tmp_path / "out"
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    results = sorted(str(c["result"]) for row in rows for c in row["tool_calls"])
    assert results == ["[<opaque>, {'type': 'image', 'image': <opaque>}]"] * 2 + ["{'s': {1}, 'o': <opaque>}"] * 2
    assert list((out / "completions").glob("completions_*.parquet"))


# ----------------------------------------------------------------------- trainer.tools, as TRL's tests use it


def test_trainer_tools_lists_the_environments_methods_too(tok, make_args):
    """TRL's `trainer.tools`: the standalone tools, then each environment's public methods (not reset/get_reward)."""
    trainer = make_trainer(tok, make_args, chat_rows(2), tools=[boom], environment_factory=Picky)
    assert [t.__name__ for t in trainer.tools] == ["boom", "lookup"]
    assert trainer.tools[0] is boom and type(trainer.tools[1].__self__) is Picky


def test_setting_trainer_tools_replaces_the_tools_or_the_rendered_schemas(tok, make_args):
    from grpokit import GRPOTrainer

    trainer = make_trainer(tok, make_args, chat_rows(2), reward_funcs=tool_reward, tools=[lookup])
    trainer.tools = [boom]
    assert [t.__name__ for t in trainer.tools] == ["boom"]
    assert [s["function"]["name"] for s in trainer.agent.schemas[None]] == ["boom"]
    schema = {"type": "function", "function": {"name": "boom", "description": "exact", "parameters": {}}}
    trainer.tools = [schema]  # a script rendering its own exact schemas: the calls still run `boom`
    assert trainer.agent.schemas[None] == [schema] and [t.__name__ for t in trainer.tools] == ["boom"]
    with pytest.raises(ValueError, match="give a list of functions, or a list of JSON schema dicts"):
        trainer.tools = ["boom"]
    stand_in = object.__new__(GRPOTrainer)  # as TRL's tests build a trainer by hand
    stand_in.tools = None
    assert stand_in.tools == []
