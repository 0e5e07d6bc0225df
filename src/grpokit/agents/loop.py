"""The tool loop: after a turn that calls tools, run the calls, append the tool turn to the sequence as token ids,
generate the next turn, and so on until no turn calls a tool or the cap is reached.

Nothing is retokenized: a rollout's completion is its first turn's ids, then for each round the ids of the tool
turn (rendered by the chat template, see `tool_suffix_ids`) and of the next generated turn. `tool_mask` is 0 on the
tool turns (the model did not write them: no loss, entropy, importance weight or length counts them) and 1 on what
the model generated.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from grpokit.dist import LOCAL, Collective
from grpokit.generation import Generated

from .tools import ToolBox, ToolCall


def tool_suffix_ids(tokenizer, tool_messages: list[dict], chat_template_kwargs: dict | None = None) -> list[int]:
    """The ids that follow an assistant turn ending in its end-of-turn token when `tool_messages` answer it: the
    tool turn(s) and the next assistant header. Found by rendering a small conversation with and without them (the
    real tool name, since some templates derive the tool header from it)."""
    kwargs = dict(chat_template_kwargs or {})
    call = {"type": "function", "function": {"name": tool_messages[0].get("name", "tool"), "arguments": {}}}
    head = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    before = list(_ids(tokenizer.apply_chat_template(head, add_generation_prompt=False, tokenize=True, **kwargs)))
    after = list(
        _ids(tokenizer.apply_chat_template(head + tool_messages, add_generation_prompt=True, tokenize=True, **kwargs))
    )
    # Templates that write "<end-of-turn>\n" after a turn: the generated turn ends at the end-of-turn token itself.
    ends = [i for i, token in enumerate(before) if token == tokenizer.eos_token_id]
    if ends:
        before = before[: ends[-1] + 1]
    if after[: len(before)] != before:
        raise ValueError(
            "the chat template renders an assistant turn differently once tool messages follow it, so the tool "
            "turn's tokens cannot be appended to a generated turn; use a prefix-preserving tool template"
        )
    return after[len(before) :]


def _ids(rendered) -> list[int]:
    if isinstance(rendered, dict) or hasattr(rendered, "keys"):
        rendered = rendered["input_ids"]
    if rendered and isinstance(rendered[0], list):
        rendered = rendered[0]
    return list(rendered)


@dataclass
class LoopResult:
    """Per rollout: the whole completion's ids, its tool mask, its sampling logprobs (0.0 on tool tokens; None when
    the backend gives none), its messages (assistant and tool turns), and the calls it made, by round."""

    completion_ids: list[list[int]]
    tool_mask: list[list[int]]
    logprobs: list[list[float]] | None
    completions: list[list[dict]]
    calls: list[list[ToolCall]] = field(default_factory=list)
    dropped: int = 0  # tool rounds rolled back because their result would overflow the length limits

    @property
    def num_calls(self) -> int:
        return sum(len(c) for c in self.calls)

    @property
    def num_failures(self) -> int:
        return sum(call.failed for c in self.calls for call in c)


def run_tool_loop(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    logprobs: list[list[float]] | None,
    first_turns: list[dict],
    *,
    toolboxes: Sequence[ToolBox],
    generate: Callable[[list[list[int]]], Generated],
    parse: Callable[[int, list[int], list[int]], dict],
    suffix: Callable[[list[dict]], list[int]],
    max_iterations: int | None,
    max_completion_length: int,
    max_positions: int | None = None,
    round_timeout: float | None = None,
    dist: Collective = LOCAL,
) -> LoopResult:
    """Run the tool loop over one process's rollouts.

    Args:
        prompt_ids, completion_ids, logprobs: the first turn, as generated (lists per rollout).
        first_turns: the first turn of each rollout parsed as an assistant message.
        toolboxes: each rollout's tools.
        generate: generates one turn per given sequence (the generation backend's `generate`).
        parse: `(rollout index, turn ids, ids before the turn) -> assistant message`.
        suffix: the ids of a tool turn answering the given tool messages (`tool_suffix_ids`).
        max_iterations: the most tool rounds per rollout; None: until no turn calls a tool; 0: calls are parsed but
            never run.
        max_completion_length: a round whose tool turn would make the completion longer is dropped (the rollout
            ends with the turn before it, its calls still counted); a turn generated after it is cut to fit.
        max_positions: likewise for the whole sequence against the model's positions.
        round_timeout: seconds all of one round's tool calls (every rollout's) may take together; calls not done by
            then end with an error result, and later ones of the round do not start. None: no cap.
        dist: every process runs the same number of rounds (a generation backend may need every process in each
            call); one with nothing left generates a throwaway turn.
    """
    completion_ids = [list(ids) for ids in completion_ids]
    logprobs = None if logprobs is None else [list(lp) for lp in logprobs]
    result = LoopResult(
        completion_ids=completion_ids,
        tool_mask=[[1] * len(ids) for ids in completion_ids],
        logprobs=logprobs,
        completions=[[turn] for turn in first_turns],
        calls=[[] for _ in completion_ids],
    )
    pending = [i for i, turn in enumerate(first_turns) if turn.get("tool_calls")]
    cap = sys.maxsize if max_iterations is None else max_iterations
    rounds = 0
    while rounds < cap and _anyone(dist, pending):
        sequences, kept = [], []
        deadline = None if round_timeout is None else time.monotonic() + round_timeout
        for i in pending:
            calls = toolboxes[i].run(result.completions[i][-1]["tool_calls"], deadline)
            result.calls[i].extend(calls)
            messages = [call.message() for call in calls]
            sequence = prompt_ids[i] + completion_ids[i] + suffix(messages)
            too_long = len(sequence) - len(prompt_ids[i]) > max_completion_length
            if too_long or (max_positions is not None and len(sequence) >= max_positions):
                result.dropped += 1  # the round is rolled back: the rollout ends with the turn that called
                continue
            result.completions[i].extend(messages)
            sequences.append(sequence)
            kept.append(i)
        generated = None
        if sequences or dist.num_processes > 1:  # a process with nothing to generate still takes part
            generated = generate(sequences if sequences else [prompt_ids[0]])
        next_pending = []
        for n, i in enumerate(kept):
            turn = list(generated.completion_ids[n])
            turn_logprobs = None if generated.logprobs is None else list(generated.logprobs[n])
            room = max_completion_length - (len(sequences[n]) - len(prompt_ids[i]))
            turn = turn[:room]
            tool_length = len(sequences[n]) - len(prompt_ids[i]) - len(completion_ids[i])
            result.tool_mask[i] += [0] * tool_length + [1] * len(turn)
            if logprobs is not None:
                filler = [0.0] * len(turn) if turn_logprobs is None else turn_logprobs[: len(turn)]
                logprobs[i] += [0.0] * tool_length + filler
            completion_ids[i] = sequences[n][len(prompt_ids[i]) :] + turn
            if turn:
                message = parse(i, turn, sequences[n])
                result.completions[i].append(message)
                if message.get("tool_calls"):
                    next_pending.append(i)
        pending = next_pending
        rounds += 1
    return result


def _anyone(dist: Collective, pending: list[int]) -> bool:
    """Whether any process has a rollout waiting for its tools (every process gets the same answer)."""
    if dist.num_processes == 1:
        return bool(pending)
    return any(dist.gather_object([len(pending)]))
