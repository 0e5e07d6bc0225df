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


DEFAULT_MAX_RESULT_CHARS = 65536
MAX_ABANDONED_CALLS = 32  # calls past their time still running in this process: no new call starts beyond it


class ToolBox:
    """The tools one rollout may call, by name.

    Every call runs in a thread of its own (a daemon thread; an async tool on the tools' event loop), and the caller
    waits for it at most `timeout`, and never past the round's `deadline`: what a tool does, blocking, hanging,
    raising (`SystemExit`, `KeyboardInterrupt` and `CancelledError` included) or returning anything, ends as a
    result or an `{'error': ...}` the model sees; nothing stops the run. A call past its time is abandoned (its
    thread, or its task on a loop it blocks, left to finish); while `MAX_ABANDONED_CALLS` of them are still
    running, new calls fail at once. The result is made text (`str(result)`, in the tool's thread and time) and cut
    at `max_result_chars` with a marker the model sees, before it is rendered, tokenized or logged; a list of content
    blocks stays a list, its texts cut.

    Args:
        tools: sync or async callables; their `__name__` is the name the model calls them by.
        timeout: seconds one call may take; a call past it ends with an error result. None waits forever (but never
            past the round's deadline).
        max_result_chars: the most characters of a result the model sees (and the logs keep).
        environment: the environment instance whose methods are among `tools` (one rollout's), if any: once a call
            of it runs past its time, its methods are not called again (`environment_lost`), since the abandoned
            call may still be changing it.
    """

    def __init__(
        self,
        tools: Sequence[Callable],
        timeout: float | None = None,
        *,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        environment: Any = None,
    ):
        self.tools: dict[str, Callable] = {}
        for tool in tools:
            name = tool_name(tool)
            if name in self.tools and self.tools[name] is not tool:
                raise ToolError(f"two tools are named {name!r}: tool names must be unique")
            self.tools[name] = tool
        self.timeout = timeout
        self.max_result_chars = max_result_chars
        self.environment = environment
        self.environment_lost = False

    def schemas(self) -> list[dict]:
        return [tool_schema(tool) for tool in self.tools.values()]

    def run(self, calls: Sequence[dict], deadline: float | None = None) -> list[ToolCall]:
        """Run one turn's calls (TRL's `{"type": "function", "function": {"name", "arguments"}}` dicts), sync ones in
        order, async ones concurrently; results in the order of the calls. `deadline` (a `time.monotonic()` value)
        is the round's end: no call is waited for past it, and none starts after it."""
        results: list[ToolCall | None] = [None] * len(calls)
        started: list[tuple[int, str, dict, _Running]] = []
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
            refusal = self._refusal(tool, name, arguments, deadline)
            if refusal is not None:
                results[i] = _failure(name, arguments, refusal, 0.0)
            elif _is_async(tool):
                started.append((i, name, arguments, _Running.start_async(tool, arguments, self.max_result_chars)))
            else:
                running = _Running.start_sync(name, tool, arguments, self.max_result_chars)
                results[i] = self._wait(name, tool, arguments, running, deadline)
        for i, name, arguments, running in started:  # async calls were all started at once: they run together
            results[i] = self._wait(name, self.tools[name], arguments, running, deadline)
        return results  # type: ignore[return-value]

    def _refusal(self, tool: Callable | None, name: str, arguments: Any, deadline: float | None) -> str | None:
        """Why a call cannot start (None: it can)."""
        if tool is None:
            return f"Tool {name} not found."
        if not isinstance(arguments, dict):
            return "tool arguments must be a JSON object"
        if self.environment_lost and getattr(tool, "__self__", None) is self.environment:
            return "this rollout's environment is unavailable: an earlier call of it did not finish in time"
        if deadline is not None and time.monotonic() >= deadline:
            return "not run: this round's tool time (tool_round_timeout) is used up"
        if _abandoned_calls() >= MAX_ABANDONED_CALLS:
            return f"not run: {MAX_ABANDONED_CALLS} earlier tool calls that timed out are still running"
        return None

    def _wait(self, name: str, tool: Callable, arguments: dict, running: _Running, deadline: float | None) -> ToolCall:
        own = None if self.timeout is None else self.timeout - (time.perf_counter() - running.start)
        round_left = None if deadline is None else deadline - time.monotonic()
        limits = [t for t in (own, round_left) if t is not None]
        if running.done.wait(max(0.0, min(limits)) if limits else None):
            return running.outcome(name, arguments)
        running.abandon()
        if getattr(tool, "__self__", None) is not None and tool.__self__ is self.environment:
            self.environment_lost = True
        seconds = time.perf_counter() - running.start
        if own is not None and (round_left is None or own <= round_left):
            return _failure(name, arguments, f"timed out after {self.timeout:g} s", seconds)
        return _failure(name, arguments, f"stopped after {seconds:.3g} s: this round's tool time is used up", seconds)


def _is_async(tool: Callable) -> bool:
    """An `async def` function or method, or an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(tool) or (
        not inspect.isroutine(tool) and inspect.iscoroutinefunction(type(tool).__call__)
    )


def _failure(name: str, arguments: Any, message: str, seconds: float) -> ToolCall:
    return ToolCall(name, arguments, {"error": message}, True, seconds)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[tool result cut: {len(text) - limit} more characters]"


def bounded_result(value: Any, limit: int) -> Any:
    """What the model sees of a tool's result, at most `limit` characters of text: numbers, booleans and None as
    they are; a string cut; a list of content blocks (`{"type": ...}` dicts) with its texts cut; anything else as
    its `str()`, cut. (TRL renders `str(result)` of any result but a list.)"""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return _cut(value, limit)
    if isinstance(value, list) and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in value):
        return [{**b, "text": _cut(str(b["text"]), limit)} if "text" in b else b for b in value]
    return _cut(str(value), limit)


def _error_text(exc: BaseException) -> str:
    text = str(exc)
    return text if text else type(exc).__name__


# ---- one call, running in its own thread (a sync tool) or as a task on the tools' event loop (an async one)

_ABANDONED: set[int] = set()  # ids of abandoned calls still running
_ABANDONED_LOCK = threading.Lock()


def _abandoned_calls() -> int:
    with _ABANDONED_LOCK:
        return len(_ABANDONED)


class _Running:
    """A call under way: `done` is set once `value` or `error` is there."""

    def __init__(self):
        self.start = time.perf_counter()
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.lock = threading.Lock()
        self.task = None  # an async call's task and loop, to cancel it when abandoned
        self.loop: asyncio.AbstractEventLoop | None = None

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        with self.lock:
            if self.done.is_set():
                return
            self.value, self.error = value, error
            self.done.set()
            if self.abandoned:
                with _ABANDONED_LOCK:
                    _ABANDONED.discard(id(self))

    def abandon(self) -> None:
        with self.lock:
            if self.done.is_set():
                return
            self.abandoned = True
            with _ABANDONED_LOCK:
                _ABANDONED.add(id(self))
        if self.loop is not None and self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
            _replace_blocked_loop(self.loop)

    def outcome(self, name: str, arguments: dict) -> ToolCall:
        seconds = time.perf_counter() - self.start
        if self.error is not None:
            return _failure(name, arguments, _error_text(self.error), seconds)
        return ToolCall(name, arguments, self.value, False, seconds)

    @classmethod
    def start_sync(cls, name: str, tool: Callable, arguments: dict, limit: int) -> _Running:
        running = cls()

        def target():
            try:
                value = bounded_result(tool(**arguments), limit)
            except BaseException as exc:  # noqa: BLE001 - SystemExit and the rest: the model sees it as an error
                running.finish(error=exc)
            else:
                running.finish(value)

        thread = threading.Thread(
            target=contextvars.copy_context().run, args=(target,), daemon=True, name=f"grpokit-tool-{name}"
        )
        thread.start()
        return running

    @classmethod
    def start_async(cls, tool: Callable, arguments: dict, limit: int) -> _Running:
        running = cls()

        async def guarded():
            if running.abandoned:  # its time ran out while the loop was busy: never started
                running.finish(error=asyncio.CancelledError())
                return
            try:
                value = await tool(**arguments)
                value = bounded_result(value, limit)
            except BaseException as exc:  # noqa: BLE001 - CancelledError, SystemExit...: never reach the loop
                running.finish(error=exc)
            else:
                running.finish(value)

        loop = _event_loop()
        running.loop = loop

        def schedule():
            running.task = loop.create_task(guarded())
            # cancelled before its first step, the coroutine's body never runs: its end is still recorded
            running.task.add_done_callback(lambda _: running.finish(error=asyncio.CancelledError()))

        try:
            loop.call_soon_threadsafe(schedule)
        except RuntimeError as exc:  # the loop was closed meanwhile
            running.finish(error=exc)
        return running


# ---- async tools: one event loop on a daemon thread, shared by every ToolBox, replaced when a tool blocks it

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()
_LOOP_PROBE_SECONDS = 0.05


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


def _replace_blocked_loop(loop: asyncio.AbstractEventLoop) -> None:
    """After an async call was abandoned: if `loop` does not answer within a moment (a tool blocks its thread, as
    `time.sleep` in an `async def` does), later async calls get a new loop; the old one finishes on its own."""
    global _loop
    answered = threading.Event()
    try:
        loop.call_soon_threadsafe(answered.set)
    except RuntimeError:
        return
    if not answered.wait(_LOOP_PROBE_SECONDS):
        with _loop_lock:
            if _loop is loop:
                _loop = None
