"""The models around a rollout: loading the policy and reward models, preparing the policy and the reference, and
placing them for the trainer (frozen models sharded like the policy; the bare policy for generation).

Model loading follows TRL 1.16: `model_init_kwargs` go to `from_pretrained`, `dtype` defaults to float32 and may be a
`torch.dtype`, `"auto"`, or one of `"bfloat16"`, `"float16"`, `"float32"`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import hub

logger = logging.getLogger(__name__)

DTYPE_NAMES = ("bfloat16", "float16", "float32")


def from_pretrained_kwargs(model_init_kwargs: dict | None, trust_remote_code: bool) -> dict[str, Any]:
    kwargs = dict(model_init_kwargs or {})  # a copy: the config's dict is not mutated
    dtype = kwargs.get("dtype", "float32")
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        kwargs["dtype"] = getattr(torch, dtype)
    elif not (isinstance(dtype, torch.dtype) or dtype in ("auto", None)):
        raise ValueError(
            f"model_init_kwargs['dtype']={dtype!r}: expected 'auto', a torch.dtype or one of {', '.join(DTYPE_NAMES)}"
        )
    else:
        kwargs["dtype"] = dtype
    kwargs.setdefault("trust_remote_code", trust_remote_code)
    return kwargs


def load_policy(model_id: str, model_init_kwargs: dict | None, trust_remote_code: bool, quantization_config=None):
    """The policy from a path or hub id: a causal LM, or with a vision tower (its config has a `vision_config`) an
    image-text-to-text model, as TRL loads them; quantised with `quantization_config` when given."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from . import gguf

    kwargs = from_pretrained_kwargs(model_init_kwargs, trust_remote_code)
    source = gguf.gguf_source(model_id, model_init_kwargs)
    if source is not None:  # dequantised into a plain float model, which saves as safetensors
        if quantization_config is not None:
            raise ValueError("a GGUF model cannot be quantised again: leave load_in_4bit/load_in_8bit unset")
        with quiet_progress_bars():
            return gguf.load_model(*source, kwargs)
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    hub.require(model_id)
    config = AutoConfig.from_pretrained(model_id, trust_remote_code=kwargs["trust_remote_code"])
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    with quiet_progress_bars():
        return auto.from_pretrained(model_id, **kwargs)


@contextlib.contextmanager
def quiet_progress_bars():
    """transformers' tqdm bars ("Loading weights", "Writing model shards") off for what the trainer loads and saves:
    a run's progress is one line per log. Left on when the user asks for them (`HF_HUB_DISABLE_PROGRESS_BARS=0`), and
    left off when they are off already."""
    import transformers.utils.logging as transformers_logging

    asked = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS", "").strip().lower() in ("0", "false", "no", "off")
    if asked or not transformers_logging.is_progress_bar_enabled():
        yield
        return
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.enable_progress_bar()


def load_tokenizer(model_id: str, **kwargs):
    """The tokenizer of a checkpoint. A checkpoint that declares the generic fast tokenizer (`TokenizersBackend` /
    `PreTrainedTokenizerFast`) gets exactly its `tokenizer.json`: `AutoTokenizer` would swap in the model type's
    own class (e.g. Qwen2Tokenizer), whose pre-tokenizer can drop characters the saved tokenizer keeps."""
    import json
    import os

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    hub.require(model_id, "tokenizer")
    config_path = os.path.join(model_id, "tokenizer_config.json")
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as fh:
            declared = json.load(fh).get("tokenizer_class")
        if declared in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            kwargs.pop("trust_remote_code", None)
            return PreTrainedTokenizerFast.from_pretrained(model_id, **kwargs)
    return AutoTokenizer.from_pretrained(model_id, **kwargs)


def load_reward_model(model_id: str, model_init_kwargs: dict | None, trust_remote_code: bool):
    """A sequence classifier with one output (the reward) and its tokenizer."""
    from transformers import AutoModelForSequenceClassification

    kwargs = from_pretrained_kwargs(model_init_kwargs, trust_remote_code)
    hub.require(model_id, "reward model")
    model = AutoModelForSequenceClassification.from_pretrained(model_id, num_labels=1, **kwargs)
    tokenizer = load_tokenizer(model_id, trust_remote_code=trust_remote_code)
    return model, tokenizer


def prepare_reward_tokenizer(model, tokenizer) -> None:
    """The reward is read at the last non-pad token, so the model must know the tokenizer's pad id."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id


def model_id(model) -> str:
    return str(getattr(model.config, "_name_or_path", "") or "")


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and every EOS the generation config declares."""
    declared = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids = [tokenizer.eos_token_id, *ids]
    return ids


def ignore_boolean_buffers(model: nn.Module) -> list[str]:
    """Make DDP skip the model's boolean buffers (`ignore_bias_buffers`): it cannot broadcast them (transformers issue
    22482). DDP reads `_ddp_params_and_buffers_to_ignore` when it wraps the model; returns the names it will skip."""
    names = [name for name, buffer in model.named_buffers() if buffer.dtype == torch.bool]
    model._ddp_params_and_buffers_to_ignore = names
    return names


def disable_dropout(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def cast_lm_head_to_fp32(model) -> None:
    """Run the output projection in float32 on float32 weights, whatever the rest of the model runs in.

    With tied embeddings the embedding table becomes float32 too; its outputs are cast back to the model's dtype so
    the rest of the network is unchanged.
    """
    if is_peft_model(model):
        model = model.get_base_model()
    head = model.get_output_embeddings()
    if _is_peft_layer(head):
        raise ValueError(
            "cast_lm_head_to_fp32=True does not work with a PEFT adapter on lm_head; remove 'lm_head' from the "
            "adapter's target_modules, or set cast_lm_head_to_fp32=False"
        )
    original_dtype = head.weight.dtype
    head.float()

    def forward_fp32(hidden_states):
        bias = None if head.bias is None else head.bias.float()
        return nn.functional.linear(hidden_states.float(), head.weight.float(), bias)

    head.forward = forward_fp32
    if getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        model.get_input_embeddings().register_forward_hook(lambda module, args, output: output.to(original_dtype))


def is_peft_model(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _is_peft_layer(module) -> bool:
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return False
    return isinstance(module, BaseTunerLayer)


def is_quantized(model) -> bool:
    """Whether the model's base was loaded quantised by bitsandbytes (4-bit or 8-bit), as transformers marks it."""
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def prepare_quantized(model) -> None:
    """A PEFT model on a quantised base, made ready to train (QLoRA): the trainable adapter weights in bfloat16, as
    TRL 1.16 has them (the QLoRA paper's choice; DoRA's magnitude vector keeps its dtype, its small updates would
    round away), and bitsandbytes' CPU repacking of 4-bit weights turned off: bitsandbytes 0.50 repacks a layer on
    its first no-gradient forward in eval mode (on AVX512-BF16 CPUs), after which its training forwards fail."""
    if not is_quantized(model):
        return
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):  # bitsandbytes' Linear4bit
            module.support_avx512bf16_for_cpu = False
    for name, param in model.named_parameters():
        if param.requires_grad and "lora_magnitude_vector" not in name:
            param.data = param.data.to(torch.bfloat16)


# bitsandbytes' quantised parameter classes (4-bit, 8-bit), by name: bitsandbytes is imported only when one is there.
QUANTIZED_PARAMS = ("Params4bit", "Int8Params")


def dequantized(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The dense weight (in `dtype`) a bitsandbytes-quantised parameter stands for, exactly what the layer multiplies
    by: a 4-bit `Params4bit` or an 8-bit `Int8Params`. None for any other tensor."""
    kind = type(param).__name__
    if kind not in QUANTIZED_PARAMS:
        return None
    import bitsandbytes.functional as bnb_functional

    with torch.no_grad():
        if kind == "Params4bit":
            dense = bnb_functional.dequantize_4bit(param.data, param.quant_state)
        else:
            dense = bnb_functional.int8_vectorwise_dequant(param.data, param.SCB)
    return dense.to(dtype)


def dense_shape(param: torch.Tensor) -> tuple[int, ...]:
    """The shape of the weight a parameter stands for: a 4-bit parameter stores its values packed in another shape."""
    state = getattr(param, "quant_state", None)
    return tuple(state.shape) if type(param).__name__ == "Params4bit" and state is not None else tuple(param.shape)


def apply_peft(model, peft_config):
    """Wrap `model` with a new adapter described by `peft_config` (a `peft.PeftConfig`)."""
    try:
        from peft import PeftConfig, get_peft_model
    except ImportError as error:
        raise ImportError("peft_config needs the peft library: pip install 'grpokit[peft]'") from error
    if not isinstance(peft_config, PeftConfig):
        raise TypeError(f"peft_config must be a peft.PeftConfig (e.g. LoraConfig), got {type(peft_config).__name__}")
    if is_peft_model(model):
        raise ValueError(
            "got both a PeftModel and a peft_config: merge and unload the existing adapter, or pass the base model "
            "with the peft_config"
        )
    from .vision import is_vision_model

    if is_vision_model(model) and getattr(peft_config, "exclude_modules", "absent") is None:
        import copy

        # The vision tower and its projector stay as they are (no adapters): a copy, the caller's config is kept.
        peft_config = copy.copy(peft_config)
        peft_config.exclude_modules = VISION_MODULES
    return get_peft_model(model, peft_config)


# A vision-language model's vision tower and projector, by the module names transformers' VLMs use; LoRA leaves them
# without adapters unless the peft config sets exclude_modules itself.
VISION_MODULES = r".*(vision_tower|vision_model|visual|multi_modal_projector|connector|vision_embed)\b.*"


def add_reference_adapter(model) -> None:
    """For a model that already carries a trained adapter ('default'): a frozen copy of it named 'ref', so the
    reference policy is the policy as it started, not the bare base model."""
    model.add_adapter("ref", model.peft_config["default"])
    for name, param in model.named_parameters():
        if ".default." in name:
            ref_param = model.get_parameter(name.replace(".default.", ".ref."))
            ref_param.data.copy_(param.data)
            ref_param.requires_grad_(False)


@contextlib.contextmanager
def reference_policy(model) -> Iterator[None]:
    """Within this context a PEFT `model` computes the reference policy: its 'ref' adapter if it has one, otherwise
    the base model (adapters disabled)."""
    if "ref" in model.peft_config:
        model.set_adapter("ref")
        try:
            yield
        finally:
            model.set_adapter("default")
    else:
        with model.disable_adapter():
            yield


def prepare_tokenizer(model, processing_class, trust_remote_code: bool = False, chat_template: str | None = None):
    """The policy's processing class: a tokenizer, or for a vision-language model (its config has a
    `vision_config`) a processor (`AutoProcessor`), loaded from the model's path when not given. Its tokenizer pads
    and truncates on the left and has a pad token, which the model's configs are told about; `chat_template` (when
    given) replaces its own."""
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

    from .vision import is_vision_model

    if processing_class is None:
        kwargs = dict(truncation_side="left", padding_side="left", trust_remote_code=trust_remote_code)
        if is_vision_model(model):
            from transformers import AutoProcessor

            processing_class = AutoProcessor.from_pretrained(model_id(model), **kwargs)
        else:
            processing_class = load_tokenizer(model_id(model), **kwargs)
    if isinstance(processing_class, ProcessorMixin):
        tokenizer = processing_class.tokenizer
        # Right padding misaligns image features (Gemma3, Idefics3) or fails (Qwen2-VL): prompts pad on the left.
        tokenizer.padding_side = tokenizer.truncation_side = "left"
    elif isinstance(processing_class, PreTrainedTokenizerBase):
        tokenizer = processing_class
        if is_vision_model(model):
            raise TypeError(
                f"{type(model).__name__} is a vision-language model: pass its processor (AutoProcessor) as "
                f"processing_class, not a tokenizer ({type(processing_class).__name__})"
            )
    else:
        raise TypeError(
            f"processing_class must be a tokenizer or a processor (ProcessorMixin); got "
            f"{type(processing_class).__name__}"
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template is not None:
        processing_class.chat_template = chat_template
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return processing_class


def prepare_policy(model, peft_config, *, beta: float, gradient_checkpointing: bool, sync_ref_model: bool):
    """The trainable policy and, when the KL term needs one, a frozen reference model: `(policy, reference)`.

    Without PEFT the reference is a frozen copy of the initial policy (beta > 0 only). With a new adapter
    (`peft_config`) there is no reference model: the policy with its adapter disabled is the reference. A
    `PeftModel` given with a trained adapter gets a frozen copy of it ('ref') to serve as reference. On a quantised
    base (QLoRA) the reference is that same quantised base, which is exactly the initial policy.
    """
    reference = None
    if is_quantized(model) and peft_config is None and not is_peft_model(model):
        raise ValueError(
            "the model is quantised (bitsandbytes) and has no PEFT adapter: a quantised base cannot be trained in "
            "full; pass peft_config (e.g. peft.LoraConfig) to train LoRA adapters on it (QLoRA)"
        )
    if beta != 0.0 and peft_config is None and not is_peft_model(model):
        from .sharding import copy_for_reference

        reference = copy_for_reference(model)
    if peft_config is not None:
        model = apply_peft(model, peft_config)
    elif is_peft_model(model) and beta != 0.0:
        add_reference_adapter(model)
    prepare_quantized(model)
    if is_peft_model(model):
        if _is_peft_layer(model.get_output_embeddings()):
            raise ValueError("a PEFT adapter on lm_head is not supported; remove 'lm_head' from target_modules")
        if sync_ref_model:
            raise ValueError(
                "sync_ref_model=True does not work with PEFT: the reference is the model with its adapter disabled, "
                "there is no separate reference model to synchronise"
            )
        if gradient_checkpointing:
            model.enable_input_require_grads()
    return model, reference


def router_aux_loss(model, coef: float | None) -> tuple[float, bool]:
    """`(coefficient, enabled)` of a Mixture-of-Experts load-balancing loss: unset `coef` takes the model config's
    value; a coefficient for a model without a router is an error."""
    text_config = model.config.get_text_config()
    has_router = hasattr(text_config, "output_router_logits")
    if coef and not has_router:
        raise ValueError(
            f"router_aux_loss_coef={coef}: {type(model).__name__} is not a Mixture-of-Experts model that returns "
            "router logits, so there is no load-balancing loss to weight; unset router_aux_loss_coef"
        )
    coef = getattr(text_config, "router_aux_loss_coef", 0.0) if coef is None else coef
    return coef, has_router and coef != 0.0


# ---------------------------------------------------------------------------------------------------- for the trainer


@dataclass
class TrainerModels:
    """What `build_models` hands the trainer."""

    policy: Any  # the model to train (with its PEFT adapter, if any)
    tokenizer: Any
    reference: (
        Any  # a frozen copy for the KL term, or None (beta == 0, or PEFT: the adapter disabled is the reference)
    )
    model_path: str | None  # the policy's checkpoint (vLLM starts from it)
    eos_token_ids: list[int]
    router_aux_loss_coef: float
    aux_loss_enabled: bool


def build_models(model, processing_class, peft_config, args, quantization_config=None) -> TrainerModels:
    """The policy (loaded if a path, quantised with `quantization_config` if given, with PEFT if asked), its tokenizer
    and the reference model, as `args` (a `GRPOConfig`) prepares them: dropout off, lm_head in float32, the MoE router
    loss."""
    from transformers import set_seed

    set_seed(args.seed)  # before the model: a new PEFT adapter is initialised at random
    model_path = model if isinstance(model, str) else getattr(model, "name_or_path", None)
    if isinstance(model, str):
        from . import gguf

        source = gguf.gguf_source(model, args.model_init_kwargs)
        if source is not None and processing_class is None:  # the tokenizer is in the GGUF file
            processing_class = gguf.load_tokenizer(*source, truncation_side="left", padding_side="left")
        model = load_policy(model, args.model_init_kwargs, args.trust_remote_code, quantization_config)
    else:
        if args.model_init_kwargs:
            logger.warning("model_init_kwargs is ignored: the model is already instantiated")
        if quantization_config is not None:
            logger.warning("quantization_config is ignored: the model is already instantiated")
    tokenizer = prepare_tokenizer(model, processing_class, args.trust_remote_code, args.chat_template)
    from .vision import tokenizer_of

    eos_ids = eos_token_ids(model, tokenizer_of(tokenizer))
    model, reference = prepare_policy(
        model,
        peft_config,
        beta=args.beta,
        gradient_checkpointing=args.gradient_checkpointing,
        sync_ref_model=args.sync_ref_model,
    )
    for m in (model, reference):
        if m is not None and args.disable_dropout:
            disable_dropout(m)
        if m is not None and args.cast_lm_head_to_fp32:
            cast_lm_head_to_fp32(m)
    coef, enabled = router_aux_loss(model, args.router_aux_loss_coef)
    from .vision import is_vision_model

    reentrant = (args.gradient_checkpointing_kwargs or {}).get("use_reentrant")
    if is_vision_model(model) and args.ddp_find_unused_parameters is None and not reentrant:
        # A batch without images leaves the vision tower without gradients: DDP must look for unused parameters, as
        # TRL sets it (reentrant activation checkpointing cannot, so it is left alone there).
        args.ddp_find_unused_parameters = True
    elif args.ddp_find_unused_parameters is None and not hasattr(
        model.config.get_text_config(), "output_router_logits"
    ):
        # A text model without experts uses every trainable parameter at every step: transformers' default (True
        # without activation checkpointing) only costs DDP a graph traversal per step and a warning on every rank.
        args.ddp_find_unused_parameters = False
    return TrainerModels(model, tokenizer, reference, model_path, eos_ids, coef, enabled)


def place_frozen(model, accelerator):
    """An inference-only model (reference, reward model) placed as the policy is: under ZeRO-3 a DeepSpeed engine
    partitioned like the policy; under FSDP2 sharded per decoder layer; otherwise a full copy on each process's device
    (ZeRO-1/2 shard only optimizer state and gradients, which a frozen model has not)."""
    from . import sharding

    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None and plugin.zero_stage == 3:
        return sharding.prepare_deepspeed_inference(model, accelerator)
    if accelerator.is_fsdp2:
        return sharding.shard_reference_fsdp2(model.to(accelerator.device), accelerator)
    return accelerator.prepare_model(model, evaluation_mode=True, device_placement=True)


def deepspeed_zero3_engine(model_wrapped):
    """The policy's DeepSpeed engine under ZeRO-3 once it is prepared (None otherwise)."""
    from .sharding import zero3_partitioned

    if type(model_wrapped).__name__ != "DeepSpeedEngine" or not zero3_partitioned(model_wrapped.module):
        return None
    return model_wrapped


@contextlib.contextmanager
def unwrapped_for_generation(accelerator, model_wrapped, ds3_gather_for_generation: bool):
    """The bare policy, with activation checkpointing off meanwhile (in training mode it disables the KV cache), and
    under ZeRO-3 its parameters gathered (with `ds3_gather_for_generation`).

    The per-layer flags are switched rather than calling `*_checkpointing_disable/enable`, so the checkpointing
    settings the Trainer chose (kwargs, every_n_layers, offload) stay exactly as they were.
    """
    from .sharding import gathered_for_generation

    model = accelerator.unwrap_model(model_wrapped)
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    gather = (
        gathered_for_generation(model_wrapped, model)
        if ds3_gather_for_generation and deepspeed_zero3_engine(model_wrapped) is not None
        else contextlib.nullcontext()
    )
    for layer in layers:
        layer.gradient_checkpointing = False
    try:
        with gather, accelerator.autocast():  # mixed precision: one autocast over the whole generate call
            yield model
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True
