"""`ModelConfig`: how the policy model is loaded (precision, attention, quantisation, LoRA). TRL 1.16's names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .rules import validate_instance


@dataclass
class ModelConfig:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Policy model: a hub id or a local directory written by save_pretrained."}
    )
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the hub model."})
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = field(
        default="float32",
        metadata={"help": "Dtype the weights are loaded in; 'auto' takes the one stored in the checkpoint."},
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "Attention kernel, e.g. 'sdpa', 'eager' or 'flash_attention_2'; unset lets transformers pick."
        },
    )
    use_peft: bool = field(default=False, metadata={"help": "Train LoRA adapters instead of the full model."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (the update is scaled alpha/r)."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input, in [0, 1)."})
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={"help": "Module names that get adapters, or 'all-linear'; unset uses peft's choice for the model."},
    )
    lora_target_parameters: list[str] | None = field(
        default=None, metadata={"help": "Parameter names (e.g. MoE expert weights) that get LoRA adapters."}
    )
    lora_modules_to_save: list[str] | None = field(
        default=None, metadata={"help": "Modules trained in full and saved beside the adapters, e.g. lm_head."}
    )
    lora_task_type: str = field(default="CAUSAL_LM", metadata={"help": "peft task type of the adapters."})
    use_rslora: bool = field(
        default=False, metadata={"help": "Rank-stabilised LoRA: scale updates by alpha/sqrt(r) instead of alpha/r."}
    )
    use_dora: bool = field(
        default=False, metadata={"help": "Weight-decomposed LoRA (DoRA): adapt magnitude and direction apart."}
    )
    load_in_8bit: bool = field(
        default=False,
        metadata={"help": "Load the base model 8-bit quantised (bitsandbytes) and train LoRA on it; needs use_peft."},
    )
    load_in_4bit: bool = field(
        default=False,
        metadata={
            "help": "Load the base model 4-bit quantised (bitsandbytes) and train LoRA on it (QLoRA); needs use_peft."
        },
    )
    bnb_4bit_quant_type: Literal["fp4", "nf4"] = field(
        default="nf4", metadata={"help": "4-bit quantisation data type (with load_in_4bit)."}
    )
    use_bnb_nested_quant: bool = field(
        default=False, metadata={"help": "Quantise the 4-bit quantisation constants too (double quantisation)."}
    )
    bnb_4bit_quant_storage: str | None = field(
        default=None, metadata={"help": "Storage dtype of 4-bit weights, e.g. 'uint8' or 'bfloat16'."}
    )

    def __post_init__(self):
        validate_instance(self)
        if self.lora_target_modules is not None and len(self.lora_target_modules) == 1:
            # A single entry like 'all-linear' is peft's string form, not a module name.
            self.lora_target_modules = self.lora_target_modules[0]
