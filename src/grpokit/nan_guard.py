"""The NaN guard: an optimizer step whose loss or gradient norm is NaN or inf is skipped, not applied.

`GRPOTrainer` notes the loss of every micro-step (`NaNGuard.note_loss`) and, right before each `optimizer.step()`,
asks `NaNGuard.verdict` whether the step is sound. A step that is not has its gradients cleared (set to None), so the
optimizer skips every parameter: neither the weights nor the optimizer state (AdamW moments, step counts) change. The
learning-rate schedule still advances, so it stays aligned with `global_step`. After `max_nonfinite_steps` such
steps in a row, training stops with `NonFiniteTrainingError`; the model then still holds the last finite weights,
since no non-finite update was ever applied. `save_model` refuses non-finite weights (`NonFiniteWeightsError`).

Under several processes the decision is the same on every rank: the gradient norm is already the global one (taken
after the gradients are all-reduced) and the loss flags are summed over the processes.
"""

from __future__ import annotations

import torch

_NAMES_SHOWN = 3


class NonFiniteTrainingError(RuntimeError):
    """`max_nonfinite_steps` optimizer steps in a row had a non-finite loss or gradient norm. The steps were skipped,
    so the model still holds the last finite weights (those after step `last_good_step`; 0: the initial ones)."""

    def __init__(self, limit: int, first_step: int, last_step: int, what: str):
        self.limit, self.first_step, self.last_step, self.what = limit, first_step, last_step, what
        self.last_good_step = first_step - 1
        count = last_step - first_step + 1
        steps = f"step {first_step}" if count == 1 else f"steps {first_step} to {last_step}"
        self.summary = (
            f"max_nonfinite_steps={limit}: {count} optimizer step{'s' if count > 1 else ''} in a row ({steps}) had "
            f"a non-finite loss or gradient norm (last: {what})"
        )
        super().__init__(f"{self.summary}; training stopped, the model keeps the last finite weights ({self.weights})")

    @property
    def weights(self) -> str:
        return "the initial weights" if self.last_good_step <= 0 else f"those after step {self.last_good_step}"


class NonFiniteWeightsError(RuntimeError):
    """`save_model` was asked to write weights that contain NaN or inf."""

    def __init__(self, output_dir, names: list[str], total: int):
        self.names, self.total = names, total
        shown = ", ".join(names[:_NAMES_SHOWN])
        more = f" and {total - len(names[:_NAMES_SHOWN])} more" if total > len(names[:_NAMES_SHOWN]) else ""
        where = shown + more if names else "on another process"
        super().__init__(
            f"refusing to save non-finite weights to {output_dir}: {total} tensor{'s' if total != 1 else ''} with "
            f"NaN or inf ({where})"
        )


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of a parameter this process holds: a DTensor's local shard, a ZeRO-3 partition, or the tensor."""
    if hasattr(tensor, "to_local"):
        return tensor.to_local()
    partition = getattr(tensor, "ds_tensor", None)
    return partition if partition is not None else tensor


def nonfinite_tensors(model: torch.nn.Module) -> list[str]:
    """Names of the floating-point parameters of `model` (this process's share) holding a NaN or inf. Buffers are not
    judged: training does not write them, and some models keep an infinite one on purpose (an attention mask)."""
    bad = []
    for name, tensor in model.named_parameters():
        local = _local(tensor.detach())
        if local.is_floating_point() and local.numel() and not bool(torch.isfinite(local).all()):
            bad.append(name)
    return bad


def refuse_nonfinite_weights(model: torch.nn.Module, output_dir, *, sum_over_processes=None, device=None) -> None:
    """Raise `NonFiniteWeightsError` (naming the tensors) when `model`'s weights hold NaN or inf. Each process checks
    the weights it holds; pass `sum_over_processes` (a collective sum of a tensor on `device`) when they are sharded,
    so that the processes sum their counts and all refuse together."""
    bad = nonfinite_tensors(model)
    total = len(bad)
    if sum_over_processes is not None:
        total = int(sum_over_processes(torch.tensor(float(total), device=device)).item())
    if total:
        raise NonFiniteWeightsError(output_dir, bad, total)


class NaNGuard:
    """Decides, once per optimizer step, whether the step is skipped; counts the skips.

    Args:
        limit: stop after this many non-finite steps in a row (`max_nonfinite_steps`); None never stops.
        grad_scaler: an fp16 GradScaler runs: it skips the steps whose gradients overflow by itself (and lowers its
            scale), so a non-finite gradient norm alone is its business and is not counted here.
    """

    def __init__(self, limit: int | None, *, grad_scaler: bool = False):
        self.limit = limit
        self.grad_scaler = grad_scaler
        self.in_a_row = 0
        self.first_in_row = 0
        self.skipped_since_log = 0
        self._loss_bad = None  # a bool tensor: some micro-step of the current optimizer step had a non-finite loss

    def note_loss(self, loss: torch.Tensor) -> None:
        """Remember whether this micro-step's loss is finite (kept as a tensor: no device sync per micro-step)."""
        bad = ~torch.isfinite(loss.detach()).all()
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad.to(self._loss_bad.device)

    def verdict(self, grad_norm, reduce=None) -> str | None:
        """What was non-finite in this optimizer step ("loss", "grad norm" or both, with values), or None when the
        step is sound or left to the grad scaler. `reduce` sums a tensor over the processes (None: one process)."""
        loss_bad, self._loss_bad = self._loss_bad, None
        device = loss_bad.device if loss_bad is not None else None
        if isinstance(grad_norm, torch.Tensor):
            if hasattr(grad_norm, "full_tensor"):  # a DTensor (FSDP2): the norm is replicated, take it whole
                grad_norm = grad_norm.full_tensor()
            norm = grad_norm.detach().float().reshape(())
        else:  # DeepSpeed gives a float; None: no norm to judge
            norm = torch.tensor(0.0 if grad_norm is None else float(grad_norm), device=device)
        if loss_bad is None:
            loss_bad = torch.tensor(False, device=norm.device)
        flags = torch.stack([loss_bad.to(norm.device).float(), (~torch.isfinite(norm)).float()])
        if reduce is not None:
            flags = reduce(flags)
        loss_nonfinite, norm_nonfinite = (flags > 0).tolist()
        if loss_nonfinite and norm_nonfinite:
            return f"loss and grad norm ({norm.item()})"
        if loss_nonfinite:
            return "loss"
        if norm_nonfinite and not self.grad_scaler:
            return f"grad norm ({norm.item()})"
        return None

    def record(self, step: int, what: str | None) -> int:
        """Count the outcome of optimizer step `step`; the number of non-finite steps in a row so far."""
        if what is None:
            self.in_a_row = 0
            return 0
        if self.in_a_row == 0:
            self.first_in_row = step
        self.in_a_row += 1
        self.skipped_since_log += 1
        if self.limit is not None and self.in_a_row >= self.limit:
            raise NonFiniteTrainingError(self.limit, self.first_in_row, step, what)
        return self.in_a_row

    def skipped_since(self, step: int | None, now: int) -> bool:
        """Whether every optimizer step after `step` (None: before the first) up to `now` was skipped here, so the
        weights are still those of step `step` (a skip leaves every parameter untouched)."""
        return step is not None and 0 < now - step <= self.in_a_row

    def take_skipped(self) -> int:
        """Steps skipped since the last call (one log row's worth)."""
        count, self.skipped_since_log = self.skipped_since_log, 0
        return count
