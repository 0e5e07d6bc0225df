"""An asynchronous run on a tiny model for the resume test, killed with SIGKILL after optimizer step K if asked.

    python _async_resume_run.py SPEC.json

SPEC: {"model": dir, "output_dir": dir, "args": {AsyncGRPOConfig overrides}, "trained": jsonl path, "resume":
checkpoint dir or null, "kill_after_step": K or null}. Each generation batch the trainer takes is appended to
`trained` as {"step": the optimizer step it trains, "prompts": one per sample}.
"""

import json
import os
import signal
import sys

from transformers import TrainerCallback


class KillAfter(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main(spec_path):
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    from datasets import Dataset

    from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    prompts = ["ab", "cde", "fghi", "jk", "lmnop", "qr", "stu", "vwxyz"]
    dataset = Dataset.from_dict({"prompt": prompts})
    args = AsyncGRPOConfig(output_dir=spec["output_dir"], **spec["args"])
    callbacks = [KillAfter(spec["kill_after_step"])] if spec.get("kill_after_step") else []

    def reward(completions, **kwargs):
        return [len(c) / 10 for c in completions]

    trainer = AsyncGRPOTrainer(spec["model"], reward, args=args, train_dataset=dataset, callbacks=callbacks)
    take = trainer._next_batch

    def recorded():
        rollout = take()
        with open(spec["trained"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": trainer.state.global_step + 1, "prompts": rollout.prompts}) + "\n")
        return rollout

    trainer._next_batch = recorded
    trainer.train(resume_from_checkpoint=spec.get("resume"))
    with open(os.path.join(spec["output_dir"], "final_step.txt"), "w") as fh:
        fh.write(str(trainer.state.global_step))


if __name__ == "__main__":
    main(sys.argv[1])
