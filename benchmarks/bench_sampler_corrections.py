"""What each sampler correction does to rollouts with a known mismatch: SmolLM2-135M-Instruct sampling in bfloat16
(transformers' `generate`, its processed log-probabilities), the learner scoring the same tokens in float32, the same
weights otherwise. TRL 1.16's four modes beside grpokit's geometric sequence weights, KL rejection and token veto.

    python benchmarks/bench_sampler_corrections.py [--per-prompt 8] [--tokens 48]

For each correction: the mean weight a token gets in the loss (a sequence weight counts for each of its tokens), the
share of tokens whose weight is 0 (masked or rejected), the share of sequences with every token at 0, the share of
tokens whose weight differs from its raw ratio (clamped), and the tokens' effective sample size
(sum w)^2 / (n sum w^2) (1: every token counts fully; a correction that leaves a few tokens with most of the weight
is near 0). Written to benchmarks/results/sampler_corrections.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_truncated_sampling import model_path, sample_transformers  # noqa: E402

CORRECTIONS = [
    ("none", {}),
    ("TRL token_truncate, max 3", {"mode": "token_truncate", "clip_max": 3.0}),
    ("TRL token_mask [0.5, 2]", {"mode": "token_mask", "clip_min": 0.5, "clip_max": 2.0}),
    ("TRL sequence_truncate, max 3", {"mode": "sequence_truncate", "clip_max": 3.0}),
    ("TRL sequence_mask, max 3 (TRL's default)", {"mode": "sequence_mask", "clip_max": 3.0}),
    ("TRL sequence_mask [0.5, 2]", {"mode": "sequence_mask", "clip_min": 0.5, "clip_max": 2.0}),
    ("geometric sequence_mask [0.99, 1.01]", {"mode": "sequence_mask", "clip_min": 0.99, "clip_max": 1.01, "geo": True}),
    ("geometric sequence_mask [0.999, 1.001]", {"mode": "sequence_mask", "clip_min": 0.999, "clip_max": 1.001, "geo": True}),
    ("KL rejection k3 mean > 1e-3", {"mode": "token_truncate", "clip_max": 3.0, "kl": (1e-3, "k3", "mean")}),
    ("KL rejection k3 max > 0.05", {"mode": "token_truncate", "clip_max": 3.0, "kl": (0.05, "k3", "max")}),
    ("token veto 0.8", {"mode": "token_truncate", "clip_max": 3.0, "veto": 0.8}),
]  # fmt: skip


def rollouts(path: str, tokenizer, per_prompt: int, tokens: int):
    """(learner logps, sampler logps, mask), each `(B, C)`: sampled by a bfloat16 copy, scored by float32."""
    from transformers import AutoModelForCausalLM

    from grpokit.scoring import score_tokens

    sampler = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    learner = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = []
    for prompt, completion, own in sample_transformers(
        sampler, tokenizer, {}, [tokenizer.eos_token_id], per_prompt, tokens
    ):
        full = torch.tensor([prompt + completion])
        with torch.no_grad():
            learned = score_tokens(learner, full, torch.ones_like(full), len(completion)).logps[0]
        rows.append((learned, torch.tensor(own)))
    width = max(len(r[0]) for r in rows)
    learner_logps = torch.zeros(len(rows), width)
    sampler_logps = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, (learned, own) in enumerate(rows):
        learner_logps[i, : len(learned)], sampler_logps[i, : len(own)], mask[i, : len(own)] = learned, own, 1
    return learner_logps, sampler_logps, mask


def effect(old, sampling, mask, correction: dict) -> dict:
    from grpokit.algorithms.importance_sampling import sequence_rejections, vllm_importance_weights

    active = mask.bool()
    raw = (old - sampling).masked_fill(~active, 0.0).exp()
    if not correction:
        weights = torch.ones_like(old)
    else:
        weights = vllm_importance_weights(
            old,
            sampling,
            mask,
            mode=correction["mode"],
            clip_min=correction.get("clip_min"),
            clip_max=correction.get("clip_max"),
            geometric=correction.get("geo", False),
        ).expand_as(old)
        if "kl" in correction or "veto" in correction:
            threshold, estimator, reduction = correction.get("kl", (None, "k3", "mean"))
            keep = sequence_rejections(
                old,
                sampling,
                mask,
                kl_threshold=threshold,
                kl_estimator=estimator,
                kl_reduction=reduction,
                token_veto=correction.get("veto"),
            )[0]
            weights = weights * keep
    w = weights[active]
    if correction and correction["mode"].startswith("token"):
        changed = ((w != raw[active]) & (w != 0)).float().mean().item()
    else:
        changed = float("nan")
    zero_rows = ((weights * mask).abs().sum(-1) == 0).float().mean().item()
    return {
        "mean_weight": w.mean().item(),
        "tokens_zero": (w == 0).float().mean().item(),
        "sequences_zero": zero_rows,
        "tokens_clamped": changed,
        "ess": (w.sum() ** 2 / (w.numel() * (w**2).sum())).item() if w.abs().sum() > 0 else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-prompt", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "sampler_corrections.json"))
    options = parser.parse_args()
    import tempfile

    from transformers import AutoTokenizer

    torch.manual_seed(0)
    path = model_path("smollm2", tempfile.mkdtemp())
    tokenizer = AutoTokenizer.from_pretrained(path)
    old, sampling, mask = rollouts(path, tokenizer, options.per_prompt, options.tokens)
    delta = (old - sampling)[mask.bool()]
    print(
        f"{mask.size(0)} completions, {int(mask.sum())} tokens; learner (fp32) - sampler (bf16) log-probability: "
        f"mean {delta.mean():+.4f}, mean |.| {delta.abs().mean():.4f}, max |.| {delta.abs().max():.3f}"
    )
    print(f"{'correction':42s} {'mean w':>7s} {'tok 0':>6s} {'seq 0':>6s} {'clamped':>8s} {'ESS':>6s}")
    results = []
    for name, correction in CORRECTIONS:
        row = effect(old, sampling, mask, correction)
        results.append({"correction": name, **row})
        print(
            f"{name:42s} {row['mean_weight']:7.3f} {row['tokens_zero']:6.1%} {row['sequences_zero']:6.1%} "
            + (f"{row['tokens_clamped']:8.1%}" if row["tokens_clamped"] == row["tokens_clamped"] else f"{'-':>8s}")
            + f" {row['ess']:6.3f}"
        )
    os.makedirs(os.path.dirname(options.out), exist_ok=True)
    summary = {"tokens": int(mask.sum()), "completions": mask.size(0), "gap_mean_abs": delta.abs().mean().item()}
    with open(options.out, "w") as fh:
        json.dump({"rollouts": summary, "results": results}, fh, indent=1)
    print(f"written {options.out}")


if __name__ == "__main__":
    main()
