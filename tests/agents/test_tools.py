"""grpokit.agents.tools: schemas, and running a turn's calls (sync, async, failures, timeouts)."""

import asyncio
import threading

import pytest

from grpokit.agents.tools import ToolBox, ToolCall, ToolError, tool_schema


def add(a: int, b: int = 0) -> int:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def boom(x: str) -> str:
    """Always fail.

    Args:
        x: anything
    """
    raise ValueError("boom went " + x)


def call(name, arguments, kind="function"):
    return {"type": kind, "function": {"name": name, "arguments": arguments}}


# ---- schemas


def test_schema_from_hints_and_docstring():
    schema = tool_schema(add)
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "add"
    assert function["description"] == "Add two numbers."
    assert function["parameters"]["properties"] == {
        "a": {"type": "integer", "description": "the first number"},
        "b": {"type": "integer", "description": "the second number"},
    }
    assert function["parameters"]["required"] == ["a"]
    assert ToolBox([add, boom]).schemas() == [tool_schema(add), tool_schema(boom)]


def test_tool_without_docstring_is_refused_by_name():
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ToolError, match="'undocumented'"):
        tool_schema(undocumented)


def test_tool_without_type_hints_is_refused_by_name():
    def unhinted(x):
        """Echo.

        Args:
            x: the value
        """
        return x

    with pytest.raises(ToolError, match="'unhinted'") as info:
        ToolBox([unhinted]).schemas()
    assert "\n" not in str(info.value)


def test_duplicate_tool_names_are_refused():
    def make():
        def twin(x: int) -> int:
            """Twin.

            Args:
                x: x
            """
            return x

        return twin

    with pytest.raises(ToolError, match="'twin'"):
        ToolBox([make(), make()])
    assert list(ToolBox([add, add]).tools) == ["add"]  # the same function twice is one tool


# ---- running calls


def test_sync_call_result():
    (result,) = ToolBox([add]).run([call("add", {"a": 2, "b": 3})])
    assert (result.name, result.arguments, result.result, result.failed) == ("add", {"a": 2, "b": 3}, 5, False)
    assert result.seconds >= 0.0


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_raising_tool_is_a_failed_call(timeout):
    (result,) = ToolBox([boom], timeout=timeout).run([call("boom", {"x": "off"})])
    assert result.failed is True
    assert result.result == {"error": "boom went off"}
    assert result.message() == {"role": "tool", "name": "boom", "content": "{'error': 'boom went off'}"}


def test_unknown_tool_name():
    (result,) = ToolBox([add]).run([call("subtract", {"a": 1})])
    assert result.failed is True
    assert result.name == "subtract"
    assert result.result == {"error": "Tool subtract not found."}


@pytest.mark.parametrize("arguments", ['{"a": 1}', [1], None, 3])
def test_arguments_that_are_not_an_object(arguments):
    (result,) = ToolBox([add]).run([call("add", arguments)])
    assert result.failed is True
    assert result.result == {"error": "tool arguments must be a JSON object"}


def test_unsupported_call_type():
    (result,) = ToolBox([add]).run([call("add", {"a": 1}, kind="code")])
    assert result.failed is True
    assert result.result == {"error": "Unsupported tool call type: code"}


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_bad_keyword_arguments(timeout):
    (missing,) = ToolBox([add], timeout=timeout).run([call("add", {"b": 1})])
    (unexpected,) = ToolBox([add], timeout=timeout).run([call("add", {"a": 1, "c": 2})])
    assert missing.failed and unexpected.failed
    assert "missing 1 required positional argument: 'a'" in missing.result["error"]
    assert "unexpected keyword argument 'c'" in unexpected.result["error"]


def test_async_tool_runs_on_the_tools_event_loop():
    seen = []

    async def where(tag: str) -> str:
        """Report the thread.

        Args:
            tag: a label
        """
        await asyncio.sleep(0)
        seen.append(threading.current_thread().name)
        return tag * 2

    results = ToolBox([where]).run([call("where", {"tag": "ab"})])
    assert [(r.result, r.failed) for r in results] == [("abab", False)]
    assert seen == ["grpokit-tools-loop"]


def test_async_tools_of_one_turn_run_concurrently():
    # Each tool waits for the other to have started: this completes only if both run at once (else both time out).
    started = {"ping": None, "pong": None}

    def make(name: str, other: str):
        async def tool(n: int) -> str:
            """Handshake.

            Args:
                n: a number
            """
            started[name] = asyncio.Event() if started[name] is None else started[name]
            started[name].set()
            while started[other] is None:
                await asyncio.sleep(0)
            await started[other].wait()
            return f"{name}{n}"

        tool.__name__ = name
        return tool

    box = ToolBox([make("ping", "pong"), make("pong", "ping")], timeout=5.0)
    results = box.run([call("ping", {"n": 1}), call("pong", {"n": 2})])
    assert [(r.name, r.result, r.failed) for r in results] == [("ping", "ping1", False), ("pong", "pong2", False)]


def test_results_keep_the_order_of_the_calls_with_sync_and_async_mixed():
    async def shout(text: str) -> str:
        """Upper-case.

        Args:
            text: the text
        """
        return text.upper()

    calls = [call("shout", {"text": "a"}), call("add", {"a": 1}), call("nope", {}), call("shout", {"text": "b"})]
    results = ToolBox([add, shout]).run(calls)
    assert [r.result for r in results] == ["A", 1, {"error": "Tool nope not found."}, "B"]
    assert [r.failed for r in results] == [False, False, True, False]


def test_async_raising_tool_is_a_failed_call():
    async def fails(x: int) -> int:
        """Fail.

        Args:
            x: x
        """
        raise RuntimeError(f"bad {x}")

    (result,) = ToolBox([fails]).run([call("fails", {"x": 7})])
    assert (result.result, result.failed) == ({"error": "bad 7"}, True)


def test_async_callable_object_is_awaited():
    class Tool:
        __name__ = "obj"

        async def __call__(self, x: int) -> int:
            return x + 1

    (result,) = ToolBox([Tool()]).run([call("obj", {"x": 1})])
    assert (result.result, result.failed) == (2, False)


def test_hanging_sync_tool_times_out():
    release = threading.Event()

    def hang(x: int) -> int:
        """Hang.

        Args:
            x: x
        """
        release.wait(30)
        return x

    try:
        (result,) = ToolBox([hang], timeout=0.2).run([call("hang", {"x": 1})])
    finally:
        release.set()
    assert result.failed is True
    assert "timed out" in result.result["error"]
    assert result.result == {"error": "timed out after 0.2 s"}


def test_hanging_async_tool_times_out_and_the_others_finish():
    async def sleepy(x: int) -> int:
        """Sleep.

        Args:
            x: x
        """
        await asyncio.sleep(30)
        return x

    async def quick(x: int) -> int:
        """Quick.

        Args:
            x: x
        """
        return x

    slow, fast = ToolBox([sleepy, quick], timeout=0.2).run([call("sleepy", {"x": 1}), call("quick", {"x": 2})])
    assert slow.failed is True
    assert slow.result == {"error": "timed out after 0.2 s"}
    assert (fast.result, fast.failed) == (2, False)


# ---- the tool message


@pytest.mark.parametrize(
    ("result", "content"),
    [
        ("VALUE", "VALUE"),
        (3, "3"),
        ({"k": 1}, "{'k': 1}"),
        (None, "None"),
        ([{"type": "text", "text": "hi"}], [{"type": "text", "text": "hi"}]),
    ],
)
def test_message_content(result, content):
    assert ToolCall("t", {}, result, False, 0.0).message() == {"role": "tool", "name": "t", "content": content}


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_async_tool_raising_its_own_timeout_error_is_its_error(timeout):
    # e.g. an HTTP client's read timeout: reported as the tool's error, never as grpokit's timeout (and no crash
    # when no timeout is set)
    async def fetch(url: str) -> str:
        """Fetch.

        Args:
            url: where
        """
        raise TimeoutError(f"read of {url} timed out")

    (result,) = ToolBox([fetch], timeout=timeout).run([call("fetch", {"url": "u"})])
    assert (result.result, result.failed) == ({"error": "read of u timed out"}, True)


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_async_tool_bad_keyword_arguments(timeout):
    async def one(a: int) -> int:
        """One.

        Args:
            a: a
        """
        return a

    (result,) = ToolBox([one], timeout=timeout).run([call("one", {"b": 1})])
    assert result.failed is True
    assert "unexpected keyword argument 'b'" in result.result["error"]
