"""grpokit.agents.loop: the tool loop over token ids with a scripted generator and the tiny tool tokenizer."""

import pytest

from grpokit.agents.loop import run_tool_loop, tool_suffix_ids
from grpokit.agents.parsing import parse_turn
from grpokit.agents.tools import ToolBox
from grpokit.generation import Generated
from grpokit.tiny import build_tool_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tool_tokenizer()


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def rep(text: str, n: int) -> str:
    """Repeat text.

    Args:
        text: the text
        n: how many times
    """
    return text * n


def fails(x: int) -> int:
    """Fail.

    Args:
        x: x
    """
    raise ValueError("no")


def call_text(name, **arguments):
    import json

    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


class Script:
    """A generate function: call k returns `turns[k]` (one list per sequence, text) and records what it was given."""

    def __init__(self, tok, *turns, logprobs=None):
        self.tok, self.turns, self.logprobs, self.seen = tok, list(turns), logprobs, []

    def __call__(self, sequences):
        self.seen.append([list(s) for s in sequences])
        texts = self.turns[len(self.seen) - 1]
        assert len(texts) == len(sequences)
        ids = [enc(self.tok, t) for t in texts]
        logprobs = None
        if self.logprobs is not None:
            logprobs = [[self.logprobs] * len(i) for i in ids]
        return Generated(ids, logprobs)


def loop(
    tok,
    first_texts,
    generate,
    *,
    max_iterations=None,
    max_completion_length=500,
    max_positions=None,
    logprob=None,
    tools=(rep, fails),
):
    prompt_ids = [enc(tok, f"<|user|>q{i}<eos><|assistant|>") for i in range(len(first_texts))]
    completion_ids = [enc(tok, t) for t in first_texts]
    logprobs = None if logprob is None else [[logprob] * len(ids) for ids in completion_ids]
    return (
        prompt_ids,
        completion_ids,
        run_tool_loop(
            prompt_ids,
            completion_ids,
            logprobs,
            [parse_turn(tok, ids) for ids in completion_ids],
            toolboxes=[ToolBox(list(tools))] * len(first_texts),
            generate=generate,
            parse=lambda i, ids, prefix: parse_turn(tok, ids),
            suffix=lambda messages: tool_suffix_ids(tok, messages),
            max_iterations=max_iterations,
            max_completion_length=max_completion_length,
            max_positions=max_positions,
        ),
    )


# ---- tool_suffix_ids


def test_tool_suffix_ids_of_the_tiny_template(tok):
    assert tool_suffix_ids(tok, [{"role": "tool", "name": "rep", "content": "RESULT"}]) == enc(
        tok, "<|tool|>RESULT<eos><|assistant|>"
    )
    two = [{"role": "tool", "name": "rep", "content": "A"}, {"role": "tool", "name": "fails", "content": "B"}]
    assert tool_suffix_ids(tok, two) == enc(tok, "<|tool|>A<eos><|tool|>B<eos><|assistant|>")


def test_tool_suffix_ids_refuses_a_template_that_rewrites_the_assistant_turn(tok):
    other = build_tool_tokenizer()
    # Renders the assistant turn differently when it is the last message.
    other.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and loop.last %}{{ '<|assistant|>LAST<eos>' }}"
        "{% else %}{{ '<|' + m['role'] + '|>' + (m['content'] or '') + '<eos>' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    with pytest.raises(ValueError, match="prefix-preserving"):
        tool_suffix_ids(other, [{"role": "tool", "name": "rep", "content": "R"}])


# ---- one round


def test_one_round_ids_mask_logprobs_messages(tok):
    first = "hm" + call_text("rep", text="ab", n=2) + "<eos>"
    generate = Script(tok, ["done<eos>"], logprobs=-2.0)
    prompt_ids, first_ids, result = loop(tok, [first], generate, logprob=-1.0)

    suffix = enc(tok, "<|tool|>abab<eos><|assistant|>")
    turn = enc(tok, "done<eos>")
    assert result.completion_ids == [first_ids[0] + suffix + turn]
    assert generate.seen == [[prompt_ids[0] + first_ids[0] + suffix]]
    assert result.tool_mask == [[1] * len(first_ids[0]) + [0] * len(suffix) + [1] * len(turn)]
    assert result.logprobs == [[-1.0] * len(first_ids[0]) + [0.0] * len(suffix) + [-2.0] * len(turn)]
    assert result.completions == [
        [
            {
                "role": "assistant",
                "content": "hm",
                "tool_calls": [{"type": "function", "function": {"name": "rep", "arguments": {"text": "ab", "n": 2}}}],
            },
            {"role": "tool", "name": "rep", "content": "abab"},
            {"role": "assistant", "content": "done"},
        ]
    ]
    assert (result.num_calls, result.num_failures, result.dropped) == (1, 0, 0)
    assert [c.result for c in result.calls[0]] == ["abab"]


def test_logprobs_stay_none_without_sampler_logprobs(tok):
    first = call_text("rep", text="a", n=1) + "<eos>"
    _, _, result = loop(tok, [first], Script(tok, ["x<eos>"]))
    assert result.logprobs is None


def test_sampler_logprobs_missing_after_the_first_turn_are_zero(tok):
    first = call_text("rep", text="a", n=1) + "<eos>"
    _, first_ids, result = loop(tok, [first], Script(tok, ["xy<eos>"]), logprob=-1.0)
    suffix = enc(tok, "<|tool|>a<eos><|assistant|>")
    assert result.logprobs == [[-1.0] * len(first_ids[0]) + [0.0] * len(suffix) + [0.0] * 3]


def test_rollouts_without_calls_are_left_alone_and_failures_are_counted(tok):
    firsts = [
        "plain<eos>",
        call_text("fails", x=1) + call_text("rep", text="z", n=3) + "<eos>",
        call_text("missing") + "<eos>",
    ]
    generate = Script(tok, ["a<eos>", "b<eos>"])
    prompt_ids, first_ids, result = loop(tok, firsts, generate)

    suffix1 = enc(tok, "<|tool|>{'error': 'no'}<eos><|tool|>zzz<eos><|assistant|>")
    suffix2 = enc(tok, "<|tool|>{'error': 'Tool missing not found.'}<eos><|assistant|>")
    assert generate.seen == [[prompt_ids[1] + first_ids[1] + suffix1, prompt_ids[2] + first_ids[2] + suffix2]]
    assert result.completion_ids == [
        first_ids[0],
        first_ids[1] + suffix1 + enc(tok, "a<eos>"),
        first_ids[2] + suffix2 + enc(tok, "b<eos>"),
    ]
    assert result.tool_mask == [
        [1] * len(first_ids[0]),
        [1] * len(first_ids[1]) + [0] * len(suffix1) + [1, 1],
        [1] * len(first_ids[2]) + [0] * len(suffix2) + [1, 1],
    ]
    assert (result.num_calls, result.num_failures) == (3, 2)
    assert [[c.failed for c in calls] for calls in result.calls] == [[], [True, False], [True]]
    assert result.completions[0] == [{"role": "assistant", "content": "plain"}]
    assert [m["role"] for m in result.completions[1]] == ["assistant", "tool", "tool", "assistant"]


# ---- max_iterations


CALLS_THEN_TEXT = (
    [call_text("rep", text="b", n=1) + "<eos>"],
    [call_text("rep", text="c", n=1) + "<eos>"],
    ["end<eos>"],
)


def test_max_iterations_none_runs_until_no_call(tok):
    generate = Script(tok, *CALLS_THEN_TEXT)
    _, first_ids, result = loop(tok, [call_text("rep", text="a", n=1) + "<eos>"], generate, max_iterations=None)
    assert len(generate.seen) == 3
    assert [c.result for c in result.calls[0]] == ["a", "b", "c"]
    assert [m["role"] for m in result.completions[0]] == ["assistant", "tool"] * 3 + ["assistant"]
    assert result.completions[0][-1] == {"role": "assistant", "content": "end"}
    expected = first_ids[0]
    for text, turn in zip("abc", CALLS_THEN_TEXT, strict=True):
        expected = expected + enc(tok, f"<|tool|>{text}<eos><|assistant|>") + enc(tok, turn[0])
    assert result.completion_ids == [expected]
    assert sum(result.tool_mask[0]) == len(first_ids[0]) + sum(len(enc(tok, t[0])) for t in CALLS_THEN_TEXT)


def test_max_iterations_one_runs_one_round(tok):
    generate = Script(tok, *CALLS_THEN_TEXT)
    _, first_ids, result = loop(tok, [call_text("rep", text="a", n=1) + "<eos>"], generate, max_iterations=1)
    assert len(generate.seen) == 1
    assert [c.result for c in result.calls[0]] == ["a"]  # the second turn's call is parsed, never run
    assert result.num_calls == 1
    assert [m["role"] for m in result.completions[0]] == ["assistant", "tool", "assistant"]
    assert result.completions[0][-1]["tool_calls"][0]["function"]["name"] == "rep"
    suffix = enc(tok, "<|tool|>a<eos><|assistant|>")
    assert result.completion_ids == [first_ids[0] + suffix + enc(tok, CALLS_THEN_TEXT[0][0])]


def test_max_iterations_zero_parses_but_never_runs(tok):
    generate = Script(tok)
    first = call_text("rep", text="a", n=1) + "<eos>"
    _, first_ids, result = loop(tok, [first], generate, max_iterations=0)
    assert generate.seen == []
    assert result.completion_ids == first_ids
    assert result.tool_mask == [[1] * len(first_ids[0])]
    assert (result.num_calls, result.dropped) == (0, 0)
    assert result.completions[0][0]["tool_calls"][0]["function"]["arguments"] == {"text": "a", "n": 1}


# ---- the length limits


def test_round_that_would_overflow_is_dropped_and_rolled_back(tok):
    firsts = [call_text("rep", text="k", n=10) + "<eos>", call_text("rep", text="L", n=40) + "<eos>"]
    lengths = [len(enc(tok, t)) for t in firsts]
    assert lengths[0] == lengths[1]
    short_suffix = enc(tok, "<|tool|>" + "k" * 10 + "<eos><|assistant|>")
    limit = lengths[0] + len(short_suffix) + 2
    generate = Script(tok, ["ok<eos>"])
    prompt_ids, first_ids, result = loop(tok, firsts, generate, max_completion_length=limit)

    assert generate.seen == [[prompt_ids[0] + first_ids[0] + short_suffix]]  # only the round that fits
    assert result.completion_ids == [first_ids[0] + short_suffix + enc(tok, "ok"), first_ids[1]]
    assert result.tool_mask == [[1] * lengths[0] + [0] * len(short_suffix) + [1, 1], [1] * lengths[1]]
    assert result.completions[1] == [parse_turn(tok, first_ids[1])]  # no tool message for the dropped round
    assert [m["role"] for m in result.completions[0]] == ["assistant", "tool", "assistant"]
    assert result.dropped == 1
    assert (result.num_calls, result.num_failures) == (2, 0)  # the dropped round's call counts, not as a failure
    assert result.calls[1][0].result == "L" * 40


def test_overflow_of_a_later_round_keeps_the_earlier_rounds(tok):
    first = call_text("rep", text="a", n=1) + "<eos>"
    second = call_text("rep", text="b", n=30) + "<eos>"
    first_length = len(enc(tok, first))
    suffix = enc(tok, "<|tool|>a<eos><|assistant|>")
    limit = first_length + len(suffix) + len(enc(tok, second)) + 10
    generate = Script(tok, [second])
    _, first_ids, result = loop(tok, [first], generate, max_completion_length=limit)
    assert len(generate.seen) == 1
    assert result.completion_ids == [first_ids[0] + suffix + enc(tok, second)]
    assert result.completions[0][-1]["role"] == "assistant"
    assert len(result.completions[0]) == 3
    assert (result.num_calls, result.dropped) == (2, 1)


@pytest.mark.parametrize(("extra", "dropped"), [(0, 1), (1, 0)])
def test_round_that_reaches_max_positions_is_dropped(tok, extra, dropped):
    first = call_text("rep", text="a", n=1) + "<eos>"
    prompt_length = len(enc(tok, "<|user|>q0<eos><|assistant|>"))
    suffix = enc(tok, "<|tool|>a<eos><|assistant|>")
    positions = prompt_length + len(enc(tok, first)) + len(suffix) + extra
    generate = Script(tok, ["zz<eos>"])
    _, first_ids, result = loop(tok, [first], generate, max_positions=positions)
    assert result.dropped == dropped
    assert len(generate.seen) == 1 - dropped
    assert result.num_calls == 1
    if dropped:
        assert result.completion_ids == first_ids


def test_turn_after_a_tool_turn_is_cut_to_fit(tok):
    first = call_text("rep", text="a", n=1) + "<eos>"
    suffix = enc(tok, "<|tool|>a<eos><|assistant|>")
    limit = len(enc(tok, first)) + len(suffix) + 3
    generate = Script(tok, ["abcdef<eos>"], logprobs=-0.5)
    _, first_ids, result = loop(tok, [first], generate, max_completion_length=limit, logprob=-1.0)
    assert result.completion_ids == [first_ids[0] + suffix + enc(tok, "abc")]
    assert len(result.completion_ids[0]) == limit
    assert result.tool_mask == [[1] * len(first_ids[0]) + [0] * len(suffix) + [1, 1, 1]]
    assert result.logprobs == [[-1.0] * len(first_ids[0]) + [0.0] * len(suffix) + [-0.5] * 3]
    assert result.completions[0][-1] == {"role": "assistant", "content": "abc"}


def test_tool_turn_that_fills_the_limit_exactly_leaves_no_room_for_a_turn(tok):
    first = call_text("rep", text="a", n=1) + "<eos>"
    suffix = enc(tok, "<|tool|>a<eos><|assistant|>")
    limit = len(enc(tok, first)) + len(suffix)
    _, first_ids, result = loop(tok, [first], Script(tok, ["abc<eos>"]), max_completion_length=limit)
    assert result.completion_ids == [first_ids[0] + suffix]
    assert result.tool_mask == [[1] * len(first_ids[0]) + [0] * len(suffix)]
    assert [m["role"] for m in result.completions[0]] == ["assistant", "tool"]
    assert result.dropped == 0
