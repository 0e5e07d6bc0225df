"""Reward functions and factories importable by dotted path, for the resolution tests."""


def always_one(completions, **kwargs):
    return [1.0] * len(completions)


def scaled(completions, scale=1.0, **kwargs):
    return [scale] * len(completions)


def make_constant(value):
    def constant_reward(completions, **kwargs):
        return [value] * len(completions)

    return constant_reward


class ConstantReward:
    """A factory given as a class: its instances are reward callables without a `__name__`."""

    def __init__(self, value):
        self.value = value

    def __call__(self, completions, **kwargs):
        return [self.value] * len(completions)


NOT_CALLABLE = 3
