"""The sampler/learner ratio under truncated sampling, with identical weights: grpokit's learner (log-probabilities over
the sampler's kept set, `logprobs_over_kept_tokens`) beside TRL 1.16's formula (the whole vocabulary).

    python benchmarks/bench_truncated_sampling.py                         # transformers backend
    .venv-vllm/bin/python benchmarks/bench_truncated_sampling.py --vllm   # and the CPU vLLM server

For each setting (none, top_p 0.8, top_k 20, min_p 0.1, all three): 8 chat prompts x 4 completions of up to 32
tokens sampled at temperature 1 (float32), the sampler's log-probability of each sampled token taken from the sampler
itself (transformers: `generate`'s processed scores, i.e. after its warpers; vLLM: its `processed_logprobs`), then the
same tokens scored by grpokit's `score_tokens` with the same weights, once over the kept set and once over the whole
vocabulary. Prints the mean and the 5th/95th percentiles of the per-token ratio `exp(learner - sampler)` over every
sampled token. Default model: SmolLM2-135M-Instruct (`grpokit model smollm2`); `--model tiny` for the demo's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {
    "none": {},
    "top_p 0.8": {"top_p": 0.8},
    "top_k 20": {"top_k": 20},
    "min_p 0.1": {"min_p": 0.1},
    "all three": {"top_p": 0.8, "top_k": 20, "min_p": 0.1},
}
QUESTIONS = [
    "What is 12+7?",
    "Name a colour of the sky.",
    "Write one word that rhymes with cat.",
    "What is the capital of France?",
    "Give me a number between 1 and 10.",
    "Say hello in Spanish.",
    "What do bees make?",
    "How many legs has a spider?",
]
PER_PROMPT, MAX_TOKENS = 4, 32


def model_path(name: str, root: str) -> str:
    if name == "tiny":
        from grpokit.demo import prepare_demo

        return prepare_demo(os.path.join(root, "demo"))[0]
    from grpokit.gguf import smollm2

    return str(smollm2())


def prompts(tokenizer) -> list[list[int]]:
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def sample_transformers(model, tokenizer, filters: dict, eos: list[int], per_prompt=PER_PROMPT, tokens=MAX_TOKENS):
    """(prompt, completion, sampler logprobs) rows, sampled by `generate` with `filters`, `per_prompt` completions of
    up to `tokens` tokens for each of `prompts(tokenizer)`; the sampler's log-probabilities are those of `generate`'s
    processed scores (after its warpers)."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=filters.get("top_p", 1.0),
        top_k=filters.get("top_k", 0),
        min_p=filters.get("min_p"),
        max_new_tokens=tokens,
        num_return_sequences=per_prompt,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    rows = []
    for prompt in prompts(tokenizer):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), generation_config=config)
        sampled = out.sequences[:, len(prompt) :]
        logps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)  # (n, T, V) after warpers
        for i in range(sampled.size(0)):
            ids = sampled[i].tolist()
            end = next((t + 1 for t, token in enumerate(ids) if token in eos), len(ids))
            own = logps[i, torch.arange(end), sampled[i, :end]].tolist()
            rows.append((prompt, ids[:end], own))
    return rows


def sample_vllm(server_url: str, model: str, tokenizer, filters: dict, eos: list[int]):
    from _serve import free_port

    from grpokit.generation.vllm_server import VLLMServerGenerator

    sampling = {"temperature": 1.0, "max_tokens": MAX_TOKENS, "top_p": 1.0, "top_k": 0, "min_p": 0.0, **filters}
    generator = VLLMServerGenerator(
        base_url=server_url,
        timeout=120.0,
        group_port=free_port(),
        sampling=sampling,
        num_generations=PER_PROMPT,
        eos_token_ids=eos,
        model_name=model,
    )
    rows = [p for p in prompts(tokenizer) for _ in range(PER_PROMPT)]
    generated = generator.generate(rows)
    generator.close()
    return list(zip(rows, generated.completion_ids, generated.logprobs, strict=True))


def ratios(model, rows, truncation) -> torch.Tensor:
    """Per-token `exp(learner - sampler)` over every sampled token of `rows`."""
    from grpokit.scoring import score_tokens

    out = []
    for prompt, completion, sampler in rows:
        if not completion:
            continue
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            scores = score_tokens(model, ids, torch.ones_like(ids), len(completion), truncation=truncation)
        out.append((scores.logps[0] - torch.tensor(sampler)).exp())
    return torch.cat(out)


def summary(values: torch.Tensor) -> dict:
    q = torch.quantile(values.double(), torch.tensor([0.05, 0.95], dtype=torch.float64)).tolist()
    return {"mean": values.double().mean().item(), "p05": q[0], "p95": q[1], "tokens": values.numel()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--vllm", action="store_true", help="also the CPU vLLM server (run from .venv-vllm)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "truncated_sampling.json"))
    options = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpokit.algorithms.truncation import Truncation

    torch.manual_seed(0)
    root = tempfile.mkdtemp(prefix="truncated-")
    path = model_path(options.model, root)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    eos = [tokenizer.eos_token_id]
    backends = {"transformers": lambda filters: sample_transformers(model, tokenizer, filters, eos)}
    server = None
    if options.vllm:
        sys.path.insert(0, os.path.join(HERE, "..", "tests", "vllm_engine"))
        from _serve import running_server

        server = running_server(path, os.path.join(root, "vllm.log"), max_model_len=512)
        url = server.__enter__().url
        backends["vllm server"] = lambda filters: sample_vllm(url, path, tokenizer, filters, eos)
    results = []
    print(f"{'backend':13s} {'setting':10s} {'grpokit mean (p05-p95)':>28s} {'TRL formula mean (p05-p95)':>30s}")
    try:
        for backend, sample in backends.items():
            order = "vllm" if backend.startswith("vllm") else "transformers"
            for name, filters in SETTINGS.items():
                rows = sample(filters)
                kept = summary(ratios(model, rows, Truncation(**filters, order=order)))
                full = summary(ratios(model, rows, None))
                results.append({"backend": backend, "setting": name, "grpokit": kept, "trl_formula": full})
                print(
                    f"{backend:13s} {name:10s} {kept['mean']:>12.5f} ({kept['p05']:.4f}-{kept['p95']:.4f}) "
                    f"{full['mean']:>14.5f} ({full['p05']:.4f}-{full['p95']:.4f})  {kept['tokens']} tokens",
                    flush=True,
                )
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    os.makedirs(os.path.dirname(options.out), exist_ok=True)
    with open(options.out, "w") as fh:
        json.dump({"model": options.model, "results": results}, fh, indent=1)
    print(f"written {options.out}")


if __name__ == "__main__":
    main()
