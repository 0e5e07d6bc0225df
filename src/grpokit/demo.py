"""The built-in demo's task: a tiny model learns, with GRPO, to answer a digit prompt `7=` by repeating the digit.

Everything is built locally (a random-init model and a character tokenizer), so `grpokit train` with no arguments
runs offline. A random policy almost never emits the right digit (reward ~0.01); the policy reaches >= 0.6 in a few
minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import random

ANSWER_LENGTH = 4


def copy_digit_reward(prompts, completions, **kwargs) -> list[float]:
    """Fraction of the first 4 completion characters equal to the prompt's digit.

    >>> copy_digit_reward(["7="], ["77x7"])
    [0.75]
    """
    rewards = []
    for prompt, completion in zip(prompts, completions, strict=True):
        text = completion if isinstance(completion, str) else completion[0]["content"]
        digit = prompt.rstrip("=")[-1]
        rewards.append(sum(ch == digit for ch in text[:ANSWER_LENGTH]) / ANSWER_LENGTH)
    return rewards


def prepare_demo(workdir: str, *, rows: int = 4000, seed: int = 0) -> tuple[str, str]:
    """Write the initial tiny model and the prompt dataset under `workdir`; return (model dir, dataset file)."""
    from grpokit.tiny import save_tiny

    model_dir = os.path.join(workdir, "initial_model")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        save_tiny(model_dir, hidden_size=64, num_layers=2, num_heads=2, seed=seed)  # head_dim 32: vLLM CPU needs >= 32
    data_path = os.path.join(workdir, "digits.jsonl")
    rng = random.Random(seed)
    # Written aside and moved into place: under a launch, every process writes it (the first one first) while the
    # first may already be reading it; a reader sees the old file or the new one, never a half-written one.
    partial = f"{data_path}.{os.getpid()}.partial"
    with open(partial, "w", encoding="utf-8") as fh:
        for _ in range(rows):
            fh.write(json.dumps({"prompt": f"{rng.randrange(10)}="}) + "\n")
    os.replace(partial, data_path)
    return model_dir, data_path


# ---- `grpokit train --demo tools`: a tiny model learns to use a tool
#
# Each prompt hides a digit in a vault that only the `open_vault` tool of the row's environment can read. The reward
# is 0.5 when the model opened the vault and the digit came back to it as a tool turn, 1 when it then answered. The
# model starts from a few seconds of supervised warm-up on the chat format (as agent RL starts from an instruct
# model): it calls the tool on about 15% of the prompts and answers at once on the rest, so the reward starts near
# 0.15; GRPO takes it to ~1 within about a hundred steps.
#
# The two answers have different shapes in the warm-up: one digit (the one read) after a tool turn, three at once.
# With the same shape, GRPO's push against answering at once also reached the answer after the tool, on the tiny
# model: for some sampling paths (seed 0 on an AVX2 CPU; seed 4 for 60 steps) it learned to call the tool and then
# say nothing, and stayed at a reward of 0.5. With distinct shapes, seeds 0-15 all passed 0.89 by step 80.

VAULT_CALL = '{"name": "open_vault", "arguments": {}}'  # the call's JSON, as the chat template writes it: one token
_VAULT_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
_VAULT_ADDED = ["<tool_call>", "</tool_call>", VAULT_CALL, "open_vault"]
_VAULT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>' }}{% for tool in tools %}{{ tool['function']['name'] }}{% endfor %}"
    "{{ '<eos>' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '<|assistant|>' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}{{ '<tool_call>' }}"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{{ '</tool_call>' }}{% endfor %}{{ '<eos>' }}"
    "{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<eos>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


class Vault:
    """The tools demo's environment: `reset` puts the row's digit in the vault; `open_vault` reads it."""

    def reset(self, secret: str, **row) -> None:
        self.secret, self.opened = secret, 0

    def open_vault(self) -> str:
        """Open the vault and read the digit inside."""
        self.opened += 1
        return self.secret


def vault_reward(completions, **kwargs) -> list[float]:
    """0.5 when the completion holds the vault's answer as a tool turn (the model opened it and read the digit), and
    0.5 more when an assistant turn after it starts with a digit; 0.0 without the tool.

    >>> vault_reward([[{"role": "assistant", "content": ""}, {"role": "tool", "content": "4"},
    ...                {"role": "assistant", "content": "7"}], [{"role": "assistant", "content": "7"}],
    ...               [{"role": "assistant", "content": ""}, {"role": "tool", "content": "4"}]])
    [1.0, 0.0, 0.5]
    """
    rewards = []
    for messages in completions:
        roles = [m.get("role") for m in messages]
        if "tool" not in roles:
            rewards.append(0.0)
            continue
        after = [m for m in messages[roles.index("tool") :] if m.get("role") == "assistant"]
        answered = any((m.get("content") or "").strip()[:1].isdigit() for m in after)
        rewards.append(1.0 if answered else 0.5)
    return rewards


def build_vault_tokenizer():
    """A 23-token tokenizer: the chat markers, the digits, `?`, the tool-call delimiters, and the vault call's
    JSON and the tool's name as single tokens (a random or barely warmed-up model could not spell them out)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AddedToken, PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(_VAULT_SPECIALS)}
    for ch in "0123456789?":
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        additional_special_tokens=[*_VAULT_SPECIALS[4:], *(AddedToken(t, special=True) for t in _VAULT_ADDED)],
    )
    fast.chat_template = _VAULT_TEMPLATE
    fast.padding_side = "left"
    return fast


def warm_up(model, tokenizer, *, steps: int = 80, call_rate: float = 0.15, seed: int = 0) -> float:
    """Supervised steps on the format only: the tool called on `call_rate` of the examples, then the digit read as the
    answer; elsewhere three random digits at once. Returns the last loss."""
    import torch

    rng = random.Random(seed)
    torch.manual_seed(seed)
    schema = [{"type": "function", "function": {"name": "open_vault"}}]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "?"}], tools=schema, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    ids_of = tokenizer.convert_tokens_to_ids
    eos, assistant, tool = ids_of("<eos>"), ids_of("<|assistant|>"), ids_of("<|tool|>")
    call = [ids_of("<tool_call>"), ids_of(VAULT_CALL), ids_of("</tool_call>"), eos]

    def digits(n):
        return [ids_of(str(rng.randrange(10))) for _ in range(n)]

    def example():
        answer = [*digits(3), eos]
        if rng.random() < call_rate:
            secret = digits(1)
            turn, answer = [tool, *secret, eos, assistant], [*secret, eos]
            return prompt + call + turn + answer, [0] * len(prompt) + [1] * 4 + [0] * 4 + [1] * 2
        return prompt + answer, [0] * len(prompt) + [1] * 4

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        batch = [example() for _ in range(32)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([i + [0] * (width - len(i)) for i, _ in batch])
        weights = torch.tensor([m + [0] * (width - len(m)) for _, m in batch], dtype=torch.float32)
        attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (losses * weights[:, 1:]).sum() / weights[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def prepare_tools_demo(workdir: str, *, rows: int = 4000, seed: int = 0) -> tuple[str, str]:
    """Write the warmed-up tiny model and the vault prompts under `workdir`; return (model dir, dataset file)."""
    from grpokit.tiny import build_model

    model_dir = os.path.join(workdir, "initial_model")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        tokenizer = build_vault_tokenizer()
        model = build_model(tokenizer, hidden_size=64, num_layers=2, num_heads=2, seed=seed)
        warm_up(model, tokenizer, seed=seed)
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    data_path = os.path.join(workdir, "vault.jsonl")
    rng = random.Random(seed)
    partial = f"{data_path}.{os.getpid()}.partial"
    with open(partial, "w", encoding="utf-8") as fh:
        for _ in range(rows):
            fh.write(json.dumps({"prompt": [{"role": "user", "content": "?"}], "secret": str(rng.randrange(10))}))
            fh.write("\n")
    os.replace(partial, data_path)
    return model_dir, data_path


# ---- `grpokit train --demo real`: a real pretrained chat model learns a verifiable skill
#
# SmolLM2-135M-Instruct (see grpokit.gguf) mostly knows one-digit sums but says them in a sentence ("4 + 8 = 12",
# "The answer is 12."). The skill it learns here is the answer alone: the reward is 1 when the reply is the sum and
# nothing else. The prompt shows the form once (a user turn "What is 3 + 4?" answered "7"), as a few-shot prompt
# would; without it the form was never sampled (0 of 64 tries at temperature 1, with each of 7 prompts tried), and a
# reward nobody earns teaches nothing. With it, greedy replies are the sum alone on about a quarter of the held-out
# sums. The 99 one-digit sums other than the example are split once: 32 held out (never trained on, scored greedily
# before and after training), 67 to train on.

SUM_EXAMPLE = (3, 4)
HELD_OUT = 32


def sum_pairs(seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train pairs, held-out pairs) of one-digit sums (the prompt's example left out), the same split for a seed."""
    pairs = [(a, b) for a in range(10) for b in range(10) if (a, b) != SUM_EXAMPLE]
    random.Random(seed).shuffle(pairs)
    return pairs[HELD_OUT:], pairs[:HELD_OUT]


def sum_row(a: int, b: int) -> dict:
    """A prompt (the example exchange, then the question) and its answer."""
    x, y = SUM_EXAMPLE
    prompt = [
        {"role": "user", "content": f"What is {x} + {y}?"},
        {"role": "assistant", "content": str(x + y)},
        {"role": "user", "content": f"What is {a} + {b}?"},
    ]
    return {"prompt": prompt, "answer": str(a + b)}


def sum_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the reply is the expected sum alone (spaces and a final period aside), else 0.0.

    >>> sum_reward([[{"role": "assistant", "content": " 12."}], [{"role": "assistant", "content": "4 + 8 = 12"}]],
    ...            ["12", "12"])
    [1.0, 0.0]
    """
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        rewards.append(1.0 if text.strip().removesuffix(".").strip() == expected else 0.0)
    return rewards


def prepare_real_demo(workdir: str, *, rows: int = 4000, seed: int = 0) -> tuple[str, str, str]:
    """SmolLM2-135M-Instruct (made once from its wheel, cached) and the sums: (model dir, train file, held-out file)."""
    from grpokit.gguf import smollm2

    model_dir = smollm2()
    train, held_out = sum_pairs(seed)
    rng = random.Random(seed)
    paths = []
    for name, lines in (("sums.jsonl", [rng.choice(train) for _ in range(rows)]), ("held_out.jsonl", held_out)):
        path = os.path.join(workdir, name)
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "w", encoding="utf-8") as fh:
            for a, b in lines:
                fh.write(json.dumps(sum_row(a, b)) + "\n")
        os.replace(partial, path)
        paths.append(path)
    return model_dir, paths[0], paths[1]


def greedy_accuracy(model, tokenizer, rows: list[dict], *, max_new_tokens: int = 8) -> float:
    """The fraction of `rows` (prompt messages, answer) that `model` answers right, greedily, in one batch."""
    import torch

    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    finally:
        tokenizer.padding_side = side
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    model.train(was_training)
    replies = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(sum_reward(replies, [r["answer"] for r in rows])) / len(rows)


def held_out_callback(path: str):
    """A TrainerCallback that scores the rows of `path` greedily when training begins and ends, prints both and
    keeps them (`.before`, `.after`, `.steps`)."""
    from transformers import TrainerCallback

    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]

    class HeldOutAccuracy(TrainerCallback):
        before = after = None
        steps = 0

        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.is_world_process_zero and self.before is None:
                self.before = greedy_accuracy(model, _tokenizer(processing_class), rows)
                print(
                    f"held-out accuracy (greedy, {len(rows)} sums never trained on) before training: {self.before:.2f}"
                )

        def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            if state.is_world_process_zero:
                self.after, self.steps = greedy_accuracy(model, _tokenizer(processing_class), rows), state.global_step
                print(
                    f"held-out accuracy (greedy) after {self.steps} steps: {self.after:.2f} (before: {self.before:.2f})"
                )

    return HeldOutAccuracy()


def _tokenizer(processing_class):
    return getattr(processing_class, "tokenizer", processing_class)
