"""The built-in rollout worker: a thread of the main process that generates, scores and queues samples while the
trainer trains.

It is a thread, not a spawned process (TRL's choice): reward functions, tools and environments are used as the
synchronous trainer uses them, closures and lambdas included, and nothing is pickled. Generation waits on the vLLM
server (or runs torch kernels, which release the GIL), so the trainer's thread keeps the cores it needs.

One loop turn produces one generation batch with the synchronous trainer's `produce_rollout` (generation, rewards,
advantages: no second copy of any of them) and queues its samples. The worker never runs further ahead than
`max_staleness` allows: it starts the batch the trainer will train at step s only once the policy version is at least
(the version step s trains with) - max_staleness, so its samples are never dropped for staleness. Prompts come in
epoch order (`PromptOrder`); the trainer reports each group it trains (`consumed`) and each it drops (`requeue`: the
prompt is generated again), which is what a checkpoint records to resume without losing or repeating a prompt.

Dynamic sampling (`keep` given): after each generation round the groups whose rewards do not differ are not queued
(their prompts count as seen for the epoch, as in the synchronous trainer) and the next rounds refill the batch; the
pacing counts queued samples, so a batch is generated ahead of its step as without the filter. After
`max_extra_rounds` extra rounds for one batch it is completed with the first groups set aside, at advantage 0 (one
warning). Per round: `dynamic_sampling/groups_kept` and `groups_dropped`; per batch completed so:
`dynamic_sampling/groups_filled_total`.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable

from grpokit.generation import GenerationError

from .samples import RolloutSample

logger = logging.getLogger(__name__)


class RolloutWorkerError(GenerationError):
    """The rollout worker died or hung: one line naming what happened (a `GenerationError`: `grpokit train` stops on
    it in one line, saving what was trained)."""


class PromptOrder:
    """Dataset indices in epoch order (shuffled per epoch with the run's seed when `shuffle`), each handed out once
    per epoch; a requeued one comes back first. `state()`/`PromptOrder(..., state=...)` resume it: the prompts of
    unfinished epochs not trained yet are handed out again, nothing else."""

    def __init__(self, size: int, *, shuffle: bool, seed: int, state: dict | None = None):
        if size < 1:
            raise ValueError("the training dataset has no rows")
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self._trained: dict[int, set[int]] = {}
        self._epoch = 0
        if state:
            self._epoch = int(state["epoch"])
            self._trained = {int(e): set(map(int, ids)) for e, ids in state["trained"].items()}
        self._queue: deque[int] = deque()
        self._requeued: deque[tuple[int, int]] = deque()
        self._fill(self._epoch)

    def order(self, epoch: int) -> list[int]:
        indices = list(range(self.size))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(indices)
        return indices

    def _fill(self, epoch: int) -> None:
        done = self._trained.get(epoch, set())
        self._queue.extend(i for i in self.order(epoch) if i not in done)

    def next(self) -> tuple[int, int]:
        """(epoch, dataset index) of the next prompt to generate."""
        if self._requeued:
            return self._requeued.popleft()
        while not self._queue:
            self._epoch += 1
            self._fill(self._epoch)
        return self._epoch, self._queue.popleft()

    def requeue(self, epoch: int, index: int) -> None:
        self._requeued.append((epoch, index))

    def trained(self, epoch: int, index: int) -> None:
        self._trained.setdefault(epoch, set()).add(index)
        while len(self._trained.get(min(self._trained), ())) == self.size and len(self._trained) > 1:
            del self._trained[min(self._trained)]  # an epoch trained to its end is forgotten (the next exists)

    def state(self) -> dict:
        """What a checkpoint keeps: the oldest unfinished epoch and the prompts trained in it and later ones."""
        unfinished = {e: ids for e, ids in self._trained.items() if len(ids) < self.size}
        epoch = min(unfinished) if unfinished else (max(self._trained) + 1 if self._trained else 0)
        return {"epoch": epoch, "trained": {str(e): sorted(ids) for e, ids in sorted(unfinished.items())}}


class AsyncRolloutWorker:
    """TRL's `RolloutWorkerProtocol`, run by a thread: `produce(rows)` makes one generation batch's `RolloutSample`s
    (the trainer builds it over `produce_rollout`); the rest is pacing, queueing and health."""

    def __init__(
        self,
        *,
        dataset,
        produce: Callable[[list[dict]], list[RolloutSample]],
        order: PromptOrder,
        num_generations: int,
        prompts_per_batch: int,
        max_staleness: int,
        queue_maxsize: int,
        version_of_batch: Callable[[int], int],
        keep: Callable[[list[RolloutSample]], list[bool]] | None = None,
        max_extra_rounds: int = 0,
    ):
        self.dataset, self.produce, self.order = dataset, produce, order
        self.num_generations, self.prompts_per_batch = num_generations, prompts_per_batch
        self.max_staleness = max_staleness
        self.version_of_batch = version_of_batch  # k-th batch of this run -> the policy version it is trained with
        self.keep, self.max_extra_rounds = keep, max_extra_rounds  # dynamic sampling: kept groups of a round
        self.samples_per_batch = prompts_per_batch * num_generations
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=queue_maxsize)
        self.metrics_queue: queue.Queue = queue.Queue(maxsize=4096)
        self._version = 0
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._failure: str | None = None
        self._hung = False  # declared hung by check_health: stop() does not wait for it
        self._heartbeat = time.time()
        self._thread: threading.Thread | None = None
        self._groups: dict[int, tuple[int, int]] = {}  # group id -> (epoch, dataset index), until trained
        self._lock = threading.Lock()  # guards order and _groups (the trainer's thread reports into them)
        self._next_group = 0

    # -- RolloutWorkerProtocol ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._heartbeat = time.time()
        self._thread = threading.Thread(target=self._run, name="grpokit-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=0 if self._hung else 30)
            if self._thread.is_alive():  # a daemon thread: it ends with the process
                logger.warning("the rollout worker is left running: a generation or reward function in it hangs")
        self._thread = None

    @property
    def model_version(self) -> int:
        return self._version

    def update_model_version(self, model_version: int) -> None:
        with self._changed:
            self._version = int(model_version)
            self._changed.notify_all()

    def check_health(self, stale_after_s: float) -> None:
        if self._failure is not None:
            raise RolloutWorkerError(f"the rollout worker failed: {self._failure}")
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RolloutWorkerError("the rollout worker stopped without an error")
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            self._hung = True
            raise RolloutWorkerError(
                f"the rollout worker gave no sign of life for {age:.0f} s (heartbeat_stale_after_s="
                f"{stale_after_s:g}): a generation request or reward function hangs"
            )

    # -- what the trainer reports ------------------------------------------------------------------------------

    def consumed(self, group_ids) -> None:
        """The trainer trained these groups: their prompts are done for their epoch."""
        with self._lock:
            for group in set(group_ids):
                where = self._groups.pop(group, None)
                if where is not None:
                    self.order.trained(*where)

    def requeue(self, group_id: int) -> None:
        """The trainer dropped this group's samples (too stale): generate its prompt again."""
        with self._lock:
            where = self._groups.pop(group_id, None)
            if where is not None:
                self.order.requeue(*where)

    def state(self) -> dict:
        with self._lock:
            return self.order.state()

    # -- the loop ------------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            queued, rounds, set_aside = 0, 0, []  # samples queued; rounds and dropped groups of the batch filling
            while not self._stop.is_set():
                batch = queued // self.samples_per_batch
                if not self._wait_for_version(self.version_of_batch(batch) - self.max_staleness):
                    return
                rows, groups = self._next_rows()
                started, first = time.time(), self._version
                samples = self.produce(rows)
                if self._stop.is_set():
                    return
                self._push_metrics({"rollout/duration_s": time.time() - started})
                for sample, group in zip(samples, groups, strict=True):
                    sample.group_id, sample.model_version = group, first
                    if sample.last_model_version is not None and sample.last_model_version == first:
                        sample.last_model_version = None
                if self.keep is not None:
                    samples, dropped = self._filter(samples)
                    rounds += 1
                    set_aside += dropped
                    short = (batch + 1) * self.samples_per_batch - queued - len(samples)  # this batch's gap
                    if short > 0 and rounds > self.max_extra_rounds:
                        samples += self._fillers(set_aside, short, rounds)
                for sample in samples:
                    if not self._put(sample):
                        return
                    queued += 1
                if queued // self.samples_per_batch > batch:
                    rounds, set_aside = 0, []
        except BaseException as exc:  # noqa: BLE001 - reported to the trainer by check_health
            detail = " ".join(str(exc).split()) or "(no message)"
            self._failure = f"{type(exc).__name__}: {detail}"
            logger.debug("rollout worker failed:\n%s", traceback.format_exc())

    def _filter(self, samples: list[RolloutSample]) -> tuple[list[RolloutSample], list[list[RolloutSample]]]:
        """(samples of the groups `keep` keeps, the dropped groups); a dropped group's prompt is seen for its epoch."""
        size = self.num_generations
        groups = [samples[i : i + size] for i in range(0, len(samples), size)]
        flags = self.keep(samples)
        kept = [s for group, ok in zip(groups, flags, strict=True) if ok for s in group]
        dropped = [group for group, ok in zip(groups, flags, strict=True) if not ok]
        self.consumed(group[0].group_id for group in dropped)
        self._push_metrics(
            {"dynamic_sampling/groups_kept": float(sum(flags)), "dynamic_sampling/groups_dropped": float(len(dropped))}
        )
        return kept, dropped

    def _fillers(self, set_aside: list[list[RolloutSample]], short: int, rounds: int) -> list[RolloutSample]:
        """`short` samples (whole groups) completing the batch after the last extra round: the first dropped groups,
        at advantage 0 (they teach nothing either way)."""
        fillers = [s for group in set_aside[: short // self.num_generations] for s in group]
        for sample in fillers:
            sample.advantage = 0.0
        del set_aside[: short // self.num_generations]
        logger.warning(
            f"dynamic sampling: after {rounds - 1} extra generation rounds (dynamic_sampling_max_rounds) a batch "
            f"still lacked {short // self.num_generations} groups whose rewards differ; it is filled with dropped "
            f"groups at advantage 0"
        )
        self._push_metrics({"dynamic_sampling/groups_filled_total": float(len(fillers) // self.num_generations)})
        return fillers

    def _wait_for_version(self, version: int) -> bool:
        started = time.time()
        with self._changed:
            while self._version < version:
                if self._stop.is_set():
                    return False
                self._heartbeat = time.time()
                self._changed.wait(timeout=0.5)
        self._heartbeat = time.time()
        self._push_metrics({"rollout/idle_s": self._heartbeat - started})  # held back by max_staleness
        return not self._stop.is_set()

    def _next_rows(self) -> tuple[list[dict], list[int]]:
        rows, groups = [], []
        with self._lock:
            for _ in range(self.prompts_per_batch):
                epoch, index = self.order.next()
                group, self._next_group = self._next_group, self._next_group + 1
                self._groups[group] = (epoch, index)
                row = dict(self.dataset[index])
                rows += [row] * self.num_generations
                groups += [group] * self.num_generations
        return rows, groups

    def _put(self, sample: RolloutSample) -> bool:
        started = time.time()
        while not self._stop.is_set():
            self._heartbeat = time.time()
            sample.enqueued_at = self._heartbeat
            try:
                self.rollout_buffer.put(sample, timeout=0.5)
            except queue.Full:
                continue
            waited = time.time() - started
            if waited > 1e-3:  # the queue was full: generation held back by the trainer
                self._push_metrics({"rollout/backpressure_s": waited})
            return True
        return False

    def _push_metrics(self, values: dict) -> None:
        try:
            self.metrics_queue.put_nowait(values)
        except queue.Full:
            pass  # never block generation for a metric
