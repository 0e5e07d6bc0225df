"""Tools an agent may call: their JSON schemas (from type hints and Google-style docstrings, as transformers'
`get_json_schema` reads them) and running one turn's calls, each within a timeout.

A call's name and arguments come from a model's completion: untrusted. They only ever select one of the given
callables by name and pass it keyword arguments; a call that fails (unknown name, wrong arguments, the tool raising,
timing out) becomes an error result the model sees on its next turn, and is counted.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class ToolError(ValueError):
    """A tool that cannot be offered to the model (no type hints, no docstring, a duplicate name): one line."""


def tool_name(tool: Callable) -> str:
    return getattr(tool, "__name__", type(tool).__name__)


def tool_schema(tool: Callable) -> dict:
    """The JSON schema transformers renders into the chat template for `tool`; a `ToolError` naming the tool when
    its type hints or docstring do not give one."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(tool)
    except Exception as exc:  # noqa: BLE001 - transformers raises several kinds; all mean "cannot describe it"
        reason = " ".join(str(exc).split())
        raise ToolError(
            f"tool {tool_name(tool)!r} cannot be described to the model: {reason} (a tool needs a type hint on every "
            "argument and a Google-style docstring with an Args: section)"
        ) from None


@dataclass
class ToolCall:
    """One executed call, as recorded in the completion logs."""

    name: str
    arguments: Any
    result: Any
    failed: bool
    seconds: float

    def message(self) -> dict:
        """The `tool` message the model sees, as TRL writes it: a list result is kept as content blocks, anything
        else becomes `str(result)`; a failure is `{'error': ...}`."""
        content = self.result if isinstance(self.result, list) else str(self.result)
        return {"role": "tool", "name": self.name, "content": content}


class ToolBox:
    """The tools one rollout may call, by name.

    Args:
        tools: sync or async callables; their `__name__` is the name the model calls them by.
        timeout: seconds one call may take; a call past it ends with an error result (an async tool is cancelled, a
            sync one is left running in its abandoned daemon thread). None waits forever.
    """

    def __init__(self, tools: Sequence[Callable], timeout: float | None = None):
        self.tools: dict[str, Callable] = {}
        for tool in tools:
            name = tool_name(tool)
            if name in self.tools and self.tools[name] is not tool:
                raise ToolError(f"two tools are named {name!r}: tool names must be unique")
            self.tools[name] = tool
        self.timeout = timeout

    def schemas(self) -> list[dict]:
        return [tool_schema(tool) for tool in self.tools.values()]

    def run(self, calls: Sequence[dict]) -> list[ToolCall]:
        """Run one turn's calls (TRL's `{"type": "function", "function": {"name", "arguments"}}` dicts), sync ones in
        order, async ones concurrently; results in the order of the calls."""
        results: list[ToolCall | None] = [None] * len(calls)
        pending = []
        for i, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            if (
                not isinstance(call, dict)
                or call.get("type", "function") != "function"
                or not isinstance(function, dict)
            ):
                kind = call.get("type") if isinstance(call, dict) else type(call).__name__
                results[i] = _failure("unknown", None, f"Unsupported tool call type: {kind}", 0.0)
                continue
            name, arguments = str(function.get("name")), function.get("arguments")
            tool = self.tools.get(name)
            if tool is None:
                results[i] = _failure(name, arguments, f"Tool {name} not found.", 0.0)
            elif not isinstance(arguments, dict):
                results[i] = _failure(name, arguments, "tool arguments must be a JSON object", 0.0)
            elif _is_async(tool):
                pending.append((i, name, tool, arguments))
            else:
                results[i] = self._call_sync(name, tool, arguments)
        if pending:
            for (i, *_), result in zip(pending, _run_async(pending, self.timeout), strict=True):
                results[i] = result
        return results  # type: ignore[return-value]

    def _call_sync(self, name: str, tool: Callable, arguments: dict) -> ToolCall:
        start = time.perf_counter()
        if self.timeout is None:
            try:
                return ToolCall(name, arguments, tool(**arguments), False, time.perf_counter() - start)
            except Exception as exc:  # noqa: BLE001 - the model sees the error and the call counts as failed
                return _failure(name, arguments, str(exc), time.perf_counter() - start)
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def target():
            try:
                outcome["value"] = tool(**arguments)
            except BaseException as exc:  # noqa: BLE001 - reported as the call's error
                outcome["error"] = exc
            finally:
                done.set()

        thread = threading.Thread(
            target=contextvars.copy_context().run, args=(target,), daemon=True, name=f"grpokit-tool-{name}"
        )
        thread.start()
        if not done.wait(self.timeout):
            return _failure(name, arguments, f"timed out after {self.timeout:g} s", time.perf_counter() - start)
        seconds = time.perf_counter() - start
        if "error" in outcome:
            return _failure(name, arguments, str(outcome["error"]), seconds)
        return ToolCall(name, arguments, outcome["value"], False, seconds)


def _is_async(tool: Callable) -> bool:
    """An `async def` function or method, or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(tool) or (
        not inspect.isroutine(tool) and inspect.iscoroutinefunction(type(tool).__call__)
    )


def _failure(name: str, arguments: Any, message: str, seconds: float) -> ToolCall:
    return ToolCall(name, arguments, {"error": message}, True, seconds)


# ---- async tools: one event loop on a daemon thread, shared by every ToolBox

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve():
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=serve, daemon=True, name="grpokit-tools-loop").start()
            ready.wait()
            _loop = loop
        return _loop


def _run_async(pending: list[tuple[int, str, Callable, dict]], timeout: float | None) -> list[ToolCall]:
    async def one(name: str, tool: Callable, arguments: dict) -> ToolCall:
        start = time.perf_counter()
        try:
            # Not wait_for: a TimeoutError the tool raises itself (an HTTP client's) is its own error, not ours.
            task = asyncio.ensure_future(tool(**arguments))
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                task.cancel()
                return _failure(name, arguments, f"timed out after {timeout:g} s", time.perf_counter() - start)
            value = task.result()
        except Exception as exc:  # noqa: BLE001 - the model sees the error and the call counts as failed
            return _failure(name, arguments, str(exc), time.perf_counter() - start)
        return ToolCall(name, arguments, value, False, time.perf_counter() - start)

    async def every():
        return await asyncio.gather(*(one(name, tool, arguments) for _, name, tool, arguments in pending))

    return asyncio.run_coroutine_threadsafe(every(), _event_loop()).result()
