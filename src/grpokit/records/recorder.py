"""The run's records in output_dir, written by one callback that every `GRPOTrainer` attaches to itself (`attach`):
metrics.jsonl (one row per log, TRL's metric names plus `step`; evaluations' rows with `eval_` names),
completions.jsonl (logged completions, with log_completions; for an agent run a few trajectories of each log without it),
resolved_config.yaml (when training begins) and
reward_curve.png (when it ends); and, with progress_lines, one line per log on the console instead of transformers'
log dicts and progress bar."""

from __future__ import annotations

import json
import logging
import os
import time

from transformers import TrainerCallback

from grpokit.config.redaction import redact_deep

logger = logging.getLogger(__name__)

RECORD_FILES = ("metrics.jsonl", "completions.jsonl")


def _number(value, spec: str) -> str:
    """A logged value for the progress line: formatted when a number ('nan' for NaN), '-' when missing."""
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def is_eval_log(logs: dict) -> bool:
    """An evaluation's log (Trainer.evaluate): TRL's `eval_` metric names, no training `loss` or `reward`."""
    return "reward" not in logs and "loss" not in logs and any(k.startswith("eval_") for k in logs)


LOSS_NOTE = (
    "note: GRPO's loss stays near 0 by design (each group's advantages average to 0) and does not measure progress: "
    "the reward does"
)
LOSS_NOTE_KL = "; with beta > 0 the loss is mostly beta x KL, which grows as the policy leaves the reference"


class RunRecorder(TrainerCallback):
    """Appends each training log and each evaluation's to metrics.jsonl, one row each (TRL's metric names plus
    `step`; an evaluation's row has only `eval_` names, e.g. `eval_reward`, never `reward`), logged completions to
    completions.jsonl; writes resolved_config.yaml when training begins and reward_curve.png when it ends. With
    `show_progress`, prints one progress line per log: step, reward, loss, ETA (`eval  step ...` for an evaluation).

    Only the main process writes or prints. Rows are only ever appended, except when training begins: rows logged
    after the step training starts from are dropped (a resumed run logs them again; a run that does not resume starts
    the files afresh)."""

    def __init__(self, output_dir: str | None = None, *, write: bool = True, show_progress: bool = True):
        self.output_dir = output_dir  # None: the run's args.output_dir
        self.write = write
        self.show_progress = show_progress
        self.trainer = None
        self.resolution = None  # `grpokit train` sets the parser's; a Python run's is built from its GRPOConfig
        self.plot_path = None  # reward_curve.png once drawn
        self._start = None
        self.first_step = None  # the step training began at (0, or the checkpoint's step when resuming)
        self._loss_explained = False  # the note under the first progress line with a loss
        self._logs_seen = 0  # training logs so far: an agent run prints a trajectory every EXCERPT_EVERY of them
        self._rewards_explained = False

    def _print_excerpt(self, step: int) -> None:
        """One trajectory of the latest batch (the first with a tool call, if any), a message a line, and, the first
        time, what each reward function scores (its docstring's first paragraph)."""
        samples = list(getattr(self.trainer, "logged_completions", None) or [])
        if not samples:
            return
        sample = next((s for s in samples if any(s.get("tool_calls") or [])), samples[0])
        from grpokit.config.redaction import redact

        print(redact(trajectory_excerpt(sample, step)), flush=True)
        if not self._rewards_explained:
            self._rewards_explained = True
            for line in reward_descriptions(self.trainer):
                print(redact(line), flush=True)

    def _dir(self, args) -> str:
        return self.output_dir or args.output_dir

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.time()
        self.first_step = state.global_step
        if not self.write or not state.is_world_process_zero:
            return
        out = self._dir(args)
        for name in RECORD_FILES:
            path = os.path.join(out, name)
            if os.path.exists(path):
                _keep_rows_until(path, state.global_step)
        # Written before the first step (about 0.03 s): a failure to write it stops the run before any step.
        self._write_resolved_config(args, out)

    def _write_resolved_config(self, args, out: str) -> None:
        from grpokit.records.resolved import python_resolution, write_resolved_config

        if self.resolution is not None:
            write_resolved_config(self.resolution, out)
            return
        trainer = self.trainer
        model = getattr(trainer, "_model_path", None) if trainer is not None else None
        rewards = list(getattr(trainer, "reward_func_names", None) or [])
        write_resolved_config(python_resolution(args), out, python={"model": model, "rewards": rewards})

    def on_train_end(self, args, state, control, **kwargs):
        if not self.write or not state.is_world_process_zero:
            return
        from grpokit.records.plot import has_reward_rows, plot_run

        out = self._dir(args)
        if has_reward_rows(out):  # else no training step was logged (logging_steps beyond the run)
            self.plot_path = plot_run(out)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        evaluation = is_eval_log(logs)
        if "reward" not in logs and "loss" not in logs and not evaluation:
            if "train_runtime" in logs and self.show_progress:
                print(f"done in {logs['train_runtime']:.0f}s")
            return
        agent_run = getattr(self.trainer, "agent", None) is not None and not evaluation
        if self.show_progress and (evaluation or "reward" in logs):
            print(self._progress_line(logs, state, evaluation), flush=True)
            if not evaluation and "loss" in logs and not self._loss_explained:
                self._loss_explained = True
                print(LOSS_NOTE + (LOSS_NOTE_KL if getattr(args, "beta", 0.0) else ""), flush=True)
            if agent_run and "reward" in logs and self._logs_seen % EXCERPT_EVERY == 0:
                self._print_excerpt(state.global_step)
        if not evaluation and "reward" in logs:
            self._logs_seen += 1
        if self.write:
            row = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
            out = self._dir(args)
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "metrics.jsonl"), "a", encoding="utf-8") as fh:
                fh.write(json.dumps(redact_deep(row)) + "\n")  # metric names are the user's (reward names): redacted
            if args.log_completions:  # every logged completion, as the field says
                self._write_completions(out, state.global_step, split="eval" if evaluation else None)
            elif agent_run:  # an agent's trajectories are what a run must be read by: a few of each log, always
                self._write_completions(out, state.global_step, limit=AGENT_TRAJECTORIES_PER_LOG)

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

    def _write_completions(self, out: str, step, split: str | None = None, limit: int | None = None) -> None:
        """The completions logged since the last log (the first `limit` of them); those of an evaluation marked
        `"split": "eval"`."""
        samples = getattr(self.trainer, "logged_completions", None)
        if not samples:
            return
        marker = {"split": split} if split else {}
        with open(os.path.join(out, "completions.jsonl"), "a", encoding="utf-8") as fh:
            for sample in list(samples)[:limit]:
                row = json.loads(json.dumps({"step": step, **marker, **sample}, default=str))  # plain, then redacted
                fh.write(json.dumps(redact_deep(row)) + "\n")
        samples.clear()


AGENT_TRAJECTORIES_PER_LOG = 4  # an agent run writes this many trajectories of each log to completions.jsonl
EXCERPT_EVERY = 10  # an agent run prints one trajectory at its first training log, then every this many logs


def _short(text, width: int = 100) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def trajectory_excerpt(sample: dict, step: int) -> str:
    """A logged trajectory, readable: its rewards, then the prompt's last message and every turn of the completion
    (assistant text and calls, tool results), a line each, each cut to 100 characters."""
    rewards = ", ".join(f"{name} {value:.3f}" for name, value in (sample.get("rewards") or {}).items())
    lines = [f"  a trajectory at step {step} ({rewards}; advantage {sample.get('advantage', 0.0):+.3f}):"]
    prompt, completion = sample.get("prompt"), sample.get("completion")
    if isinstance(prompt, list) and prompt:
        lines.append(f"    {prompt[-1].get('role', '?')}: {_short(prompt[-1].get('content', ''))}")
    elif prompt is not None:
        lines.append(f"    prompt: {_short(prompt)}")
    for message in completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]:
        role, content = message.get("role", "?"), message.get("content") or ""
        calls = [c.get("function", c) for c in message.get("tool_calls") or []]
        called = " ".join(f"[{c.get('name')}({json.dumps(c.get('arguments', {}), default=str)})]" for c in calls)
        name = f" ({message['name']})" if role == "tool" and message.get("name") else ""
        lines.append(f"    {role}{name}: {_short(' '.join(filter(None, [content, called])))}")
    return "\n".join(lines)


def reward_descriptions(trainer) -> list[str]:
    """`  reward NAME: the first paragraph of its docstring` for each reward function that has one."""
    import inspect

    rewards = getattr(trainer, "rewards", None)
    lines = []
    for name, func in zip(getattr(rewards, "names", []), getattr(rewards, "funcs", []), strict=False):
        doc = inspect.getdoc(func) or ""
        first = doc.split("\n\n")[0].strip()
        if first and not first.startswith(">>>"):
            lines.append(f"  reward {name}: {_short(first, 300)}")
    return lines


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


def attach(trainer) -> RunRecorder:
    """Give `trainer` its run recorder (`trainer.run_recorder`): one that was passed in `callbacks`, or a new one.
    `write_run_records` (default true) turns the files on; `progress_lines` (default off in Python, on under
    `grpokit train`) replaces transformers' printed log dicts and tqdm bar by one line per log."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    args = trainer.args
    write = bool(getattr(args, "write_run_records", True))
    show = bool(getattr(args, "progress_lines", False))
    recorder = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, RunRecorder)), None)
    if recorder is None:
        recorder = RunRecorder(write=write, show_progress=show)
        trainer.add_callback(recorder)
    recorder.trainer = trainer
    if show:
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
    trainer.run_recorder = recorder
    return recorder
