"""grpokit.agents.environments: pooled instances, routing, reset text, and the environments' rewards."""

import asyncio
import inspect

import pytest

from grpokit.agents.environments import EnvironmentProblem, Environments, environment_tools


def counting(cls):
    """A factory for `cls` that records every instance it makes."""
    made = []

    def make():
        made.append(cls())
        return made[-1]

    make.made = made
    return make


class Counter:
    def __init__(self):
        self.resets = []
        self.total = 0

    def reset(self, **row):
        self.resets.append(row)
        self.total = 0

    def add(self, n: int) -> int:
        """Add n.

        Args:
            n: the amount
        """
        self.total += n
        return self.total

    def get_reward(self) -> float:
        return float(self.total)

    def _private(self):
        raise AssertionError("not a tool")

    @property
    def expensive(self):
        raise AssertionError("a property is never evaluated")


class Echo:
    def reset(self, **row):
        return " [" + row.get("question", "") + "]"

    def echo(self, text: str) -> str:
        """Echo.

        Args:
            text: the text
        """
        return text


class AsyncScored(Counter):
    async def get_reward(self) -> float:
        await asyncio.sleep(0)
        return 10.0 + self.total


def prompt(text):
    return [{"role": "user", "content": text}]


def test_environment_tools_are_the_public_methods():
    counter = Counter()
    tools = environment_tools(counter)
    assert [t.__name__ for t in tools] == ["add"]
    assert tools[0].__self__ is counter
    assert [t.__name__ for t in environment_tools(Echo())] == ["echo"]


def test_pool_is_reused_across_batches_and_reset_each_time():
    make = counting(Counter)
    envs = Environments(make)
    assert len(make.made) == 1  # the probe starts the pool
    rows = [{"prompt": prompt("a"), "x": 1}, {"prompt": prompt("b"), "x": 2}]
    envs.start(rows, [r["prompt"] for r in rows])
    first = list(envs.instances)
    assert len(make.made) == 2
    assert first == make.made
    assert first[0] is not first[1]
    assert first[0].resets == [rows[0]] and first[1].resets == [rows[1]]

    envs.start(rows[::-1], [r["prompt"] for r in rows[::-1]])
    assert len(make.made) == 2  # no new instance
    assert [id(e) for e in envs.instances] == [id(e) for e in first]
    assert first[0].resets == [rows[0], rows[1]] and first[1].resets == [rows[1], rows[0]]


def test_pool_grows_only_when_a_batch_needs_more_at_once():
    make = counting(Counter)
    envs = Environments(make)
    rows = [{"prompt": prompt(str(i))} for i in range(3)]
    envs.start(rows, [r["prompt"] for r in rows])
    assert len(make.made) == 3
    envs.start(rows[:1], [rows[0]["prompt"]])
    assert envs.instances == [make.made[0]]
    envs.start(rows * 2, [r["prompt"] for r in rows * 2])
    assert len(make.made) == 6
    assert envs.instances == make.made
    assert len({id(e) for e in envs.instances}) == 6


def test_routing_by_environment_column():
    counters, echoes = counting(Counter), counting(Echo)
    envs = Environments({"count": counters, "echo": echoes})
    rows = [
        {"prompt": prompt("a"), "environment": "count", "question": "q0"},
        {"prompt": prompt("b"), "environment": "echo", "question": "q1"},
        {"prompt": prompt("c"), "environment": "count", "question": "q2"},
    ]
    prompts = envs.start(rows, [r["prompt"] for r in rows])
    assert [type(e) for e in envs.instances] == [Counter, Echo, Counter]
    assert envs.instances[0] is counters.made[0] and envs.instances[2] is counters.made[1]
    assert envs.instances[1] is echoes.made[0]
    # reset gets the row without its routing column
    assert envs.instances[0].resets == [{"prompt": prompt("a"), "question": "q0"}]
    assert prompts == [prompt("a"), prompt("b [q1]"), prompt("c")]
    assert envs.names_of(rows) == ["count", "echo", "count"]


def test_unknown_environment_name_is_refused():
    envs = Environments({"count": Counter, "echo": Echo})
    with pytest.raises(EnvironmentProblem, match="environment='nope'.*'count', 'echo'"):
        envs.start([{"prompt": prompt("a"), "environment": "nope"}], [prompt("a")])
    with pytest.raises(EnvironmentProblem, match="environment='None'"):
        envs.names_of([{"prompt": prompt("a")}])


def test_reset_text_is_appended_to_the_last_message():
    envs = Environments(Echo)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    row = {"prompt": messages, "question": "Q"}
    (out,) = envs.start([row], [messages])
    assert out == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi [Q]"}]
    assert messages[-1]["content"] == "hi"  # the row's own prompt is untouched


def test_reset_text_to_content_blocks():
    envs = Environments(Echo)
    blocks = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    (out,) = envs.start([{"prompt": blocks, "question": "Q"}], [blocks])
    assert out == [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": " [Q]"}]}]
    assert blocks[0]["content"] == [{"type": "text", "text": "hi"}]


def test_reset_blocks_to_text_content():
    class Blocks:
        def reset(self, **row):
            return [{"type": "text", "text": "obs"}]

    (out,) = Environments(Blocks).start([{"prompt": prompt("hi")}], [prompt("hi")])
    assert out == [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "obs"}]}]


def test_reset_text_on_a_text_prompt():
    (out,) = Environments(Echo).start([{"prompt": "say", "question": "Q"}], ["say"])
    assert out == "say [Q]"


def test_get_reward_functions_are_named_after_the_class():
    envs = Environments({"count": Counter, "echo": Echo, "async": AsyncScored, "again": Counter})
    rewards = envs.reward_functions()
    assert [f.__name__ for f in rewards] == ["Counter", "AsyncScored"]  # each class once, Echo has none
    rows = [
        {"prompt": prompt("a"), "environment": "count"},
        {"prompt": prompt("b"), "environment": "echo"},
        {"prompt": prompt("c"), "environment": "async"},
        {"prompt": prompt("d"), "environment": "again"},
    ]
    envs.start(rows, [r["prompt"] for r in rows])
    envs.instances[0].add(2)
    envs.instances[2].add(5)
    envs.instances[3].add(7)
    sync, scored = rewards
    assert not inspect.iscoroutinefunction(sync)
    assert inspect.iscoroutinefunction(scored)
    completions = [[{"role": "assistant", "content": ""}]] * 4
    assert sync(completions, environments=envs.instances) == [2.0, None, None, 7.0]
    assert asyncio.run(scored(completions, environments=envs.instances)) == [None, None, 15.0, None]


def test_missing_reset_is_refused():
    class NoReset:
        def act(self, x: int) -> int:
            """Act.

            Args:
                x: x
            """
            return x

    with pytest.raises(EnvironmentProblem, match="NoReset has no reset method"):
        Environments(NoReset)
    with pytest.raises(EnvironmentProblem, match=r"environment_factory\['b'\]: NoReset has no reset"):
        Environments({"a": Counter, "b": NoReset})


def test_bad_factories_are_refused():
    with pytest.raises(EnvironmentProblem, match="empty mapping"):
        Environments({})
    with pytest.raises(EnvironmentProblem, match="is not callable"):
        Environments({"a": 3})
