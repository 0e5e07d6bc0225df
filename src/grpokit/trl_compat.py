"""The surface of TRL 1.16's `GRPOTrainer` that users' subclasses, callbacks and tests touch by name, as a mixin of
`grpokit.trainer.GRPOTrainer`: the entropy and off-policy mask helpers, the `_generate` hook, the entropy-bonus
predicate, `reward_processing_classes`, and the warnings TRL gives at construction.

Each helper is a thin wrapper over grpokit's own functions (`grpokit.algorithms`, `grpokit.rollout`), with TRL's
signature and results, and the trainer calls it where TRL does, so a subclass overriding one changes training as it
would in TRL. The trainer keeps the state these read: `args`, `accelerator`, `_entropy_control`, `rewards`,
`generator`, `processing_class`.
"""

from __future__ import annotations

import logging

import torch

from .algorithms import off_policy_mask
from .algorithms.entropy_control import high_entropy_mask
from .dist import AcceleratorCollective
from .rollout.rollout import RolloutSettings, generate_completions

logger = logging.getLogger(__name__)

# Losses that sum per-token terms over the batch: with sequence-level importance sampling each sequence then weighs
# as much as its length. TRL 1.16's list.
TOKEN_SUMMED_LOSSES = ("bnpo", "dr_grpo", "dapo", "cispo")

# Pads the processes' entropies to one length before gathering; entropies are >= 0, so it never matches a real one.
_ENTROPY_PAD = -1e9


def construction_warnings(loss_type: str, importance_sampling_level: str) -> list[str]:
    """The warnings TRL 1.16 logs at construction for these loss settings (its wording, TRL's conditions)."""
    lines = []
    if loss_type == "luspo" and importance_sampling_level != "sequence":
        lines.append(
            "When using `'luspo'` loss, `importance_sampling_level` should be set to `'sequence'` to mirror the "
            "paper's setup."
        )
    if loss_type == "vespo" and importance_sampling_level != "token":
        lines.append(
            "VESPO computes sequence-level importance weights internally. `importance_sampling_level` should be set "
            "to `'token'` (the default)."
        )
    if importance_sampling_level == "sequence" and loss_type in TOKEN_SUMMED_LOSSES:
        lines.append(
            f"When using `importance_sampling_level='sequence'`, the `'{loss_type}'` loss sums per-token "
            "contributions, which effectively weights each sequence by its completion length instead of optimizing "
            "the per-sequence objective. To reproduce the GSPO paper's setup, set `loss_type='grpo'` (see "
            "https://huggingface.co/docs/trl/main/en/paper_index#group-sequence-policy-optimization)."
        )
    return lines


class TRLCompatMixin:
    """TRL 1.16 `GRPOTrainer` helpers and attributes, for a `transformers.Trainer` subclass."""

    def _warn_as_trl(self, args) -> None:
        """Log TRL's construction warnings (with `logger.warning`, as TRL), on the main process only."""
        if self.accelerator.is_main_process:
            for line in construction_warnings(args.loss_type, args.importance_sampling_level):
                logger.warning(line)

    @property
    def _entropy_bonus_enabled(self) -> bool:
        """TRL's predicate: whether the entropy bonus term exists (`entropy_coef != 0` or `use_adaptive_entropy`;
        adaptive mode keeps it while the coefficient sits at 0). Constant for the run, hence read-only."""
        return self._entropy_control.enabled

    @property
    def reward_processing_classes(self) -> list:
        """One entry per reward function: the tokenizer of a reward model (the one passed, else the model's own),
        None for a plain function. The list the rewards use, so changing an entry changes scoring."""
        return self.rewards.processing_classes

    @reward_processing_classes.setter
    def reward_processing_classes(self, value: list) -> None:
        self.rewards.processing_classes = list(value)

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """Bool `(B, T)`: the active tokens whose entropy is >= the `threshold` quantile (in [0, 1]) of the active
        tokens' entropies of every process (padding excluded from the quantile and never kept), as TRL 1.16's; all
        False when no token is active. The trainer passes `1 - top_entropy_quantile`.

        Args:
            entropies: `(B, T)` per-token entropies.
            mask: `(B, T)` 1 for active tokens, 0 for padding.
            threshold: the quantile, e.g. 0.8 keeps the top 20%.
        """
        # Through the accelerator's pad and gather, as TRL: TRL's own tests call this on a mock holding only those.
        local = entropies.detach()[mask.bool()].float()
        pooled = AcceleratorCollective(self.accelerator).gather_padded(local, pad_value=_ENTROPY_PAD)
        return high_entropy_mask(entropies, mask, threshold, pooled=pooled)

    @staticmethod
    def get_off_policy_mask(
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        sampling_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
        off_policy_threshold: float,
    ) -> torch.Tensor:
        """TRL 1.16's off-policy sequence mask (DeepSeek-V3.2): `(B, 1)` in `mask`'s dtype, 1 to keep a sequence, 0
        to drop one whose advantage is negative and whose mean per-token KL `sampling - current` over active tokens
        exceeds `off_policy_threshold` (see `grpokit.algorithms.off_policy_mask`)."""
        keep = off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold)
        return keep.to(mask.dtype)

    def _rollout_settings(self, mode: str) -> RolloutSettings:
        """What shapes this round's rollout ("train" or "eval"), with the policy's positions."""
        positions = getattr(self.accelerator.unwrap_model(self.model).config, "max_position_embeddings", None)
        return RolloutSettings.from_config(self.args, self._num_generations(mode), max_positions=positions)

    def _generate(self, prompts: list) -> tuple:
        """TRL 1.16's generation hook: every rollout generates through it, whatever the backend (transformers, vLLM
        colocate or server), so a subclass overriding it changes generation everywhere.

        Receives this process's prompts (text or messages; each already repeated once per generation, as the dataset
        rows come). Returns TRL's 8-tuple, one entry per prompt in each list: `(prompt_ids, completion_ids,
        tool_mask, completions, logprobs, extra_fields, images, tool_images)`: token id lists (completions unpadded,
        ending at the first EOS when there is one), decoded completions (assistant messages for conversational
        prompts), the sampler's per-token log-probabilities or None, and a dict of extra fields handed to the reward
        functions as columns (a list: one value per prompt). Tools and images are not supported yet: `tool_mask` and
        `images` must be None and `tool_images` empty. Unlike TRL's, it logs nothing: the rollout logs lengths and
        token counts from what it returns, overridden or not.
        """
        mode = "train" if self.model.training else "eval"
        return generate_completions(
            prompts, tokenizer=self.processing_class, generator=self.generator, settings=self._rollout_settings(mode)
        )
