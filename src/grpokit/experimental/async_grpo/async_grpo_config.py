"""TRL 1.16's module path `trl.experimental.async_grpo.async_grpo_config`, for scripts that import from it."""

from .config import AsyncGRPOConfig

__all__ = ["AsyncGRPOConfig"]
