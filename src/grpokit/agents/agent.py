"""`Agent`: what a rollout needs to train a tool-calling model: the tools (plain functions and environments'
methods), the environments' instances for this batch, and the generation of a whole multi-turn rollout."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from grpokit.dist import LOCAL, Collective
from grpokit.generation import check_prompt_lengths, encode_prompts, is_conversational

from .environments import Environments, environment_tools
from .loop import LoopResult, run_tool_loop, tool_suffix_ids
from .parsing import check_tool_template, parse_turn
from .tools import DEFAULT_MAX_RESULT_CHARS, ToolBox, ToolError


class Agent:
    """Tools and environments, as `GRPOTrainer(tools=..., environment_factory=...)` takes them (TRL 1.16).

    Args:
        tools: sync or async functions with type hints and a Google-style docstring.
        environment_factory: a no-argument callable returning an environment, or `{name: callable}` routed by the
            rows' `environment` column (see `grpokit.agents.environments`).
        max_iterations: the most tool rounds per rollout (`max_tool_calling_iterations`); None: no cap.
        timeout: seconds one tool call may take before it ends with an error result; None: no limit.
        round_timeout: seconds one round's calls (all rollouts') may take together (`tool_round_timeout`).
        max_result_chars: the most characters of a tool result the model sees (`max_tool_result_chars`).
    """

    def __init__(
        self,
        tools: Sequence[Callable] | None = None,
        environment_factory=None,
        *,
        max_iterations: int | None = None,
        timeout: float | None = None,
        round_timeout: float | None = None,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    ):
        self.tools = list(tools or [])
        self.environments = None if environment_factory is None else Environments(environment_factory)
        self.max_iterations = max_iterations
        self.timeout = timeout
        self.round_timeout = round_timeout
        self.max_result_chars = max_result_chars
        # The schemas rendered into each environment's prompts (checked now: a tool that cannot be described is
        # refused before any model loads).
        self.schemas = self._described()
        self._names: list = []
        self._toolboxes: list[ToolBox] = []
        self.last: LoopResult | None = None  # the latest batch's loop, for metrics and completion records

    def _described(self) -> dict:
        """{environment name (None without environments): the tool schemas its prompts render}."""
        probes = self.environments.probes() if self.environments is not None else {None: None}
        return {
            name: ToolBox(self.tools + ([] if probe is None else environment_tools(probe))).schemas()
            for name, probe in probes.items()
        }

    def all_tools(self) -> list[Callable]:
        """The standalone tools, then each environment's methods (of its first instance) not already named: TRL's
        `trainer.tools`."""
        found, names = list(self.tools), {getattr(t, "__name__", None) for t in self.tools}
        probes = self.environments.probes() if self.environments is not None else {}
        for probe in probes.values():
            for method in environment_tools(probe):
                if method.__name__ not in names:
                    names.add(method.__name__)
                    found.append(method)
        return found

    def set_tools(self, tools: Sequence[Callable | dict]) -> None:
        """Replace the standalone tools (callables), or the tool schemas rendered into the prompts (JSON schema
        dicts, as a script that renders exact schemas of its own sets them; calls still run the tools by name)."""
        tools = list(tools or [])
        if all(isinstance(t, dict) for t in tools) and tools:
            self.schemas = {name: list(tools) for name in self.schemas}
            return
        if not all(callable(t) for t in tools):
            raise ToolError("trainer.tools: give a list of functions, or a list of JSON schema dicts to render")
        self.tools = tools
        self.schemas = self._described()

    @property
    def instances(self) -> list | None:
        """This batch's environment instances, one per row (None without environments)."""
        return None if self.environments is None else self.environments.instances

    def reward_functions(self) -> list[Callable]:
        """Reward functions the environments own (`get_reward`), to add after the run's reward functions."""
        return [] if self.environments is None else self.environments.reward_functions()

    def check_tokenizer(self, tokenizer, chat_template_kwargs: dict | None = None, name: str = "the tokenizer"):
        check_tool_template(tokenizer, chat_template_kwargs, name)

    def start(self, rows: list[dict]) -> list:
        """Prepare a batch: each row gets its environment instance (reset with the row) and its tools; returns the
        prompts, with what `reset` returned appended."""
        self.last = None
        prompts = [row.get("prompt", [{"role": "user", "content": ""}]) for row in rows]
        limits = {"max_result_chars": self.max_result_chars}
        if self.environments is None:
            self._names = [None] * len(rows)
            self._toolboxes = [ToolBox(self.tools, self.timeout, **limits)] * len(rows)
            return prompts
        for box in self._toolboxes:  # an environment a call was abandoned in is never handed out again
            if box.environment_lost:
                self.environments.retire(box.environment)
        prompts = self.environments.start(rows, prompts)
        self._names = self.environments.names_of(rows)
        self._toolboxes = [
            ToolBox(self.tools, self.timeout, **limits)  # a rollout whose reset failed gets no environment tools
            if instance is None
            else ToolBox(self.tools + environment_tools(instance), self.timeout, environment=instance, **limits)
            for instance in self.environments.live_instances()
        ]
        return prompts

    @property
    def failed_resets(self) -> list:
        """This batch's rollouts whose environment's `reset` raised: `(row index, environment, error)`."""
        return [] if self.environments is None else list(self.environments.failed)

    def generate(self, prompts: list, *, tokenizer, generator, settings, dist: Collective = LOCAL) -> tuple:
        """Generate whole rollouts for `prompts` (this batch's, after `start`): TRL's 8-tuple `(prompt_ids,
        completion_ids, tool_mask, completions, logprobs, extra_fields, images, tool_images)`, completions as message
        lists (assistant and tool turns)."""
        if not is_conversational(prompts[0]):
            raise ValueError(
                "tools need conversational prompts (lists of {'role', 'content'} messages): the chat template renders "
                "the tools and the tool turns"
            )
        if len(self._toolboxes) != len(prompts):
            raise ValueError("Agent.generate: call start(rows) for this batch first")
        kwargs = dict(settings.chat_template_kwargs or {})
        prompt_ids: list[Any] = [None] * len(prompts)
        for name in dict.fromkeys(self._names):  # each environment's prompts with its own tools
            rows = [i for i, n in enumerate(self._names) if n == name]
            encoded = encode_prompts(
                tokenizer,
                [prompts[i] for i in rows],
                max_prompt_length=settings.max_prompt_length,
                chat_template_kwargs=kwargs,
                tools=self.schemas[name] or None,
            )
            for i, ids in zip(rows, encoded, strict=True):
                prompt_ids[i] = ids
        check_prompt_lengths(prompt_ids, prompts, settings.max_completion_length, settings.max_positions)
        first = generator.generate(prompt_ids)
        return self.continue_rollouts(
            prompt_ids,
            first.completion_ids,
            first.logprobs,
            tokenizer=tokenizer,
            generator=generator,
            settings=settings,
            dist=dist,
        )

    def continue_rollouts(
        self, prompt_ids, completion_ids, logprobs, *, tokenizer, generator, settings, dist: Collective = LOCAL
    ) -> tuple:
        """Run the tool loop from first turns already generated (by `generate`, or by a `rollout_func`, as TRL runs
        its tools on a custom rollout's output): TRL's 8-tuple, as `generate` returns it."""
        if len(self._toolboxes) != len(prompt_ids):
            raise ValueError("Agent.continue_rollouts: call start(rows) for this batch first")
        kwargs = dict(settings.chat_template_kwargs or {})

        def parse(i: int, ids: list[int], prefix: list[int]) -> dict:
            return parse_turn(tokenizer, ids, prefix=prefix, tools=self.schemas[self._names[i]] or None)

        first_turns = [parse(i, list(ids), list(prompt_ids[i])) for i, ids in enumerate(completion_ids)]
        self.last = run_tool_loop(
            [list(ids) for ids in prompt_ids],
            completion_ids,
            logprobs,
            first_turns,
            toolboxes=self._toolboxes,
            generate=generator.generate,
            parse=parse,
            suffix=lambda messages: tool_suffix_ids(tokenizer, messages, kwargs),
            max_iterations=self.max_iterations,
            max_completion_length=settings.max_completion_length,
            max_positions=min((p for p in (settings.max_positions, settings.engine_positions) if p), default=None),
            round_timeout=self.round_timeout,
            dist=dist,
        )
        loop = self.last
        for index, _, _ in self.failed_resets:  # a rollout whose environment failed to reset trains nothing
            loop.tool_mask[index] = [0] * len(loop.tool_mask[index])
        return prompt_ids, loop.completion_ids, loop.tool_mask, loop.completions, loop.logprobs, {}, None, []
