"""`Agent` over a scripted generation backend: the prompts carry the tools' schemas, one round runs, and the
engine's own sequence limit (vLLM's max model length) drops a round the policy's positions would allow."""

import json

import pytest

from grpokit.agents import Agent
from grpokit.generation import Generated
from grpokit.rollout.rollout import RolloutSettings
from grpokit.tiny import build_tool_tokenizer


def square(x: int) -> int:
    """Square a number.

    Args:
        x: the number
    """
    return x * x


@pytest.fixture(scope="module")
def tok():
    return build_tool_tokenizer()


class Backend:
    """First call: every row calls square(3); later calls: the text `ok` and end of turn."""

    def __init__(self, tok):
        self.tok, self.requests = tok, []

    def generate(self, prompt_ids):
        self.requests.append([list(p) for p in prompt_ids])
        text = (
            '<tool_call>{"name": "square", "arguments": {"x": 3}}</tool_call><eos>'
            if len(self.requests) == 1
            else "ok<eos>"
        )
        return Generated([self.tok.encode(text, add_special_tokens=False) for _ in prompt_ids])


def run(tok, **limits):
    agent = Agent([square])
    prompts = agent.start([{"prompt": [{"role": "user", "content": "hi"}]}] * 2)
    backend = Backend(tok)
    settings = RolloutSettings(num_generations=2, max_completion_length=200, **limits)
    return agent, backend, agent.generate(prompts, tokenizer=tok, generator=backend, settings=settings)


def test_one_round_with_the_tools_in_the_prompt(tok):
    agent, backend, output = run(tok)
    prompt_ids, completion_ids, tool_mask, completions, logprobs, extra, images, tool_images = output
    schema = json.dumps(agent.schemas[None][0])
    assert tok.decode(prompt_ids[0]) == f"<|system|>{schema}<eos><|user|>hi<eos><|assistant|>"
    call = '<tool_call>{"name": "square", "arguments": {"x": 3}}</tool_call><eos>'
    assert tok.decode(completion_ids[0]) == call + "<|tool|>9<eos><|assistant|>ok<eos>"
    n_call, n_tool = len(tok.encode(call, add_special_tokens=False)), len(tok.encode("<|tool|>9<eos><|assistant|>"))
    assert tool_mask[0] == [1] * n_call + [0] * n_tool + [1, 1, 1]
    assert completions[0][1] == {"role": "tool", "name": "square", "content": "9"}
    assert completions[0][2]["content"] == "ok"
    assert (logprobs, extra, images, tool_images) == (None, {}, None, [])
    assert len(backend.requests) == 2 and agent.last.num_calls == 2


def test_the_engines_limit_drops_the_round(tok):
    _, _, output = run(tok)
    whole = len(output[0][0]) + len(output[1][0]) - 3  # prompt + call + tool turn: the next turn's input
    # The engine takes inputs shorter than its limit: one position fewer than that input drops the round.
    agent, backend, output = run(tok, max_positions=512, engine_positions=whole)
    assert agent.last.dropped == 2 and len(backend.requests) == 1
    assert [m["role"] for m in output[3][0]] == ["assistant"]
    agent, backend, output = run(tok, max_positions=512, engine_positions=whole + 1)
    assert agent.last.dropped == 0 and len(backend.requests) == 2
