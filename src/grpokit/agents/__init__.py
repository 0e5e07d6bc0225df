"""Agents: tool calling, environments and the multi-turn tool loop (TRL 1.16's `tools=` and
`environment_factory=`), between generation (which produces each turn) and the rollout (which scores and trains on
the whole trajectory).

- `tools.py`: tool schemas and running a turn's calls (sync and async, with a timeout; failures become results).
- `parsing.py`: a generated turn as an assistant message with tool calls; checking a tokenizer can do tools.
- `environments.py`: environment instances, pooled and reset per rollout; their rewards.
- `loop.py`: the tool loop over token ids, with the tool mask.
- `agent.py`: `Agent`, which ties them together for one batch.
"""

from .agent import Agent
from .environments import EnvironmentProblem, Environments, environment_tools
from .loop import LoopResult, run_tool_loop, tool_suffix_ids
from .parsing import TemplateError, check_tool_template, parse_turn
from .tools import ToolBox, ToolCall, ToolError, tool_schema

__all__ = [
    "Agent",
    "EnvironmentProblem",
    "Environments",
    "LoopResult",
    "TemplateError",
    "ToolBox",
    "ToolCall",
    "ToolError",
    "check_tool_template",
    "environment_tools",
    "parse_turn",
    "run_tool_loop",
    "tool_schema",
    "tool_suffix_ids",
]
