"""Tools the model drives into misbehaving: nothing a tool does or returns stalls, floods or ends the run.

A completion chooses which tool runs with which arguments; each case here is a tool that, so driven, blocks,
raises what Python does not catch with `except Exception`, returns something huge or unprintable, or keeps running
past its time. Each ends as a result the model sees, within the time the settings give.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from grpokit.agents import tools as tools_module
from grpokit.agents.environments import Environments
from grpokit.agents.loop import run_tool_loop
from grpokit.agents.tools import ToolBox, bounded_result
from grpokit.generation import Generated


def call(name, arguments=None):
    return {"type": "function", "function": {"name": name, "arguments": arguments or {}}}


def make_tool(name, body, *, is_async=False):
    """A documented tool `name(x: int)` running `body(x)`."""
    if is_async:

        async def tool(x: int = 0):
            return body(x)

    else:

        def tool(x: int = 0):
            return body(x)

    tool.__name__ = name
    tool.__doc__ = "A tool.\n\nArgs:\n    x: anything\n"
    return tool


def raising(exc):
    def body(x):
        raise exc

    return body


def timed(box, calls, deadline=None):
    start = time.monotonic()
    results = box.run(calls, deadline)
    return results, time.monotonic() - start


# ------------------------------------------------------------------------------------- blocking and raising


def test_an_async_tool_that_blocks_its_event_loop_times_out_and_the_next_async_call_is_not_held():
    release = threading.Event()
    blocker = make_tool("blocker", lambda x: release.wait(20) and "late", is_async=True)  # time.sleep-like: no await
    quick = make_tool("quick", lambda x: x + 1, is_async=True)
    box = ToolBox([blocker, quick], timeout=0.3)
    try:
        (blocked,), seconds = timed(box, [call("blocker")])
        assert blocked.result == {"error": "timed out after 0.3 s"} and seconds < 1.0
        (after,), seconds = timed(box, [call("quick", {"x": 1})])  # the old loop is still blocked: a new one runs it
        assert (after.result, after.failed) == (2, False) and seconds < 1.0
    finally:
        release.set()


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("timeout", [None, 5.0])
@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), asyncio.CancelledError(), GeneratorExit()])
def test_base_exceptions_from_a_tool_are_its_error_and_the_tools_go_on(kind, timeout, exc):
    bad = make_tool("bad", raising(exc), is_async=kind == "async")
    good = make_tool("good", lambda x: "fine", is_async=kind == "async")
    box = ToolBox([bad, good], timeout=timeout)
    (failed,), seconds = timed(box, [call("bad")])
    assert failed.failed and seconds < 2.0
    assert failed.result == {"error": str(exc) or type(exc).__name__}
    (ok,) = box.run([call("good")])  # the tools' event loop (async) and this thread (sync) survived
    assert (ok.result, ok.failed) == ("fine", False)


# ------------------------------------------------------------------------------------------- the round's cap


def test_a_round_never_waits_past_its_deadline():
    """16 calls of 0.3 s in one round with a 1 s cap: about three run, the rest end at once, all within ~1 s."""
    slow = make_tool("slow", lambda x: time.sleep(0.3) or x)
    box = ToolBox([slow], timeout=5.0)
    deadline = time.monotonic() + 1.0
    results, seconds = timed(box, [call("slow", {"x": i}) for i in range(16)], deadline)
    assert seconds < 1.3
    done = [r for r in results if not r.failed]
    assert 2 <= len(done) <= 4 and [r.result for r in done] == list(range(len(done)))
    assert all(r.result["error"].startswith(("not run", "stopped after")) for r in results if r.failed)


def test_the_tool_loop_caps_each_round_across_rollouts():
    """8 rollouts each calling a 0.4 s tool: without a cap the round takes 3.2 s; with round_timeout=1 about 1 s."""
    slow = make_tool("slow", lambda x: time.sleep(0.4) or "done")
    turn = {"role": "assistant", "content": "", "tool_calls": [call("slow")]}

    def run(round_timeout):
        start = time.monotonic()
        result = run_tool_loop(
            [[1]] * 8,
            [[2]] * 8,
            None,
            [dict(turn) for _ in range(8)],
            toolboxes=[ToolBox([slow], timeout=5.0) for _ in range(8)],
            generate=lambda sequences: Generated([[3] for _ in sequences]),
            parse=lambda i, ids, prefix: {"role": "assistant", "content": "ok"},
            suffix=lambda messages: [9],
            max_iterations=1,
            max_completion_length=100,
            round_timeout=round_timeout,
        )
        return result, time.monotonic() - start

    capped, seconds = run(1.0)
    assert seconds < 1.4
    assert 2 <= sum(not c.failed for calls in capped.calls for c in calls) <= 3
    _, uncapped = run(None)
    assert uncapped > 3.0


# --------------------------------------------------------------------------------------- abandoned calls


def test_calls_that_outlive_their_time_are_bounded(monkeypatch):
    monkeypatch.setattr(tools_module, "MAX_ABANDONED_CALLS", 2)
    release = threading.Event()
    hang = make_tool("hang", lambda x: release.wait(20))
    box = ToolBox([hang], timeout=0.1)
    try:
        results = box.run([call("hang")] * 3)
        assert [r.result["error"] for r in results] == [
            "timed out after 0.1 s",
            "timed out after 0.1 s",
            "not run: 2 earlier tool calls that timed out are still running",
        ]
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while tools_module._abandoned_calls() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tools_module._abandoned_calls() == 0  # they finished: calls start again
    assert box.run([call("hang")])[0].result is True


# ------------------------------------------------------------------------------------------------- results


def test_a_huge_result_is_cut_before_anything_else_sees_it():
    huge = make_tool("huge", lambda x: "y" * 50_000_000)
    (result,) = ToolBox([huge], max_result_chars=1000).run([call("huge")])
    assert result.result == "y" * 1000 + "\n[tool result cut: 49999000 more characters]"
    assert result.message()["content"] == result.result


def test_content_blocks_keep_their_shape_with_their_texts_cut():
    blocks = [{"type": "text", "text": "z" * 50}, {"type": "image", "image": "img"}]
    assert bounded_result(blocks, 10) == [
        {"type": "text", "text": "z" * 10 + "\n[tool result cut: 40 more characters]"},
        {"type": "image", "image": "img"},
    ]
    assert bounded_result([1, 2, 3], 100) == "[1, 2, 3]"  # not content blocks: its text, as for any other value


def test_a_result_json_cannot_write_is_logged_as_its_text():
    class Opaque:
        def __repr__(self):
            return "opaque thing"

    (result,) = ToolBox([make_tool("opaque", lambda x: {"k": Opaque(), "s": {1, 2}})]).run([call("opaque")])
    assert result.result == "{'k': opaque thing, 's': {1, 2}}"  # what the model sees (TRL: str(result))
    assert json.loads(json.dumps(vars(result)))["result"] == result.result


def test_a_result_whose_text_raises_or_hangs_is_the_tools_error_in_its_time():
    class Unprintable:
        def __str__(self):
            raise SystemExit("no text")

    release = threading.Event()

    class Endless:
        def __str__(self):
            release.wait(20)
            return "late"

    box = ToolBox([make_tool("a", lambda x: Unprintable()), make_tool("b", lambda x: Endless())], timeout=0.3)
    try:
        (unprintable, endless), seconds = timed(box, [call("a"), call("b")])
    finally:
        release.set()
    assert unprintable.result == {"error": "no text"}
    assert endless.result == {"error": "timed out after 0.3 s"} and seconds < 1.5


# -------------------------------------------------------------------------------------------- environments


class Counter:
    """An environment whose `slow` call can outlive its timeout, counting what happens to it meanwhile."""

    made = []

    def __init__(self):
        self.resets = 0
        self.live_calls = 0
        self.resets_during_a_call = 0
        Counter.made.append(self)

    def reset(self, **row):
        self.resets += 1
        self.resets_during_a_call += self.live_calls

    def slow(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        self.live_calls += 1
        time.sleep(seconds)
        self.live_calls -= 1
        return "done"


def test_an_environment_whose_call_timed_out_is_never_handed_out_again():
    from grpokit.agents.agent import Agent

    Counter.made = []
    agent = Agent(environment_factory=Counter, timeout=0.2)
    agent.start([{"prompt": [{"role": "user", "content": "a"}]}])
    (box,) = agent._toolboxes
    first = box.environment
    (timed_out,) = box.run([call("slow", {"seconds": 1.0})])
    assert timed_out.result == {"error": "timed out after 0.2 s"} and box.environment_lost
    (refused,) = box.run([call("slow", {"seconds": 0.0})])  # the rest of this rollout: not called again
    assert refused.result["error"].startswith("this rollout's environment is unavailable")
    for _ in range(3):  # the next batches: a fresh instance, the first never reset while its call runs
        agent.start([{"prompt": [{"role": "user", "content": "b"}]}])
        assert agent._toolboxes[0].environment is not first
    assert first.resets == 1 and first.resets_during_a_call == 0
    time.sleep(1.0)


class Fussy:
    """An environment whose reset raises on rows asking for it."""

    def reset(self, **row):
        if row.get("bad"):
            raise KeyError(f"no level {row['bad']!r}")
        return " go"

    def get_reward(self):
        return 1.0

    def act(self, x: int) -> str:
        """Act.

        Args:
            x: anything
        """
        return "acted"


def test_a_reset_that_raises_fails_its_rollout_only():
    environments = Environments(Fussy)
    rows = [{"bad": None}, {"bad": "L9"}, {"bad": None}]
    prompts = environments.start(rows, [[{"role": "user", "content": f"p{i}"}] for i in range(3)])
    assert [p[0]["content"] for p in prompts] == ["p0 go", "p1", "p2 go"]
    assert environments.failed == [(1, "Fussy", "KeyError: \"no level 'L9'\"")]
    live = environments.live_instances()
    assert live[0] is not None and live[1] is None and live[2] is not None
    (reward,) = environments.reward_functions()
    assert reward([None] * 3, environments=environments.instances) == [1.0, None, 1.0]
    assert environments.instances[1] not in environments.pool[None]  # never handed out again
    environments.start([{"bad": None}], [[{"role": "user", "content": "q"}]])
    assert environments.failed == [] and reward([None], environments=environments.instances) == [1.0]


def test_async_calls_abandoned_behind_a_blocked_loop_are_never_started_and_not_counted_forever():
    """A call queued behind a tool that blocks the loop times out before it starts: when the loop frees up, it does
    not run (its result was already reported), and it no longer counts as a running abandoned call."""
    release = threading.Event()
    ran = []
    blocker = make_tool("blocker", lambda x: release.wait(20), is_async=True)
    queued = make_tool("queued", lambda x: ran.append(x), is_async=True)
    box = ToolBox([blocker, queued], timeout=0.2)
    try:
        results = box.run([call("blocker"), call("queued", {"x": 1})])  # started together on the same loop
    finally:
        release.set()
    assert [r.result for r in results] == [{"error": "timed out after 0.2 s"}] * 2
    deadline = time.monotonic() + 5
    while tools_module._abandoned_calls() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tools_module._abandoned_calls() == 0 and ran == []
