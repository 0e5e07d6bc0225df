"""Loading training data with `datasets` and shaping prompts (prompt column, system prompt).

Sources: a hub id, a local directory, a local .json/.jsonl/.csv/.parquet file, or a `datasets:` mixture. Problems
are raised as `DataError` with one line that names the dataset, the split, the column or the row.
"""

from __future__ import annotations

import math
import os

_LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class DataError(ValueError):
    """A dataset that cannot be used: one line naming what is wrong."""


def _load(path, *, name=None, data_dir=None, data_files=None, split=None, streaming=False):
    import datasets

    kwargs = {"name": name, "data_dir": data_dir, "streaming": streaming}
    ext = os.path.splitext(str(path))[1].lower()
    if ext in _LOCAL_FORMATS:
        if not os.path.isfile(path):
            raise DataError(f"dataset file {path} does not exist")
        builder, kwargs = _LOCAL_FORMATS[ext], {"data_files": {"train": str(path)}, "streaming": streaming}
        if ext != ".parquet":  # datasets' JSON reader takes bytes that are not UTF-8 and fails only when rows are read
            problem = _utf8_problem(str(path))
            if problem:
                raise DataError(f"dataset {path!r} could not be loaded: {problem}")
    else:
        builder = str(path)
        if data_files is not None:
            kwargs["data_files"] = data_files
    try:
        return datasets.load_dataset(builder, split=split, **kwargs)
    except Exception as exc:  # datasets raises many types (DatasetNotFoundError, ConnectionError, ValueError, ...)
        if ext not in _LOCAL_FORMATS and not os.path.exists(str(path)):
            offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
            why = (
                "offline (HF_HUB_OFFLINE=1), so a hub dataset must already be cached"
                if offline
                else ("it is not a local path and could not be fetched from the hub")
            )
        elif ext in _LOCAL_FORMATS:
            why = _local_file_problem(str(path), ext) or _root_cause(exc)
        else:
            why = _root_cause(exc)
        raise DataError(f"dataset {path!r} could not be loaded: {why}") from None


def _root_cause(exc: BaseException) -> str:
    """The innermost non-empty message of an exception chain (datasets wraps the parser's own error, which names the
    row or byte, in a generic "An error occurred while generating the dataset")."""
    messages = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = " ".join(str(exc).split())
        if text:
            messages.append(f"{type(exc).__name__}: {text}" if not messages else text)
        exc = exc.__cause__ or exc.__context__
    return (messages[-1] if messages else "unknown error")[:300]


def _utf8_problem(path: str, chunk: int = 1 << 24) -> str | None:
    """Where a text file stops being UTF-8 (line and byte), read in chunks; None when it is UTF-8 throughout."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    lines = 0
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as err:
                bad = block[err.start] if err.start < len(block) else block[-1]
                line = lines + block[: err.start].count(b"\n") + 1
                return f"line {line}: not UTF-8 text (byte 0x{bad:02x}); save the file as UTF-8"
            if not block:
                return None
            lines += block.count(b"\n")


def _local_file_problem(path: str, ext: str) -> str | None:
    """What is wrong with a local JSON / JSONL / CSV file, found by reading it (only after datasets failed): empty,
    or a JSON line that does not parse or is not an object (its line)."""
    import json

    with open(path, "rb") as fh:
        raw = fh.read()
    if not raw.strip():
        return "the file is empty" if not raw else "the file holds only whitespace"
    if ext not in (".json", ".jsonl"):
        return None
    text = raw.decode("utf-8")  # checked before loading
    if ext == ".json":  # one JSON document, or JSON Lines (datasets reads both)
        try:
            json.loads(text)
            return None
        except json.JSONDecodeError as err:
            if not text.lstrip().startswith("{"):
                return f"line {err.lineno}: not valid JSON ({err.msg} at column {err.colno})"
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            return f"line {number}: not valid JSON ({err.msg} at column {err.colno})"
        if not isinstance(row, dict):
            return f"line {number}: a JSON {type(row).__name__}, where each line must be an object"
    return None


def _split(dataset_dict, split, what, ways: str | None = None):
    """dataset_dict[split], or a one-line DataError naming the splits there are (and, for the eval split, `ways` to
    give eval data instead)."""
    if split not in dataset_dict:
        from grpokit.config.suggest import closest

        near = closest(split, list(dataset_dict))
        hint = f"; did you mean {near!r}?" if near else f"; it has {', '.join(dataset_dict)}"
        more = f". For evaluation, {ways}" if ways else ""
        raise DataError(f"{what} has no split {split!r}{hint}{more}")
    return dataset_dict[split]


def load_mixture(mixture) -> dict:
    """TRL's mixture semantics: each entry loaded and column-selected; `fraction`s are target shares of the final
    mixture (set on all entries or none), the mixture as large as possible without oversampling any dataset.
    With `test_split_size`, that many rows (a fraction, or a count) are held out as the "test" split."""
    import datasets

    parts = []
    for i, entry in enumerate(mixture.datasets):
        ds = _load(
            entry.path,
            name=entry.name,
            data_dir=entry.data_dir,
            data_files=entry.data_files,
            split=entry.split,
            streaming=mixture.streaming,
        )
        if entry.columns is not None:
            missing = [c for c in entry.columns if c not in (ds.column_names or [])]
            if missing:
                raise DataError(f"datasets[{i}] ({entry.path}): no column {missing[0]!r}; it has {ds.column_names}")
            ds = ds.select_columns(entry.columns)
        parts.append(ds)
    if not parts:
        raise DataError("the `datasets:` mixture is empty")
    fractions = [entry.fraction for entry in mixture.datasets]
    if any(f is not None for f in fractions):
        if any(f is None for f in fractions):
            raise DataError("datasets: set `fraction` on every entry of the mixture or on none")
        if mixture.streaming:
            raise DataError("datasets: `fraction` cannot be used with streaming")
        weights = [f / sum(fractions) for f in fractions]
        total = min(len(ds) / w for ds, w in zip(parts, weights, strict=True))
        parts = [ds.select(range(round(w * total))) for ds, w in zip(parts, weights, strict=True)]
    columns = [tuple(sorted(ds.column_names or [])) for ds in parts]
    if len(set(columns)) > 1:
        raise DataError(
            f"datasets: the mixture's entries have different columns {columns}; select common ones with `columns:`"
        )
    combined = datasets.concatenate_datasets(parts)
    if mixture.test_split_size is not None:
        return hold_out(combined, mixture.test_split_size, "the `datasets:` mixture")
    return {"train": combined}


# Fixed, so that a resumed run holds out the same rows (datasets' own default draws a new split every time).
HOLD_OUT_SEED = 42

_EVAL_WAYS = (
    "set dataset_test_split to a local eval file (.jsonl, .json, .csv or .parquet), or test_split_size to hold out "
    "a fraction (e.g. 0.1) or a number of rows of the training data"
)


def hold_out(dataset, size: float, what: str) -> dict:
    """{"train", "test"}: `size` rows of `dataset` held out for evaluation, a fraction when below 1, a number of rows
    otherwise; the same rows every time (HOLD_OUT_SEED)."""
    if not hasattr(dataset, "train_test_split"):
        raise DataError(f"test_split_size={size:g}: {what} is streamed, and a streamed dataset cannot be split")
    if size >= 1:
        if size != int(size):
            raise DataError(f"test_split_size={size:g}: a number of rows must be whole (or a fraction below 1)")
        size = int(size)
    rows = len(dataset)
    if (size if isinstance(size, int) else math.ceil(size * rows)) >= rows:  # datasets rounds a fraction up
        raise DataError(
            f"test_split_size={size:g}: {what} has {rows} rows, too few to hold out that many and still train on some"
        )
    return dict(dataset.train_test_split(test_size=size, seed=HOLD_OUT_SEED))


def is_data_file(value) -> bool:
    """Whether `value` names a local data file by its extension (.json, .jsonl, .csv, .parquet)."""
    return isinstance(value, str) and os.path.splitext(value)[1].lower() in _LOCAL_FORMATS


def eval_file(script_args) -> str | None:
    """dataset_test_split when it names a local data file (the eval set), else None (it names a split)."""
    split = script_args.dataset_test_split
    return split if is_data_file(split) else None


def load_train_eval(script_args, mixture, *, want_eval: bool):
    """(train dataset, eval dataset or None) from the script arguments or the `datasets:` mixture.

    The eval set (only when `want_eval`) is, in this order: a local file named by dataset_test_split; the rows held
    out by test_split_size (of the mixture, or of dataset_name's train split); dataset_test_split as a split."""
    held_out = mixture.test_split_size if mixture is not None else None
    eval_path = eval_file(script_args) if want_eval else None
    if eval_path is not None and held_out is not None:
        raise DataError(
            f"dataset_test_split={eval_path!r} (an eval file) and test_split_size={held_out:g} both give eval data; "
            "set one of them"
        )
    if mixture is not None and mixture.datasets:
        splits = load_mixture(mixture)
        train = splits["train"]
        evaluation = splits.get("test") if want_eval else None
        if want_eval and evaluation is None and eval_path is None:
            raise DataError(
                f"evaluation is on (eval_strategy) but the `datasets:` mixture has no eval data; {_EVAL_WAYS}"
            )
    elif script_args.dataset_name:
        loaded = _load(
            script_args.dataset_name, name=script_args.dataset_config, streaming=script_args.dataset_streaming
        )
        what = f"dataset {script_args.dataset_name!r}"
        train = _split(loaded, script_args.dataset_train_split, what)
        evaluation = None
        if held_out is not None:
            splits = hold_out(train, held_out, f"{what} (split {script_args.dataset_train_split!r})")
            train, evaluation = splits["train"], (splits["test"] if want_eval else None)
        elif want_eval and eval_path is None:
            evaluation = _split(loaded, script_args.dataset_test_split, what, ways=_EVAL_WAYS)
    else:
        raise DataError("no training data: set dataset_name or a `datasets:` mixture")
    if eval_path is not None:
        try:
            evaluation = _split(_load(eval_path, streaming=script_args.dataset_streaming), "train", eval_path)
        except DataError as exc:
            raise DataError(f"dataset_test_split (the eval file): {exc}") from None
    column, system = script_args.dataset_prompt_column, script_args.system_prompt
    train = prepare_prompts(train, column, system, "train")
    if evaluation is not None:
        evaluation = prepare_prompts(evaluation, column, system, "eval")
    return train, evaluation


def prepare_prompts(dataset, column: str = "prompt", system_prompt: str | None = None, split: str = "train"):
    """Rename `column` to `prompt`, check every row has a non-empty prompt, and prepend `system_prompt`."""
    names = dataset.column_names or []
    if column not in names:
        from grpokit.config.suggest import closest

        near = closest(column, names)
        hint = f"; did you mean {near!r}?" if near else f"; columns are {names}"
        raise DataError(f"{split} data has no prompt column {column!r} (dataset_prompt_column){hint}")
    if column != "prompt":
        if "prompt" in names:
            dataset = dataset.remove_columns("prompt")
        dataset = dataset.rename_column(column, "prompt")
    if hasattr(dataset, "__len__"):
        first_kind = None
        for index, prompt in enumerate(dataset["prompt"]):
            problem = _prompt_problem(prompt)
            if problem:
                raise DataError(f"{split} row {index}: prompt {problem}")
            kind = "a conversation" if isinstance(prompt, list) else "text"
            first_kind = first_kind or kind
            if kind != first_kind:
                # One template for the whole run: text is tokenized as it is, a conversation through the chat template.
                raise DataError(
                    f"{split} row {index}: prompt is {kind}, but row 0's is {first_kind}; a dataset holds one kind of "
                    "prompt (write the text ones as [{'role': 'user', 'content': ...}])"
                )
    if system_prompt:
        dataset = dataset.map(lambda row: {"prompt": with_system_prompt(row["prompt"], system_prompt)})
    return dataset


def _prompt_problem(prompt) -> str | None:
    if prompt is None:
        return "is missing"
    if isinstance(prompt, str):
        return "is empty" if not prompt.strip() else None
    if isinstance(prompt, list):
        if not prompt:
            return "is an empty conversation"
        for position, message in enumerate(prompt):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                return "is a list whose items are not chat messages with 'role' and 'content'"
            problem = _message_problem(message)
            if problem:
                return f"message {position}: {problem}"
        return None
    return f"has type {type(prompt).__name__}; expected text or a list of chat messages"


# The roles chat templates render. A template meeting another one renders it as nothing, or fails deep inside Jinja.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def _message_problem(message: dict) -> str | None:
    """What is wrong with one chat message: its role, or content that is not text or a list of content blocks."""
    role, content = message["role"], message["content"]
    if role not in CHAT_ROLES:
        return f"role {role!r} is not one of {', '.join(CHAT_ROLES)}"
    if isinstance(content, str):
        return None
    if content is None and message.get("tool_calls"):  # an assistant turn that only calls tools
        return None
    if isinstance(content, list) and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content):
        return None
    return (
        f"content has type {type(content).__name__}; expected text or a list of content blocks "
        "({'type': 'text', 'text': ...})"
    )


def with_system_prompt(prompt, system_prompt: str):
    """A system message first for conversational prompts (replacing none already there); text prepended otherwise."""
    if isinstance(prompt, list):
        if prompt and prompt[0].get("role") == "system":
            return prompt
        return [{"role": "system", "content": system_prompt}, *prompt]
    return f"{system_prompt}\n{prompt}"
