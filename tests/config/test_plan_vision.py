"""`grpokit config plan` for a local vision-language model: the image tokens one image becomes (from config.json and
the processor config, counted by hand below and checked against the processor itself), added to the sequence of
the activation estimate when max_prompt_length is not set."""

import pytest
from _config_helpers import plan_rows

from grpokit import vision
from grpokit.tiny import build_vlm, random_image, save_tiny_vlm

# Tokens one image becomes in the tiny families (grpokit.tiny.build_vlm), by hand:
# LLaVA: 28-pixel images in 14-pixel patches, (28 / 14)^2 = 4 (the CLS token dropped: strategy "default").
# Idefics3: image_seq_len 4 plus <fake_token_around_image>, <global-img> and a closing <fake_token_around_image>.
# Gemma3: 4 soft tokens between <start_of_image> and <end_of_image>, a blank line ("\n\n") each side, which the
# character-level tiny tokenizer writes as 2 tokens each (a real Gemma tokenizer as 1: the plan counts that).
EXPECTED = {"llava": 4, "idefics3": 7, "gemma3": 8}
CHARACTER_LEVEL_EXTRA = {"llava": 0, "idefics3": 0, "gemma3": 2}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_image_tokens_per_image(cli, tmp_path, family):
    path = save_tiny_vlm(tmp_path / family, family)
    result = cli("config", "plan", "--model_name_or_path", path, "--max_completion_length", "16")
    assert result.code == 0, result.err
    rows = plan_rows(result.out, "image prompts")
    assert rows["image tokens per image"][0] == str(EXPECTED[family])
    memory = plan_rows(result.out, "memory per process (estimate)")
    # 512 assumed prompt tokens + one image + 16 completion tokens
    assert f"x {512 + EXPECTED[family] + 16} tokens" in memory["activations (one micro-batch)"][1]
    # the processor agrees (Gemma3's blank lines aside, see above)
    model, processor = build_vlm(family)
    prompt = vision.attach_images([{"role": "user", "content": ""}], [random_image(0)], 0)
    text_only = [{"role": "user", "content": [{"type": "text", "text": ""}]}]
    ids, _ = vision.encode_vision_prompts(processor, [prompt, text_only])
    assert len(ids[0]) - len(ids[1]) == EXPECTED[family] + CHARACTER_LEVEL_EXTRA[family]


def test_a_text_model_has_no_image_section(cli, tiny_model_dir):
    result = cli("config", "plan", "--model_name_or_path", tiny_model_dir)
    assert result.code == 0 and "image prompts" not in result.out
