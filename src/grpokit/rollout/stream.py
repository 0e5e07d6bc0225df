"""Streaming (iterable) datasets: the groups and generation batches of `RepeatSampler`, formed on the fly.

An `datasets.IterableDataset` cannot be indexed, so no sampler can order it. `GroupedStream` reads prompts in
chunks and yields, per process, the rows `RepeatSampler` and accelerate's batch sharding would give that process:
each prompt `num_generations` times in a row, each generation batch once per micro-step that trains on it.

Processes read disjoint parts of the stream (`datasets.distributed.split_dataset_by_node`: whole shards, or every
n-th row) when each one's generation batch holds whole groups (`per_device_train_batch_size x
steps_per_generation` a multiple of `num_generations`); each then forms its own groups, and the global batch (the
processes' batches in process order) is whole groups, as the rollout's gathered advantages expect. Otherwise a group
spans processes: then every process reads the whole stream and keeps its contiguous slice of each generation batch,
as `RepeatSampler` under accelerate does.

Training cycles over the stream (pass k shuffled with the seed and k, an incomplete last chunk dropped as
`RepeatSampler` does) until `max_steps`: the Trainer sees one endless epoch, so on resume it skips exactly the
batches already trained on and lands at the same row of the same pass (docs/moving-from-trl.md).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader

logger = logging.getLogger(__name__)


def is_stream(dataset) -> bool:
    """A `datasets.IterableDataset` (a streaming dataset), which no sampler can order."""
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        return False
    return isinstance(dataset, datasets.IterableDataset)


class GroupedStream(torch.utils.data.IterableDataset):
    """Rows of `source` grouped as `RepeatSampler` groups them, for one process.

    Each chunk is `chunk_prompts` distinct rows read from `source` (this process's shard of it when `shard` is
    `(process_index, num_processes)`), expanded to `group_size` copies of each in a row; rows `keep[0]:keep[1]` of the
    expansion are yielded `repeat_count` times. `cycle`: start a new pass when the stream ends (training); else stop
    after one pass (evaluation), yielding the incomplete last chunk too when `drop_last` is False. `shuffle`: each pass
    is `source.shuffle(seed, buffer_size)` at epoch = pass (datasets' buffered shuffle, its shards reordered too).

    >>> import datasets
    >>> source = datasets.Dataset.from_dict({"x": list(range(7))}).to_iterable_dataset()
    >>> [r["x"] for r in GroupedStream(source, group_size=2, chunk_prompts=3, repeat_count=2, cycle=False)]
    [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 3, 3, 4, 4, 5, 5]
    """

    def __init__(
        self,
        source,
        *,
        group_size: int,
        chunk_prompts: int,
        repeat_count: int = 1,
        keep: tuple[int, int] | None = None,
        shard: tuple[int, int] | None = None,
        cycle: bool = True,
        drop_last: bool = True,
        shuffle: bool = False,
        seed: int = 0,
        buffer_size: int = 1000,
        check=None,
    ):
        self.group_size, self.chunk_prompts, self.repeat_count = group_size, chunk_prompts, repeat_count
        self.keep = keep or (0, chunk_prompts * group_size)
        self.cycle, self.drop_last = cycle, drop_last
        # `check(row, where)` sees each row as it is read, `where` naming its place in the user's stream: its index,
        # attached before the shuffle and the split between processes (in a stream of several shards datasets counts
        # each shard from 0, so the shard count is said too)
        self.check = check
        if check is not None:
            shards = getattr(source, "n_shards", 1) or 1
            self.place = "stream row {}" + ("" if shards == 1 else f" of one of its {shards} shards")
            source = source.map(_with_stream_index, with_indices=True)
        if shuffle:
            source = source.shuffle(seed=seed, buffer_size=buffer_size)
        if shard is not None and shard[1] > 1:
            from datasets.distributed import split_dataset_by_node

            source = split_dataset_by_node(source, rank=shard[0], world_size=shard[1])
        self.source = source

    def __iter__(self) -> Iterator[dict]:
        passes = 0
        while True:
            if hasattr(self.source, "set_epoch"):
                self.source.set_epoch(passes)  # a new shuffle each pass, the same one for the same pass on resume
            chunks = 0
            chunk: list[dict] = []
            for row in self.source:
                if self.check is not None:
                    self.check(row, self.place.format(row.pop(STREAM_INDEX)))
                chunk.append(row)
                if len(chunk) == self.chunk_prompts:
                    yield from self._expand(chunk)
                    chunks, chunk = chunks + 1, []
            if chunk and not self.drop_last and not self.cycle:
                yield from self._expand(chunk)
                chunks += 1
            if not self.cycle:
                return
            if chunks == 0:
                raise ValueError(
                    f"train_dataset: the stream (this process's part of it) holds fewer than {self.chunk_prompts} "
                    "prompts, one generation batch: nothing to train on; use more data or a smaller generation batch"
                )
            passes += 1

    def _expand(self, chunk: list[dict]) -> Iterator[dict]:
        rows = [row for row in chunk for _ in range(self.group_size)][self.keep[0] : self.keep[1]]
        for _ in range(self.repeat_count):
            for row in rows:
                yield copy.deepcopy(row)  # each repeat a row of its own, as a map-style dataset gives


STREAM_INDEX = "__grpokit_stream_index__"  # the key a row carries from the stream's start to GroupedStream's check


def _with_stream_index(row: dict, index: int) -> dict:
    return {**row, STREAM_INDEX: index}


def layout(rows_per_process: int, group_size: int, process_index: int, num_processes: int) -> dict:
    """How one process reads a stream so that its batches of `rows_per_process` rows (its slice of a generation
    batch) are what `RepeatSampler` gives it: its own shard when the slice is whole groups, else the whole stream and
    a slice of each chunk."""
    if num_processes == 1 or rows_per_process % group_size == 0:
        return {"chunk_prompts": rows_per_process // group_size, "shard": (process_index, num_processes)}
    start = process_index * rows_per_process
    return {
        "chunk_prompts": rows_per_process * num_processes // group_size,
        "keep": (start, start + rows_per_process),
        "shard": None,
    }


def train_loader(source, args, *, process_index: int, num_processes: int, collate_fn, check=None) -> DataLoader:
    """The training dataloader of a stream: batches of `per_device_train_batch_size x steps_per_generation` rows,
    each generation batch repeated `steps_per_generation x num_iterations` times, read in the main process (0
    workers: the grouping lives in one iterator)."""
    rows = args.per_device_train_batch_size * args.steps_per_generation
    stream = GroupedStream(
        source,
        group_size=args.num_generations,
        repeat_count=args.steps_per_generation * args.num_iterations,
        shuffle=args.shuffle_dataset,
        seed=args.seed,
        check=check,
        **layout(rows, args.num_generations, process_index, num_processes),
    )
    return DataLoader(stream, batch_size=rows, collate_fn=collate_fn, num_workers=0)


def eval_loader(
    source, args, *, group_size: int, process_index: int, num_processes: int, collate_fn, check=None
) -> DataLoader:
    """The evaluation dataloader of a stream: one pass, each prompt `group_size` times, batches of
    `per_device_eval_batch_size` rows, 0 workers (as TRL sets for an iterable eval set). Shuffled with the seed, as
    the map-style eval sampler is. With several processes every one reads the whole stream, so that all run the same
    number of batches, and the last incomplete batch (fewer than per_device_eval_batch_size x processes rows) is
    left out; one process keeps it."""
    rows = args.per_device_eval_batch_size
    if num_processes == 1:
        placement = {"chunk_prompts": 1, "drop_last": False}
    else:
        start = process_index * rows
        placement = {"chunk_prompts": rows * num_processes // group_size, "keep": (start, start + rows)}
    stream = GroupedStream(
        source, group_size=group_size, cycle=False, shuffle=True, seed=args.seed, check=check, **placement
    )
    return DataLoader(stream, batch_size=rows, collate_fn=collate_fn, num_workers=0)


def train_loader_of(trainer) -> DataLoader:
    """`train_loader` for a `GRPOTrainer` (its args, process and collator; columns removed as the Trainer would)."""
    return train_loader(
        trainer.train_dataset,
        trainer.args,
        process_index=trainer.accelerator.process_index,
        num_processes=trainer.accelerator.num_processes,
        collate_fn=trainer._get_collator_with_removed_columns(trainer.data_collator, description="training"),
        check=_row_check(trainer, "train_dataset"),
    )


def eval_loader_of(trainer, eval_dataset=None) -> DataLoader | None:
    """`eval_loader` for a `GRPOTrainer` when the eval set named by `eval_dataset` (a set, a key of a dict of sets,
    or None for the trainer's own) is a stream; None otherwise (the Trainer's own loader and sampler)."""
    if isinstance(eval_dataset, str):
        eval_dataset = trainer.eval_dataset[eval_dataset]
    elif eval_dataset is None:
        eval_dataset = trainer.eval_dataset
    if not is_stream(eval_dataset):
        return None
    return eval_loader(
        eval_dataset,
        trainer.args,
        group_size=trainer._num_generations("eval"),
        process_index=trainer.accelerator.process_index,
        num_processes=trainer.accelerator.num_processes,
        collate_fn=trainer._get_collator_with_removed_columns(trainer.data_collator, description="evaluation"),
        check=_row_check(trainer, "eval_dataset"),
    )


def _row_check(trainer, split: str):
    """What a stream's rows are checked for as they arrive: an image row for a text-only model (a map-style set is
    checked whole before training), named by its place in the stream."""
    from grpokit import vision

    processing_class = trainer.processing_class
    if vision.is_processor(processing_class):
        return None
    return lambda row, where: vision.refuse_image_row(row, where, processing_class, split)
