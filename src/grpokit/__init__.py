"""grpokit: GRPO training for language models, configured strictly and explainably, drop-in for TRL users."""

__version__ = "0.1.0"

__all__ = [
    "DatasetConfig",
    "DatasetMixtureConfig",
    "GRPOConfig",
    "GRPOScriptArguments",
    "GRPOTrainer",
    "ModelConfig",
    "ScriptArguments",
    "TrlParser",
]

_LAZY = {
    "GRPOConfig": "grpokit.config.grpo_config",
    "ScriptArguments": "grpokit.config.script_args",
    "GRPOScriptArguments": "grpokit.config.script_args",
    "DatasetConfig": "grpokit.config.script_args",
    "DatasetMixtureConfig": "grpokit.config.script_args",
    "ModelConfig": "grpokit.config.model_config",
    "TrlParser": "grpokit.config.parser",
    "GRPOTrainer": "grpokit.trainer",
}


def __getattr__(name):
    # Imports are lazy so that `grpokit config ...` never pays for torch/transformers model code it does not use.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grpokit' has no attribute {name!r}")
