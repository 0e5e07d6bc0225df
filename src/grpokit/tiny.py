"""Tiny models and tokenizers built locally, with no download: for tests, benchmarks and the built-in demo."""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]

# A minimal chat template: one marker token per role, messages end with <eos>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<eos>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tokenizer(extra_chars: str = ""):
    """A character-level `PreTrainedTokenizerFast` over printable ASCII plus `extra_chars`, with a chat template."""

    chars = sorted(set(string.printable) - set("\x0b\x0c\r") | set(extra_chars))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character is its own token; special tokens are matched first by the added-token machinery.
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return _as_transformers_tokenizer(tok)


def _as_transformers_tokenizer(tok: Tokenizer):
    """Wrap a `tokenizers.Tokenizer` over SPECIAL_TOKENS' vocabulary with the special tokens, the chat template and
    left padding."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


TOOL_TOKENS = ["<|tool|>", "<tool_call>", "</tool_call>"]

# A tool-capable template in the Hermes / Qwen style: the tools' schemas in a system turn, an assistant's calls as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call> after its text, tool results in <|tool|> turns.
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|system|>' }}{% for tool in tools %}{{ tool | tojson }}{% endfor %}{{ '<eos>' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>' + (message['content'] or '') }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set arguments = call['function']['arguments'] %}"
    "{{ '<tool_call>{\"name\": ' + (call['function']['name'] | tojson) + ', \"arguments\": ' }}"
    "{{ arguments if arguments is string else (arguments | tojson) }}{{ '}</tool_call>' }}"
    "{% endfor %}{{ '<eos>' }}"
    "{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<eos>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_tool_tokenizer(extra_chars: str = ""):
    """`build_tokenizer`'s character-level tokenizer plus the single tokens <|tool|>, <tool_call> and </tool_call>
    (ids after the other special tokens and the characters), with `TOOL_CHAT_TEMPLATE`: for agent tests and demos."""
    from transformers import AddedToken

    tokenizer = build_tokenizer(extra_chars)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [*SPECIAL_TOKENS[4:], *(AddedToken(t, special=True) for t in TOOL_TOKENS)]}
    )
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def build_word_tokenizer(vocab_size: int = 32768):
    """A word-level `PreTrainedTokenizerFast` with `vocab_size` entries: the special tokens, then the words
    `w0`, `w1`, ... (split on whitespace, decoded with spaces between words). For benchmarks that need a large
    vocabulary without downloading one."""

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for i in range(vocab_size - len(vocab)):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return _as_transformers_tokenizer(tok)


def build_model(
    tokenizer,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    vocab_size: int | None = None,
    arch: str = "qwen2",
):
    """A random-init causal LM (Qwen2 or Llama) sized for CPU tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    config = config_cls(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def build_reward_model(tokenizer, *, hidden_size: int = 16, seed: int = 0):
    """A random-init one-label Qwen2 sequence classifier (a reward model) over `tokenizer`'s vocabulary."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2ForSequenceClassification(config)


def save_tiny(path, **model_kwargs):
    """Write a tiny model and its tokenizer to `path` (a directory usable as `model_name_or_path`)."""
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, **model_kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
