from grpokit.models import load_tokenizer


def test_saved_tiny_tokenizer_round_trips_spaces(tiny_model_dir):
    # AutoTokenizer would load this Qwen2 checkpoint's generic tokenizer as Qwen2Tokenizer, which drops the spaces.
    tokenizer = load_tokenizer(tiny_model_dir, padding_side="left")
    text = "What is 2 + 3?"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert len(tokenizer(text)["input_ids"]) == len(text)  # one token per character
    assert tokenizer.padding_side == "left"
    assert tokenizer.chat_template is not None
