"""Generation with transformers: `model.generate` on left-padded prompts, through grpokit's decoding loop where it
applies (`decoding.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor

from ..sharding import is_sharded
from .base import Generated
from .tokens import cut_after_eos, pad


class TransformersGenerator:
    """Generation with `model.generate` on left-padded prompts.

    With `share_prefix`, `generate` runs grpokit's decoding loop (`grpokit.generation.decoding`): each distinct prompt
    is prefilled once and finished rows leave the decode batch. Every generation setting is still honoured by
    `generate`'s own preparation; where the loop cannot follow one (beam search, a static cache, ...), or the model is
    not a standard transformers causal LM, plain `generate` runs instead.

    Args:
        model_context: a callable returning a context manager that yields the model to generate with (the trainer
            unwraps it from DDP and switches gradient checkpointing off meanwhile); or a plain model.
        generation_config: a `transformers.GenerationConfig` (sampling settings, max_new_tokens, eos and pad ids).
        pad_token_id: left padding of the prompts.
        eos_token_ids: every id that ends a completion.
        pad_to_multiple_of: round the padded prompt length up to this multiple.
        device: where the prompt tensors go; default the model's device.
        share_prefix: use the shared-prefix decoding loop where possible.
    """

    def __init__(
        self,
        model_context: Callable[[], AbstractContextManager] | Any,
        generation_config,
        *,
        pad_token_id: int,
        eos_token_ids: Sequence[int],
        pad_to_multiple_of: int | None = None,
        device: torch.device | str | None = None,
        share_prefix: bool = True,
    ):
        self.model_context = model_context
        self.generation_config = generation_config
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.device = device
        self.share_prefix = share_prefix
        self.route_recorder = None  # a grpokit.routing.RouteRecorder: record each token's experts (routing_replay)

    def _context(self) -> AbstractContextManager:
        if isinstance(self.model_context, torch.nn.Module):
            return nullcontext(self.model_context)
        return self.model_context()

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], vision=None) -> Generated:
        """Completions of every prompt; `vision` (a `grpokit.vision.VisionRows`, one entry per prompt) holds a
        vision-language model's image inputs as the processor encoded them."""
        input_ids = pad(prompt_ids, value=self.pad_token_id, side="left", multiple_of=self.pad_to_multiple_of)
        attention_mask = pad(
            [[1] * len(p) for p in prompt_ids], value=0, side="left", multiple_of=self.pad_to_multiple_of
        )
        with self._context() as model:
            device = self.device if self.device is not None else model.device
            inputs = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
            if self.route_recorder is not None:  # routing replay: plain generate, every router's choice recorded
                if vision is not None:
                    raise ValueError("routing_replay does not take image prompts yet (text-only MoE models)")
                with self.route_recorder.recording(model, input_ids.size(0)):
                    output = model.generate(**inputs, generation_config=self.generation_config)
            elif vision is None:
                output = self._generate(model, inputs)
            else:  # image inputs: plain `generate` (the shared-prefix loop prefills text only)
                inputs.update(vision.model_inputs(input_ids.size(1), device=device))
                output = model.generate(**inputs, generation_config=self.generation_config)
        completions = output[:, input_ids.size(1) :].cpu().tolist()  # (B, C)
        completions = [cut_after_eos(ids, self.eos_token_ids) for ids in completions]
        routes = None
        if self.route_recorder is not None:
            lengths = [len(p) for p in prompt_ids]
            routes = self.route_recorder.rows(lengths, input_ids.size(1), [len(c) for c in completions])
        return Generated(completions, routes=routes)

    def sync_weights(self, model) -> None:
        """Nothing to push: `generate` runs the live policy."""

    def _generate(self, model, inputs: dict[str, Tensor]) -> Tensor:
        # With sharded parameters (ZeRO-3 through its hooks, FSDP2) every forward call gathers weights with the other
        # ranks: plain `generate` keeps them in step (synced_gpus), where grpokit's loop would let finished ranks stop.
        if self.share_prefix and _standard_causal_lm(model) and not is_sharded(model):
            from .decoding import Unsupported, shared_prefix_decoding

            try:
                return model.generate(
                    **inputs, generation_config=self.generation_config, custom_generate=shared_prefix_decoding
                )
            except Unsupported:  # raised before any model call: nothing to undo
                pass
        return model.generate(**inputs, generation_config=self.generation_config)


def _standard_causal_lm(model) -> bool:
    """A transformers decoder-only LM (possibly under a LoRA-style PEFT adapter) that `generate` can run our loop on."""
    from transformers import PreTrainedModel

    from grpokit.models import is_peft_model

    if is_peft_model(model):
        if model.peft_config[model.active_adapter].is_prompt_learning:
            return False
        model = model.get_base_model()
    return isinstance(model, PreTrainedModel) and not model.config.is_encoder_decoder
