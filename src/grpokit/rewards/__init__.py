"""Built-in reward functions (TRL and open-r1 names), their registry, and reward spec resolution.

Reward functions follow TRL's calling convention: called with keywords `prompts=`, `completions=`,
`completion_ids=`, the dataset columns (e.g. `solution=`) and `trainer_state=`, returning one float (or None to skip)
per completion; completions may be strings or conversational message lists.

Importing this package is cheap: no torch/transformers, and math-verify is imported only when a math reward runs.
"""

from ._math import MATH_INSTALL_HINT, MathVerifyNotInstalledError, is_math_verify_available
from .openr1_rewards import (
    accuracy,
    cosine,
    format_reward,
    length,
    reasoning_steps,
    repetition_penalty,
    soft_overlong_punishment,
    tag_count,
)
from .registry import (
    MATH_REWARD_NAMES,
    REWARD_FACTORIES,
    REWARD_FUNCS,
    check_reward_spec,
    resolve_reward,
    reward_names,
)
from .trl_rewards import (
    accuracy_reward,
    get_cosine_scaled_reward,
    get_repetition_penalty_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
    think_format_reward,
)

__all__ = [
    "MATH_INSTALL_HINT",
    "MATH_REWARD_NAMES",
    "REWARD_FACTORIES",
    "REWARD_FUNCS",
    "MathVerifyNotInstalledError",
    "accuracy",
    "accuracy_reward",
    "check_reward_spec",
    "cosine",
    "format_reward",
    "get_cosine_scaled_reward",
    "get_repetition_penalty_reward",
    "get_soft_overlong_punishment",
    "is_math_verify_available",
    "length",
    "reasoning_accuracy_reward",
    "reasoning_steps",
    "repetition_penalty",
    "resolve_reward",
    "reward_names",
    "soft_overlong_punishment",
    "tag_count",
    "think_format_reward",
]
