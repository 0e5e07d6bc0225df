"""The asynchronous legs of `gpu_vs_trl.sh`: grpokit sync, grpokit async and TRL 1.16's async trainer against one
vLLM server on the same CUDA GPU, on `gpu_vs_trl.py`'s model and prompts (its `prepare` must have run).

    python benchmarks/gpu_async_vs_trl.py run --work DIR

It starts `grpokit vllm-serve MODEL` (NCCL weight transfer, processed logprobs, bf16, 30 % of the GPU) on a free
port, then runs each leg in its own process against it: the same 8 generations per prompt, 64 completions per step
forced to 128 tokens, bf16, beta 0, 2 warm-up steps and 6 measured. Printed per leg: seconds per step (wall clock,
between step ends), completion tokens/s, the trainer's wait for samples (async legs), staleness. TRL's async trainer
attends through FlashAttention-3 from the Hub (`kernels`); where that cannot be fetched (no network beyond PyPI) its
leg uses the CPU reference's stand-in (`trl_async_cpu.py`'s SDPA per segment) and says so: then its step time is not
TRL's as shipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NUM_GENERATIONS, COMPLETIONS_PER_STEP, COMPLETION_LENGTH = 8, 64, 128
WARMUP, STEPS = 2, 6
LEGS = ("grpokit-sync", "grpokit-async", "trl-async")


def leg(name: str, work: str, url: str, port: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    with open(os.path.join(work, "prompts.json")) as f:
        prompts = json.load(f)
    groups = COMPLETIONS_PER_STEP // NUM_GENERATIONS
    dataset = Dataset.from_dict({"prompt": prompts[: (WARMUP + STEPS + 8) * groups]})
    model = os.path.join(work, "model")
    common = dict(
        output_dir=os.path.join(work, f"out-{name}"),
        per_device_train_batch_size=COMPLETIONS_PER_STEP,
        num_generations=NUM_GENERATIONS,
        max_completion_length=COMPLETION_LENGTH,
        learning_rate=1e-6,
        max_steps=WARMUP + STEPS,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=True,
        gradient_checkpointing=False,
        seed=0,
        disable_tqdm=True,
    )
    notes = []

    def reward(completions, **kwargs):
        return [float(len(str(c)) % 7) for c in completions]

    if name == "trl-async":
        from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

        try:
            from trl.experimental.async_grpo.packing import _flash_attn

            _flash_attn()
        except Exception as error:  # noqa: BLE001 - no FA3 kernel here: a stand-in, said
            _attend_by_segments()
            notes.append(f"FlashAttention-3 unavailable ({type(error).__name__}); TRL attends by SDPA per segment")
        args = AsyncGRPOConfig(**common, vllm_server_base_url=url, dtype="bfloat16", max_staleness=1)
        trainer = AsyncGRPOTrainer(model, reward, args=args, train_dataset=dataset)
    else:
        from grpokit import GRPOConfig, GRPOTrainer
        from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

        server = dict(use_vllm=True, vllm_mode="server", vllm_server_base_url=url, vllm_group_port=port)
        server["generation_kwargs"] = {"min_tokens": COMPLETION_LENGTH}
        model_kwargs = {"model_init_kwargs": {"dtype": "bfloat16"}}
        if name == "grpokit-sync":
            args = GRPOConfig(**common, **server, **model_kwargs, beta=0.0, loss_type="dapo")
            trainer = GRPOTrainer(model, reward, args=args, train_dataset=dataset)
        else:
            args = AsyncGRPOConfig(**common, **server, **model_kwargs, max_staleness=1)
            trainer = AsyncGRPOTrainer(model, reward, args=args, train_dataset=dataset)
    ends = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            ends.append(time.perf_counter())

    trainer.add_callback(Clock())
    trainer.train()
    steps = [b - a for a, b in zip(ends[WARMUP - 1 : -1], ends[WARMUP:], strict=True)]
    logs = [row for row in trainer.state.log_history if "loss" in row][WARMUP:]
    lengths = [row.get("completions/mean_length", COMPLETION_LENGTH) for row in logs]
    return {
        "leg": name,
        "step_s": statistics.median(steps),
        "tokens_per_s": statistics.mean(lengths) * COMPLETIONS_PER_STEP / statistics.median(steps),
        "rollout_wait_s": statistics.mean(row.get("perf/rollout_wait_s", float("nan")) for row in logs),
        "staleness_mean": statistics.mean(row.get("sample/staleness_mean", 0.0) for row in logs),
        "notes": notes,
    }


def run(work: str) -> None:
    import torch

    from grpokit.cli.demo import demo_server  # starts grpokit vllm-serve and stops it

    if not torch.cuda.is_available():
        raise SystemExit("gpu_async_vs_trl: no CUDA device; the runs need a GPU")
    model = os.path.join(work, "model")
    results = []
    log = os.path.join(work, "vllm-serve-async.log")
    with demo_server(
        model, log, max_model_len=1024, dtype="bfloat16", extra=["--gpu-memory-utilization", "0.3"]
    ) as url:
        for name in LEGS:
            out = os.path.join(work, f"{name}.json")
            command = [sys.executable, os.path.abspath(__file__), "leg", "--work", work, "--name", name]
            command += ["--url", url, "--port", str(_free_port()), "--out", out]
            limit = float(os.environ.get("GPU_VS_TRL_RUN_TIMEOUT", "150"))
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
            except subprocess.TimeoutExpired:
                print(f"{name:14s} stopped after {limit:.0f} s (GPU_VS_TRL_RUN_TIMEOUT)", flush=True)
                continue
            if done.returncode != 0:
                print(done.stdout[-2000:], done.stderr[-5000:], file=sys.stderr)
                print(f"{name:14s} failed (output above)", flush=True)
                continue
            with open(out) as f:
                results.append(json.load(f))
            r = results[-1]
            print(
                f"{name:14s} step {r['step_s']:.3f} s, {r['tokens_per_s']:.0f} tok/s, waited for samples "
                f"{r['rollout_wait_s']:.3f} s/step, staleness {r['staleness_mean']:.2f}",
                flush=True,
            )
            for note in r["notes"]:
                print(f"  note: {note}")
    by = {r["leg"]: r for r in results}
    if "grpokit-sync" in by and "grpokit-async" in by:
        print(f"grpokit async / sync step time: {by['grpokit-async']['step_s'] / by['grpokit-sync']['step_s']:.2f}")
    if "trl-async" in by and "grpokit-async" in by:
        print(f"TRL async / grpokit async step time: {by['trl-async']['step_s'] / by['grpokit-async']['step_s']:.2f}")
    with open(os.path.join(work, "gpu_async_vs_trl.json"), "w") as f:
        json.dump(results, f, indent=1)


def _attend_by_segments() -> None:
    """TRL's tree attention without FlashAttention-3: causal SDPA over each packed segment (keys gathered by the
    tree index, the query block aligned to the end of its keys, as FA's causal mode), and no peak-FLOPs lookup."""
    import torch
    import trl.experimental.async_grpo.async_grpo_trainer as trainer_module
    import trl.experimental.async_grpo.packing as packing

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=True, **_):
        out = torch.empty_like(q)
        repeat = q.shape[1] // k.shape[1]
        for i in range(len(cu_q) - 1):
            q0, q1, k0, k1 = (int(x) for x in (cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]))
            if q1 > q0:
                keep = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=q.device).tril(k1 - k0 - (q1 - q0))
                keys = k[k0:k1].repeat_interleave(repeat, 1).transpose(0, 1)
                values = v[k0:k1].repeat_interleave(repeat, 1).transpose(0, 1)
                out[q0:q1] = torch.nn.functional.scaled_dot_product_attention(
                    q[q0:q1].transpose(0, 1), keys, values, attn_mask=keep, scale=softmax_scale
                ).transpose(0, 1)
        return out

    packing._flash_attn = lambda: type("Varlen", (), {"flash_attn_varlen_func": staticmethod(varlen)})
    trainer_module.get_peak_flops_per_device = lambda *args, **kwargs: None


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["run", "leg"])
    parser.add_argument("--work", required=True)
    parser.add_argument("--name", choices=LEGS)
    parser.add_argument("--url")
    parser.add_argument("--port", type=int)
    parser.add_argument("--out")
    cli = parser.parse_args()
    if cli.command == "run":
        run(cli.work)
    else:
        with open(cli.out, "w") as f:
            json.dump(leg(cli.name, cli.work, cli.url, cli.port), f)


if __name__ == "__main__":
    main()
