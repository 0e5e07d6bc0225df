"""Run under `accelerate launch` by test_reward_faults.py: `grpokit train --config RECIPE` whose reward fails on the
process of rank 1 only (it raises, or it hangs past reward_timeout); process 0 scores fine.

The rewards are imported by `grpokit train` as `_reward_fault_worker.<name>` (this directory is on PYTHONPATH).
"""

import os
import sys
import threading


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


_CALLS = [0]


def fails_on_rank_1(completions, **kwargs):
    _CALLS[0] += 1
    if _rank() == 1 and _CALLS[0] > 1:  # from the second round on: the first step trains, so there is a step to save
        raise ValueError("rank 1 cannot score this")
    return [float(len(c)) for c in completions]


def hangs_on_rank_1(completions, **kwargs):
    if _rank() == 1:
        threading.Event().wait(600)  # never set: only the timeout ends the wait
    return [float(len(c)) for c in completions]


if __name__ == "__main__":
    from grpokit.cli import main

    code = main(["train", "--config", sys.argv[1]])
    with open(f"exit-rank{_rank()}.txt", "w") as fh:  # in the working directory
        fh.write(str(code))
    # Both processes returned (none hangs): wait for each other before exiting, or the launcher, seeing one exit
    # non-zero, could stop the other before it has written its exit code.
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    sys.exit(code)
