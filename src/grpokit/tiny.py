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


MOE_FAMILIES = ("qwen3_moe", "mixtral", "olmoe")


def build_moe(tokenizer, family: str = "qwen3_moe", *, hidden_size: int = 32, experts: int = 8, seed: int = 0):
    """A random-init mixture-of-experts causal LM (Qwen3-MoE, Mixtral or OLMoE: 2 layers, `experts` experts, 2 per
    token) sized for CPU tests; its routers' weights are drawn at 0.5 scale so that tokens spread over the experts."""
    import torch
    from transformers import (
        MixtralConfig,
        MixtralForCausalLM,
        OlmoeConfig,
        OlmoeForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    if family == "qwen3_moe":
        config = Qwen3MoeConfig(
            **common, head_dim=8, intermediate_size=64, moe_intermediate_size=16, num_experts=experts
        )
        model_cls = Qwen3MoeForCausalLM
    elif family == "mixtral":
        config, model_cls = (
            MixtralConfig(**common, head_dim=8, intermediate_size=16, num_local_experts=experts),
            (MixtralForCausalLM),
        )
    elif family == "olmoe":
        config, model_cls = OlmoeConfig(**common, intermediate_size=16, num_experts=experts), OlmoeForCausalLM
    else:
        raise ValueError(f"family={family!r}: expected one of {MOE_FAMILIES}")
    torch.manual_seed(seed)
    model = model_cls(config)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("TopKRouter"):
                module.weight.normal_(0.0, 0.5)
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


# ---------------------------------------------------------------------------------------------------- vision-language

VLM_FAMILIES = ("llava", "llava_next", "idefics3", "gemma3")


def _vlm_template(image_text: str) -> str:
    """`CHAT_TEMPLATE` for content blocks: an image block renders as `image_text` (the processor expands it)."""
    return (
        "{% for message in messages %}{{ '<|' + message['role'] + '|>' }}"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '" + image_text + "' }}"
        "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{{ '<eos>' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )


def build_vlm(family: str = "llava", *, seed: int = 0, hidden_size: int = 32, num_heads: int = 4):
    """A random-init vision-language model of `family` (one of `VLM_FAMILIES`) and its real processor class over
    `build_tokenizer`'s characters plus the family's image tokens, with PIL image processors (no torchvision):
    `(model, processor)`. Images are resized to 28-32 pixels and become 4 image tokens each."""
    import torch
    from transformers import AddedToken

    tokenizer = build_tokenizer()
    text = dict(
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=2,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=512,
    )
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)

    def add_tokens(tokens, named=None):
        tokenizer.add_special_tokens(
            {"additional_special_tokens": [*SPECIAL_TOKENS[4:], *(AddedToken(t, special=True) for t in tokens)]}
        )
        if named:
            tokenizer._set_model_specific_special_tokens(special_tokens=named)

    if family == "llava":
        from transformers import (
            CLIPVisionConfig,
            LlavaConfig,
            LlavaForConditionalGeneration,
            LlavaProcessor,
            Qwen2Config,
        )
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

        add_tokens(["<image>"])
        image_processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
        processor = LlavaProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            patch_size=14,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            chat_template=_vlm_template("<image>"),
        )
        config = LlavaConfig(
            vision_config=CLIPVisionConfig(**vision, image_size=28, patch_size=14),
            text_config=Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, **text),
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
            vision_feature_select_strategy="default",
        )
        model_cls = LlavaForConditionalGeneration
    elif family == "llava_next":
        from transformers import (
            CLIPVisionConfig,
            LlavaNextConfig,
            LlavaNextForConditionalGeneration,
            LlavaNextProcessor,
            Qwen2Config,
        )
        from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

        add_tokens(["<image>"])
        pinpoints = [[28, 56], [56, 28], [56, 56]]  # an image becomes its base tile plus up to 2x2 tiles of 28
        image_processor = LlavaNextImageProcessorPil(
            size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, image_grid_pinpoints=pinpoints
        )
        processor = LlavaNextProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            patch_size=14,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            chat_template=_vlm_template("<image>"),
        )
        config = LlavaNextConfig(
            vision_config=CLIPVisionConfig(**vision, image_size=28, patch_size=14),
            text_config=Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True, **text),
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
            vision_feature_select_strategy="default",
            image_grid_pinpoints=pinpoints,
        )
        model_cls = LlavaNextForConditionalGeneration
    elif family == "idefics3":
        from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor, LlamaConfig
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        add_tokens(["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"])
        image_processor = Idefics3ImageProcessorPil(
            size={"longest_edge": 32}, max_image_size={"longest_edge": 32}, do_image_splitting=False
        )
        processor = Idefics3Processor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            image_seq_len=4,
            chat_template=_vlm_template("<image>"),
        )
        config = Idefics3Config(
            vision_config=dict(**vision, image_size=32, patch_size=8),
            text_config=LlamaConfig(vocab_size=len(tokenizer), **text),
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
            scale_factor=2,
        )
        model_cls = Idefics3ForConditionalGeneration
    elif family == "gemma3":
        from transformers import (
            Gemma3Config,
            Gemma3ForConditionalGeneration,
            Gemma3Processor,
            Gemma3TextConfig,
            SiglipVisionConfig,
        )
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        marks = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
        add_tokens(list(marks.values()), marks)
        processor = Gemma3Processor(
            image_processor=Gemma3ImageProcessorPil(size={"height": 28, "width": 28}),
            tokenizer=tokenizer,
            image_seq_length=4,
            chat_template=_vlm_template("<start_of_image>"),
        )
        config = Gemma3Config(
            vision_config=SiglipVisionConfig(**vision, image_size=28, patch_size=7),
            text_config=Gemma3TextConfig(vocab_size=len(tokenizer), head_dim=hidden_size // num_heads, **text),
            mm_tokens_per_image=4,
            image_token_id=tokenizer.convert_tokens_to_ids("<image_soft_token>"),
            boi_token_id=tokenizer.convert_tokens_to_ids("<start_of_image>"),
            eoi_token_id=tokenizer.convert_tokens_to_ids("<end_of_image>"),
        )
        model_cls = Gemma3ForConditionalGeneration
    else:
        raise ValueError(f"family={family!r}: one of {', '.join(VLM_FAMILIES)}")
    # The tokenizer's special tokens in both configs: transformers then has nothing to align (and no warning to give)
    # when a trainer starts.
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(config.get_text_config(), name, getattr(tokenizer, name))
    torch.manual_seed(seed)
    model = model_cls(config)
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, name, getattr(tokenizer, name))
    return model, processor


def random_image(seed: int = 0, size: tuple[int, int] = (30, 40)):
    """A random RGB PIL image (`size` = width, height)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def save_tiny_vlm(path, family: str = "llava", **kwargs):
    """Write a tiny vision-language model and its processor to `path` (usable as `model_name_or_path`)."""
    model, processor = build_vlm(family, **kwargs)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return str(path)
