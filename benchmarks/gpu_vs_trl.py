"""grpokit against TRL 1.16 on one CUDA GPU, side by side: transformers generation and vLLM colocate, bf16.

    python benchmarks/gpu_vs_trl.py prepare --work DIR    # the models and prompts (no GPU needed)
    python benchmarks/gpu_vs_trl.py run --work DIR        # the runs (needs CUDA), then the table

`benchmarks/gpu_vs_trl.sh` builds the environment and calls both. The model is a random-init Qwen2 with
Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query / 2 KV heads of 64, MLP 4864, 151,936-word vocabulary, tied
embeddings; 0.49B parameters), saved in bfloat16 with a word-level tokenizer built offline; prompts are 64 random
words. Both sides train it with the same settings: bf16 weights (loaded in bfloat16, `bf16=True`), beta 0, loss
dapo, 8 generations per prompt, 64 completions per optimizer step (4 prompts), every completion forced to 128 tokens
(transformers: `min_new_tokens`, vLLM: `min_tokens`), no gradient checkpointing; with vLLM, colocate mode with
`vllm_gpu_memory_utilization=0.3` and the importance-sampling correction at its default (on).

Each run is its own process: 2 warm-up steps dropped, then the median of 4 steps. Printed per run: step time, the
phases (generation incl. the weight push; every log-probability forward; backward; optimizer), completion tokens/s,
peak GPU memory (torch's peak reserved bytes in that process: the policy, optimizer state, activations and, with
vLLM, the engine's weights and KV cache, all allocated through torch), and the MFU of the training phase: the matmul
FLOPs the training truly needs (forward + backward on the completion tokens, each prompt once per group, LM head
included: `bench_grpo.step_flops`) over the time of the training phase (every log-probability pass, backward and
optimizer step; so a side that scores twice pays for it) and the GPU's bf16 dense peak (989 TFLOP/s for H100/H200
SXM; otherwise the best bf16 matmul measured in the process). Then the ratios TRL / grpokit (step time) and grpokit /
TRL (memory).

The real-shape legs (`GPU_VS_TRL_LEGS`, default all: `qwen-transformers,qwen-vllm,smollm2-6,smollm2-128`): SmolLM2-135M-
Instruct's shape (Llama: hidden 576, 30 layers, 9 query / 3 KV heads of 64, MLP 1536, 49,152-word vocabulary, tied
embeddings), random weights built here (the GPU machine reaches no index and takes little from the checkout; speed
needs the shapes, not the weights), trained as `bench_grpo.py`'s `real-short` / `real-long` workloads on CPU: 6- or
128-word prompts, 8 generations, 16 completions of 32 tokens a step, learning rate 1e-5, transformers generation,
`bf16=True` over float32 weights (as a TRL user writes it).

TRL's side runs as shipped; only when its own weight push to vLLM fails (TRL 1.16 supports vLLM up to 0.31, grpokit
needs 0.32) does it go through vLLM's in-place reload instead (`bench_grpo.patch_trl_weight_sync`), said in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_grpo  # noqa: E402  (the phase timer and the FLOP count; imports neither grpokit nor trl at load)

NUM_GENERATIONS = 8
COMPLETIONS_PER_STEP = 64
PROMPT_WORDS = 64
COMPLETION_LENGTH = 128
WARMUP, STEPS = 2, 4
NOMINAL_BF16 = {"H100": 989e12, "H200": 989e12, "H800": 989e12, "A100": 312e12, "L40S": 362e12}


# The real-shape legs: leg -> prompt words; what they share
SMOLLM2_LEGS = {"smollm2-6": 6, "smollm2-128": 128}
SMOLLM2 = dict(completions=16, length=32, learning_rate=1e-5)


def save_random_model(path: str, architecture: str, vocab: int, dtype: str, **shape) -> None:
    """A random-init causal LM (`architecture`: "llama" or "qwen2") of `shape`, in `dtype`, with a `vocab`-word
    tokenizer built offline, saved under `path` (skipped when already there)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpokit.tiny import build_word_tokenizer

    if os.path.exists(os.path.join(path, "config.json")):
        print(f"model: {path} (already built)")
        return
    tokenizer = build_word_tokenizer(vocab)
    ids = {f"{t}_token_id": getattr(tokenizer, f"{t}_token_id") for t in ("pad", "eos", "bos")}
    config = AutoConfig.for_model(architecture, vocab_size=len(tokenizer), tie_word_embeddings=True, **ids, **shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, dtype))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    print(f"model: {path}, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, {dtype}")


def write_prompts(path: str, words: int, count: int, vocab: int) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        json.dump([" ".join(f"w{rng.randrange(vocab)}" for _ in range(words)) for _ in range(count)], f)


def prepare_smollm2(work: str) -> None:
    """A random-init model with SmolLM2-135M-Instruct's shape (float32) and a 49,152-word tokenizer, work/smollm2;
    prompts of 6 and 128 words in work/prompts-smollm2-{6,128}.json."""
    shape = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9)
    shape.update(num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5)
    save_random_model(os.path.join(work, "smollm2"), "llama", 49152, "float32", **shape)
    for words in SMOLLM2_LEGS.values():
        write_prompts(os.path.join(work, f"prompts-smollm2-{words}.json"), words, 256, 49000)


def prepare(work: str) -> None:
    """Model (random init, Qwen2.5-0.5B's shape, bf16) and tokenizer under work/model; prompts in work/prompts.json;
    the real-shape legs' model and prompts (`prepare_smollm2`)."""
    prepare_smollm2(work)
    shape = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14)
    shape.update(num_key_value_heads=2, max_position_embeddings=1024)
    save_random_model(os.path.join(work, "model"), "qwen2", 151936, "bfloat16", **shape)
    write_prompts(os.path.join(work, "prompts.json"), PROMPT_WORDS, 512, 150000)


def synced(owner, attribute: str) -> None:
    """Make `owner.attribute` wait for the GPU before returning, so the phase timer sees the work it started."""
    import torch

    original = getattr(owner, attribute)

    def call(*args, **kwargs):
        result = original(*args, **kwargs)
        torch.cuda.synchronize()
        return result

    setattr(owner, attribute, call)


def bf16_peak() -> tuple[float, str]:
    import torch

    name = torch.cuda.get_device_name()
    for key, value in NOMINAL_BF16.items():
        if key in name:
            return value, f"{name}: nominal bf16 dense {value / 1e12:.0f} TFLOP/s"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        a @ a
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    peak = 2 * 8192**3 / best
    return peak, f"{name}: measured bf16 matmul {peak / 1e12:.0f} TFLOP/s"


def worker(side: str, generation: str, work: str) -> dict:
    """One run. `generation`: "transformers" or "vllm" (the 0.5B model), or a real-shape leg ("smollm2-6", ...)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback

    if side == "grpokit":
        from grpokit import GRPOConfig, GRPOTrainer
    else:
        from trl import GRPOConfig, GRPOTrainer
    real = generation in SMOLLM2_LEGS
    path = os.path.join(work, "smollm2" if real else "model")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32 if real else torch.bfloat16)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path, padding_side="left")
    prompt_words = SMOLLM2_LEGS[generation] if real else PROMPT_WORDS
    completions = SMOLLM2["completions"] if real else COMPLETIONS_PER_STEP
    length = SMOLLM2["length"] if real else COMPLETION_LENGTH
    with open(os.path.join(work, f"prompts-smollm2-{prompt_words}.json" if real else "prompts.json")) as f:
        prompts = json.load(f)
    groups = completions // NUM_GENERATIONS
    dataset = Dataset.from_dict({"prompt": prompts[: (WARMUP + STEPS) * groups]})
    vllm = generation == "vllm"
    values = dict(
        output_dir=os.path.join(work, f"out-{side}-{generation}"),
        per_device_train_batch_size=completions,
        gradient_accumulation_steps=1,
        num_generations=NUM_GENERATIONS,
        max_completion_length=length,
        generation_kwargs={"min_tokens" if vllm else "min_new_tokens": length},
        beta=0.0,
        loss_type="dapo",
        learning_rate=SMOLLM2["learning_rate"] if real else 1e-6,
        max_steps=WARMUP + STEPS,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=True,
        gradient_checkpointing=False,
        seed=0,
        disable_tqdm=True,
        log_completions=False,
    )
    if vllm:
        values.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
    values.update(json.loads(os.environ.get("GPU_VS_TRL_CONFIG", "{}")))  # e.g. {"use_cpu": true}: a CPU smoke test
    timer = bench_grpo.PhaseTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[bench_grpo.reward_function(timer)],
        args=GRPOConfig(**values),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    notes = []
    if side == "grpokit":
        synced(trainer.generator, "generate")
        if vllm:
            synced(trainer.generator, "sync_weights")
        import grpokit.trainer as module

        synced(module, "score_tokens")
    else:
        synced(trainer, "_generate_single_turn")
        synced(trainer, "_get_per_token_logps_and_entropies")
        if vllm:
            fall_back_to_inplace_reload(trainer.vllm_generation, notes)
    synced(trainer.accelerator, "backward")
    (bench_grpo.instrument_grpokit if side == "grpokit" else bench_grpo.instrument_trl)(trainer, timer)

    class Sync(TrainerCallback):  # step boundaries after the GPU's work, before the timer's marks
        def on_step_begin(self, args, state, control, **kwargs):
            torch.cuda.synchronize()

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()

    trainer.add_callback(Sync())
    trainer.add_callback(timer.callback())
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    measured = timer.steps[WARMUP:]
    median = {k: statistics.median(s.get(k, 0.0) for s in measured) for k in {k for s in measured for k in s}}
    config = model.config.to_dict()
    _, training = bench_grpo.step_flops(config, prompt_words, length, groups, NUM_GENERATIONS, parts=True)
    peak, peak_note = bf16_peak()
    train_seconds = median.get("logprobs", 0.0) + median.get("backward", 0.0) + median.get("optimizer", 0.0)
    return {
        "side": side,
        "generation": generation,
        "median": median,
        "tokens_per_s": median["tokens"] / median["step"],
        "peak_gpu_gib": torch.cuda.max_memory_reserved() / 2**30,
        "mfu_train": training / train_seconds / peak if train_seconds else float("nan"),
        "peak_note": peak_note,
        "notes": notes,
    }


def fall_back_to_inplace_reload(vllm_generation, notes: list) -> None:
    """TRL's own weight push first; if it fails (vLLM newer than TRL 1.16 supports), vLLM's in-place reload."""
    own = vllm_generation.sync_weights

    def sync_weights():
        try:
            own()
        except Exception as error:  # noqa: BLE001 (any failure of TRL's push: say it and use the reload)
            notes.append(f"TRL's weight push failed ({type(error).__name__}: {error}); vLLM's in-place reload used")
            bench_grpo.patch_trl_weight_sync(vllm_generation)
            vllm_generation.sync_weights()

    vllm_generation.sync_weights = sync_weights


def run(work: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu_vs_trl: no CUDA device (torch.cuda.is_available() is False); the runs need a GPU")
    results = []
    legs = os.environ.get("GPU_VS_TRL_LEGS", "qwen-transformers,qwen-vllm," + ",".join(SMOLLM2_LEGS)).split(",")
    for generation in (leg.removeprefix("qwen-") for leg in legs):
        for side in ("grpokit", "trl"):
            out = os.path.join(work, f"{side}-{generation}.json")
            start = time.perf_counter()
            command = [sys.executable, os.path.abspath(__file__), "worker", "--work", work]
            command += ["--side", side, "--generation", generation, "--out", out]
            limit = float(os.environ.get("GPU_VS_TRL_RUN_TIMEOUT", "150"))
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
            except subprocess.TimeoutExpired:
                print(f"{generation:12s} {side:7s} stopped after {limit:.0f} s (GPU_VS_TRL_RUN_TIMEOUT)", flush=True)
                continue
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-6000:], file=sys.stderr)
                raise SystemExit(f"gpu_vs_trl: the {side} run with {generation} generation failed (output above)")
            with open(out) as f:
                result = json.load(f)
            results.append(result)
            m = result["median"]
            print(
                f"{generation:12s} {side:7s} step {m['step']:.3f} s, {result['tokens_per_s']:.0f} tok/s, peak GPU "
                f"{result['peak_gpu_gib']:.1f} GiB, MFU(train) {result['mfu_train']:.1%}  (run {time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            for note in result["notes"][:1]:
                print(f"  note: {note}")
    print_table(results)
    with open(os.path.join(work, "gpu_vs_trl.json"), "w") as f:
        json.dump(results, f, indent=1)


def print_table(results: list[dict]) -> None:
    phases = ("generation", "logprobs", "backward", "optimizer", "other")
    print("\n| generation | run | step s | " + " | ".join(phases) + " | tok/s | peak GPU GiB | MFU train |")
    print("|---" * (len(phases) + 6) + "|")
    by = {(r["generation"], r["side"]): r for r in results}
    for generation in dict.fromkeys(r["generation"] for r in results):
        for side in ("grpokit", "trl"):
            r = by.get((generation, side))
            if r is None:
                continue
            m = r["median"]
            cells = [f"{m['step']:.3f}", *(f"{m.get(p, 0.0):.3f}" for p in phases)]
            cells += [f"{r['tokens_per_s']:.0f}", f"{r['peak_gpu_gib']:.1f}", f"{r['mfu_train']:.1%}"]
            print(f"| {generation} | {side} | " + " | ".join(cells) + " |")
        ours, theirs = by.get((generation, "grpokit")), by.get((generation, "trl"))
        if ours is None or theirs is None:
            continue
        speed = theirs["median"]["step"] / ours["median"]["step"]
        memory = ours["peak_gpu_gib"] / theirs["peak_gpu_gib"]
        print(
            f"| {generation} | **TRL / grpokit step time** | **{speed:.2f}x** | grpokit / TRL peak GPU {memory:.2f} |"
        )
    if results:
        print(f"\n{results[0]['peak_note']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["prepare", "run", "worker"])
    parser.add_argument("--work", required=True)
    parser.add_argument("--side", choices=["grpokit", "trl"])
    parser.add_argument("--generation", choices=["transformers", "vllm", *SMOLLM2_LEGS])
    parser.add_argument("--out")
    cli = parser.parse_args()
    if cli.command == "prepare":
        prepare(cli.work)
    elif cli.command == "run":
        run(cli.work)
    else:
        with open(cli.out, "w") as f:
            json.dump(worker(cli.side, cli.generation, cli.work), f)


if __name__ == "__main__":
    main()
