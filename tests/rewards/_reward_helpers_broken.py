"""A module whose import fails inside it (a missing dependency), for the dotted-path error messages."""

import grpokit_missing_dependency_for_tests  # noqa: F401


def reward(completions, **kwargs):
    return [0.0] * len(completions)
