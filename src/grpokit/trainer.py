"""`GRPOTrainer`: a `transformers.Trainer` that trains a causal LM with GRPO; a drop-in for TRL 1.16's.

The trainer is glue. Models come from `grpokit.models.build_models`, the generation backend from
`grpokit.generation.build_generator`; rollouts (generate, reward, advantages) are produced by
`grpokit.rollout.produce_rollout`; the loss is one call to `grpokit.algorithms.policy_loss` with the `LossSettings`
built once from the config; metric buffers and their cross-process reductions are `grpokit.metrics`'; round state in
checkpoints is `grpokit.checkpoints`'. What is left here: feeding the Trainer generation batches in the right order,
buffering a rollout across the micro-steps that reuse it, normalising the loss for gradient accumulation, and
logging.

Generation rounds: the dataloader yields, per process, `per_device_train_batch_size x steps_per_generation` rows
(each prompt repeated `num_generations` times), and yields the same rows again for each of the
`steps_per_generation x num_iterations` micro-steps that train on them; a rollout is produced on the first and
sliced into `steps_per_generation` micro-batches (`generate_every`: the one definition of how often a round starts).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings

import torch
from accelerate.utils import set_seed as set_process_seed
from transformers import PreTrainedModel, Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from . import checkpoints, fastpath, models, routing, vision
from .algorithms import LossSettings, policy_loss
from .algorithms.diagnostics import step_diagnostics
from .algorithms.entropy_control import EntropyCoefficient, masked_entropy_mean
from .algorithms.truncation import sampling_truncation
from .config.grpo_config import GRPOConfig, set_wandb_environment
from .config.precision import resolve_precision
from .config.redaction import hidden_secrets
from .config.rules import vllm_mode_warnings
from .dist import AcceleratorCollective, leave_process_group_at_exit
from .generation import build_generator
from .generation.push import WeightPushes
from .metrics import MetricBuffers
from .nan_guard import NaNGuard, refuse_nonfinite_weights
from .records import recorder as records
from .rollout import dynamic
from .rollout.correction import LossStepCorrection, correction_in_loss_step
from .rollout.report import CompletionLog
from .rollout.rewards import UnscorableRounds, build_reward_functions
from .rollout.rollout import RolloutSettings, produce_rollout
from .rollout.sampler import RepeatSampler
from .scoring import score_tokens
from .startup import check_before_loading, refuse_unknown_arguments
from .trl_compat import SyncRefModelCallback, TRLCompatMixin

logger = logging.getLogger(__name__)


def identity(rows):
    """GRPO needs no collation: the rows go to the rollout as they are."""
    return rows


class GRPOTrainer(TRLCompatMixin, Trainer):
    """Group Relative Policy Optimization trainer, with the constructor of TRL 1.16's `GRPOTrainer`.

    Args:
        model: a `PreTrainedModel`, or a path / hub id loaded with `args.model_init_kwargs`.
        reward_funcs: one or a list of: callables with TRL's reward signature (sync or async), sequence-classification
            `PreTrainedModel`s, paths of such models, or built-in reward names / dotted paths /
            `{"name", "kwargs"}` mappings (see `grpokit.rewards.resolve_reward`).
        args: a `GRPOConfig`; default `GRPOConfig("<model name>-GRPO")`.
        train_dataset, eval_dataset: datasets with a `prompt` column (text or messages); other columns are passed to
            the reward functions.
        processing_class: the tokenizer; default loaded from the model's path, padding on the left.
        reward_processing_classes: one tokenizer per reward function (used for reward models only).
        callbacks, optimizers: as for `transformers.Trainer`.
        quantization_config: a `transformers.BitsAndBytesConfig` to load `model` (a path) quantised, for QLoRA with
            `peft_config`.
        peft_config: a `peft.PeftConfig` to train an adapter instead of the whole model.
    """

    _tag_names = ["grpokit", "grpo"]
    _asynchronous = False  # AsyncGRPOTrainer (grpokit.experimental.async_grpo) takes async_grpo=True
    loss_is_scaled_for_ga = True  # compute_loss already divides by the gradient-accumulation steps

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs=None,
        args: GRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        **trl_only,
    ):
        if args is None:
            name = model if isinstance(model, str) else models.model_id(model) or type(model).__name__
            args = GRPOConfig(f"{name.rstrip('/').split('/')[-1]}-GRPO")
        if args.async_grpo and not self._asynchronous:
            raise ValueError("async_grpo=True: train with grpokit.experimental.async_grpo.AsyncGRPOTrainer")
        reward_funcs = _as_list(reward_funcs)
        refuse_unknown_arguments(trl_only)  # a mistyped keyword: TypeError with "did you mean", before anything else
        owned_rewards = self._take_agent_arguments(args, trl_only, train_dataset)  # see grpokit.agents
        train_dataset = self._training_rows(args, train_dataset, eval_dataset)
        check_before_loading(
            args, reward_funcs, train_dataset, bool(owned_rewards), model, quantization_config, peft_config
        )
        resolve_precision(args)
        set_wandb_environment(args)

        # Rewards first: a reward that cannot run here (e.g. the code sandbox) is refused before the policy loads.
        self.rewards = build_reward_functions(
            reward_funcs + owned_rewards,
            _as_list(reward_processing_classes),
            model_init_kwargs=args.model_init_kwargs,
            trust_remote_code=args.trust_remote_code,
            max_completion_length=args.max_completion_length,
            chat_template_kwargs=args.chat_template_kwargs,
            timeout=args.reward_timeout,
        )
        self.reward_funcs, self.reward_func_names = self.rewards.funcs, self.rewards.names
        with warnings.catch_warnings():  # peft reads transformers' deprecated alias when it wraps the model
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            built = models.build_models(model, processing_class, peft_config, args, quantization_config)
        self._model_path, self.eos_token_ids, self.ref_model = built.model_path, built.eos_token_ids, built.reference
        self.router_aux_loss_coef, self.aux_loss_enabled = built.router_aux_loss_coef, built.aux_loss_enabled
        self.loss_settings = LossSettings.from_config(args)

        super().__init__(
            model=built.policy,
            args=args,
            data_collator=identity,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=built.tokenizer,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        if self.args.n_gpu > 1:
            raise ValueError(
                "GRPOTrainer does not support nn.DataParallel (several GPUs in one process): launch with "
                "`accelerate launch` or `torchrun`, or expose one GPU with CUDA_VISIBLE_DEVICES"
            )
        self._check_agent_tokenizer()
        vision.refuse_images_without_processor(train_dataset, self.processing_class)
        self._init_state(args)
        self._warn_as_trl(args)
        self._place_auxiliary_models()
        if args.sync_ref_model:
            self.add_callback(SyncRefModelCallback(self))
        records.attach(self)  # metrics.jsonl, resolved_config.yaml, reward_curve.png; progress_lines
        if self.accelerator.device.type == "cpu":  # nothing to pin memory for (torch warns when asked to)
            self.args.dataloader_pin_memory = False
        self.generator = self._make_generator(args)  # after the Trainer has placed the policy
        self._route_agreement = routing.attach(self)  # routing_replay: the generator records the experts it used
        if hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names)
        set_process_seed(args.seed, device_specific=True)  # different samples on each process

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus's current coefficient (it moves during training with use_adaptive_entropy)."""
        return self._entropy_control.coef

    @property
    def generate_every(self) -> int:
        """Micro-steps per generation round: a round is generated, then trained on by `steps_per_generation`
        micro-batches, `num_iterations` times each."""
        return self.args.steps_per_generation * self.args.num_iterations

    # ------------------------------------------------------------------------------------------------ construction

    def _init_state(self, args):
        self._dist = AcceleratorCollective(self.accelerator)
        if self._dist.num_processes > 1:
            leave_process_group_at_exit()  # see grpokit.dist: a script's process must not abort at exit
        fastpath.keep_freed_memory(self.accelerator.device)  # CPU: big tensors reused, not faulted in again each step
        self._step = 0  # micro-steps taken, including those inside one accumulation window
        self._buffered_inputs = None  # the micro-batches of the current generation round
        self._step_time = 0.0  # seconds spent in the micro-steps of the current optimizer step
        self._saved_at = None  # the global step of the latest checkpoint
        self._metrics = MetricBuffers(self._dist, self.accelerator.device)
        images = os.path.join(args.output_dir, "completions", "images") if args.log_multimodal else None
        self._completion_log = CompletionLog(args.generation_batch_size, image_dir=images)
        # The latest generation batch, a dict per completion, for callbacks (the run recorder reads and clears it)
        self.logged_completions = self._completion_log.samples
        self._entropy_control = EntropyCoefficient.from_config(args)
        self._entropy_window = None  # (entropy sum, token count) of the current accumulation window
        self._loss_step_correction = LossStepCorrection(self._dist)  # vLLM's IS correction when on-policy
        self._truncation = sampling_truncation(args)  # the sampler's top-k/p, min-p: the policy is scored over its set
        warn = logger.warning if self.accelerator.is_main_process else None
        self._unscorable = UnscorableRounds(args.max_unscorable_rounds, self.reward_func_names, warn)
        self._dynamic_sampling = None  # DAPO's dynamic sampling: see grpokit.rollout.dynamic
        if args.dynamic_sampling and not self._asynchronous:  # the async worker filters groups itself
            collate = self._get_collator_with_removed_columns(identity, "training")  # the dataloader's columns
            pad_id, settings = vision.tokenizer_of(self.processing_class).pad_token_id, self._rollout_settings("train")
            self._dynamic_sampling = dynamic.build(
                args, self.train_dataset, settings, dist=self._dist, pad_token_id=pad_id, collate=collate, warn=warn
            )
        # The NaN guard (grpokit.nan_guard); off under DeepSpeed, which steps inside backward (save_model still checks)
        self._nan_guard = None
        if self.is_deepspeed_enabled:
            logger.warning("NaN guard off under DeepSpeed, which steps inside backward: see max_nonfinite_steps")
        else:
            self._nan_guard = NaNGuard(args.max_nonfinite_steps, grad_scaler=self.accelerator.scaler is not None)
        self._weight_pushes = WeightPushes(self._nan_guard)  # vLLM: the policy's weights each round

    def _place_auxiliary_models(self):
        """The reference and reward models, inference only, placed as the policy is (see `models.place_frozen`)."""
        for i, func in enumerate(self.rewards.funcs):
            if isinstance(func, PreTrainedModel):
                self.rewards.funcs[i] = models.place_frozen(func, self.accelerator)
        if self.ref_model is not None:
            self.ref_model = models.place_frozen(self.ref_model, self.accelerator)

    def _make_generator(self, args):
        """The generation backend `args` asks for (`grpokit.generation.build_generator`). vLLM fields that have no
        effect here (without use_vllm, or of the other mode) are named in a warning."""
        defaults = {f.name: f.default for f in dataclasses.fields(args)}
        for line in vllm_mode_warnings(vars(args), defaults):
            logger.warning(line)
        return build_generator(
            args,
            policy=self._unwrapped_for_generation,
            model_path=self._model_path,
            dtype=self.accelerator.unwrap_model(self.model).dtype,
            tokenizer=vision.tokenizer_of(self.processing_class),
            eos_token_ids=self.eos_token_ids,
            device=self.accelerator.device,
            dist=self._dist,
            never_sample=vision.image_token_ids(self.processing_class, self.model)
            if vision.is_processor(self.processing_class)
            else (),
            vision_model=vision.is_processor(self.processing_class),
        )

    def _unwrapped_for_generation(self):
        # Read at each round: the Trainer wraps the policy (DDP, DeepSpeed) only once training starts.
        return models.unwrapped_for_generation(
            self.accelerator, self.model_wrapped, self.args.ds3_gather_for_generation
        )

    # ------------------------------------------------------------------------------------------------ data order

    def _set_signature_columns_if_needed(self):
        # Only the prompt is model input here; with remove_unused_columns=True every other column is dropped.
        if self._signature_columns is None:
            self._signature_columns = ["prompt"]

    def get_train_dataloader(self):
        from .rollout import stream  # a streaming dataset: its groups formed on the fly (see there)

        if stream.is_stream(self.train_dataset):
            return stream.train_loader_of(self)
        return self._get_dataloader(
            dataset=self.train_dataset,
            description="Training",
            batch_size=self._train_batch_size * self.args.steps_per_generation,  # one generation batch per process
            sampler_fn=self._get_train_sampler,
            is_training=True,
        )

    def _get_train_sampler(self, dataset=None):
        return RepeatSampler(
            dataset if dataset is not None else self.train_dataset,
            mini_repeat_count=self.args.num_generations,
            batch_size=self.args.generation_batch_size // self.args.num_generations,
            repeat_count=self.generate_every,
            shuffle=self.args.shuffle_dataset,
            seed=self.args.seed,
        )

    def get_eval_dataloader(self, eval_dataset=None):
        from .rollout import stream

        loader = stream.eval_loader_of(self, eval_dataset)  # None: not a stream
        return super().get_eval_dataloader(eval_dataset) if loader is None else loader

    def _get_eval_sampler(self, eval_dataset):
        return RepeatSampler(eval_dataset, mini_repeat_count=self._num_generations("eval"), seed=self.args.seed)

    def _num_generations(self, mode: str) -> int:
        return (
            self.args.num_generations
            if mode == "train"
            else self.args.num_generations_eval or self.args.num_generations
        )

    # ------------------------------------------------------------------------------------------------ rollouts

    def _prepare_inputs(self, rows):
        if not self.model.training:  # evaluation: one rollout per batch, no reuse
            return self._rollout(rows, "eval").micro_batches(1, shuffle=False)[0]
        if self._step % self.generate_every == 0 or self._buffered_inputs is None:  # None after resuming
            rollout = self._rollout(rows, "train")
            if self._dynamic_sampling is not None:  # more rounds until only groups whose rewards differ fill it
                rollout = self._dynamic_sampling.fill(
                    rollout, lambda more: self._rollout(more, "train"), self._metrics
                )
            self._buffered_inputs = rollout.micro_batches(self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _rollout(self, rows, mode: str):
        args = self.args
        settings = self._rollout_settings(mode)
        if args.use_vllm:
            policy = self.accelerator.unwrap_model(self.model)
            seconds = self._weight_pushes.before_round(self.generator, policy, self.state.global_step)
            if seconds is not None:
                self._metrics[mode]["timing/vllm_weight_sync"].append(seconds)
        chunk = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
        rows = self._start_agent_batch(rows)  # environments reset with their rows (may extend the prompts)
        self._loss_step_correction.reset()  # a new round: the loss step's correction starts over
        rollout = produce_rollout(
            rows,
            tokenizer=self.processing_class,
            generator=self.generator,
            rewards=self.rewards,
            settings=settings,
            eos_token_ids=self.eos_token_ids,
            old_logps_fn=self._logps_fn(self.model, chunk, self._truncation)
            if self._needs_old_logps(settings, mode)
            else None,
            ref_logps_fn=self._reference_logps_fn(chunk) if args.beta != 0.0 else None,
            reward_kwargs={
                "trainer_state": self.state,
                "log_extra": self._completion_log.add_extra,
                "log_metric": self._metrics.report,
                **({"environments": self.environments} if self.environments is not None else {}),
            },
            dist=self._dist,
            device=self.accelerator.device,
            generate=self._generate,  # TRL's hook: a subclass's override generates for every backend
        )
        self._record_rollout(rollout, mode)
        self._unscorable.check(rollout, mode)
        return rollout

    def _needs_old_logps(self, settings: RolloutSettings, mode: str) -> bool:
        """Old log-probabilities are scored after generation when updates are off-policy, and for vLLM's
        importance-sampling correction unless the loss step computes it from the training forward (on-policy)."""
        off_policy = mode == "train" and self._off_policy()
        in_loss = correction_in_loss_step(mode, off_policy, self.args.num_iterations, self.model)
        return off_policy or (settings.importance_sampling_mode is not None and not in_loss)

    def _off_policy(self) -> bool:
        """Whether the weights can change between generating a batch and training on it: when its micro-steps do
        not all fall inside one optimizer step. Otherwise the old log-probabilities equal the current ones."""
        return self.args.gradient_accumulation_steps % self.generate_every != 0

    def _logps_fn(self, model, chunk_size, truncation=None):
        def logps(input_ids, attention_mask, logits_to_keep, vision=None, routes=None):
            with self.accelerator.autocast():
                return score_tokens(
                    model, input_ids, attention_mask, logits_to_keep, temperature=self.args.temperature,
                    chunk_size=chunk_size, vision=vision, truncation=truncation, routes=routes,
                ).logps  # fmt: skip

        return logps

    def _reference_logps_fn(self, chunk_size):
        if self.ref_model is not None:
            return self._logps_fn(self.ref_model, chunk_size)
        policy_logps = self._logps_fn(self.model, chunk_size)

        def logps(*inputs, **kwargs):
            with models.reference_policy(self.accelerator.unwrap_model(self.model)):
                return policy_logps(*inputs, **kwargs)

        return logps

    def _record_rollout(self, rollout, mode: str):
        if mode == "train":
            self.state.num_input_tokens_seen += rollout.num_tokens
        metrics = self._metrics[mode]
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        for name, value in {**rollout.metrics, **self._agent_records()}.items():
            metrics[name].append(value)
        self._metrics.add_reported(mode)  # what reward functions logged with log_metric
        self._completion_log.add_rollout(rollout, self.reward_func_names, self._dist)

    # ------------------------------------------------------------------------------------------------ loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("GRPOTrainer.compute_loss does not return model outputs")
        args, mode = self.args, "train" if self.model.training else "eval"
        attention = inputs["completion_mask"]  # (B, C); tool turns (tool_mask 0) are seen, never trained on
        mask = attention if inputs.get("tool_mask") is None else attention * inputs["tool_mask"]
        with self.accelerator.autocast():
            scores = score_tokens(
                model,
                torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1),
                torch.cat([inputs["prompt_mask"], attention], dim=1),
                mask.size(1),
                temperature=args.temperature,
                compute_entropy=True,  # logged; with a gradient only for the entropy bonus
                entropy_grad=self._entropy_control.enabled,
                compute_aux_loss=self.aux_loss_enabled,
                vision=inputs.get("vision"),
                truncation=self._truncation,
                routes=routing.batch_routes(inputs),  # routing_replay: the sampler's experts
                agreement=self._route_agreement,
            )
        logps, entropies = scores.logps, scores.entropies  # (B, C) each
        old_logps = inputs.get("old_logps")  # None: on-policy
        entropy_keep = None
        if args.top_entropy_quantile < 1.0:  # ranked over all processes' active tokens, as TRL
            entropy_keep = self.get_high_entropy_mask(entropies, mask, 1 - args.top_entropy_quantile)
        off_policy_keep = None
        if args.off_policy_mask_threshold is not None:
            # The sampler's own logprobs where the backend gave them (vLLM), else the trainer's old ones, as TRL.
            sampling_logps = inputs.get("sampling_logps")
            if sampling_logps is None:
                sampling_logps = logps.detach() if old_logps is None else old_logps
            off_policy_keep = self.get_off_policy_mask(
                inputs["advantages"], logps, sampling_logps, mask, args.off_policy_mask_threshold
            )
        # dapo/cispo/vespo: over the round's active tokens (all processes) rescaled to one micro-batch of one process;
        # every loss is then divided by the accumulation steps (not in eval).
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        splits = args.steps_per_generation if mode == "train" else 1
        num_items = inputs["num_items_in_batch"].clamp(min=1.0) / (self.accelerator.num_processes * splits)
        sampling_ratio = inputs.get("importance_sampling_ratio")
        if sampling_ratio is None and old_logps is None and inputs.get("sampling_logps") is not None:
            sampling_ratio = self._loss_step_correction(  # on-policy vLLM rounds (rollout.correction)
                logps, inputs, mask, self._rollout_settings(mode), parts=splits, metrics=self._metrics[mode]
            )
        result = policy_loss(
            logps,
            old_logps,
            inputs["advantages"],
            mask,
            settings=self.loss_settings,
            ref_logps=inputs.get("ref_logps"),
            num_items_in_batch=num_items,
            off_policy_mask=off_policy_keep,
            entropy_mask=entropy_keep,
            importance_sampling_ratio=sampling_ratio,
        )
        routing.log_agreement(self._route_agreement, self._dist, self._metrics[mode], mask.device)
        # The diagnostics read the ratio and KL the loss computed (detached), not a second copy of them.
        self._metrics[mode]["entropy"].append(self._metrics.global_mean(entropies.detach(), mask))
        self._metrics.add_diagnostics(
            mode, step_diagnostics(result.terms, inputs["advantages"], mask, self.loss_settings), mask
        )
        return self._regularised(result.loss, scores, mask, entropy_keep, accumulation, mode)

    def _regularised(self, loss, scores, mask, entropy_keep, accumulation, mode: str):
        """The policy loss, scaled for gradient accumulation, minus the entropy bonus, plus the MoE router loss."""
        policy_value = loss.detach()
        loss = loss / accumulation
        if self._entropy_control.enabled:
            # The bonus is the mean entropy of the tokens the policy term trains on, whatever the loss type.
            active = mask if entropy_keep is None else mask * entropy_keep
            bonus = masked_entropy_mean(scores.entropies, active) / accumulation
            loss = loss - self._entropy_control.applied() * bonus
            self._metrics[mode]["policy_loss"].append(self._metrics.gathered_mean(policy_value, skip_nan=True))
            self._track_entropy(scores.entropies.detach(), active, mode)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * scores.aux_loss / accumulation
            self._metrics[mode]["aux_loss"].append(self._metrics.gathered_mean(scores.aux_loss))
        return loss

    def _track_entropy(self, entropies, active, mode: str):
        """Adaptive entropy: accumulate the step's entropy and move the coefficient at the optimizer step."""
        if mode != "train":
            return
        if self._entropy_control.adaptive:
            stats = torch.stack([(entropies * active).sum(), active.sum()]).float()
            self._entropy_window = stats if self._entropy_window is None else self._entropy_window + stats
            if self.accelerator.sync_gradients:
                total = self._dist.sum(self._entropy_window)
                self._entropy_control.update((total[0] / total[1].clamp(min=1.0)).item())
                self._entropy_window = None
        if self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self._entropy_control.coef)

    def training_step(self, model, inputs, num_items_in_batch=None):
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        routing.release(self.model)  # routing_replay: the backward pass (and its recomputation) is done
        if self._nan_guard is not None:
            self._nan_guard.note_loss(loss)
        self._step += 1
        self._step_time += time.perf_counter() - start
        if self._step % self.current_gradient_accumulation_steps == 0:  # TRL's step_time: one optimizer step
            self._metrics["train"]["step_time"].append(self._step_time)
            self._step_time = 0.0
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        # Once per optimizer step, after clipping, right before `optimizer.step()`: the NaN guard's hook. A non-finite
        # loss or gradient norm drops the step's gradients (no update); the scheduler still steps (max_nonfinite_steps)
        grad_norm = super()._get_grad_norm(model, grad_norm)
        guard = self._nan_guard
        if guard is None:
            return grad_norm
        what = guard.verdict(grad_norm, self._dist.sum if self._dist.num_processes > 1 else None)
        if what is not None:
            for group in self.optimizer.param_groups:
                for param in group["params"]:
                    param.grad = None
        step = self.state.global_step + 1
        in_a_row = guard.record(step, what)  # raises NonFiniteTrainingError at max_nonfinite_steps in a row
        if what is not None and self.accelerator.is_main_process:
            limit = self.args.max_nonfinite_steps
            logger.warning(
                f"warning: step {step}: non-finite {what}; optimizer step skipped, weights and optimizer state "
                f"unchanged ({in_a_row} in a row{'' if limit is None else f', the run stops at {limit}'})"
            )
        return grad_norm

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        # Evaluation has no labels: the "prediction" is the GRPO loss on a fresh rollout.
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.mean().detach(), None, None

    # ------------------------------------------------------------------------------------------------ logging

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = self._metrics.interval_means(mode)
        if mode == "eval":
            metrics = {f"eval_{name}": value for name, value in metrics.items()}
        elif self._nan_guard is not None and "loss" in logs:  # a training row (not the end-of-training summary)
            metrics["nonfinite_steps_skipped"] = self._nan_guard.take_skipped()
        elif "train_runtime" in logs and self._saved_at == self.state.global_step < self.state.max_steps:
            metrics = {}  # stopped early right after a checkpoint that holds this interval: logged after a resume
        logs.update(metrics)
        super().log(logs, start_time)
        self._metrics[mode].clear()
        if self.args.log_completions and self.accelerator.is_main_process:
            self._completion_log.report(
                self.state.global_step,
                self.args.output_dir,
                self.args.num_completions_to_print,
                self.args.log_unique_prompts,
            )

    # ------------------------------------------------------------------------------------------------ checkpoints

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train`, with resume_from_checkpoint also `"last"` (as `True`: the latest complete checkpoint in
        output_dir, interrupted saves ignored), and refused (ValueError listing them) when settings the checkpoint
        records have changed since: batch geometry, processes, num_generations, loss_type, beta 0 or not, model;
        with `resume_allow_changes` each change is a warning instead (see `grpokit.checkpoints`)."""
        checkpoint = checkpoints.trainer_resume_checkpoint(self, resume_from_checkpoint)
        return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def _save(self, output_dir: str | None = None, state_dict=None):
        # training_args.bin (a pickle of the arguments) is written without hub_token, as resolved_config.yaml is.
        with hidden_secrets(self.args), models.quiet_progress_bars():
            super()._save(output_dir, state_dict)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as `Trainer.save_model` does, but refuse (`NonFiniteWeightsError`, naming the tensors) to write weights
        holding NaN or inf. Each process checks the weights it holds; when they are sharded (FSDP, DeepSpeed), where
        saving is collective anyway, the processes sum their counts so that all refuse together. Replicated weights
        (DDP) need no collective: save_model may then be called on the main process alone, as many scripts do."""
        sharded = self._dist.num_processes > 1 and (self.is_fsdp_enabled or self.is_deepspeed_enabled)
        refuse_nonfinite_weights(
            self.accelerator.unwrap_model(self.model),
            output_dir or self.args.output_dir,
            sum_over_processes=self._dist.sum if sharded else None,
            device=self.accelerator.device,
        )
        super().save_model(output_dir, _internal_call)

    @checkpoints.atomic_checkpoint  # written as tmp-checkpoint-N/checkpoint-N, renamed to checkpoint-N once complete
    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        checkpoints.save_round_state(self, folder)
        self._saved_at = self.state.global_step

    def _issue_warnings_after_load(self, load_result):
        # A tied lm_head is saved once, under the embedding's name: not a missing key (see without_tied_keys).
        super()._issue_warnings_after_load(checkpoints.without_tied_keys(self.model, load_result))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            checkpoints.load_round_state(self, checkpoint)


# ---------------------------------------------------------------------------------------------------- helpers


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
