"""The run's records in output_dir: metrics.jsonl (one row per log, TRL's metric names plus `step`; evaluations'
rows with `eval_` names), completions.jsonl (logged completions), the one-line progress printed per log, and the
closing message that lists what the run left."""

from __future__ import annotations

import json
import os
import time

from transformers import TrainerCallback

from grpokit.config.redaction import redact_deep


def _number(value, spec: str) -> str:
    """A logged value for the progress line: formatted when a number ('nan' for NaN), '-' when missing."""
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def is_eval_log(logs: dict) -> bool:
    """An evaluation's log (Trainer.evaluate): TRL's `eval_` metric names, no training `loss` or `reward`."""
    return "reward" not in logs and "loss" not in logs and any(k.startswith("eval_") for k in logs)


class RunRecorder(TrainerCallback):
    """Appends each training log and each evaluation's to metrics.jsonl, one row each (TRL's metric names plus
    `step`; an evaluation's row has only `eval_` names, e.g. `eval_reward`, never `reward`), logged completions to
    completions.jsonl, and prints one progress line per log: step, reward, loss, ETA (`eval  step ...` for an
    evaluation)."""

    def __init__(self, output_dir: str, *, fresh: bool = True, show_progress: bool = True, keep_until=None):
        """Rows are only ever appended. `fresh` (the writing process) with `keep_until` (the step of the checkpoint a
        run resumes from): when training begins, the files' rows logged after that step are dropped (the resumed run
        logs them again); the rows up to it stay. Nothing is touched before training begins."""
        self.output_dir = output_dir
        self.show_progress = show_progress
        self.trainer = None
        self._start = None
        self._trim_at = keep_until if fresh else None
        self.first_step = None  # the step training began at (0, or the checkpoint's step when resuming)

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.time()
        self.first_step = state.global_step
        if self._trim_at is not None:
            for name in ("metrics.jsonl", "completions.jsonl"):
                path = os.path.join(self.output_dir, name)
                if os.path.exists(path):
                    _keep_rows_until(path, self._trim_at)
            self._trim_at = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        evaluation = is_eval_log(logs)
        if "reward" not in logs and "loss" not in logs and not evaluation:
            if "train_runtime" in logs and self.show_progress:
                print(f"done in {logs['train_runtime']:.0f}s")
            return
        row = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
        with open(os.path.join(self.output_dir, "metrics.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(redact_deep(row)) + "\n")  # metric names are the user's (reward names): redacted
        if args.log_completions:  # completions.jsonl only when asked for, as the field says
            self._write_completions(state.global_step, split="eval" if evaluation else None)
        if self.show_progress and (evaluation or "reward" in logs):
            print(self._progress_line(logs, state, evaluation), flush=True)

    def _progress_line(self, logs, state, evaluation: bool) -> str:
        """`step  N/T | reward m ± s | loss l | elapsed, ETA` for a training log; `eval  step N/T | reward m ± s |
        loss l` for an evaluation (its metrics are TRL's `eval_` names)."""
        prefix = "eval_" if evaluation else ""
        total = state.max_steps or 0
        reward_key, loss_key = prefix + "reward", prefix + "loss"
        reward = f"{_number(logs.get(reward_key), '.3f')} ± {_number(logs.get(reward_key + '_std', 0), '.3f')}"
        loss = f" | loss {_number(logs[loss_key], '+.4f')}" if loss_key in logs else ""
        if evaluation:
            return f"eval  step {state.global_step:>5}/{total} | reward {reward}{loss}"
        elapsed = time.time() - (self._start or time.time())
        eta = elapsed / max(state.global_step, 1) * max(total - state.global_step, 0)
        return f"step {state.global_step:>5}/{total} | reward {reward}{loss} | {elapsed:.0f}s elapsed, ETA {eta:.0f}s"

    def _write_completions(self, step, split: str | None = None) -> None:
        """The completions logged since the last log; those of an evaluation marked `"split": "eval"`."""
        samples = getattr(self.trainer, "logged_completions", None)
        if not samples:
            return
        marker = {"split": split} if split else {}
        with open(os.path.join(self.output_dir, "completions.jsonl"), "a", encoding="utf-8") as fh:
            for sample in samples:
                row = json.loads(json.dumps({"step": step, **marker, **sample}, default=str))  # plain, then redacted
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


def closing_message(output_dir: str, plot_path: str, *, adapter: bool = False) -> str:
    """What a finished run prints: where its weights (the LoRA adapter only, `adapter_model.safetensors`, for a PEFT
    run), resolved config, metrics and reward curve are."""
    rows = [
        ("LoRA adapter and tokenizer:" if adapter else "model and tokenizer:", f"{output_dir}/"),
        ("resolved config:", f"{output_dir}/resolved_config.yaml"),
        ("metrics:", f"{output_dir}/metrics.jsonl"),
        ("reward curve:", plot_path),
    ]
    width = max(len(label) for label, _ in rows) + 1
    return "\n" + "\n".join(f"{label:<{width}}{value}" for label, value in rows)


def library_progress_bars(resolution=None) -> None:
    """Turn off the tqdm bars of datasets ("Generating train split", "Map"), transformers ("Loading weights",
    "Writing model shards") and huggingface_hub (downloads) for `grpokit train`, whose progress is one line per log.

    They stay on when the user asks for them: `HF_HUB_DISABLE_PROGRESS_BARS=0` in the environment (the libraries'
    own switch; also from a YAML `env:` section, applied when the configuration resolves), or `disable_tqdm: false`
    set explicitly in the configuration (`resolution`, once resolved; TrainingArguments' default, None, leaves them
    off: its bars are Trainer's, which grpokit replaces by its progress lines anyway). Called twice: before the
    configuration is parsed (nothing loads bars before) and with the resolution."""
    asked_env = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().lower() in ("0", "false", "no", "off")
    source = resolution.sources.get("disable_tqdm", "default") if resolution is not None else "default"
    asked_config = source not in ("default", "derived") and resolution.values.get("disable_tqdm") is False
    wanted = asked_env or asked_config
    import datasets
    import transformers.utils.logging as transformers_logging

    if wanted:
        transformers_logging.enable_progress_bar()  # huggingface_hub's bars too
        if os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS") is None:  # else that variable decides, and warns
            datasets.enable_progress_bars()
    else:
        transformers_logging.disable_progress_bar()
        if os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS") is None:
            datasets.disable_progress_bars()
