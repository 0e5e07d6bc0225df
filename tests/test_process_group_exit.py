"""A launched process leaves its process group with nothing still holding it: the DDP-wrapped model lives on in
the trainer's reference cycles after the run, and gloo torn down by interpreter finalization can abort a run that
succeeded ("terminate called without an active exception")."""

import gc
import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from grpokit.dist import leave_process_group, leave_process_group_at_exit


class _Owner:
    """Stands in for the trainer: holds the wrapped model and is held by it (callbacks, accelerator, ...)."""

    def __init__(self, model):
        self.model = model
        model.owner = self


def test_the_wrapped_model_is_gone_before_the_group_is_left(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        gc.disable()  # no automatic collection between here and the call: only the call may free the cycle
        model = DistributedDataParallel(torch.nn.Linear(2, 1))
        alive = weakref.ref(model)
        _Owner(model)
        del model
        assert alive() is not None  # a cycle: reference counting alone keeps it
        leave_process_group()
        assert alive() is None
        assert not dist.is_initialized()
    finally:
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()


def test_without_a_group_nothing_happens():
    assert not dist.is_initialized()
    leave_process_group()
    assert not dist.is_initialized()


def test_registered_at_exit_once(monkeypatch):
    import atexit

    import grpokit.dist

    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(grpokit.dist, "_leaving_at_exit", False)
    leave_process_group_at_exit()
    leave_process_group_at_exit()
    assert registered == [leave_process_group]
