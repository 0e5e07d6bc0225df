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


def _quiet_bitsandbytes_cpu_kernel() -> None:
    """bitsandbytes (>= 0.50), imported by peft and so by transformers' Trainer whenever it is installed, tries on a
    CPU with AVX512-BF16 to fetch a 4-bit inference kernel from the Hub and logs "Failed to load CPU
    gemm_4bit_forward ..." (and the `kernels` package a line about its trust check) when it cannot: on every grpokit
    run. That kernel serves only the repacked 4-bit weights, which grpokit turns off for training (see
    `grpokit.models.prepare_quantized`), so the lines say nothing here; they are dropped at their two loggers."""
    import logging

    class _DropKernelFetch(logging.Filter):
        def filter(self, record):
            text = str(record.msg)
            return "gemm_4bit_forward" not in text and "quantization-bitsandbytes" not in text

    for name in ("bitsandbytes.backends.cpu.ops", "kernels._internals.hf_hub"):
        logging.getLogger(name).addFilter(_DropKernelFetch())


_quiet_bitsandbytes_cpu_kernel()


def __getattr__(name):
    # Imports are lazy so that `grpokit config ...` never pays for torch/transformers model code it does not use.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grpokit' has no attribute {name!r}")
