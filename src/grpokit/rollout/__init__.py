"""Rollouts: generation backends, reward calling, and the `Rollout` a generation round produces."""

from .dist import LOCAL, AcceleratorCollective, Collective
from .generate import (
    GenerationBackend,
    TransformersGenerator,
    cut_after_eos,
    decode_completions,
    encode_prompts,
    is_conversational,
    is_truncated,
    left_truncate,
)
from .rewards import RewardError, RewardFunctions
from .rollout import Rollout, RolloutSettings, produce_rollout
from .sampler import RepeatSampler
from .scoring import TokenScores, score_tokens

__all__ = [
    "LOCAL",
    "AcceleratorCollective",
    "Collective",
    "GenerationBackend",
    "RepeatSampler",
    "RewardError",
    "RewardFunctions",
    "Rollout",
    "RolloutSettings",
    "TokenScores",
    "TransformersGenerator",
    "cut_after_eos",
    "decode_completions",
    "encode_prompts",
    "is_conversational",
    "is_truncated",
    "left_truncate",
    "produce_rollout",
    "score_tokens",
]
