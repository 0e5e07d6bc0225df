"""vLLM colocate mode: a vLLM engine inside each training process (`distributed_executor_backend="external_launcher"`).

Every training process runs its own engine over the same weights. With `vllm_tensor_parallel_size = T > 1`, the
processes form groups of T consecutive ranks whose engines shard one model between them: a group gathers its
members' prompts, its engines generate all of them together (each engine returns the same completions), and each
rank keeps its own share. The engines' seeds differ per group (`process_index // T`), so groups sample differently.
The engines of a group must sample the same tokens, or their schedulers part and their collectives stop matching;
vLLM draws its sampling noise from the process's random state, which the trainer seeds per process and training
consumes, so a group's engines sample from a random state of their own, seeded with the group's seed and carried
from round to round (`_GroupRandomState`).

Weights: `sync_weights(model)` loads the policy's weights (LoRA merged, names as vLLM loads them) into the engine
through vLLM's in-place reload, which re-runs the post-load processing of every layer; on CPU a tied `lm_head` keeps
a pre-packed copy of the embedding matrix that the reload does not refresh, so it is re-processed here (as the gloo
engine of server mode does).

Sleep mode (`vllm_enable_sleep_mode`): the engine sleeps (weights and KV cache released) outside generation and is
woken before each round; where the platform cannot sleep (vLLM's CPU build), it stays awake with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import weakref
from collections.abc import Sequence

import torch

from grpokit.dist import LOCAL, Collective

from .base import Generated, GenerationError
from .tokens import cut_after_eos
from .vllm_common import (
    CPU_BLOCK_SIZE,
    LOGPROBS_MODE,
    policy_weights,
    reprocess_tied_embeddings,
    require_vllm,
    trainable_weights,
)

logger = logging.getLogger(__name__)


class VLLMColocateGenerator:
    """Generation with a `vllm.LLM` inside this training process.

    Args:
        model_path: the checkpoint vLLM starts from (a local folder or hub id with the policy's architecture; the
            policy's own weights are pushed before the first round).
        sampling: keyword arguments of `vllm.SamplingParams` (`vllm_common.sampling_kwargs`).
        eos_token_ids: every id that ends a completion.
        dtype: the engine's dtype ("float32", "bfloat16", ... or "auto").
        tensor_parallel_size, gpu_memory_utilization, max_model_length, model_impl, enable_sleep_mode: as the
            `vllm_*` fields of `GRPOConfig`.
        max_num_seqs: the most sequences one engine generates at once (the rows of one generation round).
        seed: the run's seed; each tensor-parallel group adds its index.
        trust_remote_code: as for transformers' `from_pretrained`.
        dist: the training processes.
        enforce_eager: skip vLLM's compilation (and CUDA graphs). Off by default, on CPU too: compiling costs about
            15 s at engine start and saves ~20 % of each generate call there (2 cores, 6-token prompts: 0.285 ->
            0.230 s per step's generation); tests that start many engines turn it on.
    """

    def __init__(
        self,
        *,
        model_path: str,
        sampling: dict,
        eos_token_ids: Sequence[int],
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.3,
        max_model_length: int | None = None,
        model_impl: str = "vllm",
        enable_sleep_mode: bool = False,
        max_num_seqs: int | None = None,
        seed: int = 0,
        trust_remote_code: bool = False,
        dist: Collective = LOCAL,
        enforce_eager: bool = False,
    ):
        require_vllm()
        if dist.num_processes % tensor_parallel_size != 0:
            raise ValueError(
                f"vllm_tensor_parallel_size={tensor_parallel_size} must divide the number of processes "
                f"({dist.num_processes})"
            )
        self.sampling = dict(sampling)
        self.eos_token_ids = list(eos_token_ids)
        self.tp = tensor_parallel_size
        self.dist = dist
        self.tp_group = _tensor_parallel_group(tensor_parallel_size, dist)
        self.sleep_mode = enable_sleep_mode and _can_sleep()
        if enable_sleep_mode and not self.sleep_mode:
            logger.warning(
                "vllm_enable_sleep_mode=True has no effect here: this vLLM platform cannot sleep (it needs CUDA); "
                "the engine keeps its memory between rounds"
            )
        self.last_sync_seconds = 0.0
        self._pushed = None  # (the model last pushed, its trainable weights then): later pushes of it are partial
        _check_head_size(model_path)
        from vllm import LLM

        engine_kwargs = dict(
            model=model_path,
            dtype=dtype,
            tensor_parallel_size=self.tp,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_length,
            model_impl=model_impl,
            enable_sleep_mode=self.sleep_mode,
            max_num_seqs=max_num_seqs,
            seed=seed + dist.process_index // self.tp,  # each tensor-parallel group samples differently
            distributed_executor_backend="external_launcher",
            logprobs_mode=LOGPROBS_MODE,
            enforce_eager=enforce_eager,
            max_num_batched_tokens=4096,  # as TRL: vLLM's memory profiler misjudges its much larger default
            **_cpu_block_size(),
            trust_remote_code=trust_remote_code,
        )
        start = time.perf_counter()
        try:
            with _launcher_environment():
                self.llm = LLM(**engine_kwargs)
        except Exception as error:  # vLLM's own errors are long; the log has the whole traceback
            logger.exception("the vLLM engine failed to start")
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise GenerationError(f"the vLLM engine failed to start for {model_path}: {first}") from error
        self.start_seconds = time.perf_counter() - start
        self._group_random = _GroupRandomState(engine_kwargs["seed"]) if self.tp > 1 else None
        self._awake = True
        self._sleep()

    # ------------------------------------------------------------------------------------------------ weights

    @torch.no_grad()
    def sync_weights(self, model) -> None:
        """Load `model`'s current weights into the engine (every process, each into its own engine)."""
        start = time.perf_counter()
        self._wake(["weights"])
        runner = self._model_runner()
        # After a first push of this model, only the layers training can change (trainable now or at the last push):
        # frozen weights and LoRA's untouched base layers keep what the engine holds (vLLM's reload puts a layer that
        # gets no weights back as it was). Everything for another model object, and after a sleep.
        trainable = trainable_weights(model, getattr(runner.get_model(), "packed_modules_mapping", None) or {})
        pushed = self._pushed
        only = pushed[1] | trainable if pushed and pushed[0]() is model and not self.sleep_mode else None
        with _quiet_reload_log():  # it warns, each push, about layers with no weights of their own (rotary, tied head)
            runner.reload_weights(weights_iterator=policy_weights(model, only), is_checkpoint_format=True)
        self._pushed = (weakref.ref(model), trainable)
        reprocess_tied_embeddings(runner.get_model())  # the CPU build's packed copy of a tied LM head
        self.llm.reset_prefix_cache()  # cached prompt blocks hold keys and values of the old weights
        # and cached image embeddings the old vision tower's: reload_weights empties the runner's encoder cache but
        # not the scheduler's record of it, which then skips the encoder for an image it thinks cached ("Encoder
        # cache miss"); this resets both.
        self.llm.llm_engine.reset_encoder_cache()
        self.last_sync_seconds = time.perf_counter() - start

    def _model_runner(self):
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner

    # ------------------------------------------------------------------------------------------------ generation

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], vision=None) -> Generated:
        """Completions of every prompt. A vision-language model's prompt with images (`vision`, see
        `grpokit.vision.EnginePrompt`) goes to vLLM with its images and its placeholders unexpanded: vLLM expands
        them with its own processor, and must arrive at the same prompt tokens as the trainer's processor.

        Each run of consecutive equal text prompts (a group's num_generations copies) is one request with n = the
        run's length: completions, their order and their logprobs are those of the copies; the engine's sampling
        stream is the same (its children are scheduled in the copies' order). With a per-request `seed` in
        generation_kwargs the copies are sent as they are: vLLM would give the n samples seeds seed + i (distinct
        completions) where the copies, as in TRL, all sample with the same seed (identical completions).

        vLLM does not detokenize (`detokenize=False`, unless there are `stop` strings, which need the text, or
        generation_kwargs set it): only token ids are used, and its incremental detokenizer took about a tenth of a
        round (16 completions of 32 tokens, 2 CPU cores)."""
        from vllm import SamplingParams

        engine = vision.engine_prompts if vision is not None else [None] * len(prompt_ids)
        rows = [
            (list(p), e.token_ids, e.images) if e is not None and e.images else (list(p), list(p), [])
            for p, e in zip(prompt_ids, engine, strict=True)
        ]
        parts = self._gather_group(rows)  # the prompts of each rank of this tensor-parallel group
        prompts = [p for part in parts for p in part]
        kwargs = dict(self.sampling)
        if not kwargs.get("stop"):  # stop strings need vLLM's text; the trainer decodes the token ids itself
            kwargs.setdefault("detokenize", False)
        if isinstance(kwargs.get("structured_outputs"), dict):
            from vllm.sampling_params import StructuredOutputsParams

            kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
        runs = _repeat_runs(prompts) if kwargs.get("seed") is None and kwargs.get("n", 1) == 1 else None
        requests = prompts if runs is None else [prompts[start] for start, _ in runs]
        if runs is None:
            params = SamplingParams(**kwargs)
        else:
            params = [SamplingParams(**{**kwargs, "n": count}) for _, count in runs]
        self._wake(None)
        try:
            with self._group_random.active() if self._group_random else contextlib.nullcontext():
                outputs = self.llm.generate(
                    [
                        {"prompt_token_ids": ids, **({"multi_modal_data": {"image": pictures}} if pictures else {})}
                        for _, ids, pictures in requests
                    ],
                    params,
                    use_tqdm=False,
                )
        finally:
            self._sleep()
        for i, (output, (expected, _, pictures)) in enumerate(zip(outputs, requests, strict=True)):
            if pictures and list(output.prompt_token_ids) != expected:
                raise GenerationError(
                    f"vLLM encoded image prompt {i} as {len(output.prompt_token_ids)} tokens where the trainer's "
                    f"processor gives {len(expected)}: its processor settings differ from the trainer's (check the "
                    "model directory's processor config), and training would score other tokens than vLLM saw"
                )
        completions, logprobs = [], []
        for output in outputs:
            for sample in output.outputs:  # a run's n samples in order (n = 1 for a row of its own)
                ids = cut_after_eos(list(sample.token_ids), self.eos_token_ids)
                completions.append(ids)
                logprobs.append(_sampled_logprobs(sample, len(ids)))
        if len(completions) != len(prompts):
            raise RuntimeError(
                f"vLLM returned {len(completions)} completions for {len(prompts)} prompts; generation_kwargs must not "
                "set n (each prompt is already repeated num_generations times)"
            )
        if self.tp > 1:  # keep this rank's share of the group's prompts
            member = self.dist.process_index % self.tp
            start = sum(len(part) for part in parts[:member])
            end = start + len(parts[member])
            completions, logprobs = completions[start:end], logprobs[start:end]
        return Generated(completions, logprobs)

    def _gather_group(self, rows: list) -> list[list]:
        if self.tp == 1:
            return [list(rows)]
        gathered: list = [None] * self.tp
        torch.distributed.all_gather_object(gathered, list(rows), group=self.tp_group)
        return gathered

    # ------------------------------------------------------------------------------------------------ sleep mode

    def _sleep(self) -> None:
        if self.sleep_mode and self._awake:
            self.llm.sleep(level=2)  # weights are pushed again before the next round anyway
            self._awake = False

    def _wake(self, tags: list[str] | None) -> None:
        if self.sleep_mode:
            self.llm.wake_up(tags=tags)
            self._awake = tags is None

    def close(self) -> None:
        self.llm = None


class _GroupRandomState:
    """The random state a tensor-parallel group's engines sample from, the same on every member: `active()` puts it
    in place of the process's own (CPU, and the current CUDA device's where there is one) around a generate call,
    keeps what sampling left of it for the next call, and gives the process its own state back."""

    def __init__(self, seed: int):
        self._cuda = torch.cuda.current_device() if torch.cuda.is_available() else None
        self._cpu_state = torch.Generator().manual_seed(seed).get_state()
        self._cuda_state = None
        if self._cuda is not None:
            self._cuda_state = torch.Generator(device=f"cuda:{self._cuda}").manual_seed(seed).get_state()

    @contextlib.contextmanager
    def active(self):
        with torch.random.fork_rng(devices=[] if self._cuda is None else [self._cuda]):
            torch.random.set_rng_state(self._cpu_state)
            if self._cuda is not None:
                torch.cuda.set_rng_state(self._cuda_state, self._cuda)
            try:
                yield
            finally:
                self._cpu_state = torch.random.get_rng_state()
                if self._cuda is not None:
                    self._cuda_state = torch.cuda.get_rng_state(self._cuda)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


@contextlib.contextmanager
def _quiet_reload_log():
    # a filter, not setLevel: each setLevel clears the cached levels of every logger (about 2.5 ms a push)
    names = ("vllm.model_executor.model_loader.reload.layerwise", "vllm.model_executor.model_loader.reload.inplace")
    loggers = [logging.getLogger(name) for name in names]  # the second names the weights a partial push leaves
    for each in loggers:
        each.addFilter(_errors_only)
    try:
        yield
    finally:
        for each in loggers:
            each.removeFilter(_errors_only)


def _cpu_block_size() -> dict:
    return {} if torch.cuda.is_available() else {"block_size": CPU_BLOCK_SIZE}


def _repeat_runs(prompts: list[tuple]) -> list[tuple[int, int]]:
    """(first index, length) of each run of consecutive equal text-only prompts (each prompt comes num_generations
    times in a row): one vLLM request with n = the run's length per run, so the engine receives the prompt once,
    where G requests with n = 1 would each carry it. Completions come back in the same order as for the copies."""
    runs: list[tuple[int, int]] = []
    for i, (_, ids, pictures) in enumerate(prompts):
        if runs and not pictures and not prompts[i - 1][2] and ids == prompts[i - 1][1]:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _sampled_logprobs(sample, length: int) -> list[float]:
    """The logprob of each sampled token (NaN where vLLM gave none), for the first `length` tokens."""
    values = []
    for position, token in enumerate(sample.token_ids[:length]):
        entry = sample.logprobs[position].get(token) if sample.logprobs else None
        values.append(float(entry.logprob) if entry is not None else float("nan"))
    return values


def _check_head_size(model_path: str) -> None:
    """vLLM's CPU attention takes only some head sizes; say so in one line instead of failing inside the engine."""
    if torch.cuda.is_available():
        return
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = AutoConfig.from_pretrained(model_path)
    config = getattr(config, "text_config", None) or config
    heads = getattr(config, "num_attention_heads", None)
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim is not None and head_dim not in supported:
        raise GenerationError(
            f"{model_path}: head size {head_dim} is not one vLLM's CPU attention supports ({supported}); use a "
            "model whose hidden_size / num_attention_heads is one of them, or generate without vLLM on CPU"
        )


def _tensor_parallel_group(size: int, dist: Collective):
    """This rank's group of `size` consecutive ranks (None for size 1). Every rank creates every group, as torch
    requires."""
    if size == 1:
        return None
    groups = [torch.distributed.new_group(list(range(i, i + size))) for i in range(0, dist.num_processes, size)]
    return groups[dist.process_index // size]


def _can_sleep() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


@contextlib.contextmanager
def _launcher_environment():
    """`external_launcher` reads the torch.distributed rendezvous from the environment; a plain single process (no
    accelerate/torchrun) has none, so it gets a one-process world on a free local port while the engine starts (and
    nothing after: a child process, e.g. another run, must not inherit a port this process holds)."""
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            defaults["MASTER_PORT"] = str(s.getsockname()[1])
    added = [key for key in defaults if key not in os.environ]
    for key in added:
        os.environ[key] = defaults[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)
