"""grpokit.agents.parsing: Hermes tool calls read from token ids, and the tool-template check."""

import pytest

from grpokit.agents.parsing import TemplateError, check_tool_template, hermes_delimiters, parse_turn
from grpokit.tiny import TOOL_CHAT_TEMPLATE, build_tokenizer, build_tool_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tool_tokenizer()


def enc(tok, text):
    return tok.encode(text, add_special_tokens=False)


def chars(tok, text):
    """`text` as one id per character, never matching a special token."""
    return [tok.convert_tokens_to_ids(c) for c in text]


def fn(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_delimiters_are_single_tokens(tok):
    open_id, close_id = hermes_delimiters(tok)
    assert enc(tok, "<tool_call></tool_call>") == [open_id, close_id]
    assert hermes_delimiters(build_tokenizer()) is None


def test_plain_text(tok):
    assert parse_turn(tok, enc(tok, "just text<eos>")) == {"role": "assistant", "content": "just text"}


def test_text_and_one_call(tok):
    ids = enc(tok, 'let me see<tool_call>{"name": "lookup", "arguments": {"key": "a"}}</tool_call><eos>')
    assert parse_turn(tok, ids) == {
        "role": "assistant",
        "content": "let me see",
        "tool_calls": [fn("lookup", {"key": "a"})],
    }


def test_two_calls(tok):
    ids = enc(
        tok,
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        '<tool_call>{"name": "lookup", "arguments": {}}</tool_call><eos>',
    )
    assert parse_turn(tok, ids) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [fn("add", {"a": 1, "b": 2}), fn("lookup", {})],
    }


def test_call_without_arguments_key(tok):
    ids = enc(tok, '<tool_call>{"name": "now"}</tool_call><eos>')
    assert parse_turn(tok, ids)["tool_calls"] == [fn("now", {})]


def test_arguments_given_as_a_json_string(tok):
    ids = enc(tok, '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}</tool_call><eos>')
    assert parse_turn(tok, ids)["tool_calls"] == [fn("add", {"a": 3})]


@pytest.mark.parametrize(
    "text",
    [
        'ok<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call><eos>',  # malformed JSON
        'ok<tool_call>{"arguments": {"a": 1}}</tool_call><eos>',  # no name
        'ok<tool_call>{"name": 3, "arguments": {}}</tool_call><eos>',  # a name that is not a string
        'ok<tool_call>{"name": "add", "arguments": [1]}</tool_call><eos>',  # arguments not an object
        'ok<tool_call>["add"]</tool_call><eos>',  # not an object
        'ok<tool_call>{"name": "add", "arguments": {"a": 1}}<eos>',  # unclosed (cut by the length limit)
        "ok</tool_call><eos>",  # a closing delimiter alone
        # one good call and one malformed: the whole turn is text
        'ok<tool_call>{"name": "add", "arguments": {}}</tool_call><tool_call>{bad}</tool_call><eos>',
    ],
)
def test_malformed_turns_are_plain_text(tok, text):
    ids = enc(tok, text)
    message = parse_turn(tok, ids)
    assert "tool_calls" not in message
    assert message == {"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)}
    assert message["content"].startswith("ok")


def test_delimiters_spelled_out_in_characters_call_nothing(tok):
    body = '{"name": "add", "arguments": {"a": 1}}'
    ids = chars(tok, "<tool_call>" + body + "</tool_call>") + [tok.eos_token_id]
    assert tok.unk_token_id not in ids
    assert hermes_delimiters(tok)[0] not in ids
    message = parse_turn(tok, ids)
    assert message == {"role": "assistant", "content": "<tool_call>" + body + "</tool_call>"}


def test_real_delimiters_around_a_spelled_out_one(tok):
    # The body holds the characters of "<tool_call>" inside a JSON string: still one call, argument kept verbatim.
    open_id, close_id = hermes_delimiters(tok)
    ids = [open_id, *chars(tok, '{"name": "echo", "arguments": {"text": "<tool_call>"}}'), close_id]
    assert parse_turn(tok, ids)["tool_calls"] == [fn("echo", {"text": "<tool_call>"})]


# ---- check_tool_template


def test_tool_tokenizer_passes_the_check(tok):
    check_tool_template(tok)


def test_plain_template_is_refused():
    with pytest.raises(TemplateError, match="ignores tools") as info:
        check_tool_template(build_tokenizer(), name="tiny")
    assert str(info.value).startswith("tiny's chat template")
    assert "\n" not in str(info.value)


def test_an_in_memory_tokenizer_is_named_and_the_tiny_helper_offered():
    """A tokenizer built in memory has no path: the line names its class, and the tiny helper that does tools."""
    tokenizer = build_tokenizer()
    with pytest.raises(TemplateError) as info:
        check_tool_template(tokenizer, name="")
    message = str(info.value)
    kind = type(tokenizer).__name__
    assert message.startswith(f"the tokenizer ({kind}, built in memory)'s chat template ignores tools")
    assert message.endswith("grpokit.tiny.build_tool_tokenizer() gives a tokenizer that does tools")
    check_tool_template(build_tool_tokenizer(), name="")  # and that one passes


def test_tool_template_without_single_token_delimiters_is_refused():
    plain = build_tokenizer()
    plain.chat_template = TOOL_CHAT_TEMPLATE  # renders tools, but <tool_call> is 11 characters here
    with pytest.raises(TemplateError, match="cannot parse tool calls"):
        check_tool_template(plain)


def test_template_that_fails_to_render_is_refused():
    broken = build_tool_tokenizer()
    broken.chat_template = "{{ raise_exception('no tools here') }}"
    with pytest.raises(TemplateError, match="cannot render a tool-calling conversation.*no tools here"):
        check_tool_template(broken)


# ---- a tokenizer with its own response parser


class _ParsingTokenizer:
    """Stands in for a tokenizer with `response_schema`: `parse_response` returns what it is told to."""

    response_schema = {"x-regex": "unused"}
    eos_token = "<eos>"

    def __init__(self, parsed):
        self.parsed = parsed

    def parse_response(self, ids, **kwargs):
        if isinstance(self.parsed, Exception):
            raise self.parsed
        return self.parsed

    def decode(self, ids, skip_special_tokens=False):
        return "decoded"


def test_response_parser_calls_are_normalised():
    parsed = {"role": "assistant", "content": "hi<eos>", "tool_calls": [{"name": "add", "arguments": '{"a": 1}'}]}
    assert parse_turn(_ParsingTokenizer(parsed), [1, 2]) == {
        "role": "assistant",
        "content": "hi",
        "tool_calls": [fn("add", {"a": 1})],
    }


@pytest.mark.parametrize(
    "parsed",
    [ValueError("no match"), "not a dict", {"content": "x", "tool_calls": [{"arguments": {}}]}],
)
def test_response_parser_failures_are_plain_text(parsed):
    assert parse_turn(_ParsingTokenizer(parsed), [1, 2]) == {"role": "assistant", "content": "decoded"}


def test_json_nested_past_the_recursion_limit_is_plain_text(tok):
    # A completion is untrusted: 20000 nested arrays make json.loads raise RecursionError, which must not escape.
    body = '{"name": "f", "arguments": {"x": ' + "[" * 20000 + "]" * 20000 + "}}"
    ids = tok.encode(f"<tool_call>{body}</tool_call><eos>", add_special_tokens=False)
    message = parse_turn(tok, ids)
    assert "tool_calls" not in message and message["content"].startswith('{"name": "f"')
