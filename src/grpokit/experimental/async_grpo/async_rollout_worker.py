"""TRL 1.16's module path `trl.experimental.async_grpo.async_rollout_worker`, for scripts that import from it."""

from .samples import RolloutSample
from .worker import AsyncRolloutWorker

__all__ = ["AsyncRolloutWorker", "RolloutSample"]
