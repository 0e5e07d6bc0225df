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


def _quiet_deepspeed_cpu_detection() -> None:
    """DeepSpeed logs "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
    each time it is imported on a machine without a GPU, and transformers and accelerate import it whenever it is
    installed: on every grpokit command and script. On a CPU machine grpokit trains on the CPU on purpose, so that
    line says nothing; it is dropped here, at DeepSpeed's logger (set DS_ACCELERATOR to choose its accelerator).
    Standard library only: the filter is in place before DeepSpeed is ever imported."""
    import logging

    class _DropCpuDetection(logging.Filter):
        def filter(self, record):
            return not str(record.msg).startswith("Setting accelerator to CPU")

    logging.getLogger("DeepSpeed").addFilter(_DropCpuDetection())


_quiet_deepspeed_cpu_detection()


def __getattr__(name):
    # Imports are lazy so that `grpokit config ...` never pays for torch/transformers model code it does not use.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grpokit' has no attribute {name!r}")
