"""Asynchronous GRPO, as TRL 1.16's `trl.experimental.async_grpo`: generation overlapped with training.

    from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

`config.py` the configuration; `samples.py` what the worker hands the trainer and TRL's plug-in protocols;
`worker.py` the built-in rollout worker (a thread); `transfer.py` the generators it uses and how weights reach them;
`trainer.py` the trainer.
"""

from .config import AsyncGRPOConfig
from .samples import RolloutSample, RolloutWorkerProtocol, WeightTransferProtocol
from .trainer import AsyncGRPOTrainer
from .transfer import LocalSampler, LocalWeightTransfer, ServerWeightTransfer
from .worker import AsyncRolloutWorker, RolloutWorkerError

__all__ = [
    "AsyncGRPOConfig",
    "AsyncGRPOTrainer",
    "AsyncRolloutWorker",
    "LocalSampler",
    "LocalWeightTransfer",
    "RolloutSample",
    "RolloutWorkerError",
    "RolloutWorkerProtocol",
    "ServerWeightTransfer",
    "WeightTransferProtocol",
]
