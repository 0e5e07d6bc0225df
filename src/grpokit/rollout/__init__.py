"""One GRPO round: generate (through a `grpokit.generation` backend), reward, and turn rewards into advantages.

`produce_rollout` returns the `Rollout` a generation round trains on; reward calling lives in `rewards.py`, the
data order (each prompt repeated once per generation) in `sampler.py`; the few cross-process operations it needs are
`grpokit.dist`'s (re-exported here).
"""

from grpokit.dist import LOCAL, AcceleratorCollective, Collective

from .rewards import RewardError, RewardFunctions
from .rollout import Rollout, RolloutSettings, generate_completions, produce_rollout
from .sampler import RepeatSampler

__all__ = [
    "LOCAL",
    "AcceleratorCollective",
    "Collective",
    "RepeatSampler",
    "RewardError",
    "RewardFunctions",
    "Rollout",
    "RolloutSettings",
    "generate_completions",
    "produce_rollout",
]
