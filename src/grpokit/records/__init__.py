"""The records a run leaves in output_dir, written the same way by `GRPOTrainer` in Python and by `grpokit train`:
metrics.jsonl and completions.jsonl (`recorder`, a TrainerCallback the trainer attaches to itself), reward_curve.png
(`plot`) and resolved_config.yaml (`resolved`), each value with its source (`python` for a GRPOConfig(...) argument).
`write_run_records: false` turns the files off; `progress_lines` prints one line per log instead of transformers'
log dicts.

Nothing is imported here, so that `grpokit.records.resolved` (the YAML writer the config commands use too) loads
without torch or transformers.
"""
