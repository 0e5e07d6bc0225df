"""Showing what a rollout produced: a plain-text table of prompts, completions, rewards and advantages."""

from __future__ import annotations

import json
import math
import os
import random
from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any


def _text(entry: Any) -> str:
    if isinstance(entry, list) and all(isinstance(m, dict) for m in entry):
        return " | ".join(f"{m.get('role', '')}: {_content_text(m.get('content', ''))}{_calls_text(m)}" for m in entry)
    return str(entry)


def _content_text(content: Any) -> str:
    """A message's content as text: content blocks joined, each image shown as `<image>`."""
    if isinstance(content, list) and all(isinstance(block, dict) for block in content):
        return "".join(
            "<image>" if block.get("type") == "image" else str(block.get("text") or "") for block in content
        )
    return "" if content is None else str(content)


def _calls_text(message: dict) -> str:
    """An assistant message's tool calls, as `name(arguments)` after its text."""
    calls = message.get("tool_calls") or []
    functions = [c.get("function", {}) if isinstance(c, dict) else {} for c in calls]
    return "".join(f" [{f.get('name')}({json.dumps(f.get('arguments'), default=str)})]" for f in functions)


def _cell(value: Any, width: int, *, keep_end: bool = False) -> str:
    """One cell: a number with 2 decimals, or the text cut to `width` (its end kept with `keep_end`)."""
    if isinstance(value, float):
        text = "nan" if math.isnan(value) else f"{value:.2f}"
    else:
        text = _text(value).replace("\r", "").replace("\n", "\\n").replace("\t", " ")
    if len(text) <= width:
        return text
    return "..." + text[3 - width :] if keep_end else text[: width - 3] + "..."


SYSTEM_ROLES = ("system", "developer")


def _is_conversation(entry: Any) -> bool:
    return isinstance(entry, list) and all(isinstance(m, dict) for m in entry)


def _without_system(entry: Any) -> Any:
    """A conversation's messages less its system and developer messages (the same system prompt in every row would
    fill the prompt cell before the user's message shows); a text prompt as it is."""
    if not _is_conversation(entry):
        return entry
    return [m for m in entry if m.get("role") not in SYSTEM_ROLES] or entry


def select_rows(prompts: Sequence, num_samples: int | None, *, unique_prompts: bool = False, seed: int | None = None):
    """Indices of the rows to show: one per distinct prompt if `unique_prompts`, then at most `num_samples` of them
    drawn at random (all of them, in order, when `num_samples` is None or large enough)."""
    indices = list(range(len(prompts)))
    if unique_prompts:
        seen, kept = set(), []
        for i in indices:
            key = repr(prompts[i])
            if key not in seen:
                seen.add(key)
                kept.append(i)
        indices = kept
    if num_samples is not None and num_samples < len(indices):
        indices = sorted(random.Random(seed).sample(indices, num_samples))
    return indices


def completions_table(
    prompts: Sequence,
    completions: Sequence,
    rewards: dict[str, Sequence[float]],
    advantages: Sequence[float],
    step: int,
    *,
    num_samples: int | None = None,
    unique_prompts: bool = False,
    extra: dict[str, Sequence] | None = None,
    text_width: int = 48,
) -> str:
    """A fixed-width table, one row per completion: prompt, completion, each reward, the advantage, extra columns.

    Long texts are cut to `text_width` characters and newlines shown as `\\n`. A conversational prompt is shown
    without its system and developer messages (the header then says `prompt (no system)`; completions.jsonl and the
    parquet files keep the whole prompt), and a prompt too long for its cell keeps its end, the latest message (the
    one the completion answers), behind a leading `...`.
    """
    rows = select_rows(prompts, num_samples, unique_prompts=unique_prompts)
    extra = extra or {}
    shown = [_without_system(prompts[i]) for i in rows]
    dropped = any(p is not prompts[i] and len(p) < len(prompts[i]) for p, i in zip(shown, rows, strict=True))
    headers = ["prompt (no system)" if dropped else "prompt", "completion", *rewards, "advantage", *extra]
    widths = [text_width, text_width] + [text_width if h == "tools" else max(9, len(h)) for h in headers[2:]]
    body = []
    for prompt, i in zip(shown, rows, strict=True):
        values = [prompt, completions[i], *(float(r[i]) for r in rewards.values()), float(advantages[i])]
        values += [col[i] if i < len(col) else "" for col in extra.values()]
        body.append([_cell(v, w, keep_end=j == 0) for j, (v, w) in enumerate(zip(values, widths, strict=True))])
    widths = [max([len(h)] + [len(r[c]) for r in body]) for c, h in enumerate(headers)]
    numeric = set(range(2, 3 + len(rewards)))

    def line(cells):
        return (
            "| "
            + " | ".join(
                c.rjust(w) if j in numeric else c.ljust(w) for j, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    rule = "+-" + "-+-".join("-" * w for w in widths) + "-+"
    return "\n".join([f"completions at step {step}", rule, line(headers), rule, *map(line, body), rule])


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else value


def _calls_summary(calls: list[dict]) -> str:
    """`name(arguments) -> result` per call, `!` marking a failed one; for the completions table."""
    return "; ".join(
        f"{'!' if c.get('failed') else ''}{c.get('name')}({json.dumps(c.get('arguments'), default=str)}) -> "
        f"{c.get('result')}"
        for c in calls
    )


class CompletionLog:
    """The prompts, completions, rewards and advantages of the latest generation batch (all processes), shown at
    each logging step when `log_completions` is on."""

    def __init__(self, size: int, image_dir: str | None = None):
        """`image_dir`: where the images of logged image prompts are written (`log_multimodal`); their paths,
        relative to the run folder two levels above it (where completions.jsonl is), go into each completion's record
        under `images`. None: images are not written."""
        self.image_dir = image_dir
        self._images_written = 0
        self.prompts, self.completions, self.advantages = deque(maxlen=size), deque(maxlen=size), deque(maxlen=size)
        self.rewards = defaultdict(lambda: deque(maxlen=size))
        self.extra = defaultdict(lambda: deque(maxlen=size))
        self.samples = deque(maxlen=size)  # one dict per completion: prompt, completion, rewards, advantage
        self._pending_extra = defaultdict(list)
        self._pending_calls: list[list[dict]] = []
        self._unreported = False  # a rollout arrived since the last report

    def add_extra(self, column: str, values: list):
        """`log_extra` for reward functions: one more column of the completions table."""
        self._pending_extra[column].extend(values)

    def add_tool_calls(self, calls: list[list[dict]]):
        """This process's tool calls in the next rollout, one list per completion (dicts with name, arguments,
        result, failed, seconds): written with each completion's record and summarised in the table's `tools`
        column."""
        self._pending_calls.extend(calls)

    def state_dict(self) -> dict:
        """Everything held, as plain lists and dicts (saved in checkpoints, so a resumed run logs the same)."""
        return {
            "prompts": list(self.prompts),
            "completions": list(self.completions),
            "advantages": list(self.advantages),
            "rewards": {name: list(values) for name, values in self.rewards.items()},
            "extra": {name: list(values) for name, values in self.extra.items()},
            "samples": list(self.samples),
            "pending_extra": dict(self._pending_extra),
            "pending_calls": list(self._pending_calls),
            "unreported": self._unreported,
        }

    def load_state_dict(self, state: dict) -> None:
        for name in ("prompts", "completions", "advantages", "samples"):
            getattr(self, name).clear()
            getattr(self, name).extend(state[name])
        for name in ("rewards", "extra"):
            getattr(self, name).clear()
            for column, values in state[name].items():
                getattr(self, name)[column].extend(values)
        self._pending_extra.clear()
        self._pending_extra.update({column: list(values) for column, values in state["pending_extra"].items()})
        self._pending_calls = list(state.get("pending_calls", []))  # absent from checkpoints before agents
        self._unreported = state["unreported"]

    def add_rollout(self, rollout, names: list[str], dist):
        self.prompts.extend(rollout.prompts)
        self.completions.extend(rollout.completions)
        for i, name in enumerate(names):
            self.rewards[name].extend(rollout.rewards[:, i].tolist())
        self.advantages.extend(rollout.all_advantages.tolist())
        self._unreported = True
        for i, (prompt, completion) in enumerate(zip(rollout.prompts, rollout.completions, strict=True)):
            rewards = {name: _json_float(rollout.rewards[i, j].item()) for j, name in enumerate(names)}
            advantage = rollout.all_advantages[i].item()
            self.samples.append(
                {"prompt": prompt, "completion": completion, "rewards": rewards, "advantage": advantage}
            )
        if self.image_dir is not None and rollout.images is not None and dist.process_index == 0:
            records = list(self.samples)[-len(rollout.images) :]
            for sample, paths in zip(records, self._write_images(rollout.images), strict=True):
                if paths:
                    sample["images"] = paths
        local_rows = len(rollout.prompts) // dist.num_processes
        for column in sorted(set(dist.gather_object(list(self._pending_extra)))):
            values = self._pending_extra.get(column, [None] * local_rows)
            self.extra[column].extend(dist.gather_object(values))
        self._pending_extra.clear()
        if any(dist.gather_object([bool(self._pending_calls)])):
            calls = dist.gather_object(self._pending_calls or [[] for _ in range(local_rows)])
            for sample, made in zip(list(self.samples)[-len(calls) :], calls, strict=True):
                sample["tool_calls"] = made
            self.extra["tools"].extend(_calls_summary(made) for made in calls)
        self._pending_calls.clear()

    def _write_images(self, images: list) -> list[list[str]]:
        """Each row's images as PNG files in `image_dir` (a group's repeats share one file): their paths relative to
        the run folder (`<output_dir>/completions/images` -> `completions/images/image_0000001.png`)."""
        import hashlib

        os.makedirs(self.image_dir, exist_ok=True)
        written: dict[str, str] = {}
        paths = []
        for row in images:
            row_paths = []
            for image in row or []:
                digest = hashlib.blake2b(image.tobytes(), digest_size=16).hexdigest() + f"{image.size}"
                if digest not in written:
                    self._images_written += 1
                    name = f"image_{self._images_written:07d}.png"
                    image.save(os.path.join(self.image_dir, name))
                    run = os.path.dirname(os.path.dirname(os.path.abspath(self.image_dir)))
                    written[digest] = os.path.relpath(os.path.join(self.image_dir, name), run)
                row_paths.append(written[digest])
            paths.append(row_paths)
        return paths

    def report(self, step: int, output_dir: str, num_samples: int | None, unique_prompts: bool) -> str:
        """Print the table and write the whole batch to `<output_dir>/completions/completions_<step>.parquet`;
        nothing when no rollout arrived since the last report (e.g. the end-of-training log)."""
        if not self._unreported:
            return ""
        self._unreported = False
        prompts, rewards = list(self.prompts), {name: list(values) for name, values in self.rewards.items()}
        extra = {name: list(values) for name, values in self.extra.items()}
        table = completions_table(
            prompts,
            list(self.completions),
            rewards,
            list(self.advantages),
            step,
            num_samples=num_samples,
            unique_prompts=unique_prompts,
            extra=extra,
        )
        from grpokit.config.redaction import redact

        table = redact(table)  # a secret the policy or a prompt repeats is not printed or written
        print(table)
        self._write_parquet(
            step, output_dir, rewards, extra, select_rows(prompts, None, unique_prompts=unique_prompts)
        )
        return table

    def _write_parquet(self, step, output_dir, rewards, extra, rows):
        import pandas as pd

        from grpokit.config.redaction import redact

        def text(value):
            return redact(value if isinstance(value, str) else json.dumps(value, default=str))

        n = len(self.prompts)
        columns = {
            "step": [step] * n,
            "prompt": [text(p) for p in self.prompts],
            "completion": [text(c) for c in self.completions],
            **rewards,
            **{k: [redact(str(v)) for v in values] for k, values in extra.items()},
            "advantage": list(self.advantages),
        }
        frame = pd.DataFrame({k: v for k, v in columns.items() if len(v) == n}).iloc[rows]
        folder = os.path.join(output_dir, "completions")
        os.makedirs(folder, exist_ok=True)
        frame.to_parquet(os.path.join(folder, f"completions_{step:05d}.parquet"))
