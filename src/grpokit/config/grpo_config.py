"""`GRPOConfig`: every knob of GRPO training, as a `transformers.TrainingArguments` subclass.

Field names and defaults match TRL 1.16's `GRPOConfig` (checked by tests/config/test_trl_parity.py). Fields are
grouped in pipeline order: model, data, generation, vLLM, rewards, loss, logging. The `help` metadata is the only
description of a field; `grpokit config schema` and `--help` are built from it.
"""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

from transformers import TrainingArguments

from .redaction import register_fields
from .rules import ConfigError, check_fields, check_geometry, derive_batch_geometry, type_problems, validate_instance

LossType = Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"]
ScaleRewards = Literal["group", "batch", "none"]


@dataclass
class GRPOConfig(TrainingArguments):
    # ---- TrainingArguments defaults that GRPO changes (same as TRL) ----
    learning_rate: float = field(
        default=1e-6,
        metadata={"help": "Initial learning rate of the AdamW optimizer. GRPO updates are small: 1e-6 by default."},
    )
    logging_steps: float = field(
        default=10,
        metadata={
            "help": "Log every this many optimizer steps; a value in [0, 1) is a fraction of the total number of steps."
        },
    )
    gradient_checkpointing: bool = field(
        default=True,
        metadata={"help": "Recompute activations in the backward pass to save memory, at roughly 20%% more compute."},
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "Train in bfloat16 mixed precision. Unset (null) means: bf16 unless fp16 is set, on hardware that "
            "supports it; on a machine without bf16 support it resolves to fp32, with a note."
        },
    )
    remove_unused_columns: bool | None = field(
        default=False,
        metadata={
            "help": "Drop dataset columns the model's forward does not take. Off, because reward functions receive "
            "the dataset's extra columns (e.g. `solution`)."
        },
    )
    lr_scheduler_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Extra keyword arguments for the learning-rate scheduler, e.g. {'num_cycles': 1}."},
    )

    # ---- grpokit: presets ----
    recipe: str | None = field(
        default=None,
        metadata={
            "help": "Name of a shipped recipe (see `grpokit recipes`) whose values sit under your YAML and flags. "
            "In Python, `GRPOConfig(recipe=...)` fills every field you left at its default from the recipe."
        },
    )

    # ---- grpokit: resume ----
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "Resume training from this checkpoint folder (output_dir/checkpoint-N), or `true` / `last` for "
            "the latest complete checkpoint in output_dir. The batch geometry, number of processes, "
            "num_generations, loss_type, beta (0 or not) and model must be those the checkpoint was trained with "
            "(see resume_allow_changes)."
        },
    )
    resume_allow_changes: bool = field(
        default=False,
        metadata={
            "help": "Resume even when settings the checkpoint records (grpokit_run.json: batch geometry, number of "
            "processes, num_generations, loss_type, beta 0 or not, model) have changed; each change is then a "
            "warning instead of an error. The run then does not continue the one it resumes exactly."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start a fresh run in an output_dir that holds a previous one (checkpoints, saved weights, "
            "metrics.jsonl): its checkpoint-*, interrupted-step-*, saved weights and records are deleted once every "
            "check has passed, just before training. Without it such a run is refused; resume it with "
            "resume_from_checkpoint instead. (Removed from transformers 5's TrainingArguments; grpokit gives it "
            "back this meaning.)"
        },
    )

    # ---- Model ----
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for `AutoModelForCausalLM.from_pretrained` when the model is given as a path "
            "or hub id, e.g. {'dtype': 'bfloat16', 'attn_implementation': 'sdpa'}."
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow custom modeling code from the model repository when loading models."},
    )
    disable_dropout: bool = field(
        default=False,
        metadata={"help": "Set every dropout probability of the policy (and reference) model to 0."},
    )
    cast_lm_head_to_fp32: bool = field(
        default=False,
        metadata={
            "help": "Compute the output projection (lm_head) in float32 even when the model runs in lower "
            "precision, for more accurate log-probabilities. Requires untied word embeddings."
        },
    )
    router_aux_loss_coef: float | None = field(
        default=None,
        metadata={
            "help": "Weight of the Mixture-of-Experts load-balancing loss added to the training loss. Unset uses the "
            "model config's value; 0 disables it. An error with a model that has no router."
        },
    )
    routing_replay: bool = field(
        default=False,
        metadata={
            "help": "Mixture-of-Experts models: record the experts each token was routed to while generating and "
            "route the learner's forward to the same ones (R3), the gate weights recomputed from the learner's "
            "router so that it still learns; logs routing/agreement (the share the learner would have routed "
            "alike). Transformers generation only (not vLLM, continuous batching, agents or async_grpo yet). Off "
            "by default: with the transformers backend the sampler is the learner "
            "itself and routes alike up to rounding. An error with a model that has no router. grpokit extension."
        },
    )

    # ---- Data ----
    shuffle_dataset: bool | None = field(
        default=True,
        metadata={"help": "Shuffle the training prompts each epoch."},
    )
    max_prompt_length: int | None = field(
        default=None,
        metadata={
            "help": "Keep at most this many prompt tokens, cutting from the left (the end of the prompt is kept). "
            "Unset keeps whole prompts. grpokit extension: TRL removed this field, recipes still set it."
        },
    )
    chat_template: str | None = field(
        default=None,
        metadata={
            "help": "Jinja chat template that replaces the tokenizer's own for conversational prompts (and is saved "
            "with the tokenizer). Unset keeps the tokenizer's. open-r1 field."
        },
    )
    pad_to_multiple_of: int | str | None = field(
        default="auto",
        metadata={
            "help": "Pad prompt and completion ids to a multiple of this many tokens. 'auto' pads to 128 on AWS "
            "Neuron (which compiles once per shape) and does not pad elsewhere; null never pads."
        },
    )

    # ---- Generation ----
    num_generations: int | None = field(
        default=8,
        metadata={
            "help": "Completions sampled per prompt (the group size G). At least 2: advantages are relative to the "
            "group. The generation batch must hold whole groups."
        },
    )
    num_generations_eval: int | None = field(
        default=None,
        metadata={"help": "Completions sampled per prompt during evaluation. Unset uses num_generations."},
    )
    max_completion_length: int | None = field(
        default=512,
        metadata={"help": "Maximum number of tokens generated per completion."},
    )
    generation_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Completions generated in one generation round, across all processes. Unset: "
            "per_device_train_batch_size x processes x steps_per_generation. Exclusive with steps_per_generation."
        },
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={
            "help": "Micro-batches (per process) trained on each generation round before generating again. Unset: "
            "gradient_accumulation_steps. Exclusive with generation_batch_size."
        },
    )
    temperature: float = field(
        default=1.0,
        metadata={"help": "Sampling temperature. Higher gives more diverse completions, which helps exploration."},
    )
    top_p: float = field(
        default=1.0,
        metadata={"help": "Nucleus sampling: sample from the smallest token set whose probability reaches top_p."},
    )
    top_k: int = field(
        default=0,
        metadata={"help": "Sample only among the top_k most likely tokens; 0 disables top-k filtering."},
    )
    min_p: float | None = field(
        default=None,
        metadata={
            "help": "Drop tokens whose probability is below min_p times the most likely token's; unset disables it."
        },
    )
    repetition_penalty: float = field(
        default=1.0,
        metadata={"help": "Penalty on tokens already present in the prompt or completion; 1.0 means no penalty."},
    )
    logprobs_over_kept_tokens: bool = field(
        default=True,
        metadata={
            "help": "When sampling truncates (top_k > 0, top_p < 1 or min_p, generation_kwargs included), score the "
            "policy over the tokens those filters keep at each position, renormalised: the distribution the "
            "completions were drawn from, so the policy ratio, vLLM's importance weights and the entropies compare "
            "like with like (equal weights give a sampler/learner ratio of 1). The loss then optimises that "
            "truncated policy. The reference model stays scored over the whole vocabulary. false: the whole "
            "vocabulary, as TRL 1.16 (with equal weights its ratio is the kept mass, below 1). No effect without "
            "truncation. grpokit extension."
        },
    )
    generation_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Extra keyword arguments for generation (e.g. {'min_new_tokens': 32}); they override the "
            "sampling fields above."
        },
    )
    chat_template_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Extra keyword arguments for `apply_chat_template` on conversational prompts, e.g. "
            "{'enable_thinking': False}."
        },
    )
    cache_implementation: str | None = field(
        default=None,
        metadata={"help": "KV-cache implementation passed to `generate` (e.g. 'static'); unset uses the default."},
    )
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata={
            "help": "Under DeepSpeed ZeRO-3, gather the full policy weights on every process for generation (fast, "
            "needs the whole model's memory); false generates through DeepSpeed's hooks, gathering layer by layer at "
            "every token (slow, lean). Without ZeRO-3 it has no effect."
        },
    )
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata={
            "help": "Maximum tool-calling rounds per completion when training an agent with tools: null runs tools "
            "until a turn calls none; 0 parses calls but never runs them; N runs at most N rounds (the calls of the "
            "last generated turn stay unrun)."
        },
    )
    tool_timeout: float | None = field(
        default=120.0,
        metadata={
            "help": "Seconds one tool call may take; past it the call ends with an error result the model sees, and "
            "counts as failed (an async tool is cancelled, a sync one left running in its abandoned thread). null "
            "waits forever. grpokit extension."
        },
    )
    tool_round_timeout: float | None = field(
        default=600.0,
        metadata={
            "help": "Seconds all tool calls of one tool round (every rollout's, on one process) may take together; "
            "calls still running then end with an error result, and calls not started yet are not run. The "
            "trainer never waits longer for a round. null: no cap. grpokit extension."
        },
    )
    max_tool_result_chars: int = field(
        default=65536,
        metadata={
            "help": "Most characters of one tool result the model sees (and the completion logs keep): a longer one "
            "is cut, ending with a line saying how much was cut, before it is rendered or tokenized. grpokit "
            "extension."
        },
    )
    # ---- grpokit: asynchronous GRPO (TRL 1.16's trl.experimental.async_grpo fields) ----
    async_grpo: bool = field(
        default=False,
        metadata={
            "help": "Overlap generation with training: a rollout worker thread generates, scores and queues samples "
            "while the trainer trains (AsyncGRPOTrainer; `grpokit train` picks it). Each sample is trained within "
            "max_staleness weight updates of the policy that generated it, its tokens weighted by the "
            "importance-sampling correction (vllm_importance_sampling_*). One generation batch per optimizer step. "
            "grpokit extension (TRL: a separate AsyncGRPOTrainer)."
        },
    )
    max_staleness: int = field(
        default=4,
        metadata={
            "help": "With async_grpo: most weight updates a sample may lag behind the policy it is trained with; a "
            "staler one is dropped and its prompt generated again (the built-in worker never runs further ahead). "
            "0: every sample is trained by the policy that generated it, as without async_grpo."
        },
    )
    max_inflight_tasks: int = field(
        default=-1,
        metadata={
            "help": "With async_grpo: most completions the rollout worker asks the generator for at once (whole "
            "groups of num_generations). -1: a generation batch per request."
        },
    )
    queue_maxsize: int = field(
        default=1024,
        metadata={
            "help": "With async_grpo: most scored samples waiting for the trainer; a full queue blocks the worker, "
            "never the trainer."
        },
    )
    weight_sync_steps: int = field(
        default=1,
        metadata={"help": "With async_grpo: optimizer steps between two pushes of the policy's weights."},
    )
    heartbeat_stale_after_s: float = field(
        default=300.0,
        metadata={
            "help": "With async_grpo: seconds without a sign of life from the rollout worker (a generation or "
            "reward that hangs) after which training stops with an error naming it."
        },
    )
    request_timeout: int = field(
        default=600,
        metadata={
            "help": "With async_grpo and vLLM: seconds one generation request to the server may take before it "
            "fails the rollout worker."
        },
    )
    weight_sync_timeout: int = field(
        default=1800,
        metadata={
            "help": "With async_grpo: seconds one weight sync (the generator's pause and the push, to a vLLM server "
            "or through any weight transfer) may take; past it the run stops with one line naming the target and the "
            "policy version, the checkpoints already saved kept."
        },
    )
    use_transformers_continuous_batching: bool = field(
        default=False,
        metadata={
            "help": "Generate with transformers' continuous batching (`generate_batch`: a paged KV cache, finished "
            "rows replaced as they end, each group's prompt prefilled once) instead of `generate`. Text models only; "
            "not with use_vllm, repetition_penalty != 1, cache_implementation, or generation_kwargs it does not "
            "apply (min_new_tokens, no_repeat_ngram_size, ...)."
        },
    )
    transformers_continuous_batching_config: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for transformers' `ContinuousBatchingConfig`. Without num_blocks or "
            "max_memory_percent, grpokit sizes the KV cache to one round's rows (prompt + max_completion_length "
            "each), not to a share of free memory; return_logprobs: true reports the sampler's log-probabilities."
        },
    )
    use_transformers_paged: bool = field(
        default=False,
        metadata={"help": "Deprecated name of use_transformers_continuous_batching; migrated with a warning."},
    )

    # ---- vLLM ----
    use_vllm: bool = field(
        default=False,
        metadata={"help": "Generate completions with vLLM instead of transformers `generate`."},
    )
    vllm_mode: Literal["server", "colocate"] = field(
        default="colocate",
        metadata={
            "help": "'server': a separate `vllm serve` process generates; 'colocate': vLLM runs inside each training "
            "process and shares its GPU."
        },
    )
    vllm_model_impl: Literal["vllm", "transformers"] = field(
        default="vllm",
        metadata={"help": "Model implementation vLLM uses: its own ('vllm') or the transformers one."},
    )
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={"help": "Colocate mode: release vLLM's weights and KV cache from GPU memory during training steps."},
    )
    vllm_structured_outputs_regex: str | None = field(
        default=None,
        metadata={"help": "Constrain vLLM generations to match this regular expression; unset disables it."},
    )
    vllm_server_base_url: str | None = field(
        default=None,
        metadata={"help": "Server mode: base URL of the vLLM server; when set, host and port are ignored."},
    )
    vllm_server_host: str = field(
        default="0.0.0.0",
        metadata={"help": "Server mode: host of the vLLM server."},
    )
    vllm_server_port: int = field(
        default=8000,
        metadata={"help": "Server mode: port of the vLLM server (1-65535)."},
    )
    vllm_server_timeout: float = field(
        default=240.0,
        metadata={"help": "Server mode: seconds to wait for the vLLM server to come up before failing."},
    )
    vllm_group_port: int = field(
        default=51216,
        metadata={"help": "Server mode: port of the weight-synchronisation process group (1-65535)."},
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3,
        metadata={"help": "Colocate mode: fraction of GPU memory vLLM may take, in (0, 1]."},
    )
    vllm_max_model_length: int | None = field(
        default=None,
        metadata={"help": "Colocate mode: vLLM's context length; unset uses the model's own maximum."},
    )
    vllm_tensor_parallel_size: int = field(
        default=1,
        metadata={"help": "Colocate mode: GPUs a vLLM engine's tensors are split over."},
    )
    vllm_importance_sampling_correction: bool = field(
        default=True,
        metadata={
            "help": "Correct for the mismatch between vLLM's sampling distribution and the training model's with "
            "importance weights."
        },
    )
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = (
        field(
            default="sequence_mask",
            metadata={
                "help": "How the vLLM importance weights are bounded: truncate (clamp) or mask (zero) outside "
                "[clip_min, clip_max], per token or per sequence."
            },
        )
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None,
        metadata={"help": "Lower bound of the vLLM importance weights; unset means no lower bound."},
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0,
        metadata={"help": "Upper bound of the vLLM importance weights; must exceed clip_min."},
    )
    vllm_importance_sampling_cap: float | None = field(
        default=None,
        metadata={"help": "Deprecated name of vllm_importance_sampling_clip_max; migrated with a warning."},
    )
    sampler_sequence_geometric: bool = field(
        default=False,
        metadata={
            "help": "Sequence modes of the importance-sampling correction: weigh a sequence by the geometric mean of "
            "its token ratios, exp(mean of learner - sampler log-probability), instead of their product (TRL's), so "
            "that bounds such as [0.999, 1.001] mean the same for every completion length. grpokit extension."
        },
    )
    sampler_kl_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Reject (weight 0) each sequence whose estimate of KL(sampler || learner) exceeds this: per token "
            "by sampler_kl_estimator, over the sequence by sampler_kl_reduction; on top of the correction's mode. "
            "Needs the importance-sampling correction. Unset: off. grpokit extension."
        },
    )
    sampler_kl_estimator: Literal["k1", "k3"] = field(
        default="k3",
        metadata={
            "help": "Per-token KL estimate for sampler_kl_threshold, with r = learner / sampler probability of the "
            "token: k1 = -log r, k3 = r - 1 - log r (never negative). grpokit extension."
        },
    )
    sampler_kl_reduction: Literal["mean", "max"] = field(
        default="mean",
        metadata={"help": "How sampler_kl_threshold reduces a sequence's per-token estimates. grpokit extension."},
    )
    sampler_token_veto: float | None = field(
        default=None,
        metadata={
            "help": "Reject (weight 0) each sequence with a token whose ratio learner / sampler is below this (e.g. "
            "1e-4: a token the learner finds far less likely than the sampler did); in (0, 1). Needs the "
            "importance-sampling correction. Unset: off. grpokit extension."
        },
    )

    # ---- Rewards and advantages ----
    reward_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "One weight per reward, in order: the reward model first (when set), then each reward function. "
            "Unset weighs all by 1.0."
        },
    )
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = field(
        default="sum_then_normalize",
        metadata={
            "help": "With several rewards: 'sum_then_normalize' sums the weighted rewards then normalises per group; "
            "'normalize_then_sum' normalises each reward per group, sums with weights, then normalises the batch."
        },
    )
    scale_rewards: ScaleRewards = field(
        default="group",
        metadata={
            "help": "Divide centred rewards by the std of the group ('group'), of the whole batch ('batch'), or not "
            "at all ('none', as Dr. GRPO recommends). Legacy true/false mean 'group'/'none'."
        },
    )
    reward_timeout: float | None = field(
        default=600.0,
        metadata={
            "help": "Seconds each reward call (function, async function or reward model) may take on a batch before "
            "the run stops with an error naming it (weights saved). An async function is cancelled; a sync one is "
            "left running in its abandoned thread. null waits forever. grpokit extension."
        },
    )
    max_unscorable_rounds: int | None = field(
        default=None,
        metadata={
            "help": "Stop after this many generation rounds in a row where every reward is None/NaN (nothing to "
            "learn from: zero advantages). null (the default, as TRL) warns and trains on. grpokit extension."
        },
    )

    # ---- grpokit: dynamic sampling (DAPO) ----
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO's dynamic sampling: after each training generation round is scored, drop the groups whose "
            "rewards do not differ (reward std <= dynamic_sampling_min_reward_std: zero advantage, no gradient) and "
            "generate more prompts from the train data until the round holds only groups that differ. Logged as "
            "dynamic_sampling/* (rounds, groups kept, dropped and filled, completions generated per kept one). "
            "Evaluation is never filtered. grpokit extension."
        },
    )
    dynamic_sampling_min_reward_std: float = field(
        default=0.0,
        metadata={
            "help": "Dynamic sampling: a group whose reward std (of the weighted reward sum) is at most this is "
            "dropped; 0 drops only groups with all-equal rewards (std <= 1e-6, float rounding). Groups with fewer than two scorable completions "
            "are always dropped. grpokit extension."
        },
    )
    dynamic_sampling_max_rounds: int = field(
        default=10,
        metadata={
            "help": "Dynamic sampling: at most this many extra generation rounds per training round; when they do "
            "not find enough groups that differ, a one-line warning, and the round is filled with dropped groups "
            "trained at advantage 0. grpokit extension."
        },
    )

    # ---- Loss ----
    loss_type: LossType = field(
        default="dapo",
        metadata={
            "help": "Objective and normalisation: 'grpo' (mean per sequence), 'dr_grpo' (constant max length), "
            "'dapo' (active tokens in the global batch), 'bnpo' (active tokens in the micro-batch), 'cispo' "
            "(clipped IS weights), 'sapo' (soft gate), 'luspo', 'vespo'."
        },
    )
    beta: float = field(
        default=0.0,
        metadata={
            "help": "Weight of the KL penalty to the reference model. 0 disables it and the reference model is not "
            "loaded."
        },
    )
    num_iterations: int = field(
        default=1,
        metadata={"help": "Optimisation passes over each generation round (mu in the GRPO paper)."},
    )
    epsilon: float = field(
        default=0.2,
        metadata={"help": "Lower clipping bound of the importance ratio: it is clipped below at 1 - epsilon."},
    )
    epsilon_high: float | None = field(
        default=None,
        metadata={
            "help": "Upper clipping bound: the ratio is clipped above at 1 + epsilon_high. Unset uses epsilon. DAPO "
            "uses 0.28."
        },
    )
    delta: float | None = field(
        default=None,
        metadata={
            "help": "Two-sided clipping (INTELLECT-2): also clamp the unclipped ratio at delta. Must exceed 1; unset "
            "disables it."
        },
    )
    importance_sampling_level: Literal["token", "sequence"] = field(
        default="token",
        metadata={
            "help": "'token': one importance ratio per token; 'sequence': one per completion, the geometric mean "
            "over its tokens (GSPO)."
        },
    )
    sapo_temperature_pos: float = field(
        default=1.0,
        metadata={"help": "SAPO: temperature of the soft gate for positive advantages (> 0)."},
    )
    sapo_temperature_neg: float = field(
        default=1.05,
        metadata={"help": "SAPO: temperature of the soft gate for negative advantages (> 0)."},
    )
    vespo_k_pos: float = field(
        default=2.0,
        metadata={"help": "VESPO: shape parameter k of the weighting for positive advantages."},
    )
    vespo_lambda_pos: float = field(
        default=3.0,
        metadata={"help": "VESPO: rate parameter lambda of the weighting for positive advantages."},
    )
    vespo_k_neg: float = field(
        default=3.0,
        metadata={"help": "VESPO: shape parameter k of the weighting for negative advantages."},
    )
    vespo_lambda_neg: float = field(
        default=2.0,
        metadata={"help": "VESPO: rate parameter lambda of the weighting for negative advantages."},
    )
    mask_truncated_completions: bool = field(
        default=False,
        metadata={"help": "Exclude completions that hit max_completion_length without an EOS from the loss (DAPO)."},
    )
    top_entropy_quantile: float = field(
        default=1.0,
        metadata={
            "help": "Train only on the tokens whose entropy is in the top fraction rho of the batch (0 < rho <= 1); "
            "1.0 keeps all tokens, the 80/20 paper uses 0.2."
        },
    )
    off_policy_mask_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Mask sequences with negative advantage whose KL to the sampling policy exceeds this value "
            "(DeepSeek-V3.2); unset disables it."
        },
    )
    use_bias_correction_kl: bool = field(
        default=True,
        metadata={
            "help": "Multiply the KL term by the importance ratio so its gradient is the unbiased reverse-KL "
            "gradient (DeepSeek-V3.2). Only matters when beta > 0."
        },
    )
    entropy_coef: float = field(
        default=0.0,
        metadata={"help": "Weight of an entropy bonus subtracted from the loss; 0 disables it."},
    )
    use_adaptive_entropy: bool = field(
        default=False,
        metadata={
            "help": "Adapt entropy_coef each step (Skywork-OR1): raise it by entropy_coef_delta while entropy is "
            "below entropy_target, lower it otherwise, within [entropy_coef_min, entropy_coef_max]."
        },
    )
    entropy_coef_min: float = field(
        default=0.0,
        metadata={"help": "Adaptive entropy: lower bound of the coefficient."},
    )
    entropy_coef_max: float = field(
        default=1.0,
        metadata={"help": "Adaptive entropy: upper bound of the coefficient."},
    )
    entropy_coef_delta: float = field(
        default=0.005,
        metadata={"help": "Adaptive entropy: step by which the coefficient moves each update."},
    )
    entropy_target: float = field(
        default=0.2,
        metadata={"help": "Adaptive entropy: target mean token entropy in nats."},
    )
    sync_ref_model: bool = field(
        default=False,
        metadata={"help": "Periodically move the reference model towards the policy (TR-DPO style)."},
    )
    ref_model_mixup_alpha: float = field(
        default=0.6,
        metadata={"help": "Reference sync: ref = alpha * policy + (1 - alpha) * ref, with 0 <= alpha <= 1."},
    )
    ref_model_sync_steps: int = field(
        default=512,
        metadata={"help": "Reference sync: optimizer steps between two syncs."},
    )

    # ---- grpokit: NaN guard ----
    max_nonfinite_steps: int | None = field(
        default=3,
        metadata={
            "help": "NaN guard: an optimizer step whose loss or gradient norm is NaN or inf is skipped, with a "
            "warning: its gradients are cleared, so neither the weights nor the optimizer state change (the "
            "learning-rate schedule still advances with the step count). The metric `nonfinite_steps_skipped` is the "
            "number of steps skipped since the previous log row. After this many such steps in a row, training "
            "stops with the last finite weights (`grpokit train` saves them to output_dir/interrupted-step-N and "
            "exits 1); unset (null) never stops. Under fp16 the gradient scaler skips overflowing steps itself, and "
            "those are not counted; under DeepSpeed (which steps inside backward) the guard is off."
        },
    )

    # ---- Logging ----
    log_completions: bool = field(
        default=False,
        metadata={"help": "Log a sample of prompts, completions and rewards at every logging step."},
    )
    num_completions_to_print: int | None = field(
        default=None,
        metadata={"help": "How many logged completions to print in the console; unset prints all of them."},
    )
    log_unique_prompts: bool = field(
        default=False,
        metadata={"help": "Log each prompt once rather than once per completion."},
    )
    log_multimodal: bool = field(
        default=True,
        metadata={
            "help": "Include images in logged completions for multimodal prompts: with log_completions, each image "
            "is written once to <output_dir>/completions/images/ and completions.jsonl records its path."
        },
    )
    log_completions_hub_repo: str | None = field(
        default=None,
        metadata={"help": "Hub dataset repository to upload logged completions to; needs log_completions."},
    )
    write_run_records: bool = field(
        default=True,
        metadata={
            "help": "Leave the run's records in output_dir, from Python as from `grpokit train`: metrics.jsonl (a row "
            "per log), resolved_config.yaml (each value with its source, `python` for a GRPOConfig argument), "
            "reward_curve.png, and completions.jsonl with log_completions. grpokit extension."
        },
    )
    progress_lines: bool | None = field(
        default=None,
        metadata={
            "help": "Print one line per log (step, reward ± std, loss, ETA) instead of transformers' log dicts and "
            "progress bar. null: on under `grpokit train`, off in Python (TRL's console). grpokit extension."
        },
    )
    wandb_entity: str | None = field(
        default=None,
        metadata={"help": "Weights & Biases entity: sets WANDB_ENTITY when training starts. open-r1 field."},
    )
    wandb_project: str | None = field(
        default=None,
        metadata={"help": "Weights & Biases project: sets WANDB_PROJECT when training starts. open-r1 field."},
    )
    wandb_run_group: str | None = field(
        default=None,
        metadata={"help": "Weights & Biases run group: sets WANDB_RUN_GROUP when training starts. open-r1 field."},
    )

    # ---- open-r1: its cluster and Hub tooling, accepted and refused when set (see support.py) ----
    callbacks: list[str] = field(
        default_factory=list,
        metadata={
            "help": "open-r1's callbacks by name (e.g. push_to_hub_revision). open-r1 field; refused when non-empty: "
            "pass TrainerCallback objects to GRPOTrainer instead."
        },
    )
    benchmarks: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Benchmarks open-r1 runs after training (Slurm jobs). open-r1 field; refused when non-empty."
        },
    )
    hub_model_revision: str | None = field(
        default="main",
        metadata={"help": "Hub branch open-r1 pushes the model to. open-r1 field; refused when not 'main'."},
    )
    overwrite_hub_revision: bool = field(
        default=False,
        metadata={"help": "Let open-r1 overwrite an existing Hub branch. open-r1 field; refused when true."},
    )
    push_to_hub_revision: bool = field(
        default=False,
        metadata={"help": "Push each checkpoint to a Hub branch (open-r1). open-r1 field; refused when true."},
    )

    def __new__(cls, *args, **kwargs):
        # Remember which fields the caller passed, so that a recipe fills only the others (`GRPOConfig(recipe="grpo",
        # beta=0.0)` keeps beta=0.0 even though 0.0 is also the default). Done here, not in __init__, because the
        # dataclass writes __init__ (a subclass's too) and __new__ sees the same arguments.
        config = super().__new__(cls)
        names = [f.name for f in fields(cls) if f.init]
        unknown = [key for key in kwargs if key not in names]
        if unknown:  # a TypeError as Python's own, with the nearest field name, and the other values' problems
            from .suggest import UnknownArgumentError

            known = {key: value for key, value in kwargs.items() if key not in unknown}
            raise UnknownArgumentError(f"{cls.__name__}.__init__", unknown, names, _problems_of(cls, known))
        object.__setattr__(config, "_explicit_fields", frozenset(names[: len(args)]) | frozenset(kwargs))
        return config

    @classmethod
    def for_processes(cls, processes: int, *, noted: bool = False, **kwargs) -> GRPOConfig:
        """A config whose batch geometry is derived for `processes` processes instead of its own world size: the
        parser builds the config of the launch it checks (`--num_processes 8` checked in one process). `noted=True`:
        the caller has told the user the geometry's problems at this count already, as notes (`grpokit config` given
        no process count), so the geometry is derived without raising them."""
        config = cls.__new__(cls, **kwargs)
        object.__setattr__(config, "_planned_geometry", (processes, noted))
        config.__init__(**kwargs)
        return config

    def __post_init__(self):
        if self.recipe is not None:
            _apply_recipe_defaults(self)
        if self.debug is None:  # what HfArgumentParser gives for the unset list field; transformers reads it as ""
            self.debug = ""
        try:
            validate_instance(self)
        except ConfigError as exc:  # the batch geometry's problems too, as the YAML path reports them together
            raise ConfigError([*exc.problems, *_geometry_problems(vars(self), self)]) from None
        # The configuration is judged, not the machine: TrainingArguments would reject bf16/tf32 on a CPU-only
        # machine, so they are held back here and checked (and applied) when training starts; see `precision.py`.
        if getattr(self, "activation_checkpointing", False) is None:  # a field from transformers 5.20 on
            self.activation_checkpointing = self.gradient_checkpointing  # its new name; avoids the rename warning
        held_back = {"bf16": self.bf16, "bf16_full_eval": self.bf16_full_eval, "tf32": self.tf32}
        self.bf16, self.bf16_full_eval, self.tf32 = False, False, None
        if self.ddp_backend is None:
            from grpokit.launch import default_ddp_backend

            self.ddp_backend = default_ddp_backend()
        try:
            super().__post_init__()
        finally:
            for name, value in held_back.items():
                setattr(self, name, value)
        if self.bf16:
            self.mixed_precision = "bf16"
        if self.pad_to_multiple_of == "auto":
            self.pad_to_multiple_of = 128 if self.device.type == "neuron" else None
        processes, noted = getattr(self, "_planned_geometry", None) or (self.world_size, False)
        derived = derive_batch_geometry(vars(self), num_processes=processes, noted=noted)
        for name, value in derived.items():
            setattr(self, name, value)
        register_fields(self)  # hub_token: redacted from logs and output files from now on


def _geometry_problems(values: dict, config) -> list:
    """The batch geometry's problems at the planned or launched process count, for an error that reports others:
    none when the values are too broken to judge it."""
    processes = (getattr(config, "_planned_geometry", None) or (int(os.environ.get("WORLD_SIZE", "1") or 1),))[0]
    try:
        return check_geometry(values, processes)[1]
    except Exception:  # noqa: BLE001 - a value of the wrong type is reported already
        return []


def _problems_of(cls, given: dict) -> list[str]:
    """The problem lines of `given` keyword arguments over the defaults (types, rules, batch geometry), for an error
    about unknown keywords to report with them. A recipe fills values later: with one, only the types are judged."""
    defaults = {f.name: f.default for f in fields(cls) if f.init and f.default is not MISSING}
    try:
        coerced, problems = type_problems({**defaults, **given}, cls)
        if "recipe" not in given:
            problems += check_fields(coerced, defaults) + _geometry_problems(coerced, None)
    except Exception:  # noqa: BLE001 - the unknown keywords are the error; these lines only add to it
        return []
    return [p.line() for p in problems]


# open-r1's Weights & Biases fields -> the variables wandb reads when the run starts.
WANDB_ENVIRONMENT = {
    "wandb_entity": "WANDB_ENTITY",
    "wandb_project": "WANDB_PROJECT",
    "wandb_run_group": "WANDB_RUN_GROUP",
}


def set_wandb_environment(config) -> dict[str, str]:
    """Set WANDB_ENTITY / WANDB_PROJECT / WANDB_RUN_GROUP from the fields that are set (as open-r1 does when training
    starts); returns the variables set."""
    chosen = {env: getattr(config, name, None) for name, env in WANDB_ENVIRONMENT.items()}
    chosen = {env: str(value) for env, value in chosen.items() if value is not None}
    os.environ.update(chosen)
    return chosen


def _apply_recipe_defaults(config: GRPOConfig) -> None:
    from .recipes import load_recipe

    values = load_recipe(config.recipe)
    own = {f.name for f in fields(config)}
    explicit = getattr(config, "_explicit_fields", frozenset())
    for name, value in values.items():
        if name in own and name not in explicit:
            setattr(config, name, value)
