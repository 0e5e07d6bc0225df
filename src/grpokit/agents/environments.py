"""Environments (TRL 1.16's `environment_factory`): objects whose public methods are an agent's tools, one instance
per rollout, pooled and reset between episodes.

An environment class defines `reset(**row)` (required; may return text appended to the prompt's last message),
public methods (the tools), and optionally `get_reward()` (sync or async), which scores the finished rollout from
the instance's state: a reward column named after the class, weight 1.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

_NOT_TOOLS = ("reset", "get_reward")


class EnvironmentProblem(ValueError):
    """An environment that cannot be used (no `reset`, a row naming an unknown environment): one line."""


def environment_tools(instance) -> list[Callable]:
    """The bound public methods of `instance` that are tools: every function of its class not starting with `_`,
    except `reset` and `get_reward` (listed on the class, so properties are never evaluated)."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    ]


class Environments:
    """The environments of a run: `factory` (a no-argument callable) or `{name: factory}` (rows choose theirs with
    an `environment` column). Each factory is called once here to check its instances and read their tools; that
    instance starts the pool."""

    def __init__(self, factory: Callable | dict[str, Callable]):
        self.routed = isinstance(factory, dict)
        self.factories: dict[Any, Callable] = dict(factory) if self.routed else {None: factory}
        if not self.factories:
            raise EnvironmentProblem("environment_factory: an empty mapping names no environment")
        self.pool: dict[Any, list] = {}
        self._probes: dict[Any, Any] = {}  # the first instance of each, kept even when the pool retires it
        self.reward_classes: list[type] = []  # classes that define get_reward, in order, each once
        for name, make in self.factories.items():
            if not callable(make):
                raise EnvironmentProblem(f"environment_factory{_label(name)}: {make!r} is not callable")
            instance = make()
            if not callable(getattr(instance, "reset", None)):
                raise EnvironmentProblem(
                    f"environment_factory{_label(name)}: {type(instance).__name__} has no reset method; an "
                    "environment must define reset(**row) (it may return text to append to the prompt)"
                )
            self.pool[name] = [instance]
            self._probes[name] = instance
            if callable(getattr(type(instance), "get_reward", None)) and type(instance) not in self.reward_classes:
                self.reward_classes.append(type(instance))
        self.instances: list | None = None  # this batch's, one per row
        self.failed: list[tuple[int, Any, str]] = []  # this batch's rows whose reset raised: (row, name, error)
        self._broken: set[int] = set()  # ids of this batch's instances whose reset raised

    def probes(self) -> dict[Any, Any]:
        """One instance of each environment (the first one made, at construction)."""
        return dict(self._probes)

    def names_of(self, rows: list[dict]) -> list:
        names = [row.get("environment") if self.routed else None for row in rows]
        unknown = sorted({str(n) for n in names if n not in self.factories})
        if unknown:
            raise EnvironmentProblem(
                f"a row has environment={unknown[0]!r}, which environment_factory does not define (it defines "
                f"{', '.join(repr(n) for n in self.factories)})"
            )
        return names

    def start(self, rows: list[dict], prompts: list) -> list:
        """Hand one pooled instance to each row (more are made only when a batch needs more at once), reset it with
        the row, and return the prompts with what `reset` returned appended to their last message."""
        names = self.names_of(rows)
        taken: dict[Any, int] = {}
        self.instances = []
        for name in names:
            index = taken.get(name, 0)
            if index == len(self.pool[name]):
                self.pool[name].append(self.factories[name]())
            taken[name] = index + 1
            self.instances.append(self.pool[name][index])
        out = []
        self.failed = []
        self._broken.clear()  # (in place: the reward functions hold this set)
        for index, (prompt, row, instance, name) in enumerate(zip(prompts, rows, self.instances, names, strict=True)):
            kwargs = {k: v for k, v in row.items() if k != "environment"} if self.routed else dict(row)
            try:
                observation = instance.reset(**kwargs)
                out.append(prompt if observation is None else _appended(prompt, observation))
            except KeyboardInterrupt:  # in the trainer's own thread: the user's Ctrl-C
                raise
            except BaseException as exc:  # noqa: BLE001 - the rollout fails, the run goes on
                self.failed.append((index, name if self.routed else type(instance).__name__, _said(exc)))
                self._broken.add(id(instance))
                self.retire(instance)
                out.append(prompt)
        return out

    def live_instances(self) -> list:
        """This batch's instances, None where `reset` raised."""
        return [None if id(instance) in self._broken else instance for instance in self.instances or []]

    def retire(self, instance) -> None:
        """Never hand `instance` out again (its reset raised, or a call of it was abandoned while still running): a
        later batch gets a fresh one from the factory."""
        for instances in self.pool.values():
            for i, pooled in enumerate(instances):
                if pooled is instance:
                    del instances[i]
                    return

    def reward_functions(self) -> list[Callable]:
        """One reward function per environment class with `get_reward`, named after the class: it scores the rows
        whose environment is exactly that class, None elsewhere (and where its reset raised)."""
        return [_reward_of(cls, self._broken) for cls in self.reward_classes]


def _label(name) -> str:
    return "" if name is None else f"[{name!r}]"


def _appended(prompt, observation):
    """`prompt` (messages) with `observation` added to its last message's content (text to text, content blocks
    to content blocks), the row's own prompt left untouched."""
    if not isinstance(prompt, list):
        return prompt + observation if isinstance(observation, str) else prompt
    last = prompt[-1]
    content = last.get("content")
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return [*prompt[:-1], {**last, "content": content + observation}]


def _said(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _reward_of(cls: type, broken: set[int]) -> Callable:
    if inspect.iscoroutinefunction(cls.get_reward):

        async def reward(completions, environments=None, **kwargs):
            return [await e.get_reward() if type(e) is cls and id(e) not in broken else None for e in environments]

    else:

        def reward(completions, environments=None, **kwargs):
            return [e.get_reward() if type(e) is cls and id(e) not in broken else None for e in environments]

    reward.__name__ = reward.__qualname__ = cls.__name__
    return reward
