"""grpokit.vision: images placed into prompts as TRL 1.16 places them, bad image rows named in one line, and each
row's processor outputs collated back into the model's batch layout (values worked out by hand, and checked against
the model: a row scored alone equals the same row scored in a mixed batch)."""

from __future__ import annotations

import pytest
import torch

from grpokit import vision
from grpokit.tiny import VLM_FAMILIES, build_tokenizer, build_vlm, random_image
from grpokit.vision import PER_IMAGE, PER_PROMPT, PER_TOKEN, VisionError, VisionRows


def test_images_go_before_the_first_user_text_as_trl_places_them():
    a, b = random_image(0), random_image(1)
    prompt = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is it?"},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "Sure?"},
    ]
    out = vision.attach_images(prompt, [a, b], 0)
    assert out[0] == {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    assert out[1]["content"] == [
        {"type": "image", "image": a},
        {"type": "image", "image": b},
        {"type": "text", "text": "What is it?"},
    ]
    assert out[3]["content"] == [{"type": "text", "text": "Sure?"}]  # only the first user turn gets the images
    assert prompt[1]["content"] == "What is it?"  # the row itself is left as it was
    assert vision.prompt_images(out) == [a, b]
    assert vision.without_images(out)[1]["content"][0] == {"type": "image"}


def test_placeholders_are_filled_in_order_and_counted():
    a, b = random_image(0), random_image(1)
    prompt = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image"}, {"type": "image"}]}]
    out = vision.attach_images(prompt, [a, b], 0)
    assert [block.get("image") for block in out[0]["content"]] == [None, a, b]
    with pytest.raises(VisionError, match=r"train row 3: its prompt has more image placeholders than the row's 1"):
        vision.attach_images(prompt, [a], 3)
    one = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}]
    with pytest.raises(VisionError, match=r"train row 5: 2 image\(s\) but 1 image placeholder\(s\)"):
        vision.attach_images(one, [a, b], 5)


def test_a_text_prompt_with_images_is_refused():
    with pytest.raises(VisionError, match="train row 2: has images but its prompt is text; multimodal training"):
        vision.attach_images("Describe it", [random_image(0)], 2)


def test_image_columns_and_bad_values(tmp_path):
    image = random_image(0)
    assert vision.row_images({"prompt": "p", "image": image}, 0) == [image]
    assert vision.row_images({"prompt": "p", "images": [image, image]}, 0) == [image, image]
    assert vision.row_images({"prompt": "p", "image": None}, 0) is None
    assert vision.row_images({"prompt": "p"}, 0) is None
    path = tmp_path / "a.png"
    image.save(path)
    assert vision.row_images({"image": str(path)}, 0)[0].size == (30, 40)
    with pytest.raises(VisionError, match=r"^train row 4: column 'image': image file '.*missing.png' not found$"):
        vision.row_images({"image": str(tmp_path / "missing.png")}, 4)
    with pytest.raises(VisionError, match=r"^train row 1: column 'images' holds int, not an image; give a PIL"):
        vision.row_images({"images": [image, 7]}, 1)
    (tmp_path / "bad.png").write_text("not a png")
    with pytest.raises(VisionError, match=r"^train row 0: column 'image': '.*bad.png' is not a readable image"):
        vision.row_images({"image": str(tmp_path / "bad.png")}, 0)


def test_collation_by_kind_with_hand_values():
    rows = VisionRows(
        [
            {
                "token_type_ids": (PER_TOKEN, torch.tensor([0, 1, 1])),
                "pixel_values": (PER_IMAGE, torch.full((1, 2), 1.0)),
                "mask": (PER_PROMPT, torch.ones(1, 2)),
            },
            {},  # a text-only row
            {
                "token_type_ids": (PER_TOKEN, torch.tensor([1, 0])),
                "pixel_values": (PER_IMAGE, torch.full((2, 2), 3.0)),
                "mask": (PER_PROMPT, torch.full((2, 2), 2.0)),
            },
        ]
    )
    inputs = rows.model_inputs(prompt_width=4, completion_length=2)
    assert inputs["token_type_ids"].tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0]]
    assert inputs["pixel_values"].tolist() == [[1.0, 1.0], [3.0, 3.0], [3.0, 3.0]]  # images in row order
    assert inputs["mask"].tolist() == [[[1, 1], [0, 0]], [[0, 0], [0, 0]], [[2, 2], [2, 2]]]  # zero images pad
    picked = rows.select(torch.tensor([2, 0])).model_inputs(prompt_width=3)
    assert picked["token_type_ids"].tolist() == [[0, 1, 0], [0, 1, 1]]
    assert picked["pixel_values"][:, 0].tolist() == [3.0, 3.0, 1.0]
    assert rows.model_inputs(4, rows=slice(1, 2)) == {}  # a text-only row alone: no image inputs


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_a_row_scores_the_same_alone_and_in_a_mixed_batch(family):
    model, processor = build_vlm(family)
    prompts = [
        vision.attach_images([{"role": "user", "content": "What?"}], [random_image(0)], 0),
        vision.attach_images([{"role": "user", "content": "Hi there"}], [random_image(1), random_image(2)], 1),
        [{"role": "user", "content": [{"type": "text", "text": "no image"}]}],
    ]
    ids, rows = vision.encode_vision_prompts(processor, prompts)
    image_ids = set(vision.image_token_ids(processor, model))
    # each image became the processor's image tokens: 4 per image in these tiny families (Gemma3: and its
    # begin-of-image token, which its processor names image_token_id)
    counts = [sum(t in image_ids for t in row) for row in ids]
    if family == "llava_next":  # a base tile plus the image's own grid of tiles, unpadded: it varies with the size
        assert counts[0] > 4 and counts[1] > counts[0] and counts[2] == 0
    else:
        per_image = 5 if family == "gemma3" else 4
        assert counts == [per_image, 2 * per_image, 0]
    width = max(map(len, ids))
    pad = processor.tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in ids])
    mask = (torch.arange(width) >= torch.tensor([width - len(r) for r in ids])[:, None]).long()
    with torch.no_grad():
        together = model(input_ids=input_ids, attention_mask=mask, **rows.model_inputs(width)).logits
        for i in range(3):
            alone = model(
                input_ids=input_ids[i : i + 1],
                attention_mask=mask[i : i + 1],
                **rows.model_inputs(width, rows=slice(i, i + 1)),
            ).logits
            torch.testing.assert_close(alone[0, mask[i].bool()], together[i, mask[i].bool()], atol=1e-5, rtol=1e-4)


def test_per_image_tensors_of_different_shapes_are_zero_padded():
    rows = VisionRows(
        [{"pixel_values": (PER_IMAGE, torch.ones(1, 3, 2))}, {"pixel_values": (PER_IMAGE, torch.full((2, 5, 2), 2.0))}]
    )
    values = rows.model_inputs(prompt_width=1)["pixel_values"]
    assert values.shape == (3, 5, 2)
    assert values[0, :3].eq(1).all() and values[0, 3:].eq(0).all() and values[1:].eq(2).all()


def test_identical_consecutive_prompts_are_encoded_once(monkeypatch):
    model, processor = build_vlm("llava")
    calls = []
    real = vision._encode_one
    monkeypatch.setattr(vision, "_encode_one", lambda *a: calls.append(1) or real(*a))
    prompt = lambda seed: vision.attach_images([{"role": "user", "content": "x"}], [random_image(seed)], 0)  # noqa: E731
    ids, rows = vision.encode_vision_prompts(processor, [prompt(0), prompt(0), prompt(1), prompt(1)])
    assert len(calls) == 2 and ids[0] == ids[1] and len(rows) == 4
    assert rows.rows[0]["pixel_values"][1] is rows.rows[1]["pixel_values"][1]  # shared, not copied


def test_max_prompt_length_never_cuts_an_image():
    model, processor = build_vlm("llava")
    prompt = vision.attach_images([{"role": "user", "content": "abcdefgh"}], [random_image(0)], 0)
    ids, _ = vision.encode_vision_prompts(processor, [prompt])
    assert len(ids[0]) == 15  # <|user|> + 4 image tokens + 8 characters + <eos> + <|assistant|>
    with pytest.raises(VisionError, match=r"prompt 0: 15 tokens with its images, over max_prompt_length=12, .*image"):
        vision.encode_vision_prompts(processor, [prompt], max_prompt_length=12)
    text_first = [{"role": "user", "content": [{"type": "text", "text": "abcdefgh"}, {"type": "image"}]}]
    ids, _ = vision.encode_vision_prompts(processor, [vision.attach_images(text_first, [random_image(0)], 0)])
    cut, _ = vision.encode_vision_prompts(
        processor, [vision.attach_images(text_first, [random_image(0)], 0)], max_prompt_length=12
    )
    assert cut[0] == ids[0][3:]  # <|user|>ab went, the image tokens stayed


def test_image_tokens_are_the_ones_never_sampled():
    tokenizer = build_tokenizer()
    for family, tokens in {"llava": ["<image>"], "gemma3": ["<image_soft_token>", "<start_of_image>"]}.items():
        model, processor = build_vlm(family)
        expected = {processor.tokenizer.convert_tokens_to_ids(t) for t in tokens}
        assert set(vision.image_token_ids(processor, model)) == expected
    assert vision.image_token_ids(tokenizer) == []
