"""The generation-backend interface: prompt token ids in; completion ids (and, where the backend has them, the
sampling log-probabilities) out; a hook to push the policy's weights before a generation round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class GenerationError(RuntimeError):
    """A generation backend cannot go on (an engine that does not start, a server that is unreachable or died): one
    line saying what and how to fix it. `grpokit train` stops on it like on a failing reward, saving the weights."""


@dataclass
class Generated:
    """What one `generate` call returns, one entry per prompt, in prompt order.

    `completion_ids` end at (and include) the first EOS and are unpadded. `logprobs`, when the backend reports them,
    are the log-probabilities of those tokens under the distribution they were sampled from (after temperature), one
    per token; None when the backend samples from the training model itself (transformers), where they equal the
    trainer's own scores.
    """

    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None = None
    # With routing replay (transformers backend): each row's routed experts, `(prompt + completion tokens, routers,
    # top_k)` int16, -1 where none was recorded (grpokit.routing)
    routes: list | None = None


class GenerationBackend(Protocol):
    def generate(self, prompt_ids: list[list[int]], vision=None) -> Generated:
        """Completions of every prompt (each prompt is already repeated once per completion wanted). For a
        vision-language model, `vision` (`grpokit.vision.VisionRows`, one entry per prompt) holds the processor's
        image inputs and, for engines that encode images themselves, each prompt's images with its unexpanded
        tokens."""

    def sync_weights(self, model) -> None:
        """Make the backend generate with `model`'s current weights (a no-op where it runs the live model)."""
