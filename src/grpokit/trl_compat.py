"""The surface of TRL 1.16's `GRPOTrainer` that users' subclasses, callbacks and tests touch by name, as a mixin of
`grpokit.trainer.GRPOTrainer`: the entropy and off-policy mask helpers, the `_generate` hook, the entropy-bonus
predicate, `reward_processing_classes`, the warnings TRL gives at construction, the agent arguments (`tools`,
`environment_factory`, `rollout_func`; see `grpokit.agents`), and TRL's `SyncRefModelCallback` (`sync_ref_model`).

Each helper is a thin wrapper over grpokit's own functions (`grpokit.algorithms`, `grpokit.rollout`), with TRL's
signature and results, and the trainer calls it where TRL does, so a subclass overriding one changes training as it
would in TRL. The trainer keeps the state these read: `args`, `accelerator`, `_entropy_control`, `rewards`,
`generator`, `processing_class`, `_dist` (the cross-process collective).
"""

from __future__ import annotations

import json
import logging

import torch
from transformers import TrainerCallback

from . import sharding
from .agents import Agent, EnvironmentProblem, TemplateError, ToolError
from .algorithms import off_policy_mask
from .algorithms.entropy_control import high_entropy_mask
from .config.redaction import redact
from .dist import AcceleratorCollective
from .generation import decode_completions, is_conversational
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
        """What shapes this round's rollout ("train" or "eval"), with the policy's positions. The environments'
        own rewards (`get_reward`) come after the run's reward functions, with weight 1 each, as in TRL."""
        positions = getattr(self.accelerator.unwrap_model(self.model).config, "max_position_embeddings", None)
        settings = RolloutSettings.from_config(self.args, self._num_generations(mode), max_positions=positions)
        environments = None if self.agent is None else self.agent.environments
        owned = 0 if environments is None else len(environments.reward_classes)
        if owned and settings.reward_weights is not None:
            settings.reward_weights = [*settings.reward_weights, *[1.0] * owned]
        return settings

    # ---- agents: TRL 1.16's tools, environment_factory and rollout_func

    def _take_agent_arguments(self, args, trl_only: dict, train_dataset=None) -> list:
        """Take `tools`, `environment_factory` and `rollout_func` out of the constructor's extra arguments and set
        up `self.agent` and `self.rollout_func`, before any model loads; returns the environments' reward
        functions. Every problem is one line (ValueError)."""
        tools = trl_only.pop("tools", None)
        factory = trl_only.pop("environment_factory", None)
        self.rollout_func = trl_only.pop("rollout_func", None)
        self.agent = None
        if self.rollout_func is not None and not callable(self.rollout_func):
            raise ValueError(f"rollout_func: {self.rollout_func!r} is not callable")
        if not (tools or factory):
            if args.max_tool_calling_iterations is not None:
                raise ValueError(
                    f"max_tool_calling_iterations={args.max_tool_calling_iterations}: it caps the tool loop, and "
                    "there are no tools; pass tools or environment_factory, or leave it unset"
                )
            return []
        if tools is not None and (isinstance(tools, (str, bytes)) or not all(callable(t) for t in tools)):
            raise ValueError(f"tools: a list of functions is expected, got {tools!r}")
        try:
            self.agent = Agent(
                tools,
                factory,
                max_iterations=args.max_tool_calling_iterations,
                timeout=args.tool_timeout,
                round_timeout=args.tool_round_timeout,
                max_result_chars=args.max_tool_result_chars,
            )
            self._check_routing(train_dataset)
        except (ToolError, EnvironmentProblem) as exc:
            raise ValueError(str(exc)) from None
        return self.agent.reward_functions()

    def _training_rows(self, args, train_dataset, eval_dataset=None):
        """`train_dataset`, required as in TRL unless one environment owns the data (its `reset` writes the prompt):
        then `max_steps` sets the length and one generation round of empty prompts, cycled, drives the loop."""
        _dispatch_batches_off(args, train_dataset, eval_dataset)
        if train_dataset is not None:
            return _streamed(args, train_dataset)
        environments = None if self.agent is None else self.agent.environments
        if environments is None:
            raise ValueError("`train_dataset` is required unless an `environment_factory` is provided.")
        if environments.routed:
            raise ValueError(
                "A `dict` `environment_factory` (multiple environments) requires a `train_dataset` with an "
                "`environment` column to route each example to its environment; provide one, or pass a single factory"
            )
        if args.max_steps <= 0:
            raise ValueError(
                "without a `train_dataset` (the environment owns the data and writes the prompt in `reset()`), "
                "`max_steps` must be set to a positive value to define the training length"
            )
        from datasets import Dataset

        rows = args.generation_batch_size // args.num_generations
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * rows})

    def _check_routing(self, train_dataset) -> None:
        """With environments by name, every row of the training set names one of them (checked before the model
        loads, not at the batch that meets the bad row)."""
        environments = self.agent.environments
        if environments is None or not environments.routed or train_dataset is None:
            return
        columns = getattr(train_dataset, "column_names", None)
        if columns is None or not hasattr(train_dataset, "__len__"):  # not a map-style Dataset: checked batch by batch
            return
        if "environment" not in columns:
            raise EnvironmentProblem(
                "environment_factory is a mapping of environments, and train_dataset has no 'environment' column to "
                "route each row to one; add the column or pass a single factory"
            )
        environments.names_of([{"environment": name} for name in set(train_dataset["environment"])])

    def _check_agent_tokenizer(self) -> None:
        """The tokenizer must render tools and tool turns, and its turns must be parseable for calls."""
        if self.agent is not None:
            from .vision import is_processor

            if is_processor(self.processing_class):
                raise ValueError(
                    "tools / environment_factory with a vision-language model's processor are not supported yet; "
                    "train the agent with a text model, or the vision model without tools"
                )
            try:
                self.agent.check_tokenizer(self.processing_class, self.args.chat_template_kwargs, self._model_path)
            except TemplateError as exc:
                raise ValueError(str(exc)) from None

    @property
    def environments(self) -> list | None:
        """This batch's environment instances, one per rollout (TRL's attribute; None without environments)."""
        return None if self.agent is None else self.agent.instances

    @property
    def tools(self) -> list:
        """TRL's attribute: the standalone tools, then the environments' methods (those of each environment's first
        instance; every rollout calls its own instance's)."""
        agent = getattr(self, "agent", None)
        if agent is None:
            return self.__dict__.get("_tools_without_agent") or []
        return agent.all_tools()

    @tools.setter
    def tools(self, value) -> None:
        """Replace the tools (functions), or the JSON schemas rendered into the prompts (dicts), as TRL scripts do
        after building the trainer. On a trainer built without tools there is no tool loop to give them to."""
        agent = getattr(self, "agent", None)
        if agent is None:
            if value and hasattr(self, "args"):
                raise ValueError("trainer.tools: this trainer was built without tools; pass tools=[...] to it")
            self.__dict__["_tools_without_agent"] = value  # a stand-in trainer (TRL's tests build them by hand)
            return
        try:
            agent.set_tools(value)
        except ToolError as exc:
            raise ValueError(str(exc)) from None

    def _start_agent_batch(self, rows: list[dict], dist=None) -> list[dict]:
        """Rows with their prompts as the environments' `reset` extended them (the dataset's rows untouched);
        `dist`: the processes that start this batch together (default: the trainer's)."""
        if self.agent is None:
            return rows
        prompts = self.agent.start(rows)
        if self.agent.environments is not None:
            self._report_failed_resets(rows, dist)
        return [{**row, "prompt": prompt} for row, prompt in zip(rows, prompts, strict=True)]

    def _report_failed_resets(self, rows: list[dict], dist=None) -> None:
        """Warn of this batch's environments whose `reset` raised (their rollouts train nothing); stop in one line
        when every environment of the round, over all processes, did."""
        dist = dist or self._dist
        failed = self.agent.failed_resets
        if failed:
            index, name, error = failed[0]
            logger.warning(
                redact(
                    f"{len(failed)} of {len(rows)} environments failed to reset on process "
                    f"{dist.process_index} (their rollouts train nothing); the first: {name} on batch row "
                    f"{index} ({_row_excerpt(rows[index])}): {error}"
                )
            )
        counts = dist.gather_object([(len(failed), len(rows))])
        if failed and sum(c[0] for c in counts) == sum(c[1] for c in counts):
            index, name, error = failed[0]
            raise ValueError(
                redact(
                    f"every environment of this generation round failed to reset, so nothing can be generated; the "
                    f"first: {name}.reset on batch row {index} ({_row_excerpt(rows[index])}) raised {error}"
                )
            )

    def _agent_records(self, dist=None, record_calls: bool = True) -> dict[str, float]:
        """TRL's tool metrics for the latest batch, over all processes of `dist` (default: the trainer's; calls per
        completion, failed calls per call); its calls go to the completion records (name, arguments, result, failed,
        seconds per call) unless `record_calls` is False."""
        loop = None if self.agent is None else self.agent.last
        if loop is None:
            return {}
        if record_calls:
            self._completion_log.add_tool_calls([[dict(vars(call)) for call in calls] for calls in loop.calls])
        dist = dist or self._dist
        failed = [(i, call) for i, calls in enumerate(loop.calls) for call in calls if call.failed]
        if failed:  # named: which tool, with what, on which completion (the records have them all)
            i, call = failed[0]
            arguments = json.dumps(call.arguments, default=str)[:200]
            logger.warning(
                redact(
                    f"{len(failed)} of {loop.num_calls} tool calls failed in this batch on process "
                    f"{dist.process_index}; the first: {call.name}({arguments}) of completion {i}: "
                    f"{str(call.result.get('error', call.result))[:300]}"
                )
            )
        resets = len(self.agent.failed_resets)
        counts = dist.gather_object([(len(loop.completion_ids), loop.num_calls, loop.num_failures, resets)])
        rollouts, calls, failures, resets = (sum(c[k] for c in counts) for k in range(4))
        return {
            "tools/call_frequency": calls / max(rollouts, 1),
            "tools/failure_frequency": failures / calls if calls else 0.0,
            "tools/reset_failures": float(resets),
        }

    def _custom_rollout(self, prompts: list, mode: str, dist=None) -> tuple:
        """TRL's `rollout_func(prompts, trainer)`: a dict with prompt_ids, completion_ids and logprobs (one entry per
        prompt); `env_mask` becomes the tool mask; every other key goes to the reward functions as a column. The
        round's settings are read only where the tool loop continues the turns (as TRL, which reads none here: its
        own tests call this on a trainer built by hand, with no model config)."""
        output = self.rollout_func(prompts, self)
        if not isinstance(output, dict):
            raise ValueError(f"rollout_func must return a dict, got {type(output).__name__}")
        missing = sorted({"prompt_ids", "completion_ids", "logprobs"} - output.keys())
        if missing:
            raise ValueError(f"rollout_func must return keys {missing} in its output dict.")
        extra = {k: v for k, v in output.items() if k not in ("prompt_ids", "completion_ids", "logprobs")}
        env_mask = extra.pop("env_mask", None)
        prompt_ids = [list(ids) for ids in output["prompt_ids"]]
        completion_ids = [list(ids) for ids in output["completion_ids"]]
        logprobs = output["logprobs"]
        for name, values in (("prompt_ids", prompt_ids), ("completion_ids", completion_ids), ("logprobs", logprobs)):
            if values is not None and len(values) != len(prompts):
                raise ValueError(f"rollout_func returned {len(values)} {name} for {len(prompts)} prompts")
        if logprobs is not None:
            logprobs = [list(lp) for lp in logprobs]
            for i, (lp, ids) in enumerate(zip(logprobs, completion_ids, strict=True)):
                if len(lp) != len(ids):
                    raise ValueError(
                        f"rollout_func: logprobs of completion {i} has {len(lp)} values for {len(ids)} tokens"
                    )
        if getattr(self, "agent", None) is not None:  # as TRL: the tool loop runs on the custom rollout's turns
            output = self.agent.continue_rollouts(
                prompt_ids,
                completion_ids,
                logprobs,
                tokenizer=self.processing_class,
                generator=self.generator,
                settings=self._rollout_settings(mode),
                dist=self._dist if dist is None else dist,
            )
            return (*output[:5], extra, None, [])
        completions = decode_completions(
            self.processing_class, completion_ids, conversational=is_conversational(prompts[0])
        )
        return prompt_ids, completion_ids, env_mask, completions, logprobs, extra, None, []

    def _generate(self, prompts: list) -> tuple:
        """TRL 1.16's generation hook: every rollout generates through it, whatever the backend (transformers, vLLM
        colocate or server), so a subclass overriding it changes generation everywhere.

        Receives this process's prompts (text or messages; each already repeated once per generation, as the dataset
        rows come). Returns TRL's 8-tuple, one entry per prompt in each list: `(prompt_ids, completion_ids,
        tool_mask, completions, logprobs, extra_fields, images, tool_images)`: token id lists (completions unpadded,
        ending at the first EOS when there is one), decoded completions (assistant messages for conversational
        prompts), the sampler's per-token log-probabilities or None, and a dict of extra fields handed to the reward
        functions as columns (a list: one value per prompt). `tool_mask`: 0 on completion tokens the model did not
        write (tool turns), 1 elsewhere, or None. Images are not supported yet: `images` must be None and
        `tool_images` empty. Unlike TRL's, it logs nothing: the rollout logs lengths and
        token counts from what it returns, overridden or not.
        """
        mode = "train" if self.model.training else "eval"
        if self.rollout_func is not None:
            return self._custom_rollout(prompts, mode)
        settings = self._rollout_settings(mode)
        if self.agent is not None:
            return self.agent.generate(
                prompts, tokenizer=self.processing_class, generator=self.generator, settings=settings, dist=self._dist
            )
        return generate_completions(
            prompts, tokenizer=self.processing_class, generator=self.generator, settings=settings
        )


def _dispatch_batches_off(args, train_dataset, eval_dataset) -> None:
    """As TRL 1.16: with an iterable train or eval set, `accelerator_config.dispatch_batches` must not be True (the
    stream's loader never dispatches batches here either), and it is set to False."""
    from .rollout.stream import is_stream

    evals = eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset]
    if not (is_stream(train_dataset) or any(is_stream(d) for d in evals if d is not None)):
        return
    config = getattr(args, "accelerator_config", None)
    if config is None or not hasattr(config, "dispatch_batches"):
        return
    if config.dispatch_batches:
        raise ValueError(
            "Iterable datasets require `dispatch_batches=False`, but it is set to `True` in `accelerator_config`. "
            "Please set it to `False`."
        )
    config.dispatch_batches = False


def _streamed(args, train_dataset):
    """A streaming train set, as TRL 1.16 takes it: its length is unknown, so max_steps sets the run's; it is read
    by one worker (the groups are formed in one iterator; TRL overrides dataloader_num_workers with a warning)."""
    from .rollout.stream import is_stream

    if not is_stream(train_dataset):
        return train_dataset
    if args.max_steps <= 0:
        raise ValueError(
            "train_dataset is an IterableDataset (streaming): its length is unknown, so `max_steps` must be set to a "
            "positive value to define the training length"
        )
    if args.dataloader_num_workers != 0:
        logger.warning(
            f"streaming train_dataset: Iterable datasets require `dataloader_num_workers=0` (its groups are formed "
            f"in one iterator); using 0, not {args.dataloader_num_workers}"
        )
        args.dataloader_num_workers = 0
    return train_dataset


class SyncRefModelCallback(TrainerCallback):
    """TRL's reference-model sync (`sync_ref_model`): every `ref_model_sync_steps` optimizer steps,
    `ref <- alpha * policy + (1 - alpha) * ref` with `alpha = ref_model_mixup_alpha` (TRL-DPO's soft update)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.ref_model_sync_steps == 0:
            trainer = self.trainer
            policy = trainer.accelerator.unwrap_model(trainer.model)
            reference = trainer.accelerator.unwrap_model(trainer.ref_model)
            sharding.copy_weights(reference, policy, args.ref_model_mixup_alpha)


def _row_excerpt(row: dict) -> str:
    """A short view of a dataset row for an error line: its columns, each value cut."""
    return ", ".join(f"{k}={str(v)[:40]!r}" for k, v in list(row.items())[:4])
