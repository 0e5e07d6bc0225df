from grpokit.models import load_tokenizer


def test_saved_tiny_tokenizer_round_trips_spaces(tiny_model_dir):
    # AutoTokenizer would load this Qwen2 checkpoint's generic tokenizer as Qwen2Tokenizer, which drops the spaces.
    tokenizer = load_tokenizer(tiny_model_dir, padding_side="left")
    text = "What is 2 + 3?"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert len(tokenizer(text)["input_ids"]) == len(text)  # one token per character
    assert tokenizer.padding_side == "left"
    assert tokenizer.chat_template is not None


def test_ignore_boolean_buffers_lists_exactly_the_boolean_ones(tiny_model):
    import torch

    from grpokit.models import ignore_boolean_buffers

    tiny_model.model.layers[1].register_buffer("causal_mask", torch.ones(2, 2, dtype=torch.bool))
    tiny_model.model.register_buffer("scale", torch.ones(1))  # not boolean: DDP broadcasts it
    assert ignore_boolean_buffers(tiny_model) == ["model.layers.1.causal_mask"]
    assert tiny_model._ddp_params_and_buffers_to_ignore == ["model.layers.1.causal_mask"]
