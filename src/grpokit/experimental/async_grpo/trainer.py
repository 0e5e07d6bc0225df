"""`AsyncGRPOTrainer`: GRPO with generation overlapped with training, the constructor of TRL 1.16's
`trl.experimental.async_grpo.AsyncGRPOTrainer`.

It is grpokit's `GRPOTrainer` with one seam changed: a generation batch is not generated at the start of its
optimizer step but taken from the rollout worker's queue, where a worker thread (`worker.py`) put it while earlier
steps trained. Everything else is the synchronous trainer's: the loss, the rewards, the records, checkpoints.

Staleness. The policy has a version, 1 after the first weight sync at train start, +1 at each sync (every
`weight_sync_steps` optimizer steps). A sample carries the version generation started with; one more than
`max_staleness` versions behind is dropped (`sample/dropped_stale_total`) and its prompt generated again. What is
kept is corrected, not only clipped: the loss is the synchronous one with old log-probabilities = the current
policy's (detached), and vLLM's importance-sampling correction (`vllm_importance_sampling_mode` / `_clip_max`)
weights each token by pi_current / pi_sampler from the sampler's own per-token log-probabilities, the policy that
sampled being any number of versions old. With `max_staleness=0` the worker waits for each sync, and the run trains
as the synchronous trainer on the same completions.

Only the main process runs the worker and talks to the generator; each batch is broadcast and every process trains
its equal slice, as in the synchronous trainer.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import warnings

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from grpokit import checkpoints, sharding, vision
from grpokit.dist import LOCAL
from grpokit.generation import build_generator, is_conversational, is_truncated
from grpokit.rollout import dynamic
from grpokit.rollout.rollout import _vision_rows, correction_settings, generate_completions, produce_rollout
from grpokit.trainer import GRPOTrainer

from .accounting import SamplerDistance, StepClock, batch_metrics, padded_positions
from .config import AsyncGRPOConfig
from .samples import RolloutSample, check_plugged, drain, reduce_window, rollout_of, split
from .transfer import LocalSampler, LocalWeightTransfer, ServerWeightTransfer, SyncDeadline, transfer_target
from .worker import AsyncRolloutWorker, PromptOrder

logger = logging.getLogger(__name__)

STATE_FILE = "async_rollout_state.json"


class WeightSyncError(RuntimeError):
    """A weight push to the generator failed or outlasted `weight_sync_timeout`."""


class AsyncGRPOTrainer(GRPOTrainer):
    """Asynchronous GRPO: TRL 1.16's constructor (`rollout_worker=` and `weight_transfer=` take TRL's protocols).

    Rewards, tools and environments run in a thread of this process (closures and lambdas work). Without vLLM
    (`use_vllm=False`) the worker generates with its own copy of the policy.
    """

    _tag_names = ["grpokit", "async-grpo"]
    _asynchronous = True

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: AsyncGRPOConfig | None = None,
        train_dataset=None,
        processing_class=None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers=(None, None),
        peft_config=None,
        tools=None,
        environment_factory=None,
        rollout_worker=None,
        weight_transfer=None,
        **grpokit_only,
    ):
        if args is None:
            name = model if isinstance(model, str) else type(model).__name__
            args = AsyncGRPOConfig(f"{name.rstrip('/').split('/')[-1]}-AsyncGRPO")
        if not getattr(args, "async_grpo", False):
            raise TypeError(
                f"args: AsyncGRPOTrainer takes an AsyncGRPOConfig (or a GRPOConfig with async_grpo=True), got "
                f"{type(args).__name__} with async_grpo={getattr(args, 'async_grpo', None)}"
            )
        if isinstance(model, str) and getattr(args, "dtype", None):
            init = dict(args.model_init_kwargs or {}) if not isinstance(args.model_init_kwargs, str) else None
            if init is not None:
                init.setdefault("dtype", args.dtype)
                args.model_init_kwargs = init
        check_plugged(rollout_worker, weight_transfer)
        if (tools or environment_factory) and args.max_inflight_tasks != -1:
            raise ValueError(
                f"max_inflight_tasks={args.max_inflight_tasks}: the tool loop runs a generation batch's rollouts "
                "together, so it cannot be split into requests; leave it at -1 with tools or environment_factory"
            )
        self._plugged_worker, self._plugged_transfer = rollout_worker, weight_transfer
        if args.use_vllm and weight_transfer is None and int(os.environ.get("RANK", "0") or 0) == 0:
            from grpokit.generation.vllm_server import wait_for_server

            url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
            wait_for_server(url, args.vllm_server_timeout)  # before anything loads: one line
        if rollout_worker is not None and weight_transfer is not None and args.use_vllm:
            args.use_vllm = False  # the plugged worker generates and the plugged transfer syncs: no vLLM needed here
        if rollout_worker is not None and not reward_funcs and environment_factory is None:
            reward_funcs = [_scored_by_the_worker]  # the plugged worker scores; nothing here is called
        agent = {k: v for k, v in (("tools", tools), ("environment_factory", environment_factory)) if v}
        super().__init__(
            model,
            reward_funcs,
            args,
            train_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
            **agent,
            **grpokit_only,
        )
        self.model_version = 0
        self._sync_base = None  # (global step, version) right after the first sync of this train() call
        self._resume_state = None  # the rollout state read from the checkpoint resumed from
        self._wait_s = 0.0
        self._sync_failed = False  # a weight push failed or timed out: the transfer may be stuck
        self._producing = threading.Lock()  # one generation batch at a time: the worker's or evaluation's
        self._span_end = None  # the version right after the worker's last generation, when weights can change under it
        self.rollout_worker = self.weight_transfer = self.rollout_queue = None
        self._loss_step_correction = SamplerDistance(self._dist, self._metrics)  # also TRL's `ratio` and `kl`
        self._step_tokens = None  # (forwarded, trained) tokens of the current step's batch, all processes
        self.add_callback(_Pipeline(self))
        self.add_callback(StepClock(self))

    # -- construction ----------------------------------------------------------------------------------------

    def _make_generator(self, args):
        """Only the main process generates, with its own collective: nothing here is called by the others."""
        if not self.accelerator.is_main_process:
            return None
        if self._plugged_worker is not None and (self._plugged_transfer is not None or not args.use_vllm):
            return None  # the plugged worker generates; nothing here would push weights to a server
        processor = self.processing_class
        common = dict(
            model_path=self._model_path,
            dtype=self.accelerator.unwrap_model(self.model).dtype,
            tokenizer=vision.tokenizer_of(processor),
            eos_token_ids=self.eos_token_ids,
            device=self.accelerator.device,
            never_sample=vision.image_token_ids(processor, self.model) if vision.is_processor(processor) else (),
            vision_model=vision.is_processor(processor),
        )
        if args.use_vllm:
            generator = build_generator(args, policy=self._unwrapped_for_generation, dist=LOCAL, **common)
            generator.request_timeout, generator.weight_timeout = args.request_timeout, args.weight_sync_timeout
            return generator
        if sharding.is_sharded(self.accelerator.unwrap_model(self.model)):
            raise ValueError(
                "the rollout worker's own copy of the policy needs it whole, and it was loaded sharded (ZeRO-3 with "
                "zero3_init_flag): generate with a vLLM server, or leave zero3_init_flag off"
            )
        return LocalSampler(
            self.accelerator.unwrap_model(self.model),
            lambda policy: build_generator(_without_vllm(args), policy=policy, **common),
            args.temperature,
            vision.tokenizer_of(processor).pad_token_id,
            truncation=self._truncation,  # its logprobs are of the distribution it samples from, as vLLM's
        )

    def _start_pipeline(self) -> None:
        """At train start (main process): the transfer and worker, the first weight sync (version 1), the worker's
        start; TRL's order."""
        main = self.accelerator.is_main_process
        if main:
            self.weight_transfer = self._plugged_transfer or self._default_transfer()
            self.rollout_worker = self._plugged_worker or self._default_worker()
            self.rollout_queue = self.rollout_worker.rollout_buffer
            if self._resume_state is not None and self._plugged_worker is not None:
                self.rollout_worker.update_model_version(self.model_version)
            if self.weight_transfer is not None:
                self.weight_transfer.init_weight_transfer()
            if hasattr(self.generator, "adapter_version_start"):  # adapter names carry on from a resumed version
                self.generator.adapter_version_start = self.model_version
        self._sync_weights()
        self._sync_base = (self.state.global_step, self.model_version)
        if main:
            self.rollout_worker.start()

    def _default_transfer(self):
        if self.generator is None:
            return None
        if self.args.use_vllm:
            return ServerWeightTransfer(self.generator, lambda: self.accelerator.unwrap_model(self.model))
        return LocalWeightTransfer(self.generator)

    def _default_worker(self) -> AsyncRolloutWorker:
        args = self.args
        state = (self._resume_state or {}).get("prompts")
        order = PromptOrder(len(self.train_dataset), shuffle=args.shuffle_dataset, seed=args.seed, state=state)
        return AsyncRolloutWorker(
            dataset=self.train_dataset,
            produce=self._produce,
            order=order,
            num_generations=args.num_generations,
            prompts_per_batch=args.generation_batch_size // args.num_generations,
            max_staleness=args.max_staleness,
            queue_maxsize=args.queue_maxsize,
            version_of_batch=self._version_of_batch,
            keep=self._groups_that_teach if args.dynamic_sampling else None,
            max_extra_rounds=args.dynamic_sampling_max_rounds,
        )

    def _groups_that_teach(self, samples: list[RolloutSample]) -> list[bool]:
        """Dynamic sampling's test, as the synchronous trainer's (`dynamic.kept_groups`), per group of `samples`."""
        rewards = torch.tensor(
            [[s.metrics[f"rewards/{name}"] for name in self.reward_func_names] for s in samples], dtype=torch.float64
        )
        settings = self._rollout_settings("train")
        return dynamic.kept_groups(
            rewards, self.args.num_generations, self.args.dynamic_sampling_min_reward_std, settings.reward_weights
        ).tolist()

    def _version_of_batch(self, k: int) -> int:
        """The policy version the k-th batch of this train() call is trained with (none dropped)."""
        step, version = self._sync_base
        every = self.args.weight_sync_steps
        return version + (step + k) // every - step // every

    # -- the worker's side (runs in its thread) --------------------------------------------------------------

    def _produce(self, rows: list[dict], mode: str = "train") -> list[RolloutSample]:
        """One generation batch of samples, by the synchronous trainer's `produce_rollout` on one process. One batch at
        a time (the worker's or evaluation's): they share the generator, the tool loop and the environments."""
        with self._producing:
            return self._produce_batch(rows, mode)

    def _produce_batch(self, rows: list[dict], mode: str) -> list[RolloutSample]:
        args = self.args
        settings = self._worker_settings(mode)
        rows = self._start_agent_batch(rows, LOCAL)
        extras: dict[str, list] = {}  # what reward functions log with log_extra, a value per row
        rollout = produce_rollout(
            rows,
            tokenizer=self.processing_class,
            generator=self.generator,
            rewards=self.rewards,
            settings=settings,
            eos_token_ids=self.eos_token_ids,
            reward_kwargs={
                "trainer_state": self.state,
                "log_extra": lambda column, values: extras.setdefault(column, []).extend(values),
                "log_metric": self._worker_metric,
                **({"environments": self.environments} if self.environments is not None else {}),
            },
            dist=LOCAL,
            generate=lambda prompts: self._worker_generate(prompts, settings, mode),
        )
        span_end = self._span_end
        if rollout.sampling_logps is None:
            raise ValueError("the generator gave no sampling log-probabilities, which the asynchronous trainer needs")
        weights = torch.tensor(settings.reward_weights or [1.0] * rollout.rewards.size(1))
        calls = [[]] * len(rows)
        images = vision.is_processor(self.processing_class) and any(vision.has_image_column(row) for row in rows)
        if self.agent is not None and self.agent.last is not None:
            self._worker_metrics(self._agent_records(LOCAL, record_calls=False))
            calls = [[dict(vars(call)) for call in made] for made in self.agent.last.calls]
        samples = []
        for i in range(len(rows)):
            prompt = rollout.prompt_ids[i][rollout.prompt_mask[i].bool()].tolist()
            length = int(rollout.completion_mask[i].sum())
            completion = rollout.completion_ids[i][:length].tolist()
            trained = [1] * length if rollout.tool_mask is None else rollout.tool_mask[i][:length].tolist()
            truncated = is_truncated(
                completion, self.eos_token_ids, vision.tokenizer_of(self.processing_class).pad_token_id
            )
            if truncated and args.mask_truncated_completions:
                trained = [0] * length
            rewards = rollout.rewards[i]
            total = torch.nansum(rewards * weights).item() if not torch.isnan(rewards).all() else float("nan")
            samples.append(
                RolloutSample(
                    prompt=_with_images(rows[i], i) if images else rollout.prompts[i],
                    completion=rollout.completions[i],
                    input_ids=_array(prompt + completion, "int64"),
                    completion_mask=_array([0] * len(prompt) + trained, "int64"),
                    old_log_probs=_array([0.0] * len(prompt) + rollout.sampling_logps[i][:length].tolist(), "float32"),
                    advantage=float(rollout.all_advantages[i]),
                    model_version=0,  # the worker stamps it
                    group_id=0,
                    metrics={
                        "reward": total,
                        **{f"rewards/{n}": float(r) for n, r in zip(self.reward_func_names, rewards, strict=True)},
                    },
                    truncated=truncated,
                    last_model_version=span_end,
                    extra={
                        **{column: values[i] for column, values in extras.items() if len(values) == len(rows)},
                        **({"tool_calls": calls[i]} if calls[i] else {}),
                    },
                )
            )
        return samples

    def _rollout_settings(self, mode: str):
        """The synchronous settings, with the importance-sampling correction on whatever the generator (the local
        sampler is as stale as a server)."""
        settings = super()._rollout_settings(mode)
        for name, value in correction_settings(self.args).items():
            setattr(settings, name, value)
        return settings

    def _worker_settings(self, mode: str = "train"):
        settings = self._rollout_settings(mode)
        settings.mask_truncated_completions = False  # the samples carry the lengths; their masks do the masking
        return settings

    def _worker_generate(self, prompts: list, settings, mode: str = "train") -> tuple:
        """Completions for one generation batch (TRL's `rollout_func` when given), at most max_inflight_tasks (whole
        groups) asked at once."""
        try:
            if self.rollout_func is not None:
                return self._custom_rollout(prompts, mode, dist=LOCAL)
            return self._generate_in_parts(prompts, settings)
        finally:
            # A server swaps merged weights under requests in flight (pause with mode=keep); a request naming an
            # adapter version keeps it, and the local sampler never swaps under a generation.
            swaps = self.args.use_vllm and not getattr(self.generator, "pushes_adapters", False)
            self._span_end = self.rollout_worker.model_version if swaps else None

    def _generate_in_parts(self, prompts: list, settings) -> tuple:
        if self.agent is not None:  # the tool loop holds the whole batch's toolboxes
            return self.agent.generate(
                prompts, tokenizer=self.processing_class, generator=self.generator, settings=settings, dist=LOCAL
            )
        size = len(prompts) if self.args.max_inflight_tasks < 0 else self.args.max_inflight_tasks
        group = self.args.num_generations
        size = max(group, -(-size // group) * group)
        parts = [
            generate_completions(
                prompts[i : i + size], tokenizer=self.processing_class, generator=self.generator, settings=settings
            )
            for i in range(0, len(prompts), size)
        ]
        return _joined(parts)

    def _worker_metric(self, name: str, value: float) -> None:
        self._worker_metrics({name: float(value)})

    def _worker_metrics(self, values: dict) -> None:
        try:
            self.rollout_worker.metrics_queue.put_nowait(values)
        except queue.Full:
            pass  # never block generation for a metric

    # -- the trainer's side ----------------------------------------------------------------------------------

    def _prepare_inputs(self, rows):
        if not self.model.training:
            return self._evaluation_batch(rows)
        if self._step % self.generate_every == 0 or self._buffered_inputs is None:
            self._loss_step_correction.reset()
            self._buffered_inputs = self._next_batch().micro_batches(self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _evaluation_batch(self, rows):
        """Evaluation: every process's rows of this eval batch generated by the main process, with the one policy
        version the generator holds (weights are pushed only from this thread, never during evaluation), scored,
        and each process's share returned; logged as `eval_*`, with `eval_model_version`."""
        every = self._dist.gather_object(list(rows))
        samples = self._produce(every, "eval") if self.accelerator.is_main_process else None
        rollout = self._shared_rollout(self._dist.broadcast_object(samples), "eval")
        self._metrics["eval"]["model_version"].append(float(self.model_version))
        return rollout.micro_batches(1, shuffle=False)[0]

    def _next_batch(self):
        """One generation batch from the queue (main process), shared by every process as its `Rollout` slice."""
        samples = self._take_samples(self.args.generation_batch_size) if self.accelerator.is_main_process else None
        return self._shared_rollout(self._dist.broadcast_object(samples), "train")

    def _shared_rollout(self, samples: list[RolloutSample], mode: str):
        """This process's `Rollout` slice of `samples` (every process holds them all), its metrics logged."""
        args = self.args
        names = self._reward_names(samples)
        rollout = rollout_of(
            samples,
            process_index=self._dist.process_index,
            num_processes=self._dist.num_processes,
            pad_token_id=vision.tokenizer_of(self.processing_class).pad_token_id,
            reward_names=names,
            num_generations=self._num_generations(mode),
            advantage_kwargs=dict(
                reward_weights=self._rollout_settings(mode).reward_weights,
                scale_rewards=args.scale_rewards,
                multi_objective_aggregation=args.multi_objective_aggregation,
            ),
            pad_to_multiple_of=args.pad_to_multiple_of,
            device=self.accelerator.device,
        )
        if vision.is_processor(self.processing_class):
            self._attach_images(rollout, samples)
        if args.beta != 0.0:
            chunk = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
            ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
            mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1)
            scoring = {"vision": rollout.vision} if rollout.vision is not None else {}
            with torch.no_grad():
                rollout.ref_logps = self._reference_logps_fn(chunk)(
                    ids, mask, rollout.completion_ids.size(1), **scoring
                )
        metrics = self._metrics[mode]
        if mode == "train":
            self.state.num_input_tokens_seen += rollout.num_tokens
            accounted = batch_metrics(
                samples, padded_positions(samples, self._dist.num_processes, args.pad_to_multiple_of)
            )
            for name, value in accounted.items():
                metrics[name].append(value)
            forwarded, trained = (
                accounted["batch/forwarded_tokens_per_step"],
                accounted["batch/trained_tokens_per_step"],
            )
            self._step_tokens = (forwarded, trained)
            metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        for name, value in rollout.metrics.items():
            metrics[name].append(value)
        share = len(samples) // self._dist.num_processes
        mine = [getattr(s, "extra", None) or {} for s in samples][self._dist.process_index * share :][:share]
        if self.agent is not None:  # the tool calls of this process's rows, for the completion records
            self._completion_log.add_tool_calls([extra.get("tool_calls", []) for extra in mine])
        for column in sorted({c for extra in mine for c in extra} - {"tool_calls"}):  # log_extra's columns
            self._completion_log.add_extra(column, [extra.get(column) for extra in mine])
        self._completion_log.add_rollout(rollout, names, self._dist)
        self._unscorable.check(rollout, mode)
        if mode == "train" and self.accelerator.is_main_process and hasattr(self.rollout_worker, "consumed"):
            self.rollout_worker.consumed(s.group_id for s in samples)
        return rollout

    def _attach_images(self, rollout, samples: list[RolloutSample]) -> None:
        """A vision-language model's image inputs for this process's rows, encoded from the samples' prompts as
        generation encoded them (checked against the samples' prompt tokens); the records keep the prompts' text."""
        share = len(samples) // self._dist.num_processes
        mine = samples[self._dist.process_index * share : (self._dist.process_index + 1) * share]
        prompts = [s.prompt for s in mine]
        if vision_prompts(prompts):
            prompt_ids = [split(s)[0] for s in mine]
            rollout.vision = _vision_rows(
                self.processing_class, prompts, prompt_ids, self._rollout_settings("train"), self.accelerator.device
            )
        rollout.prompts = [vision.without_images(p) for p in rollout.prompts]

    def _reward_names(self, samples: list[RolloutSample]) -> list[str]:
        if self._plugged_worker is None:
            return list(self.reward_func_names)
        names = dict.fromkeys(
            k.removeprefix("rewards/") for s in samples for k in s.metrics if k.startswith("rewards/")
        )
        return list(names)

    def _take_samples(self, count: int) -> list[RolloutSample]:
        """`count` samples no staler than max_staleness; the stale ones dropped (their prompts generated again),
        the worker's health checked while waiting."""
        metrics, taken = self._metrics["train"], []
        while len(taken) < count:
            started = time.time()
            while True:
                try:
                    sample = self.rollout_queue.get(timeout=0.2)
                    break
                except queue.Empty:
                    self.rollout_worker.check_health(self.args.heartbeat_stale_after_s)
            now = time.time()
            self._wait_s += now - started
            budget = getattr(self.args, "token_budget", None)
            if budget is not None and budget > 0 and len(sample.input_ids) > budget:
                logger.warning(
                    f"dropping a rollout sample of {len(sample.input_ids)} tokens: over token_budget={budget}"
                )
                metrics["batch/dropped_oversize_total"].append(1.0)
                continue
            staleness = self.model_version - int(sample.model_version)
            if staleness > self.args.max_staleness:
                metrics["sample/dropped_stale_total"].append(1.0)
                if hasattr(self.rollout_worker, "requeue"):
                    self.rollout_worker.requeue(sample.group_id)
                continue
            metrics["sample/staleness_mean"].append(float(staleness))
            metrics["sample/staleness_max"].append(float(staleness))
            metrics["sample/rollout_queue_size"].append(float(self.rollout_queue.qsize()))
            if getattr(sample, "enqueued_at", None) is not None:
                metrics["sample/time_in_queue_s"].append(now - sample.enqueued_at)
            last = getattr(sample, "last_model_version", None)
            metrics["sample/spanning_versions_total"].append(float(last is not None and last != sample.model_version))
            taken.append(sample)
        metrics["perf/rollout_wait_s"].append(self._wait_s)
        self._wait_s = 0.0
        return taken

    def _sync_weights(self) -> None:
        """Push the policy to the generator and move the version on (TRL's order: pause, barrier, send, barrier,
        resume, version + 1). The main process's pause and send share `weight_sync_timeout`; a push that fails or
        outlasts it stops every process with one line naming the target and the version (checkpoints already saved
        are kept: the push comes before the step's own save)."""
        main, transfer = self.accelerator.is_main_process, self.weight_transfer
        version = self.model_version + 1
        deadline = SyncDeadline(
            self.args.weight_sync_timeout, f"the weight sync of version {version} to {transfer_target(transfer)}"
        )
        error = None
        start = time.time()
        if main and transfer is not None:
            error = deadline.run(transfer.pause)
        paused = time.time()
        self.accelerator.wait_for_everyone()
        gathered = time.time()
        model = self.accelerator.unwrap_model(self.model)
        with sharding.full_parameters(model):  # ZeRO-3 / FSDP2: every process gathers, the main one sends
            if main and transfer is not None and error is None:
                pairs = [(name, p.detach()) for name, p in model.named_parameters()]
                error = deadline.run(lambda: transfer.send_weights(iter(pairs)))
        sent = time.time()
        error = self._dist.broadcast_object(error)  # also the barrier after the send
        if error is not None:
            self._sync_failed = True
            raise WeightSyncError(error)
        if main:
            if transfer is not None:
                transfer.resume()
            self.model_version = version
            if self.rollout_worker is not None:
                self.rollout_worker.update_model_version(self.model_version)
        metrics = self._metrics["train"]
        metrics["perf/weight_sync_s"].append(time.time() - start)
        metrics["perf/weight_sync_pause_s"].append(paused - start)
        metrics["perf/weight_sync_barrier_s"].append(gathered - paused)
        metrics["perf/weight_sync_transfer_s"].append(sent - gathered)

    def _stop_pipeline(self) -> None:
        if not self.accelerator.is_main_process:
            return
        if self.rollout_worker is not None:
            self.rollout_worker.stop()
        if self.weight_transfer is not None:
            if not self._sync_failed:
                self.weight_transfer.destroy()
            elif reason := SyncDeadline(10.0, "closing the weight transfer").run(self.weight_transfer.destroy):
                logger.warning(f"after the failed weight sync, {reason}")

    # -- logging, checkpoints ----------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        buffers = self._metrics["train"]
        if self.model.training and self.rollout_worker is not None:
            for values in drain(self.rollout_worker.metrics_queue):
                for name, value in values.items():
                    buffers[name].append(value)
        for name, values in list(buffers.items()):
            words = name.split("/")[-1].split("_")
            if values and (any(isinstance(v, tuple) for v in values) or {"total", "max", "min"} & set(words)):
                buffers[name] = [reduce_window(name, values)]
        super().log(logs, start_time)

    def _inner_training_loop(self, *args, **kwargs):
        try:
            return super()._inner_training_loop(*args, **kwargs)
        finally:
            self._stop_pipeline()

    @checkpoints.atomic_checkpoint
    def _save_checkpoint(self, model, trial):
        GRPOTrainer._save_checkpoint.__wrapped__(self, model, trial)
        if not self.args.should_save:
            return
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        state = {"model_version": self.model_version}
        if hasattr(self.rollout_worker, "state"):
            state["prompts"] = self.rollout_worker.state()
        with open(os.path.join(folder, STATE_FILE), "w") as f:
            json.dump(state, f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.isfile(path):
            warnings.warn(f"{path} is missing: the rollout worker starts from the first prompt", stacklevel=2)
            return
        with open(path) as f:
            self._resume_state = json.load(f)
        self.model_version = int(self._resume_state.get("model_version", 0))


class _Pipeline(TrainerCallback):
    """Starts the pipeline at train begin and syncs the weights every `weight_sync_steps` optimizer steps."""

    def __init__(self, trainer: AsyncGRPOTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer._start_pipeline()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.weight_sync_steps == 0:
            self.trainer._sync_weights()


# ---------------------------------------------------------------------------------------------------- helpers


def _with_images(row: dict, index: int):
    """A dataset row's prompt with its `image`/`images` put into it, as the rollout generated from it."""
    if not vision.has_image_column(row):
        return row["prompt"]
    return vision.attach_images(row["prompt"], vision.row_images(row, index, "batch"), index, "batch")


def vision_prompts(prompts: list) -> bool:
    return bool(prompts) and is_conversational(prompts[0]) and any(vision.prompt_images(p) for p in prompts)


def _scored_by_the_worker(prompts, completions, **kwargs):
    raise RuntimeError("rewards come from the plugged rollout worker's samples")


def _array(values: list, dtype: str):
    import numpy as np

    return np.asarray(values, dtype=dtype)


def _joined(parts: list[tuple]) -> tuple:
    """TRL's 8-tuples of several generation calls as one."""
    if len(parts) == 1:
        return parts[0]
    prompt_ids, completion_ids, completions, logprobs = [], [], [], []
    for p in parts:
        prompt_ids += p[0]
        completion_ids += p[1]
        completions += p[3]
        logprobs = None if logprobs is None or p[4] is None else logprobs + list(p[4])
    return prompt_ids, completion_ids, None, completions, logprobs, {}, None, []


def _without_vllm(args):
    import copy

    plain = copy.copy(args)
    plain.use_vllm = False
    return plain
