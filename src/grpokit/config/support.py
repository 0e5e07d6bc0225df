"""Fields that are accepted and shown but not implemented by the trainer yet.

`grpokit train` and `GRPOTrainer` refuse any of them set to a non-default value, before anything loads: a knob that
does nothing must fail loudly, never be a silent no-op. The documentation lists this table (docs/moving-from-trl.md).
"""

from __future__ import annotations

import dataclasses

# field -> why it is not available yet
NOT_IMPLEMENTED: dict[str, str] = {
    "code_eval_scoring_mode": "it scores open-r1's Codeforces reward (cf_code), which grpokit refuses by design (its "
    "checkers run only on open-r1's remote Piston/Morph graders); the code and binary_code rewards score the fraction "
    "of tests passed and pass/fail",
    "log_completions_hub_repo": "uploading completions to the Hub is not supported (runs are offline-first)",
    # open-r1's fields that drive its cluster and Hub tooling
    "callbacks": "open-r1's callbacks need its Hub tooling (revision pushes); pass TrainerCallback objects to "
    "GRPOTrainer instead",
    "benchmarks": "open-r1's benchmarks run as Slurm jobs after training; run them yourself on the saved model",
    "hub_model_revision": "pushes to a Hub branch are not supported (runs are offline-first)",
    "overwrite_hub_revision": "pushes to a Hub branch are not supported (runs are offline-first)",
    "push_to_hub_revision": "pushes to a Hub branch are not supported (runs are offline-first)",
    "dataset_mixture": "open-r1's mixture format is not read: write it as a `datasets:` mixture (id -> path, config "
    "-> name, split, columns; a weight w keeps that fraction of the rows: fraction)",
}


def unsupported_settings(*configs) -> list[str]:
    """One line per not-yet-implemented field set to a non-default value in any of `configs`."""
    lines = []
    for config in configs:
        if config is None or not dataclasses.is_dataclass(config):
            continue
        for f in dataclasses.fields(config):
            if f.name not in NOT_IMPLEMENTED:
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            value = getattr(config, f.name, default)
            if value != default:
                lines.append(f"{f.name}={value!r}: {NOT_IMPLEMENTED[f.name]}")
    return lines
