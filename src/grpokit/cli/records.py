"""What `grpokit train` prints about its records: the closing message that lists what the run left, and the
libraries' progress bars turned off. The records themselves (metrics.jsonl, completions.jsonl, resolved_config.yaml,
reward_curve.png, the one-line progress per log) are the library's (`grpokit.records`), written the same way for a
run started from Python."""

from __future__ import annotations

import os

__all__ = ["RunRecorder", "closing_message", "is_eval_log", "library_progress_bars"]  # noqa: F822 - lazy, below


def __getattr__(name: str):
    """`RunRecorder` and `is_eval_log`, imported when first asked for: the recorder is a transformers callback, and
    `grpokit train` must be able to refuse a mistyped flag before transformers loads (seconds)."""
    if name in ("RunRecorder", "is_eval_log"):
        from grpokit.records import recorder

        return getattr(recorder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def closing_message(output_dir: str, plot_path: str | None, *, adapter: bool = False, records: bool = True) -> str:
    """What a finished run prints: where its weights (the LoRA adapter only, `adapter_model.safetensors`, for a PEFT
    run), resolved config, metrics and reward curve are (no records with `write_run_records: false`; no curve when no
    training step was logged)."""
    rows = [("LoRA adapter and tokenizer:" if adapter else "model and tokenizer:", f"{output_dir}/")]
    if records:
        rows += [
            ("resolved config:", f"{output_dir}/resolved_config.yaml"),
            ("metrics:", f"{output_dir}/metrics.jsonl"),
            ("reward curve:", plot_path or "(none: no training step was logged)"),
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
