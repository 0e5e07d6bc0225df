"""When a vLLM engine gets the policy's weights: before a round, and only if an optimizer step changed them."""

from __future__ import annotations

from grpokit import sharding


class WeightPushes:
    """The optimizer step whose weights the engine holds. Before a round, `before_round` pushes the policy when the
    engine is behind, except when every step since its last push was skipped as non-finite (`nan_guard`): the weights
    are then the ones it has. Under ZeRO-3 every rank gathers the parameters and the backend pushes from rank 0. The
    backend is given at each call: the trainer's `generator` attribute may be replaced after it is built."""

    def __init__(self, nan_guard=None):
        self.nan_guard = nan_guard
        self.step = None  # the global step whose weights the engine holds (None: never pushed)

    def before_round(self, generator, policy, step: int) -> float | None:
        """Push `policy` to `generator` if it is behind `step`; the push's seconds, or None when nothing was sent."""
        if self.step == step:
            return None
        seconds = None
        if self.nan_guard is None or not self.nan_guard.skipped_since(self.step, step):
            with sharding.full_parameters(policy):
                generator.sync_weights(policy)
            seconds = generator.last_sync_seconds
        self.step = step
        return seconds
