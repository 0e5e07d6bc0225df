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
