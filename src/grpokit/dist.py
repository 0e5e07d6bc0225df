"""The few cross-process operations a rollout and a generation backend need, behind one small interface.

`LOCAL` (one process, every operation the identity) lets rollouts run and be tested without a Trainer or an
Accelerator; `AcceleratorCollective` wraps an `accelerate.Accelerator` for multi-process training.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor


class Collective(Protocol):
    process_index: int
    num_processes: int

    def gather(self, tensor: Tensor) -> Tensor:
        """Concatenate along dim 0 the tensors of every process, in process order."""

    def gather_object(self, items: list) -> list:
        """Concatenate the Python lists of every process, in process order."""

    def sum(self, tensor: Tensor) -> Tensor:
        """Element-wise sum over processes."""

    def gather_padded(self, tensor: Tensor, pad_value: float) -> Tensor:
        """Gather 1-D tensors of different lengths (padded with `pad_value`, which is then dropped)."""

    def broadcast_object(self, obj: Any) -> Any:
        """The main process's `obj` on every process (picklable Python objects)."""


class _Local:
    process_index = 0
    num_processes = 1

    def gather(self, tensor: Tensor) -> Tensor:
        return tensor

    def gather_object(self, items: list) -> list:
        return list(items)

    def sum(self, tensor: Tensor) -> Tensor:
        return tensor

    def gather_padded(self, tensor: Tensor, pad_value: float) -> Tensor:
        return tensor

    def broadcast_object(self, obj: Any) -> Any:
        return obj


LOCAL: Collective = _Local()


class AcceleratorCollective:
    def __init__(self, accelerator: Any):
        self.accelerator = accelerator

    @property
    def process_index(self) -> int:
        return self.accelerator.process_index

    @property
    def num_processes(self) -> int:
        return self.accelerator.num_processes

    def gather(self, tensor: Tensor) -> Tensor:
        return self.accelerator.gather(tensor)

    def gather_object(self, items: list) -> list:
        if self.num_processes == 1:
            return list(items)
        from accelerate.utils import gather_object

        return gather_object(list(items))

    def sum(self, tensor: Tensor) -> Tensor:
        return self.accelerator.reduce(tensor, reduction="sum")

    def gather_padded(self, tensor: Tensor, pad_value: float) -> Tensor:
        if self.num_processes == 1:
            return tensor
        padded = self.accelerator.pad_across_processes(tensor, dim=0, pad_index=pad_value)
        gathered = self.accelerator.gather(padded)
        return gathered[gathered != pad_value]

    def broadcast_object(self, obj: Any) -> Any:
        if self.num_processes == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj], from_process=0)[0]


def leave_process_group() -> None:
    """Leave the default process group, if any, with nothing still holding it. A trainer's reference cycles keep the
    DDP-wrapped model, and through it gloo's group and worker threads, alive past the run; torn down by interpreter
    finalization, they can abort a process whose training succeeded ("terminate called without an active
    exception"). They are collected here, while the interpreter is whole."""
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - exiting anyway; a failed teardown must not hide the run's result
            pass


_leaving_at_exit = False


def leave_process_group_at_exit() -> None:
    """Have `leave_process_group` run at exit (once), for scripts that train under a launcher and never leave it."""
    global _leaving_at_exit
    if not _leaving_at_exit:
        import atexit

        atexit.register(leave_process_group)
        _leaving_at_exit = True
