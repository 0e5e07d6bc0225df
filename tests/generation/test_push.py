"""`generation.push.WeightPushes`: the policy goes to the engine once per optimizer step, not after skipped steps."""

import torch

from grpokit.generation.push import WeightPushes


class Engine:
    def __init__(self):
        self.pushed = []  # the policy's weight at each push
        self.last_sync_seconds = 0.0

    def sync_weights(self, policy):
        self.pushed.append(float(policy.weight.detach()))
        self.last_sync_seconds = 0.25 * len(self.pushed)


class Guard:
    def __init__(self, skipped):
        self.skipped = skipped  # the steps the NaN guard skipped
        self.asked = []

    def skipped_since(self, step, now):
        self.asked.append((step, now))
        return step is not None and all(s in self.skipped for s in range(step + 1, now + 1))


def test_one_push_per_step_and_none_within_it():
    engine, pushes, policy = Engine(), WeightPushes(), torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.constant_(policy.weight, 1.0)
    assert pushes.before_round(engine, policy, 0) == 0.25  # never pushed: the first round pushes
    assert pushes.before_round(engine, policy, 0) is None  # a second round of the same step (eval, refill)
    torch.nn.init.constant_(policy.weight, 2.0)
    assert pushes.before_round(engine, policy, 1) == 0.5
    assert engine.pushed == [1.0, 2.0] and pushes.step == 1


def test_no_push_when_every_step_since_the_last_was_skipped():
    engine, guard, policy = Engine(), Guard(skipped={2, 3}), torch.nn.Linear(1, 1, bias=False)
    pushes = WeightPushes(guard)
    assert pushes.before_round(engine, policy, 1) == 0.25
    assert pushes.before_round(engine, policy, 3) is None  # steps 2 and 3 skipped: the engine has these weights
    assert pushes.step == 3
    assert pushes.before_round(engine, policy, 4) == 0.5  # step 4 was taken
    assert len(engine.pushed) == 2
    assert guard.asked == [(None, 1), (1, 3), (3, 4)]


def test_the_backend_is_the_one_given_at_each_round():
    first, second, policy, pushes = Engine(), Engine(), torch.nn.Linear(1, 1, bias=False), WeightPushes()
    pushes.before_round(first, policy, 0)
    pushes.before_round(second, policy, 1)  # the trainer's generator was replaced in between
    assert len(first.pushed) == 1 and len(second.pushed) == 1
