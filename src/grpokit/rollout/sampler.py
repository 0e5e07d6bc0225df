"""The order in which prompts are drawn: each prompt repeated once per generation, each generation batch repeated
once per micro-step that reuses it."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler


class RepeatSampler(Sampler[int]):
    """Yields dataset indices so that groups and generation batches stay whole.

    The dataset is (optionally) shuffled and cut into chunks of `batch_size` distinct prompts (an incomplete last
    chunk is dropped). Each chunk is emitted `repeat_count` times; within a chunk each index is emitted
    `mini_repeat_count` times in a row. With `mini_repeat_count = num_generations`,
    `batch_size = generation_batch_size / num_generations` and `repeat_count = steps_per_generation * num_iterations`,
    every dataloader batch of `per_device_train_batch_size * steps_per_generation` rows (per process) is one slice of
    one generation batch, and the same generation batch comes back for every micro-step that trains on it; the
    trainer generates only on the first one. This is the order TRL 1.16's sampler produces.

    >>> list(RepeatSampler(range(4), mini_repeat_count=2, batch_size=2, repeat_count=2, shuffle=False))
    [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3]
    """

    def __init__(
        self,
        data_source: Sized,
        mini_repeat_count: int,
        batch_size: int = 1,
        repeat_count: int = 1,
        shuffle: bool = True,
        seed: int | None = None,
    ):
        self.num_samples = len(data_source)
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count
        self.shuffle = shuffle
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=self.generator).tolist()
        else:
            order = list(range(self.num_samples))
        whole_chunks = self.num_samples // self.batch_size
        for c in range(whole_chunks):
            chunk = order[c * self.batch_size : (c + 1) * self.batch_size]
            for _ in range(self.repeat_count):
                for index in chunk:
                    yield from [index] * self.mini_repeat_count

    def __len__(self) -> int:
        return (self.num_samples // self.batch_size) * self.batch_size * self.mini_repeat_count * self.repeat_count
