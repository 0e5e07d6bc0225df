"""A real GRPO run on the demo's tiny model, for the resume tests; killed with SIGKILL at a chosen point if asked.

    python _resume_run.py SPEC.json

SPEC: {"model": dir, "data": jsonl, "output_dir": dir, "args": {GRPOConfig overrides}, "rows": jsonl path,
"resume": checkpoint dir or null, "kill": {"at": "save" | "step_end", "step": K} or null}.

Every log row (with the completions logged since the previous one) is appended to `rows`; at the end the weights go
to `<output_dir>/final`. `kill.at == "save"` kills the process right after checkpoint K is written, `"step_end"` right
after optimizer step K (before its log and checkpoint).
"""

import json
import os
import signal
import sys

import torch
from transformers import TrainerCallback


class Recorder(TrainerCallback):
    def __init__(self, path, kill):
        self.path, self.kill, self.trainer = path, kill or {}, None

    def on_log(self, args, state, control, logs=None, **kwargs):
        completions = list(self.trainer.logged_completions)
        self.trainer.logged_completions.clear()
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"step": state.global_step, "logs": logs, "completions": completions}) + "\n")

    def on_step_end(self, args, state, control, **kwargs):
        self._maybe_kill("step_end", state.global_step)

    def on_save(self, args, state, control, **kwargs):
        self._maybe_kill("save", state.global_step)

    def _maybe_kill(self, event, step):
        if self.kill.get("at") == event and self.kill.get("step") == step:
            os.kill(os.getpid(), signal.SIGKILL)


def main(spec_path):
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    torch.set_num_threads(1)  # the same arithmetic in every run
    from datasets import Dataset

    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.demo import copy_digit_reward

    with open(spec["data"], encoding="utf-8") as fh:
        dataset = Dataset.from_list([json.loads(line) for line in fh])
    args = GRPOConfig(output_dir=spec["output_dir"], **spec["args"])
    recorder = Recorder(spec["rows"], spec.get("kill"))
    trainer = GRPOTrainer(spec["model"], copy_digit_reward, args=args, train_dataset=dataset, callbacks=[recorder])
    recorder.trainer = trainer
    trainer.train(resume_from_checkpoint=spec.get("resume"))
    trainer.save_model(os.path.join(spec["output_dir"], "final"))


if __name__ == "__main__":
    main(sys.argv[1])
