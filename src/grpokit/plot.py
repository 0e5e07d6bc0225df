"""`reward_curve.png`: reward ± reward_std and loss over steps, drawn from a run's metrics.jsonl."""

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


def plot_run(run_dir: str) -> str:
    """Draw RUN_DIR/reward_curve.png; return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(run_dir) if "reward" in r and "step" in r]
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no logged training step with a reward")
    steps = [r["step"] for r in rows]
    reward = [r["reward"] for r in rows]
    std = [r.get("reward_std", 0.0) for r in rows]
    fig, (ax_r, ax_l) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax_r.plot(steps, reward, color="tab:blue", label="reward (mean)")
    ax_r.fill_between(
        steps,
        [m - s for m, s in zip(reward, std, strict=True)],
        [m + s for m, s in zip(reward, std, strict=True)],
        color="tab:blue",
        alpha=0.2,
        label="± reward_std",
    )
    ax_r.set_ylabel("reward")
    ax_r.legend(loc="lower right")
    ax_r.grid(alpha=0.3)
    loss_rows = [r for r in rows if "loss" in r]
    ax_l.plot([r["step"] for r in loss_rows], [r["loss"] for r in loss_rows], color="tab:red")
    ax_l.set_ylabel("loss")
    ax_l.set_xlabel("optimizer step")
    ax_l.grid(alpha=0.3)
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    fig.tight_layout()
    path = os.path.join(run_dir, "reward_curve.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
