"""TRL 1.16's module path `trl.experimental.async_grpo.async_grpo_trainer`, for scripts that import from it."""

from .samples import RolloutWorkerProtocol, WeightTransferProtocol
from .trainer import AsyncGRPOTrainer

__all__ = ["AsyncGRPOTrainer", "RolloutWorkerProtocol", "WeightTransferProtocol"]
