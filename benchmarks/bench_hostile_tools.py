"""What a hostile tool costs the trainer: memory with a huge result, and a round's wall time with slow calls.

    python benchmarks/bench_hostile_tools.py            # both measurements, each in a fresh process
    PYTHONPATH=/path/to/older/src python benchmarks/bench_hostile_tools.py   # the same on an older checkout

`memory`: one rollout whose tool returns `--mb` MB of text goes through the tool loop as the trainer runs it (the
call, the tool turn rendered by the chat template and tokenized, the next turn); prints the peak RSS growth.
`round`: 16 rollouts each calling a tool that sleeps 0.9 s in one round; prints the round's wall time (with the
round cap of the settings, `tool_round_timeout`, default 600 s, and with `--round-timeout`). Prints numbers; not a
test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _agent(tools, **limits):
    import inspect

    from grpokit.agents.agent import Agent

    accepted = inspect.signature(Agent).parameters
    return Agent(tools, **{k: v for k, v in limits.items() if k in accepted})


def _run_loop(agent, rows: int, tool_name: str):
    from types import SimpleNamespace

    from grpokit.generation import Generated
    from grpokit.tiny import build_tool_tokenizer

    tok = build_tool_tokenizer()
    agent.start([{"prompt": [{"role": "user", "content": "q"}]} for _ in range(rows)])
    first = tok.encode(
        f'<tool_call>{{"name": "{tool_name}", "arguments": {{}}}}</tool_call><eos>', add_special_tokens=False
    )
    generator = SimpleNamespace(
        generate=lambda prompts: Generated([tok.encode("ok<eos>", add_special_tokens=False)] * len(prompts))
    )
    settings = SimpleNamespace(
        chat_template_kwargs=None, max_completion_length=1 << 30, max_positions=None, engine_positions=None
    )
    return agent.continue_rollouts(
        [[1, 2]] * rows, [list(first)] * rows, None, tokenizer=tok, generator=generator, settings=settings
    )


def memory(mb: int) -> dict:
    def dump() -> str:
        """Dumps a lot.

        Args:
        """
        return "A" * (mb * 1_000_000)

    agent = _agent([dump], timeout=600.0)
    before = _rss_mb()
    start = time.perf_counter()
    _run_loop(agent, 1, "dump")
    return {
        "result_mb": mb,
        "peak_rss_growth_mb": round(_rss_mb() - before, 1),
        "seconds": round(time.perf_counter() - start, 2),
    }


def round_time(round_timeout: float | None) -> dict:
    def slow() -> str:
        """Sleeps 0.9 s.

        Args:
        """
        time.sleep(0.9)
        return "done"

    agent = _agent([slow], timeout=120.0, round_timeout=round_timeout)
    start = time.perf_counter()
    _run_loop(agent, 16, "slow")
    calls = [c for calls in agent.last.calls for c in calls]
    return {
        "round_timeout": round_timeout,
        "calls": len(calls),
        "finished": sum(not c.failed for c in calls),
        "round_seconds": round(time.perf_counter() - start, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--round-timeout", type=float, default=5.0)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, value = args.one.split(":")
        result = memory(int(value)) if kind == "memory" else round_time(None if value == "none" else float(value))
        print(json.dumps(result))
        return
    for one in (f"memory:{args.mb}", "round:600", f"round:{args.round_timeout:g}"):
        out = subprocess.run([sys.executable, __file__, "--one", one], capture_output=True, text=True, timeout=3600)
        print(one, out.stdout.strip() or out.stderr.strip()[-500:], flush=True)


if __name__ == "__main__":
    main()
