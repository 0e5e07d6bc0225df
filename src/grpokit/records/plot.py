"""`reward_curve.png`: reward ± reward_std and loss over steps, drawn from a run's metrics.jsonl, with the eval reward
(`eval_reward` ± `eval_reward_std`) as markers when the run evaluated. Drawn by the run when training ends (see
`grpokit.records.recorder`), and again by `grpokit plot RUN_DIR`."""

from __future__ import annotations

import json
import os


def read_metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ValueError(f"{path} does not exist: is {run_dir} a grpokit run directory?")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{number}: not a JSON object") from None
    return rows


def has_reward_rows(run_dir: str) -> bool:
    """Whether RUN_DIR/metrics.jsonl exists and has a training row with a reward (what the plot needs)."""
    try:
        return bool(curve_series(read_metrics(run_dir))["reward"]["step"])
    except ValueError:
        return False


def curve_series(rows: list[dict]) -> dict[str, dict[str, list]]:
    """The series the plot draws, from metrics.jsonl rows: {"reward": {step, mean, std}, "loss": {step, value},
    "eval_reward": {step, mean, std}, "tool_calls": {step, value}, "held_out": {step, value}}; a series with no rows has empty lists. Training
    rows are those with `reward`, evaluation rows those with `eval_reward` (TRL's names; an evaluation's row has no
    `reward`)."""
    train = [r for r in rows if "reward" in r and "step" in r]
    evaluation = [r for r in rows if "eval_reward" in r and "step" in r]
    losses = [r for r in train if "loss" in r]
    return {
        "reward": {
            "step": [r["step"] for r in train],
            "mean": [r["reward"] for r in train],
            "std": [r.get("reward_std", 0.0) for r in train],
        },
        "loss": {"step": [r["step"] for r in losses], "value": [r["loss"] for r in losses]},
        "eval_reward": {
            "step": [r["step"] for r in evaluation],
            "mean": [r["eval_reward"] for r in evaluation],
            "std": [r.get("eval_reward_std", 0.0) for r in evaluation],
        },
        "tool_calls": {
            "step": [r["step"] for r in train if "tools/call_frequency" in r],
            "value": [r["tools/call_frequency"] for r in train if "tools/call_frequency" in r],
        },
        "held_out": {
            "step": [r["step"] for r in rows if "held_out/greedy_accuracy" in r],
            "value": [r["held_out/greedy_accuracy"] for r in rows if "held_out/greedy_accuracy" in r],
        },
    }


def plot_run(run_dir: str) -> str:
    """Draw RUN_DIR/reward_curve.png; return its path."""
    series = curve_series(read_metrics(run_dir))
    reward, loss, evaluation = series["reward"], series["loss"], series["eval_reward"]
    if not reward["step"]:
        raise ValueError(f"{run_dir}/metrics.jsonl has no logged training step with a reward")
    # A Figure of its own, drawn by Agg, without pyplot: its import and global state cost a third of a second of the
    # run's end, and no window is ever wanted here.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 6))
    ax_r, ax_l = fig.subplots(2, 1, sharex=True)
    ax_r.plot(reward["step"], reward["mean"], color="tab:blue", label="reward (mean)")
    ax_r.fill_between(
        reward["step"],
        [m - s for m, s in zip(reward["mean"], reward["std"], strict=True)],
        [m + s for m, s in zip(reward["mean"], reward["std"], strict=True)],
        color="tab:blue",
        alpha=0.2,
        label="± reward_std",
    )
    if evaluation["step"]:
        ax_r.errorbar(
            evaluation["step"],
            evaluation["mean"],
            yerr=evaluation["std"],
            color="tab:orange",
            marker="o",
            linestyle="--",
            capsize=3,
            label="eval reward ± std",
        )
    held_out = series["held_out"]
    if held_out["step"]:  # the real demo: greedy accuracy on prompts never trained on, before and after
        ax_r.plot(
            held_out["step"],
            held_out["value"],
            color="tab:purple",
            marker="s",
            linestyle="-.",
            label="held-out accuracy (greedy)",
        )
    calls = series["tool_calls"]
    if calls["step"]:  # an agent run: tool calls per completion beside the reward
        ax_r.plot(calls["step"], calls["value"], color="tab:green", linestyle=":", label="tool calls per completion")
    ax_r.set_ylabel("reward")
    ax_r.legend(loc="lower right")
    ax_r.grid(alpha=0.3)
    ax_l.plot(loss["step"], loss["value"], color="tab:red")
    ax_l.set_ylabel("loss")
    ax_l.set_title(
        "loss: near 0 by design in GRPO (advantages average to 0 per group); the reward shows progress", fontsize=8
    )
    ax_l.set_xlabel("optimizer step")
    ax_l.grid(alpha=0.3)
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    # Fixed margins, not tight_layout: the layout is the same for every run (two panels, short labels), and
    # tight_layout draws the whole figure once more to measure it (a third of the plot's time).
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.08, top=0.92, hspace=0.18)
    path = os.path.join(run_dir, "reward_curve.png")
    # zlib's fastest level: a third of the encoder's time, for a file about a quarter larger (about 30 KB)
    fig.savefig(path, dpi=100, pil_kwargs={"compress_level": 1})
    return path


def warm_up() -> None:
    """Import what `plot_run` draws with and fill matplotlib's font and text caches, by drawing a small figure with
    the same kinds of artists (lines, a band, a legend, titles, tick labels) into memory."""
    import io

    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="a")
    ax.fill_between([0, 1], [0, 0], [1, 1], alpha=0.2, label="b")
    ax.legend(loc="lower right")
    ax.set_title("t", fontsize=8)
    ax.set_ylabel("y")
    ax.grid(alpha=0.3)
    fig.suptitle("s")
    fig.savefig(io.BytesIO(), dpi=30, pil_kwargs={"compress_level": 1})
