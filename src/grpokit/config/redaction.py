"""Secrets stay off disk and out of logs.

Two kinds of redaction:

- By name, wherever a configuration is shown or written (`grpokit config show` in every format, `config diff`,
  `resolved_config.yaml`): every `*_token` field (`hub_token`, ...) and every variable of a YAML `env:` section whose
  name looks secret (it contains TOKEN, KEY, SECRET, PASSWORD or PASSWD, whatever the case; TOKENIZERS_PARALLELISM
  excepted). The re-runnable YAML says where the value must come from instead, as a comment.
- By value, in free text (log records, `error:`/`warning:` lines, metrics.jsonl and completions.jsonl): the values of
  those fields and variables seen by this process (`register`), when they are at least `MIN_SECRET_LENGTH`
  characters long, are replaced by `<redacted>`. Shorter values ("1", "true") are not secrets worth hunting in text.

The pickled arguments Trainer writes beside the weights (training_args.bin) are written without them too
(`hidden_secrets`, used by `GRPOTrainer._save`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

REDACTED = "<redacted>"
MIN_SECRET_LENGTH = 8
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD")
_NOT_SECRET = frozenset({"TOKENIZERS_PARALLELISM"})
# Where a secret field's value is read from when the field is unset.
_FIELD_ENV = {"hub_token": "HF_TOKEN"}

_known: set[str] = set()
_factory_installed = False


def is_secret_field(name: str) -> bool:
    """A configuration field holding a secret: `*_token` (hub_token), or a name with secret/password/api_key in it.
    Not `average_tokens_across_devices` and the like: only a name that ends with `token` counts."""
    lower = name.lower()
    return lower == "token" or lower.endswith("_token") or any(w in lower for w in ("secret", "password", "api_key"))


def is_secret_env(name: str) -> bool:
    """An environment variable whose name looks secret (HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY, PGPASSWORD)."""
    upper = str(name).upper()
    return upper not in _NOT_SECRET and any(word in upper for word in _SECRET_WORDS)


def field_placeholder(name: str) -> str:
    """What the re-runnable YAML says instead of a secret field's value."""
    env = _FIELD_ENV.get(name)
    return f"<redacted: set {env} or pass --{name}>" if env else f"<redacted: pass --{name}>"


def env_placeholder(name: str) -> str:
    return f"<redacted: set {name} in the environment>"


def shown_value(name: str, value: Any) -> Any:
    """A field's value as shown to the user: `<redacted>` for a set secret field."""
    return REDACTED if is_secret_field(name) and value not in (None, "") else value


def register(*values) -> None:
    """Remember secret values seen by this process, to redact them from free text (and from every log record from now
    on). Values shorter than MIN_SECRET_LENGTH, and non-strings, are ignored."""
    global _factory_installed
    new = {v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET_LENGTH}
    if not new:
        return
    _known.update(new)
    if not _factory_installed:
        _install_log_redaction()
        _factory_installed = True


def register_fields(instance) -> None:
    """Register the values of an instance's secret fields (a GRPOConfig's hub_token)."""
    if dataclasses.is_dataclass(instance):
        register(*(getattr(instance, f.name, None) for f in dataclasses.fields(instance) if is_secret_field(f.name)))


def redact(text):
    """`text` with every registered secret replaced by `<redacted>`; non-strings are returned as they are."""
    if not isinstance(text, str) or not _known:
        return text
    for secret in sorted(_known, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redact_deep(value):
    """`redact` applied to every string inside lists, tuples and dicts (keys included); numbers are left alone."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_deep(k): redact_deep(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_deep(v) for v in value)
    return value


@contextlib.contextmanager
def hidden_secrets(instance):
    """Within this block the instance's secret fields are None (e.g. while it is pickled to training_args.bin)."""
    saved = {}
    if dataclasses.is_dataclass(instance):
        for f in dataclasses.fields(instance):
            if is_secret_field(f.name) and getattr(instance, f.name, None) not in (None, ""):
                saved[f.name] = getattr(instance, f.name)
    try:
        for name in saved:
            setattr(instance, name, None)
        yield instance
    finally:
        for name, value in saved.items():
            setattr(instance, name, value)


def _install_log_redaction() -> None:
    """Every log record created from now on, by any logger, has the registered secrets redacted from its message."""
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        if _known:
            try:
                message = record.getMessage()
            except Exception:  # a malformed record is logging's business, reported when it is emitted
                return record
            cleaned = redact(message)
            if cleaned != message:
                record.msg, record.args = cleaned, None
        return record

    logging.setLogRecordFactory(factory)


def _reset_for_tests() -> None:
    _known.clear()
