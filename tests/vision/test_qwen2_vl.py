"""Qwen2-VL (Qwen2.5-VL's family): image patches and grids per image, `mm_token_type_ids` per token. Its processor
class needs a video processor, which needs torchvision, which does not load with the CPU torch on these machines:
the test builds the real `Qwen2VLProcessor` with no video processor by skipping transformers' class check for that
one attribute (a test-only shim); images never reach the video processor."""

from __future__ import annotations

import datasets
import pytest
import torch

from grpokit import GRPOConfig, GRPOTrainer, vision
from grpokit.tiny import SPECIAL_TOKENS, _vlm_template, build_tokenizer, random_image


@pytest.fixture
def qwen2_vl(monkeypatch):
    from transformers import (
        AddedToken,
        ProcessorMixin,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLProcessor,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    check = ProcessorMixin.check_argument_for_proper_class

    def without_video(self, name, arg):
        return None if name == "video_processor" and arg is None else check(self, name, arg)

    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class", without_video)
    tokenizer = build_tokenizer()
    marks = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [*SPECIAL_TOKENS[4:], *(AddedToken(t, special=True) for t in marks)]}
    )
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=28 * 28 * 4),
        tokenizer=tokenizer,
        video_processor=None,
        chat_template=_vlm_template("<|vision_start|><|image_pad|><|vision_end|>"),
    )
    ids = {
        name: tokenizer.convert_tokens_to_ids(t)
        for name, t in zip(("start", "end", "image", "video"), marks, strict=True)
    }
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=512,
            rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        ),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=64, num_heads=2, patch_size=14, spatial_merge_size=2),
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        vision_start_token_id=ids["start"],
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, processor


def test_patches_and_grids_are_sliced_per_row(qwen2_vl):
    model, processor = qwen2_vl
    prompts = [
        vision.attach_images([{"role": "user", "content": "What?"}], [random_image(0)], 0),
        vision.attach_images([{"role": "user", "content": "Hi"}], [random_image(1), random_image(2, (60, 30))], 1),
        [{"role": "user", "content": [{"type": "text", "text": "no image"}]}],
    ]
    ids, rows = vision.encode_vision_prompts(processor, prompts)
    # a 30x40 image (w x h) resizes to 28x28 pixels: 2x2 patches of 14 (one token after 2x2 merging); 60x30 to
    # 56x28: 2 rows of 4 patches (two tokens)
    assert [r["image_grid_thw"][1].tolist() for r in rows.rows[:2]] == [[[1, 2, 2]], [[1, 2, 2], [1, 2, 4]]]
    assert [r["pixel_values"][1].shape[0] for r in rows.rows[:2]] == [4, 12]
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert [row.count(image_id) for row in ids] == [1, 3, 0]
    width = max(map(len, ids))
    pad = processor.tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in ids])
    mask = (input_ids != pad).long()
    with torch.no_grad():
        together = model(input_ids=input_ids, attention_mask=mask, **rows.model_inputs(width)).logits
        for i in range(3):
            alone = model(
                input_ids=input_ids[i : i + 1],
                attention_mask=mask[i : i + 1],
                **rows.model_inputs(width, rows=slice(i, i + 1)),
            ).logits
            torch.testing.assert_close(alone[0, mask[i].bool()], together[i, mask[i].bool()], atol=1e-5, rtol=1e-4)


def test_qwen2_vl_trains(qwen2_vl, tmp_path):
    model, processor = qwen2_vl
    rows = [
        {"prompt": [{"role": "user", "content": f"Describe {i}"}], "images": [random_image(i)] * (1 + i % 2)}
        for i in range(4)
    ]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=5,
        max_steps=2,
        learning_rate=1e-2,
        beta=0.1,
        report_to="none",
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [float(len(c[0]["content"]) % 4) for c in completions],
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=processor,
    )
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert any("visual" in n for n in changed) and any("language_model" in n for n in changed)
