"""`grpokit config plan` for an agent run: rounds, generation requests, the shared completion budget, waiting."""

from grpokit.cli.plan import agent_plan


def rows(**values):
    base = {"max_completion_length": 512, "max_prompt_length": 256, "tool_timeout": 120.0, "tool_round_timeout": 600.0}
    out = agent_plan({**base, **values})
    return None if out is None else {name: value for name, value, _ in out}


def test_no_tools_no_section():
    assert rows() is None
    assert rows(tools=[], environment_factory=None) is None


def test_capped_rounds():
    plan = rows(tools=["m:a", "m:b"], max_tool_calling_iterations=3)
    assert plan["tools"] == 2 and plan["environments"] == 0
    assert plan["tool rounds per rollout"] == 3
    assert plan["generation requests per rollout"] == "<= 4"  # the first turn + one per round
    assert plan["completion budget"] == 512
    assert plan["longest engine input"] == "768"  # 256 prompt + 512 completion
    assert plan["tool wait per round"] == "120 s per call, at most 600 s per round"
    assert plan["tool result"] == "<= 65536 characters"
    assert (
        rows(tools=["m:a"], tool_round_timeout=None, max_tool_result_chars=100)["tool result"] == "<= 100 characters"
    )


def test_uncapped_environments_and_no_timeout():
    plan = rows(environment_factory={"maze": "e:Maze", "game": "e:Game"}, max_tool_calling_iterations=None)
    assert plan["environments"] == 2 and plan["tools"] == 0
    assert plan["tool rounds per rollout"] == "no cap" and plan["generation requests per rollout"] == "1 + rounds"
    assert (
        rows(environment_factory="e:Maze", tool_timeout=None, tool_round_timeout=None)["tool wait per round"]
        == "no limit (tool_timeout: null), no cap per round"
    )
    assert rows(environment_factory="e:Maze", max_prompt_length=None)["longest engine input"] == "prompt + 512"


def test_zero_rounds_says_calls_never_run():
    (how,) = [h for name, _, h in agent_plan({"tools": ["m:a"], "max_tool_calling_iterations": 0}) if "rounds" in name]
    assert how.endswith("calls are parsed, never run")
