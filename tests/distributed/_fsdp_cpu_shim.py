"""Test-only: let accelerate run FSDP on CPU processes.

accelerate switches to FSDP only from GPU-like distributed types, so on a CPU machine `--use_fsdp` silently gives
DDP (MULTI_CPU over gloo). torch's FSDP2 (`fully_shard`) itself works on CPU over gloo; this shim turns the
MULTI_CPU state into FSDP with the plugin accelerate built from the launcher's environment, so the Trainer's real
FSDP path (preparation, sharded forward/backward, full state dict) runs in CPU tests. Mixed precision is not applied
on this path, so tests run fp32.
"""

import os


def install() -> None:
    """Patch accelerate's process state (what the process group is) and accelerator state (which engine)."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    def use_fsdp() -> bool:
        return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"

    partial_init, accelerator_init = PartialState.__init__, AcceleratorState.__init__

    def partial_state(self, *args, **kwargs):
        partial_init(self, *args, **kwargs)
        if use_fsdp() and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP  # what a GPU machine's state becomes

    def accelerator_state(self, *args, fsdp_plugin=None, **kwargs):
        accelerator_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if use_fsdp() and fsdp_plugin is not None and getattr(self, "fsdp_plugin", None) is None:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    PartialState.__init__, AcceleratorState.__init__ = partial_state, accelerator_state
