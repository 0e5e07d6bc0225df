"""The asynchronous legs of `gpu_vs_trl.sh`: grpokit sync, grpokit async at max_staleness 0, 1 and 4, and TRL 1.16's
async trainer against one vLLM server on the same CUDA GPU, on `gpu_vs_trl.py`'s model (Qwen2.5-0.5B's shape) and
prompts (its `prepare` runs first when they are missing). One device call of at most 10 minutes:

    python benchmarks/gpu_async_vs_trl.py run --work DIR          # GPU
    python benchmarks/gpu_async_vs_trl.py run --work DIR --cpu    # the same legs on CPU, SmolLM2-135M, small

It starts `grpokit vllm-serve MODEL` (NCCL weight transfer, processed logprobs, bf16, 30 % of the GPU) on a free
port, then runs each leg in its own process against it (each stopped after GPU_VS_TRL_RUN_TIMEOUT seconds, 90 by
default): the same 8 generations per prompt, 64 completions per step forced to 128 tokens, bf16, beta 0, 2 warm-up
steps and 5 measured. Printed per leg: seconds per step (wall clock, between step ends), completion tokens/s, trainer
idle (seconds a step the trainer waits for samples: the generation itself in the sync leg, `perf/rollout_wait_s` in
the async ones), generator idle (seconds a step no generation call is running), staleness. TRL's async trainer
attends through FlashAttention-3 from the Hub (`kernels`); where that cannot be fetched (no network beyond PyPI) its
leg uses the CPU reference's stand-in (`trl_async_cpu.py`'s SDPA per segment) and says so: then its step time is not
TRL's as shipped.

`--cpu` checks the whole script end to end without a GPU: the CPU vLLM server (gloo weight transfer, float32),
SmolLM2-135M-Instruct (the real model, `grpokit model smollm2`), 16 completions of 32 tokens a step, 1 warm-up step and
3 measured. TRL's leg is skipped there and says why: its weight transfer to vLLM is NCCL only.
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

NUM_GENERATIONS = 8
# (completions a step, completion tokens, warm-up steps, measured steps, dtype) on a GPU and in the CPU check
WORKLOADS = {"gpu": (64, 128, 2, 5, "bfloat16"), "cpu": (16, 32, 1, 3, "float32")}
LEGS = ("grpokit-sync", "grpokit-async-0", "grpokit-async-1", "grpokit-async-4", "trl-async")


def leg(name: str, work: str, url: str, port: int, cpu: bool = False) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    completions, length, warmup, steps, dtype = WORKLOADS["cpu" if cpu else "gpu"]
    with open(os.path.join(work, "prompts.json")) as f:
        prompts = json.load(f)
    groups = completions // NUM_GENERATIONS
    dataset = Dataset.from_dict({"prompt": prompts[: (warmup + steps + 8) * groups]})
    model = os.path.join(work, "model")
    common = dict(
        output_dir=os.path.join(work, f"out-{name}"),
        per_device_train_batch_size=completions,
        num_generations=NUM_GENERATIONS,
        max_completion_length=length,
        learning_rate=1e-6,
        max_steps=warmup + steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=not cpu,
        use_cpu=cpu,
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
        args = AsyncGRPOConfig(**common, vllm_server_base_url=url, dtype=dtype, max_staleness=1)
        trainer = AsyncGRPOTrainer(model, reward, args=args, train_dataset=dataset)
    else:
        from grpokit import GRPOConfig, GRPOTrainer
        from grpokit.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

        server = dict(use_vllm=True, vllm_mode="server", vllm_server_base_url=url, vllm_group_port=port)
        server["generation_kwargs"] = {"min_tokens": length}
        model_kwargs = {"model_init_kwargs": {"dtype": dtype}}
        if name == "grpokit-sync":
            args = GRPOConfig(**common, **server, **model_kwargs, beta=0.0, loss_type="dapo")
            trainer = GRPOTrainer(model, reward, args=args, train_dataset=dataset)
        else:
            staleness = int(name.rsplit("-", 1)[1])
            args = AsyncGRPOConfig(**common, **server, **model_kwargs, max_staleness=staleness)
            trainer = AsyncGRPOTrainer(model, reward, args=args, train_dataset=dataset)
    ends, generating = [], []  # step ends; (start, end) of every generation call

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            ends.append(time.perf_counter())

    trainer.add_callback(Clock())
    if name != "trl-async" and trainer.generator is not None:  # the generator's busy spans, from any thread
        generate = trainer.generator.generate

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return generate(*args, **kwargs)
            finally:
                generating.append((start, time.perf_counter()))

        trainer.generator.generate = timed
    trainer.train()
    measured = list(zip(ends[warmup - 1 : -1], ends[warmup:], strict=True))
    step_times = [b - a for a, b in measured]
    logs = [row for row in trainer.state.log_history if "loss" in row][warmup:]
    lengths = [row.get("completions/mean_length", length) for row in logs]
    window = measured[-1][1] - measured[0][0]
    busy = sum(max(0.0, min(e, measured[-1][1]) - max(s, measured[0][0])) for s, e in generating)
    if name == "grpokit-sync":
        trainer_idle = busy / len(measured)  # the trainer waits while its round generates
    else:
        trainer_idle = statistics.mean(row.get("perf/rollout_wait_s", float("nan")) for row in logs)
    return {
        "leg": name,
        "step_s": statistics.median(step_times),
        "tokens_per_s": statistics.mean(lengths) * completions / statistics.median(step_times),
        "trainer_idle_s": trainer_idle,
        "generator_idle_s": (window - busy) / len(measured) if generating else float("nan"),
        "staleness_mean": statistics.mean(row.get("sample/staleness_mean", 0.0) for row in logs),
        "notes": notes,
    }


def run(work: str, cpu: bool = False) -> None:
    import torch

    from grpokit.cli.demo import demo_server  # starts grpokit vllm-serve and stops it

    if not cpu and not torch.cuda.is_available():
        raise SystemExit("gpu_async_vs_trl: no CUDA device; the runs need a GPU (--cpu: the CPU check)")
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "model")
    if cpu:
        prepare_cpu(work)
    elif not os.path.isdir(model):
        import gpu_vs_trl

        gpu_vs_trl.prepare(work)
    results = []
    log = os.path.join(work, "vllm-serve-async.log")
    server = dict(max_model_len=256, dtype="float32") if cpu else dict(max_model_len=1024, dtype="bfloat16")
    extra = [] if cpu else ["--gpu-memory-utilization", "0.3"]
    with demo_server(model, log, **server, extra=extra) as url:
        if url is None:
            raise SystemExit("gpu_async_vs_trl: vLLM is not installed in this environment")
        for name in LEGS:
            if cpu and name == "trl-async":
                print(f"{name:16s} skipped: TRL 1.16's weight transfer to vLLM is NCCL only (no CPU path)", flush=True)
                continue
            out = os.path.join(work, f"{name}.json")
            command = [sys.executable, os.path.abspath(__file__), "leg", "--work", work, "--name", name]
            command += ["--url", url, "--port", str(_free_port()), "--out", out] + (["--cpu"] if cpu else [])
            limit = float(os.environ.get("GPU_VS_TRL_RUN_TIMEOUT", "600" if cpu else "90"))
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=limit)
            except subprocess.TimeoutExpired:
                print(f"{name:16s} stopped after {limit:.0f} s (GPU_VS_TRL_RUN_TIMEOUT)", flush=True)
                continue
            if done.returncode != 0:
                print(done.stdout[-2000:], done.stderr[-5000:], file=sys.stderr)
                print(f"{name:16s} failed (output above)", flush=True)
                continue
            with open(out) as f:
                results.append(json.load(f))
            r = results[-1]
            print(
                f"{name:16s} step {r['step_s']:.3f} s, {r['tokens_per_s']:.0f} tok/s, trainer idle "
                f"{r['trainer_idle_s']:.3f} s/step, generator idle {r['generator_idle_s']:.3f} s/step, staleness "
                f"{r['staleness_mean']:.2f}",
                flush=True,
            )
            for note in r["notes"]:
                print(f"  note: {note}")
    print("\n| leg | s / step | completion tok/s | trainer idle s/step | generator idle s/step | staleness mean |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['leg']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | {r['trainer_idle_s']:.3f} | "
            f"{r['generator_idle_s']:.3f} | {r['staleness_mean']:.2f} |"
        )
    by = {r["leg"]: r for r in results}
    for name in ("grpokit-async-0", "grpokit-async-1", "grpokit-async-4"):
        if "grpokit-sync" in by and name in by:
            print(f"{name} / sync step time: {by[name]['step_s'] / by['grpokit-sync']['step_s']:.2f}")
    if "trl-async" in by and "grpokit-async-1" in by:
        ratio = by["trl-async"]["step_s"] / by["grpokit-async-1"]["step_s"]
        print(f"TRL async / grpokit async (max_staleness 1, TRL's leg's) step time: {ratio:.2f}")
    with open(os.path.join(work, "gpu_async_vs_trl.json"), "w") as f:
        json.dump(results, f, indent=1)


def prepare_cpu(work: str) -> None:
    """work/model: SmolLM2-135M-Instruct's folder (linked); work/prompts.json: 6-word prompts."""
    import gpu_vs_trl

    from grpokit.gguf import smollm2

    model = os.path.join(work, "model")
    if not os.path.exists(model):
        os.symlink(str(smollm2()), model)
    gpu_vs_trl.write_prompts(os.path.join(work, "prompts.json"), 6, 256, 1000)


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
    parser.add_argument("--cpu", action="store_true", help="the CPU check: CPU vLLM server, SmolLM2, small workload")
    cli = parser.parse_args()
    if cli.command == "run":
        run(cli.work, cli.cpu)
    else:
        with open(cli.out, "w") as f:
            json.dump(leg(cli.name, cli.work, cli.url, cli.port, cli.cpu), f)


if __name__ == "__main__":
    main()
