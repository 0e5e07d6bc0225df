"""Run under `accelerate launch` by test_nan_guard_ddp.py: `grpokit train --config RECIPE` where, at optimizer step 2,
the loss of the process of rank 1 only is NaN while its gradients stay finite (loss + NaN). The NaN guard must skip
that step on both processes; each writes what it ended with to result-rank{R}.json in the working directory."""

import hashlib
import json
import os
import sys

BAD_STEP = 2


def length_reward(completions, **kwargs):
    """Varies between completions, so the advantages and gradients are not all 0 and every applied step moves."""
    return [float(len(c)) for c in completions]


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _patch():
    from grpokit.trainer import GRPOTrainer

    compute_loss, train = GRPOTrainer.compute_loss, GRPOTrainer.train

    def poisoned(self, model, inputs, *args, **kwargs):
        loss = compute_loss(self, model, inputs, *args, **kwargs)
        if _rank() == 1 and self.state.global_step + 1 == BAD_STEP:
            return loss + float("nan")
        return loss

    def weights(self) -> str:
        digest = hashlib.sha256()
        for _, param in sorted(self.accelerator.unwrap_model(self.model).named_parameters()):
            digest.update(param.detach().cpu().numpy().tobytes())
        return digest.hexdigest()

    def recorded(self, *args, **kwargs):
        self._initial_weights = weights(self)
        output = train(self, *args, **kwargs)
        model = self.accelerator.unwrap_model(self.model)
        first = next(model.parameters())
        result = {
            "weights": weights(self),
            "initial": self._initial_weights,
            "adam_steps": self.optimizer.state[first]["step"].item(),
            "skipped": {e["step"]: e["nonfinite_steps_skipped"] for e in self.state.log_history if "loss" in e},
        }
        with open(f"result-rank{_rank()}.json", "w") as fh:
            json.dump(result, fh)
        return output

    GRPOTrainer.compute_loss, GRPOTrainer.train = poisoned, recorded


if __name__ == "__main__":
    _patch()
    from grpokit.cli import main

    sys.exit(main(["train", "--config", sys.argv[1]]))
