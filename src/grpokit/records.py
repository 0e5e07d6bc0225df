"""The run's records in output_dir: metrics.jsonl (one row per log, TRL's metric names plus `step`), completions.jsonl
(logged completions), and the one-line progress printed per log."""

from __future__ import annotations

import json
import os
import time

from transformers import TrainerCallback

from grpokit.config.redaction import redact_deep


def _number(value, spec: str) -> str:
    """A logged value for the progress line: formatted when a number ('nan' for NaN), '-' when missing."""
    return format(value, spec) if isinstance(value, (int, float)) else "-"


class RunRecorder(TrainerCallback):
    """Appends each training log to metrics.jsonl (TRL's metric names plus `step`), logged completions to
    completions.jsonl, and prints one progress line per log: step, reward, loss, ETA."""

    def __init__(self, output_dir: str, *, fresh: bool = True, show_progress: bool = True, keep_until=None):
        """`fresh`: start the files afresh; with `keep_until` (the step of the checkpoint a run resumes from), keep
        their rows up to that step and drop the later ones, which the resumed run logs again."""
        self.output_dir = output_dir
        self.show_progress = show_progress
        self.trainer = None
        self._start = None
        for name in ("metrics.jsonl", "completions.jsonl") if fresh else ():
            path = os.path.join(output_dir, name)
            if os.path.exists(path) and keep_until is not None:
                _keep_rows_until(path, keep_until)
            elif os.path.exists(path):
                os.remove(path)

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.time()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "reward" not in logs and "loss" not in logs:
            if "train_runtime" in logs and self.show_progress:
                print(f"done in {logs['train_runtime']:.0f}s")
            return
        row = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
        with open(os.path.join(self.output_dir, "metrics.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(redact_deep(row)) + "\n")  # metric names are the user's (reward names): redacted
        if args.log_completions:  # completions.jsonl only when asked for, as the field says
            self._write_completions(state.global_step)
        if self.show_progress and "reward" in logs:
            elapsed = time.time() - (self._start or time.time())
            total = state.max_steps or 0
            eta = elapsed / max(state.global_step, 1) * max(total - state.global_step, 0)
            loss = f" | loss {_number(logs['loss'], '+.4f')}" if "loss" in logs else ""
            reward = f"{_number(logs['reward'], '.3f')} ± {_number(logs.get('reward_std', 0), '.3f')}"
            print(
                f"step {state.global_step:>5}/{total} | reward {reward}{loss} | {elapsed:.0f}s elapsed, ETA {eta:.0f}s",
                flush=True,
            )

    def _write_completions(self, step) -> None:
        samples = getattr(self.trainer, "logged_completions", None)
        if not samples:
            return
        with open(os.path.join(self.output_dir, "completions.jsonl"), "a", encoding="utf-8") as fh:
            for sample in samples:
                row = json.loads(json.dumps({"step": step, **sample}, default=str))  # plain values, then redacted
                fh.write(json.dumps(redact_deep(row)) + "\n")
        samples.clear()


def _keep_rows_until(path: str, step: int) -> None:
    """Rewrite a JSON-lines file of the run without its rows logged after `step` (or that cannot be read)."""
    kept = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(kept)
