"""Stopping a run on a signal without losing it.

SIGTERM (what schedulers send before killing a job) and SIGINT (Ctrl-C) during training: the first lets the current
optimizer step finish, saves a resumable checkpoint (`checkpoint-N`, written atomically like every checkpoint) and ends
training; the run then exits with 128 + the signal number (143, 130). A second signal, at least a second later, stops
at once (KeyboardInterrupt: the weights of the last finished step are saved as `interrupted-step-N`). A second signal
sooner is taken as the same request: launchers such as torchrun pass a Ctrl-C on to their processes as SIGTERM.

Under several processes, every process agrees at the end of each step on whether any of them was signalled (one
all-reduce of a flag), so all of them save the same checkpoint together (which ZeRO-3 and FSDP need) and stop.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from transformers import TrainerCallback

REPEAT_AFTER_S = 1.0  # a second signal later than this stops at once


class GracefulStop(TrainerCallback):
    """Installs the handlers (`install`/`uninstall`, main thread only) and turns a signal into save-and-stop at the
    end of the current step. `signal_name` is the first signal received; `stopped_at` the step saved and stopped at."""

    def __init__(self, *, announce: bool = True):
        self.announce = announce
        self.signal_name: str | None = None
        self.stopped_at: int | None = None
        self._first_at = 0.0
        self._previous: dict = {}

    def install(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    @property
    def exit_code(self) -> int:
        return 128 + int(getattr(signal, self.signal_name or "SIGINT"))

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self.signal_name is not None:
            if now - self._first_at >= REPEAT_AFTER_S:
                raise KeyboardInterrupt
            return
        self.signal_name, self._first_at = signal.Signals(signum).name, now
        if self.announce:
            print(
                f"\n{self.signal_name}: finishing this step, then saving a checkpoint and stopping (send it again to "
                "stop at once)",
                file=sys.stderr,
                flush=True,
            )

    def on_step_end(self, args, state, control, **kwargs):
        requested = self.signal_name is not None
        if args.world_size > 1:
            requested = _any_process(requested)
        if requested:
            self.signal_name = self.signal_name or "SIGTERM"  # another process was signalled
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
        return control


def _any_process(flag: bool) -> bool:
    """Whether `flag` is set on any process (every process must call this at the same point)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
