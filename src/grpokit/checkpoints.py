"""Checkpoints: written atomically, found again, and checked before a run resumes from one.

Atomic writes (`atomic_checkpoint`, around `GRPOTrainer._save_checkpoint`): transformers' Trainer writes
`output_dir/checkpoint-N` in place, file after file, so a process killed while saving leaves a folder that looks like a
checkpoint and is not one. Here every file of the checkpoint (Trainer's, and whatever grpokit adds) is written into
`output_dir/tmp-checkpoint-N/checkpoint-N`; when all processes are done, the folder is renamed to
`output_dir/checkpoint-N` (a rename within one file system is atomic), and only then are older checkpoints rotated out
(save_total_limit) and the checkpoint pushed to the Hub. A kill at any moment leaves either no `checkpoint-N` or a
complete one; the `tmp-checkpoint-*` left behind is removed at the next save and never picked up by resume.

Resume (`resolve_resume`): `resume_from_checkpoint` is a checkpoint folder, or `true` / `last` for the latest complete
checkpoint in output_dir (`latest_checkpoint`: the highest `checkpoint-N` holding trainer_state.json). Each checkpoint
records the settings a resumed run must keep (`grpokit_run.json`: batch geometry, number of processes,
num_generations, loss_type, beta, model, each with where its value came from); resuming with any of them changed is
refused with every change listed (`resume_changes`), unless `resume_allow_changes` is set.

Round state (`save_round_state` / `load_round_state`, called from `GRPOTrainer`'s checkpoint hooks): what a checkpoint
needs beyond the Trainer's own files to resume exactly where it stopped inside a generation round.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
from collections import defaultdict

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy, rotate_checkpoints

logger = logging.getLogger(__name__)

ENTROPY_STATE_FILE = "entropy_ctrl_state.json"
ROUND_STATE_FILE = "grpokit_round_rank{rank}.pt"  # one per process: its generation round at the checkpoint
TRAINER_STATE_NAME = "trainer_state.json"  # transformers.trainer's name for it, written last but one by Trainer
RUN_FILE = "grpokit_run.json"
STAGING_PREFIX = f"tmp-{PREFIX_CHECKPOINT_DIR}-"
LATEST = ("true", "last")  # resume_from_checkpoint values meaning "the latest checkpoint in output_dir"
NO_RESUME = ("", "false")
_CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")

# What a resumed run must keep, in the order a refusal lists them. beta counts only as 0 (no reference model) or not.
GUARDED_FIELDS = (
    "model_name_or_path",
    "num_processes",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "num_iterations",
    "num_generations",
    "loss_type",
    "beta",
)


# What a resumed run may change, but is told about in one line (old -> new): the length of the run and the learning
# rate schedule, and when it logs, evaluates and saves. Recorded in grpokit_run.json; for a checkpoint without them
# (older grpokit, other trainers), those trainer_state.json keeps.
SCHEDULE_FIELDS = (
    "max_steps",
    "num_train_epochs",
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "logging_steps",
    "eval_steps",
    "save_steps",
)
_STATE_SCHEDULE = ("max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps")


class ResumeError(ValueError):
    """resume_from_checkpoint cannot be honoured: one line (or one line per changed setting) that says why."""

    def __init__(self, lines: list[str]):
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


# ---------------------------------------------------------------------------------------------------- finding


def is_complete(folder: str) -> bool:
    """A checkpoint folder Trainer finished writing (trainer_state.json is among the last files it writes; with the
    atomic writes here a `checkpoint-N` folder is complete anyway, but older or foreign ones may not be)."""
    return os.path.isfile(os.path.join(folder, TRAINER_STATE_NAME))


def latest_checkpoint(output_dir: str) -> str | None:
    """The complete `checkpoint-N` folder of output_dir with the highest N; incomplete ones are skipped with a
    warning, `tmp-checkpoint-*` folders (interrupted saves) are never considered."""
    if not os.path.isdir(output_dir):
        return None
    found = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_NAME.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(match.group(1)), name))
    for _, name in sorted(found, reverse=True):
        folder = os.path.join(output_dir, name)
        if is_complete(folder):
            return folder
        logger.warning(f"{folder} is incomplete (no {TRAINER_STATE_NAME}): not resumed from")
    return None


def resolve_resume(value, output_dir: str, source: str | None = None) -> str | None:
    """The checkpoint folder `resume_from_checkpoint` designates (None: no resume), or ResumeError with one line."""
    if value is None or value is False:
        return None
    text = "true" if value is True else str(value)
    if text.strip().lower() in NO_RESUME:
        return None
    where = f"resume_from_checkpoint={text!r}" + (f" ({source})" if source and source != "default" else "")
    if text.strip().lower() in LATEST:
        latest = latest_checkpoint(output_dir)
        if latest is None:
            raise ResumeError(
                [
                    f"{where}: no complete checkpoint in output_dir {output_dir} (a checkpoint-N folder holding "
                    f"{TRAINER_STATE_NAME}); leave resume_from_checkpoint unset to start afresh, or set output_dir to "
                    "the run to resume"
                ]
            )
        return latest
    folder = text
    if not os.path.exists(folder):
        raise ResumeError([f"{where}: no such folder"])
    if not os.path.isdir(folder):
        raise ResumeError([f"{where}: not a folder; give a checkpoint folder (output_dir/checkpoint-N)"])
    parent = os.path.basename(os.path.dirname(os.path.abspath(folder)))
    if parent.startswith(STAGING_PREFIX):
        raise ResumeError([f"{where}: an interrupted save, not a checkpoint; resume from a checkpoint-N folder"])
    if not is_complete(folder):
        inside = latest_checkpoint(folder)
        hint = f"; did you mean {inside}?" if inside else ""
        raise ResumeError([f"{where}: not a complete checkpoint (no {TRAINER_STATE_NAME}){hint}"])
    return folder


# ---------------------------------------------------------------------------------------------------- run record


def run_record(values, sources=None, *, processes: int, processes_source: str = "default") -> dict:
    """{field: {"value", "source"}} of the GUARDED_FIELDS, from resolved values (plus the number of processes)."""
    from grpokit.config.parser import plain

    sources = sources or {}
    record = {}
    for name in GUARDED_FIELDS:
        if name == "num_processes":
            record[name] = {"value": int(processes), "source": processes_source}
        else:
            record[name] = {"value": plain(values.get(name)), "source": sources.get(name, "default")}
    return record


def trainer_run_record(trainer) -> dict:
    """The record of a trainer's run: its arguments, its model, its processes; sources from `trainer.config_sources`
    (set by `grpokit train` from the resolution), else `GRPOConfig(...)` for the arguments given, `default` otherwise."""
    from grpokit import models

    args = trainer.args
    values = {name: getattr(args, name, None) for name in GUARDED_FIELDS}
    values["model_name_or_path"] = models.model_id(trainer.accelerator.unwrap_model(trainer.model))
    sources = getattr(trainer, "config_sources", None)
    if sources is None:
        explicit = getattr(args, "_explicit_fields", frozenset())
        sources = {name: "GRPOConfig(...)" if name in explicit else "default" for name in GUARDED_FIELDS}
        for name in ("steps_per_generation", "generation_batch_size"):  # computed from the others unless given
            sources[name] = "GRPOConfig(...)" if name in explicit else "derived"
        sources["model_name_or_path"] = "GRPOTrainer(model=...)"
        sources["num_processes"] = "WORLD_SIZE" if "WORLD_SIZE" in os.environ else "default"
    return run_record(
        values, sources, processes=args.world_size, processes_source=sources.get("num_processes", "default")
    )


def write_run_record(folder: str, record: dict, schedule: dict | None = None) -> None:
    import grpokit

    data = {"grpokit_version": grpokit.__version__, "fields": record}
    if schedule is not None:
        data["schedule"] = schedule
    with open(os.path.join(folder, RUN_FILE), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, default=str)
        fh.write("\n")


def schedule_of(args) -> dict:
    """The SCHEDULE_FIELDS of training arguments, as plain values."""
    from grpokit.config.parser import plain

    return {name: plain(getattr(args, name, None)) for name in SCHEDULE_FIELDS}


def _same_value(old, new) -> bool:
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and not isinstance(old, bool):
        return float(old) == float(new)
    return old == new


def schedule_changes(checkpoint: str, args) -> list[str]:
    """`name old → new` for each schedule field that differs from the checkpoint's (its grpokit_run.json, else its
    trainer_state.json), in SCHEDULE_FIELDS order."""
    saved = None
    try:
        with open(os.path.join(checkpoint, RUN_FILE), encoding="utf-8") as fh:
            saved = json.load(fh).get("schedule")
    except (OSError, ValueError, AttributeError):
        pass
    if not isinstance(saved, dict):
        try:
            with open(os.path.join(checkpoint, TRAINER_STATE_NAME), encoding="utf-8") as fh:
                state = json.load(fh)
            saved = {name: state[name] for name in _STATE_SCHEDULE if name in state}
            if saved.get("num_train_epochs") is not None and saved.get("max_steps", -1) > 0:
                del saved["num_train_epochs"]  # Trainer stores the epochs it computed from max_steps
        except (OSError, ValueError, AttributeError, TypeError):
            return []
    now = schedule_of(args)
    return [
        f"{name} {_shown(saved[name])} → {_shown(now[name])}"
        for name in SCHEDULE_FIELDS
        if name in saved and not _same_value(saved[name], now[name])
    ]


def _shown(value) -> str:
    """A schedule value as a person writes it: 2 (not 2.0), 0.001, 3e-06, "cosine"."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return json.dumps(value, default=str)


def read_run_record(checkpoint: str) -> dict | None:
    path = os.path.join(checkpoint, RUN_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh).get("fields")
    except (OSError, ValueError, AttributeError):
        return None


def _same(name: str, old, new) -> bool:
    if name == "beta":
        return (old in (0, None)) == (new in (0, None))
    if name == "model_name_or_path" and isinstance(old, str) and isinstance(new, str):
        if old.rstrip("/") == new.rstrip("/"):
            return True
        return os.path.isdir(old) and os.path.isdir(new) and os.path.realpath(old) == os.path.realpath(new)
    return old == new


def resume_changes(checkpoint: str, record: dict) -> list[str]:
    """One line per guarded setting that differs between the checkpoint's record and `record` (none when the
    checkpoint has no record: one written before grpokit kept them, or by another trainer)."""
    saved = read_run_record(checkpoint)
    if saved is None:
        return []
    lines = []
    for name in GUARDED_FIELDS:
        if name not in saved or name not in record:
            continue
        old, new = saved[name], record[name]
        if _same(name, old.get("value"), new.get("value")):
            continue
        line = (
            f"{name}: {json.dumps(old.get('value'))} ({old.get('source', 'default')}) in the checkpoint, "
            f"{json.dumps(new.get('value'))} ({new.get('source', 'default')}) now"
        )
        if name == "beta":
            line += " (beta 0 trains without a reference model, any other value with one)"
        lines.append(line)
    return lines


def refusal(checkpoint: str, changes: list[str], asked: str | None = None) -> list[str]:
    """The lines that refuse a resume with changed settings: a summary, then one line per change. `asked`: how
    resume_from_checkpoint was given, when it is not the checkpoint's path (e.g. "resume_from_checkpoint='true' (cli)")."""
    how = f" ({asked})" if asked else ""
    return [
        f"resuming from {checkpoint}{how}: {len(changes)} setting(s) differ from those the checkpoint was "
        "trained with (listed below); change them back, or set resume_allow_changes: true "
        "(--resume_allow_changes) to resume anyway",
        *(f"  {line}" for line in changes),
    ]


def trainer_resume_checkpoint(trainer, resume_from_checkpoint) -> str | None:
    """The checkpoint `GRPOTrainer.train(resume_from_checkpoint)` resumes from (`resolve_resume`), refused with
    `ResumeError` when settings it records have changed since; with `resume_allow_changes` a warning instead."""
    checkpoint = resolve_resume(resume_from_checkpoint, trainer.args.output_dir)
    if checkpoint is None:
        return None
    changes = resume_changes(checkpoint, trainer_run_record(trainer))
    if changes and not trainer.args.resume_allow_changes:
        raise ResumeError(refusal(checkpoint, changes))
    if changes and trainer.accelerator.is_main_process:
        logger.warning(
            "warning: resuming from %s with changed settings (resume_allow_changes): %s",
            checkpoint,
            "; ".join(changes),
        )
    moved = schedule_changes(checkpoint, trainer.args)
    if moved and trainer.accelerator.is_main_process:
        # This line says it once; transformers would list logging/eval/save steps again, over several lines.
        _quiet_transformers_step_mismatch()
        logger.warning("warning: resuming from %s with a changed schedule: %s", checkpoint, ", ".join(moved))
    return checkpoint


class _DropStepMismatch(logging.Filter):
    def filter(self, record):
        return "do not match the ones in the `trainer_state.json`" not in str(record.msg)


def _quiet_transformers_step_mismatch() -> None:
    """Drop transformers' own multi-line warning about logging/eval/save steps that differ from the checkpoint's
    (`compare_trainer_and_checkpoint_args`): the schedule line above says it, with the other fields."""
    target = logging.getLogger("transformers.trainer_utils")
    if not any(isinstance(f, _DropStepMismatch) for f in target.filters):
        target.addFilter(_DropStepMismatch())


def check_resume(resolution) -> list[str]:
    """For `grpokit train`, before anything loads: resolve resume_from_checkpoint into the training arguments (a
    checkpoint folder, or None) and return the problem lines (none when there is nothing to refuse). Changes allowed
    by resume_allow_changes are left to the trainer to warn about when it resumes."""
    training_args = resolution.instances[1]
    value = resolution.values.get("resume_from_checkpoint")
    try:
        checkpoint = resolve_resume(value, training_args.output_dir, resolution.sources.get("resume_from_checkpoint"))
    except ResumeError as exc:
        return exc.lines
    training_args.resume_from_checkpoint = checkpoint
    if checkpoint is None:
        return []
    unreadable = checkpoint_problems(checkpoint)
    if unreadable or training_args.resume_allow_changes:
        return unreadable
    changes = resume_changes(
        checkpoint,
        run_record(
            resolution.values,
            resolution.sources,
            processes=resolution.processes,
            processes_source=processes_source(resolution),
        ),
    )
    source = resolution.sources.get("resume_from_checkpoint", "default")
    asked = f"resume_from_checkpoint={value!r}" + ("" if source == "default" else f", {source}")
    return refusal(checkpoint, changes, asked) if changes else []


# The files of a checkpoint folder that are read when a run resumes, by how they are read.
_TENSOR_FILES = (".pt", ".pth", ".bin")  # torch.load(weights_only=True): tensors and plain values, no other pickle
_JSON_FILES = (".json",)
# Written by transformers for the record (a pickled TrainingArguments) and never read when a run resumes: not checked,
# and never unpickled.
_NOT_READ_ON_RESUME = ("training_args.bin",)


def file_problem(path: str) -> str | None:
    """What is wrong with one file of a checkpoint, or None. Tensor files are opened as `torch.load(weights_only=True,
    mmap=True)` does (no object is unpickled beyond tensors and plain values; nothing is read into memory), safetensors
    through their header, JSON files parsed."""
    import pickle

    import torch

    name = os.path.basename(path)
    try:
        if name.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, framework="pt") as fh:
                fh.keys()
        elif name.endswith(_TENSOR_FILES):
            from transformers.trainer_pt_utils import safe_globals  # numpy's RNG state, as the loader allows

            with safe_globals():
                try:
                    torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                except (RuntimeError, OSError):
                    # The legacy format cannot be mapped, and a damaged file fails mapping with a bare EINVAL: read
                    # plainly, which says what is wrong (or loads the legacy file).
                    torch.load(path, map_location="cpu", weights_only=True)
        elif name.endswith(_JSON_FILES):
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            if name == TRAINER_STATE_NAME and not isinstance(getattr(data, "get", lambda _: None)("global_step"), int):
                return "has no integer global_step"
    except pickle.UnpicklingError as exc:
        named = re.search(r"unsupported (?:global: )?GLOBAL ([\w.]+)", str(exc), re.I)
        if named:  # an object the loader refuses: what a planted pickle asks for
            return f"holds a pickled object beyond tensors and plain values (it asks for {named.group(1)}): refused"
        detail = re.search(r"WeightsUnpickler error: (.+?)(?:\n\n|$)", str(exc), re.S)
        what = " ".join((detail.group(1) if detail else str(exc)).split())[:200]
        return f"cannot be read (not a tensor file: {what})"
    except OSError as exc:
        if name.endswith(_TENSOR_FILES) and _damaged_archive(path):  # torch says only "[Errno 22] Invalid argument"
            return f"cannot be read (truncated or damaged: {_damaged_archive(path)})"
        return f"cannot be read (OSError: {' '.join(str(exc).split())[:200]})"
    except Exception as exc:  # truncated, garbage, wrong format: whatever the reader says, in one line
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        return f"cannot be read ({type(exc).__name__}: {detail})"
    return None


def _damaged_archive(path: str) -> str | None:
    """Why a torch file (a zip archive) is not a whole archive, or None when it is one or is not a zip file."""
    import zipfile

    with open(path, "rb") as fh:
        if fh.read(2) != b"PK":
            return None
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as exc:
        return f"{exc}; its archive is incomplete"
    return f"{bad} fails its checksum" if bad else None


def checkpoint_problems(checkpoint: str) -> list[str]:
    """Every unreadable or inconsistent file of a checkpoint folder (its top level: DeepSpeed's own folder is read
    by DeepSpeed), one line each naming the file, plus where to resume from instead."""
    problems = [f"{checkpoint}/{TRAINER_STATE_NAME}: missing"] if not is_complete(checkpoint) else []
    for name in sorted(os.listdir(checkpoint)):
        path = os.path.join(checkpoint, name)
        if os.path.isfile(path) and name not in _NOT_READ_ON_RESUME:
            problem = file_problem(path)
            if problem:
                problems.append(f"{path}: {problem}")
    named = _CHECKPOINT_NAME.match(os.path.basename(os.path.normpath(checkpoint)))
    step = checkpoint_step(checkpoint)
    if not problems and named and step is not None and step != int(named.group(1)):
        # e.g. a trainer_state.json copied in from another checkpoint: the run would resume at the wrong step
        state = os.path.join(checkpoint, TRAINER_STATE_NAME)
        problems.append(f"{state}: global_step {step} in a folder named for step {named.group(1)}")
    if not problems:
        return []
    earlier = _previous_good_checkpoint(checkpoint)
    advice = (
        f"resume from the previous complete checkpoint: --resume_from_checkpoint {earlier}"
        if earlier
        else "no earlier complete checkpoint in this folder: start without resume_from_checkpoint"
    )
    return [f"resume_from_checkpoint: {problem}; {advice}" for problem in problems]


def _previous_good_checkpoint(checkpoint: str) -> str | None:
    """The newest `checkpoint-N` beside `checkpoint`, with a smaller N, whose files all read."""
    match = _CHECKPOINT_NAME.match(os.path.basename(os.path.normpath(checkpoint)))
    if not match:
        return None
    parent = os.path.dirname(os.path.normpath(checkpoint))
    steps = sorted(
        (int(m.group(1)), name)
        for name in os.listdir(parent)
        if (m := _CHECKPOINT_NAME.match(name)) and int(m.group(1)) < int(match.group(1))
    )
    for _, name in reversed(steps):
        folder = os.path.join(parent, name)
        if is_complete(folder) and not any(
            file_problem(os.path.join(folder, f))
            for f in os.listdir(folder)
            if os.path.isfile(os.path.join(folder, f)) and f not in _NOT_READ_ON_RESUME
        ):
            return folder
    return None


def checkpoint_step(checkpoint: str | None) -> int | None:
    """The global step a checkpoint was taken at (from its trainer_state.json); None without a readable one."""
    if not checkpoint:
        return None
    try:
        with open(os.path.join(checkpoint, TRAINER_STATE_NAME), encoding="utf-8") as fh:
            step = json.load(fh).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def processes_source(resolution) -> str:
    """Where a resolution's number of processes comes from, in a few words."""
    from grpokit.launch import under_launcher

    if resolution.launch is not None and not under_launcher():  # checked here for the launch it will start
        return resolution.processes_how
    return "WORLD_SIZE" if "WORLD_SIZE" in os.environ else "default"


# ---------------------------------------------------------------------------------------------------- atomic saves


def remove_interrupted_saves(run_dir: str) -> None:
    """Delete the `tmp-checkpoint-*` folders that saves interrupted earlier left in run_dir."""
    if not os.path.isdir(run_dir):
        return
    for name in os.listdir(run_dir):
        path = os.path.join(run_dir, name)
        if name.startswith(STAGING_PREFIX) and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)


def _publish(folder: str, final: str) -> None:
    """Rename the finished checkpoint `folder` to `final` (replacing an older folder of that name), then drop the
    staging folder around it."""
    staging = os.path.dirname(folder)
    if not os.path.isdir(folder):  # another node sharing this file system published it already
        return
    replaced = None
    if os.path.lexists(final):
        replaced = f"{staging}-replaced"
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(final, replaced)
    os.rename(folder, final)
    shutil.rmtree(staging, ignore_errors=True)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)


def _repoint_best(trainer, run_dir: str, staging: str) -> bool:
    """Trainer looked for the best checkpoint in the staging folder: point state.best_model_checkpoint at run_dir's,
    as it would have. True when it changed."""
    state, args = trainer.state, trainer.args
    before = state.best_model_checkpoint
    if args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST) and state.best_global_step:
        best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.best_global_step}")
        if state.best_global_step == state.global_step or os.path.isdir(best):
            state.best_model_checkpoint = best
    if state.best_model_checkpoint and os.path.abspath(state.best_model_checkpoint).startswith(
        os.path.abspath(staging) + os.sep
    ):
        state.best_model_checkpoint = os.path.join(run_dir, os.path.basename(state.best_model_checkpoint))
    return state.best_model_checkpoint != before


def atomic_checkpoint(save_checkpoint):
    """Decorate a Trainer's `_save_checkpoint(model, trial)` so that the checkpoint appears complete or not at all.

    While the decorated method runs, `trainer._get_output_dir()` answers the staging folder `run_dir/tmp-checkpoint-N`
    (so Trainer and any override write `tmp-checkpoint-N/checkpoint-N`, which is what they compute as the checkpoint
    folder) and pushes to the Hub are held back. Then grpokit_run.json is added, every process waits for the others,
    the folder is renamed to `run_dir/checkpoint-N`, older checkpoints are rotated out and the held push is made.
    """

    @functools.wraps(save_checkpoint)
    def save(trainer, model, trial):
        args, step = trainer.args, trainer.state.global_step
        run_dir = trainer._get_output_dir(trial=trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{step}"
        staging = os.path.join(run_dir, f"{STAGING_PREFIX}{step}")
        if args.should_save:
            remove_interrupted_saves(run_dir)
        trainer.accelerator.wait_for_everyone()  # nobody writes into a staging folder being removed
        held_pushes = []
        trainer._get_output_dir = lambda trial=None: staging
        trainer._push_from_checkpoint = held_pushes.append
        try:
            save_checkpoint(trainer, model, trial)
        finally:
            del trainer._get_output_dir, trainer._push_from_checkpoint
        folder = os.path.join(staging, name)
        best_moved = _repoint_best(trainer, run_dir, staging)
        if args.should_save and os.path.isdir(folder):
            if best_moved:
                trainer.state.save_to_json(os.path.join(folder, TRAINER_STATE_NAME))
            write_run_record(folder, trainer_run_record(trainer), schedule_of(args))
        trainer.accelerator.wait_for_everyone()  # every process has written its files
        final = os.path.join(run_dir, name)
        if args.should_save:
            _publish(folder, final)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=args.save_total_limit,
                best_model_checkpoint=trainer.state.best_model_checkpoint,
                use_mtime=True,
            )
        trainer.accelerator.wait_for_everyone()  # the checkpoint is in place for every process
        if held_pushes:
            trainer._push_from_checkpoint(final)

    return save


# ---------------------------------------------------------------------------------------------------- loading


def without_tied_keys(model, load_result):
    """`load_result` (a state-dict load's missing and unexpected keys) less the missing keys of tied weights.

    A model whose lm_head shares its tensor with the input embedding (tie_word_embeddings) is saved with that tensor
    once, under the embedding's name; loading the checkpoint then reports `lm_head.weight` missing, and transformers
    warns "There were missing keys in the checkpoint model loaded: ['lm_head.weight']", which reads like lost weights.
    Nothing is lost: the embedding was loaded, and lm_head is the same tensor. A missing key is dropped only when
    another name of its tensor was loaded."""
    names_of = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        names_of[id(param)].append(name)
    missing = set(load_result.missing_keys)
    tied = {
        name
        for names in names_of.values()
        if len(names) > 1 and any(n not in missing for n in names)
        for name in names
        if name in missing
    }
    if not tied:
        return load_result
    kept = [key for key in load_result.missing_keys if key not in tied]
    if hasattr(load_result, "_replace"):  # torch's _IncompatibleKeys (a named tuple)
        return load_result._replace(missing_keys=kept)
    from types import SimpleNamespace

    return SimpleNamespace(missing_keys=kept, unexpected_keys=list(load_result.unexpected_keys))


# ---------------------------------------------------------------------------------------------------- round state


def save_round_state(trainer, folder: str) -> None:
    """What a checkpoint needs beyond the Trainer's own files to resume exactly, written into `folder` (the
    checkpoint being written): the entropy coefficient (main process) and, from every process, its generation round
    (`grpokit_round_rank<i>.pt`): the micro-step count, the buffered micro-batches when the checkpoint falls inside a
    round (they were generated with older weights; generating them again would not give the same), and the metrics and
    completions not logged yet. The Trainer's RNG states continue the sampling from there."""
    import torch

    args, entropy_control = trainer.args, trainer._entropy_control
    if entropy_control.adaptive and args.should_save:
        with open(os.path.join(folder, ENTROPY_STATE_FILE), "w") as f:
            json.dump(entropy_control.state_dict(), f)
    if args.save_only_model:  # no optimizer or RNG states either: such a checkpoint cannot be resumed
        return
    inside_round = trainer._buffered_inputs is not None and trainer._step % trainer.generate_every != 0
    state = {
        "step": trainer._step,
        "global_step": trainer.state.global_step,
        "buffered_inputs": _storable(trainer._buffered_inputs) if inside_round else None,
        # dynamic sampling's refill stream: how many chunks of extra prompts it has drawn (-1: off)
        "refill_position": -1 if trainer._dynamic_sampling is None else trainer._dynamic_sampling.refill.position,
        # python values as JSON text, so that the file loads with torch.load(weights_only=True)
        "logged": json.dumps(
            {
                "metrics": trainer._metrics["train"],
                "step_time": trainer._step_time,
                "completions": trainer._completion_log.state_dict(),
            },
            default=str,
        ),
    }
    os.makedirs(folder, exist_ok=True)  # a process can get here before the main one made the folder
    torch.save(state, os.path.join(folder, ROUND_STATE_FILE.format(rank=args.process_index)))


def _storable(batches: list[dict] | None) -> list[dict] | None:
    """Micro-batches as `torch.load(weights_only=True)` reads them back: a vision-language model's `vision` entry
    (`grpokit.vision.VisionRows`) becomes its rows' lists of `[kind, tensor]` (the images kept for generation engines
    are not needed to train on the round)."""
    if batches is None:
        return None
    return [
        {**batch, "vision": [{k: [kind, t] for k, (kind, t) in row.items()} for row in batch["vision"].rows]}
        if batch.get("vision") is not None
        else batch
        for batch in batches
    ]


def _restored(batches: list[dict] | None) -> list[dict] | None:
    """`_storable`'s inverse."""
    if batches is None:
        return None
    from .vision import VisionRows

    return [
        {**batch, "vision": VisionRows([{k: (kind, t) for k, (kind, t) in row.items()} for row in batch["vision"]])}
        if isinstance(batch.get("vision"), list)
        else batch
        for batch in batches
    ]


def load_round_state(trainer, checkpoint: str) -> None:
    """Restore what `save_round_state` wrote (called once the Trainer state of `checkpoint` is loaded). Without a
    matching round file (older grpokit, other geometry) the micro-step count follows from the step, and the round the
    checkpoint falls in is generated again."""
    import torch

    args, entropy_control = trainer.args, trainer._entropy_control
    path = os.path.join(checkpoint, ENTROPY_STATE_FILE)
    if entropy_control.adaptive and os.path.exists(path):
        with open(path) as f:
            entropy_control.load_state_dict(json.load(f))
    path = os.path.join(checkpoint, ROUND_STATE_FILE.format(rank=args.process_index))
    state = None
    if os.path.isfile(path):
        state = torch.load(path, map_location=trainer.accelerator.device, weights_only=True)
    buffered = state["buffered_inputs"] if state is not None else None
    if (
        state is None
        or state["global_step"] != trainer.state.global_step
        or (buffered is not None and len(buffered) != args.steps_per_generation)
    ):
        trainer._step = trainer.state.global_step * args.gradient_accumulation_steps
        trainer._buffered_inputs = None
        if trainer._step % trainer.generate_every:
            logger.warning(
                "%s has no saved generation round for process %d: the round it falls in is generated again "
                "with the current weights, so the run continues but not exactly as it would have",
                checkpoint,
                args.process_index,
            )
        return
    trainer._step, trainer._buffered_inputs = state["step"], _restored(buffered)
    if trainer._dynamic_sampling is not None and state.get("refill_position", -1) >= 0:
        trainer._dynamic_sampling.refill.position = int(state["refill_position"])
    logged = json.loads(state["logged"])
    trainer._metrics["train"] = defaultdict(list, logged["metrics"])
    trainer._step_time = logged["step_time"]
    trainer._completion_log.load_state_dict(logged["completions"])
