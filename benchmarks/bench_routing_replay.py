"""Routing agreement between a mixture-of-experts sampler and its learner, and the log-probability gap with and
without routing replay (`routing_replay`), on tiny random Qwen3-MoE, Mixtral and OLMoE models (CPU).

    python benchmarks/bench_routing_replay.py [--hidden 64] [--experts 16]

The experts' weights are drawn at `--expert-scale` (default 0.3, against transformers' 0.02 initialisation) so that
experts differ as trained ones do; with near-identical random experts a token's expert hardly matters. Three known
mismatches, each with the learner in float32: the sampler in bfloat16 (same weights), a stale sampler (float32, every
weight moved by noise of 2 % of its tensor's scale, as an optimizer step might), and router drift (only the routers'
weights moved, by 10 %). For each:
16 completions of 24 tokens sampled with routes recorded (`grpokit.routing.RouteRecorder`), then scored by the
learner without replay and with it. Prints the share of (token, router) pairs the learner routes to the sampler's
experts by itself, and the mean and max |learner - sampler| log-probability of the sampled tokens both ways.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import zlib

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def sample(sampler, tokenizer, prompts, tokens: int):
    """(completions, sampler logprobs per row, routes per row), sampled with `generate`'s processed scores."""
    from transformers import GenerationConfig

    from grpokit import routing

    config = GenerationConfig(
        do_sample=True,
        top_k=0,  # the full distribution: what the learner scores
        max_new_tokens=tokens,
        eos_token_id=None,  # every completion runs its full length
        pad_token_id=tokenizer.pad_token_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    ids = torch.tensor(prompts)  # equal lengths: no padding
    recorder = routing.RouteRecorder()
    with recorder.recording(sampler, ids.size(0)), torch.no_grad():
        out = sampler.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    completions = out.sequences[:, ids.size(1) :]
    logps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
    own = logps.gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    routes = recorder.rows([ids.size(1)] * len(prompts), ids.size(1), [tokens] * len(prompts))
    return completions, own, routes


def measure(family: str, hidden: int, experts: int, mismatch: str, expert_scale: float) -> dict:
    from grpokit import routing
    from grpokit.scoring import score_tokens
    from grpokit.tiny import build_moe, build_tokenizer

    tokenizer = build_tokenizer()
    learner = build_moe(tokenizer, family, hidden_size=hidden, experts=experts).eval()
    with torch.no_grad():
        for name, param in learner.named_parameters():
            if ".experts." in name:
                param.normal_(0.0, expert_scale, generator=torch.Generator().manual_seed(zlib.crc32(name.encode())))
    if mismatch == "bf16 sampler":
        sampler = copy.deepcopy(learner).to(torch.bfloat16)
    else:
        sampler = copy.deepcopy(learner)
        generator = torch.Generator().manual_seed(1)
        routers = {id(r.weight) for r in routing.routers(sampler)}
        with torch.no_grad():
            for param in sampler.parameters():
                if mismatch == "stale sampler":
                    param.add_(torch.randn(param.shape, generator=generator) * 0.02 * param.std())
                elif id(param) in routers:
                    param.add_(torch.randn(param.shape, generator=generator) * 0.1 * param.std())
    torch.manual_seed(0)
    prompts = torch.randint(5, len(tokenizer) - 1, (16, 8), generator=torch.Generator().manual_seed(2)).tolist()
    completions, sampler_logps, routes = sample(sampler, tokenizer, prompts, 24)
    ids = torch.cat([torch.tensor(prompts), completions], dim=1)
    mask = torch.ones_like(ids)
    padded = routing.padded_routes(routes, [8] * 16, 8, 24)
    agreement = routing.Agreement()
    with torch.no_grad():
        plain = score_tokens(learner, ids, mask, 24).logps
        replayed = score_tokens(learner, ids, mask, 24, routes=padded, agreement=agreement).logps
    gap_plain = (plain - sampler_logps).abs()
    gap_replayed = (replayed - sampler_logps).abs()
    return {
        "family": family,
        "mismatch": mismatch,
        "agreement_without_replay": agreement.fraction,
        "gap_mean_without": gap_plain.mean().item(),
        "gap_max_without": gap_plain.max().item(),
        "gap_mean_with": gap_replayed.mean().item(),
        "gap_max_with": gap_replayed.max().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--expert-scale", type=float, default=0.3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "routing_replay.json"))
    options = parser.parse_args()
    from grpokit.tiny import MOE_FAMILIES

    results = []
    print(f"{'family':10s} {'mismatch':14s} {'routed alike':>12s} {'gap without (mean/max)':>24s} {'gap with':>18s}")
    for family in MOE_FAMILIES:
        for mismatch in ("bf16 sampler", "stale sampler", "router drift"):
            r = measure(family, options.hidden, options.experts, mismatch, options.expert_scale)
            results.append(r)
            print(
                f"{family:10s} {mismatch:14s} {r['agreement_without_replay']:12.4f} "
                f"{r['gap_mean_without']:>11.5f} / {r['gap_max_without']:<10.4f} "
                f"{r['gap_mean_with']:>8.5f} / {r['gap_max_with']:<8.4f}",
                flush=True,
            )
    os.makedirs(os.path.dirname(options.out), exist_ok=True)
    with open(options.out, "w") as fh:
        settings = {"hidden": options.hidden, "experts": options.experts, "expert_scale": options.expert_scale}
        json.dump({**settings, "results": results}, fh, indent=1)
    print(f"written {options.out}")


if __name__ == "__main__":
    main()
