"""Vision-language GRPO end to end on tiny local models of three families (LLaVA, Idefics3, Gemma3), each with its
real processor class: training changes the weights (the vision tower's included), images travel with their rows
through shuffled micro-batches, image tokens are never sampled, a model given by path loads with its processor, a
TRL script runs with only the import changed, and bad image rows stop the run in one line before the model loads."""

from __future__ import annotations

import os
import subprocess
import sys

import datasets
import pytest
import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.scoring import score_tokens
from grpokit.tiny import VLM_FAMILIES, build_model, build_tokenizer, build_vlm, random_image, save_tiny_vlm

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def length_reward(completions, **kwargs):
    return [float(len(c[0]["content"]) % 5) for c in completions]


def image_rows(n=4, column="images"):
    """Rows with 1 or 2 images each (mixed in one batch), or one `image` each."""
    rows = []
    for i in range(n):
        images = [random_image(10 * i + k) for k in range(1 + i % 2)]
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"Describe {i}"}],
                column: images if column == "images" else images[0],
            }
        )
    return datasets.Dataset.from_list(rows)


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        max_steps=2,
        learning_rate=1e-2,
        beta=0.1,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=3,
    )
    return GRPOConfig(**{**values, **overrides})


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_each_family_trains_and_changes_text_and_vision_weights(family, tmp_path):
    model, processor = build_vlm(family)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=config(tmp_path),
        train_dataset=image_rows(),
        processing_class=processor,
    )
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert any("vision" in n for n in changed), sorted(changed)[:5]
    assert any("language_model" in n or "text_model" in n for n in changed), sorted(changed)[:5]
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    image_ids = {processor.tokenizer.convert_tokens_to_ids(t) for t in ("<image>", "<image_soft_token>")} - {
        processor.tokenizer.unk_token_id
    }
    assert image_ids <= set(trainer.generator.generation_config.suppress_tokens)


def test_images_travel_with_their_rows_through_shuffled_micro_batches(tmp_path):
    """Off-policy (2 micro-batches per round, one per optimizer step): the old log-probabilities are scored on the
    whole round at once; each shuffled micro-batch scored with its own rows' images gives the same numbers."""
    model, processor = build_vlm("idefics3")  # images padded per prompt: the hardest layout to keep aligned
    args = config(tmp_path, steps_per_generation=2, per_device_train_batch_size=2, max_steps=1)
    trainer = GRPOTrainer(
        model=model, reward_funcs=length_reward, args=args, train_dataset=image_rows(), processing_class=processor
    )
    rows = [trainer.train_dataset[i] for i in (0, 0, 1, 1)]
    rollout = trainer._rollout(rows, "train")
    assert rollout.old_logps is not None and len(rollout.vision) == 4
    torch.manual_seed(0)
    for batch in rollout.micro_batches(2):
        with torch.no_grad():
            scores = score_tokens(
                trainer.model,
                torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
                batch["completion_ids"].size(1),
                vision=batch["vision"],
            )
        mask = batch["completion_mask"].bool()
        torch.testing.assert_close(scores.logps[mask], batch["old_logps"][mask], atol=1e-5, rtol=1e-5)


def test_a_single_image_column_and_a_model_given_by_path(tmp_path):
    path = save_tiny_vlm(tmp_path / "vlm", "gemma3")
    trainer = GRPOTrainer(
        model=path,
        reward_funcs=length_reward,
        args=config(tmp_path / "out", max_steps=1),
        train_dataset=image_rows(column="image"),
    )
    assert type(trainer.model).__name__ == "Gemma3ForConditionalGeneration"
    assert type(trainer.processing_class).__name__ == "Gemma3Processor"
    assert trainer.processing_class.tokenizer.padding_side == "left"
    trainer.train()
    assert trainer.state.global_step == 1


def test_a_trl_vlm_script_runs_with_only_the_import_changed(tmp_path):
    script = os.path.join(ROOT, "examples", "trl_vlm_script.py")
    with open(script) as f:
        imports = [line.strip() for line in f if line.startswith(("import ", "from "))]
    assert [line for line in imports if "grpokit" in line or "trl" in line] == [
        "from grpokit import GRPOConfig, GRPOTrainer"
    ]
    path = save_tiny_vlm(tmp_path / "vlm", "llava")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, script, "--model_name_or_path", path, "--output_dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'rewards/reward_names_colour/mean'" in result.stdout
    assert os.path.exists(tmp_path / "out" / "model.safetensors")
    assert os.path.exists(tmp_path / "out" / "processor_config.json")


def _refusal(tmp_path, dataset, model="no/such-model-was-loaded", **kwargs):
    with pytest.raises(ValueError) as info:
        GRPOTrainer(model=model, reward_funcs=length_reward, args=config(tmp_path), train_dataset=dataset, **kwargs)
    return str(info.value)


def test_bad_image_rows_stop_before_the_model_loads(tmp_path):
    good = random_image(0)
    missing = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "a"}], "image": str(tmp_path / "gone.png")}]
    )
    assert "train row 0: column 'image': image file" in _refusal(tmp_path, missing)
    assert "gone.png' not found" in _refusal(tmp_path, missing)
    text_prompt = datasets.Dataset.from_list([{"prompt": "describe", "images": [good]}])
    assert "train row 0: has images but its prompt is text" in _refusal(tmp_path, text_prompt)
    blocks = [{"type": "image", "text": None}, {"type": "text", "text": "b"}]
    too_many = datasets.Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": blocks}], "images": [good]},
            {"prompt": [{"role": "user", "content": blocks}], "images": [good, good]},
        ]
    )
    message = _refusal(tmp_path, too_many)
    assert "train row 1: 2 image(s) but 1 image placeholder(s) in its prompt" in message
    assert "no/such-model" not in message  # refused before loading


def test_an_image_in_a_text_only_models_prompt_is_refused(tmp_path):
    tokenizer = build_tokenizer()
    with pytest.raises(ValueError, match=r"train row 0: has an image \(column 'images'\) but the model is text-only"):
        GRPOTrainer(
            model=build_model(tokenizer),
            reward_funcs=length_reward,
            args=config(tmp_path),
            train_dataset=image_rows(),
            processing_class=tokenizer,
        )


def _text_rows_with_one_image(at: int, n: int = 100):
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "image": None} for i in range(n)]
    rows[at]["image"] = random_image(at)
    return datasets.Dataset.from_list(rows)


def test_an_image_far_into_a_text_only_models_dataset_is_refused_by_row(tmp_path):
    """Row 80 of 100: the whole dataset is looked at before the model trains (its image column only)."""
    tokenizer = build_tokenizer()
    with pytest.raises(ValueError, match=r"train row 80: has an image \(column 'image'\) but the model is text-only"):
        GRPOTrainer(
            model=build_model(tokenizer),
            reward_funcs=length_reward,
            args=config(tmp_path),
            train_dataset=_text_rows_with_one_image(80),
            processing_class=tokenizer,
        )


def test_an_image_in_a_text_only_models_stream_is_refused_when_its_row_arrives(tmp_path):
    """The same rows as a stream: nothing to look at before training; row 5 stops the run as it is read, named by its
    place in the stream (not in the shuffled batch) and its prompt, before anything is generated for it."""
    tokenizer = build_tokenizer()
    trainer = GRPOTrainer(
        model=build_model(tokenizer),
        reward_funcs=length_reward,
        args=config(tmp_path, max_steps=8),  # 8 steps of 2 rows: all 16 rows, in the stream's shuffled order
        train_dataset=_text_rows_with_one_image(5, n=16).to_iterable_dataset(),
        processing_class=tokenizer,
    )
    with pytest.raises(ValueError, match=r"^train_dataset stream row 5: has an image \(column 'image'\) .*'q5'"):
        trainer.train()


def test_a_stream_of_several_shards_names_the_row_within_its_shard(tmp_path):
    """datasets counts each shard of a stream from 0: the row is named with the shard count (and its prompt)."""
    tokenizer = build_tokenizer()
    stream = _text_rows_with_one_image(13, n=16).to_iterable_dataset(num_shards=2)  # row 13: row 5 of shard 2
    trainer = GRPOTrainer(
        model=build_model(tokenizer),
        reward_funcs=length_reward,
        args=config(tmp_path, max_steps=8),
        train_dataset=stream,
        processing_class=tokenizer,
    )
    pattern = r"^train_dataset stream row 5 of one of its 2 shards: has an image \(column 'image'\) .*'q13'"
    with pytest.raises(ValueError, match=pattern):
        trainer.train()


def test_a_vision_model_with_a_plain_tokenizer_is_refused(tmp_path):
    model, processor = build_vlm("llava")
    with pytest.raises(
        TypeError, match="LlavaForConditionalGeneration is a vision-language model: pass its processor"
    ):
        GRPOTrainer(
            model=model,
            reward_funcs=length_reward,
            args=config(tmp_path),
            train_dataset=image_rows(),
            processing_class=processor.tokenizer,
        )


def test_lora_leaves_the_vision_tower_without_adapters(tmp_path):
    from peft import LoraConfig

    model, processor = build_vlm("llava")
    config_in = LoraConfig(r=4, target_modules="all-linear")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=config(tmp_path, max_steps=1, beta=0.0),
        train_dataset=image_rows(),
        processing_class=processor,
        peft_config=config_in,
    )
    adapters = [n for n, _ in trainer.model.named_parameters() if "lora_" in n]
    assert adapters and not [n for n in adapters if "vision_tower" in n or "multi_modal_projector" in n]
    assert config_in.exclude_modules is None  # the caller's config is not changed
    trainer.train()
    assert trainer.state.global_step == 1


def test_vllm_sampling_gets_a_logit_bias_against_image_tokens():
    from grpokit.generation.factory import _biased

    assert _biased({"temperature": 1.0}, [104, 106]) == {"temperature": 1.0, "logit_bias": {104: -100.0, 106: -100.0}}
    # a bias the user set in generation_kwargs wins for its token
    assert _biased({"logit_bias": {104: 5.0}}, [104, 7])["logit_bias"] == {104: 5.0, 7: -100.0}
    assert _biased({"n": 1}, []) == {"n": 1}


@pytest.mark.parametrize("conversational", [False, True])
def test_a_vision_model_trains_on_text_only_prompts(conversational, tmp_path):
    """Gemma3 with its processor on prompts without images, plain text or messages: no image inputs, one step."""
    model, processor = build_vlm("gemma3")
    prompts = ["Describe a", "Describe b"]
    if conversational:
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=length_reward if conversational else lambda completions, **kw: [len(c) % 3 for c in completions],
        args=config(tmp_path, max_steps=1),
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts * 2}),
        processing_class=processor,
    )
    trainer.train()
    assert trainer.state.global_step == 1


@pytest.mark.parametrize("log_multimodal", [True, False])
def test_logged_completions_carry_their_images(log_multimodal, tmp_path, capsys):
    """log_completions + log_multimodal: each distinct image is written once and every completion's record points at
    its own; the table shows `<image>` where an image was. Without log_multimodal no image is written."""
    import json

    model, processor = build_vlm("llava")
    args = config(tmp_path, max_steps=1, log_completions=True, log_multimodal=log_multimodal, logging_steps=1)
    trainer = GRPOTrainer(
        model=model, reward_funcs=length_reward, args=args, train_dataset=image_rows(), processing_class=processor
    )
    trainer.train()
    assert "user: <image>Describe" in capsys.readouterr().out
    records = [json.loads(line) for line in open(tmp_path / "completions.jsonl")]
    assert len(records) == 4  # 2 prompts x 2 completions
    folder = tmp_path / "completions" / "images"
    if not log_multimodal:
        assert not folder.exists() and all("images" not in r for r in records)
        return
    # dataset row i ("Describe i") holds 1 + i % 2 distinct images; a prompt's two completions share its files
    for record in records:
        row = int(record["prompt"][0]["content"][-1]["text"].split()[-1])
        assert record["prompt"][0]["content"][0] == {"type": "image"}
        assert len(record["images"]) == 1 + row % 2
        assert all(path.startswith("completions/images/image_") for path in record["images"])
        assert all((tmp_path / path).is_file() for path in record["images"])  # from the run folder, as jsonl is
    distinct = {path for record in records for path in record["images"]}
    assert sorted(p.name for p in folder.iterdir()) == sorted(os.path.basename(p) for p in distinct)
    by_prompt = {}
    for record in records:
        by_prompt.setdefault(json.dumps(record["prompt"]), []).append(record["images"])
    assert all(a == b for a, b in by_prompt.values()) and len(by_prompt) == 2


def test_a_vision_run_resumes_inside_a_round_exactly(tmp_path):
    """A checkpoint between the two micro-batches of a round keeps the second one, images included (read back with
    torch.load(weights_only=True)); resuming from it ends with the weights of the run that was not interrupted."""
    import warnings

    def run(output_dir, max_steps, resume=None):
        model, processor = build_vlm("idefics3")
        args = config(
            output_dir, max_steps=max_steps, steps_per_generation=2, per_device_train_batch_size=2, save_steps=1
        )
        args.save_strategy = "steps"
        trainer = GRPOTrainer(
            model=model, reward_funcs=length_reward, args=args, train_dataset=image_rows(), processing_class=processor
        )
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    whole = run(tmp_path / "whole", 2)
    run(tmp_path / "cut", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        resumed = run(tmp_path / "cut", 2, resume=str(tmp_path / "cut" / "checkpoint-1"))
    assert resumed.state.global_step == 2
    for (name, a), b in zip(whole.model.named_parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_ddp_looks_for_unused_parameters_of_a_vision_model(tmp_path):
    """A batch without images leaves the vision tower without gradients, which DDP refuses unless it looks for
    unused parameters (TRL sets the same); a value the user set is left as it is; a text model without experts uses
    every parameter, so DDP is told not to look (transformers' default would, with a warning every step)."""
    model, processor = build_vlm("llava")
    args = config(tmp_path)
    GRPOTrainer(
        model=model, reward_funcs=length_reward, args=args, train_dataset=image_rows(), processing_class=processor
    )
    assert args.ddp_find_unused_parameters is True
    model, processor = build_vlm("llava")
    args = config(tmp_path, ddp_find_unused_parameters=False)
    GRPOTrainer(
        model=model, reward_funcs=length_reward, args=args, train_dataset=image_rows(), processing_class=processor
    )
    assert args.ddp_find_unused_parameters is False
    tokenizer = build_tokenizer()
    args = config(tmp_path)
    text = datasets.Dataset.from_dict({"prompt": ["ab", "cd"]})
    GRPOTrainer(
        model=build_model(tokenizer),
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=text,
        processing_class=tokenizer,
    )
    assert args.ddp_find_unused_parameters is False


def test_tools_with_a_vision_processor_are_refused_in_one_line(tmp_path):
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        return key

    model, processor = build_vlm("llava")
    with pytest.raises(ValueError, match=r"^tools / environment_factory with a vision-language model's processor"):
        GRPOTrainer(
            model=model,
            reward_funcs=length_reward,
            args=config(tmp_path),
            train_dataset=image_rows(),
            processing_class=processor,
            tools=[lookup],
        )


def test_continuous_batching_with_a_vision_model_is_refused_in_one_line(tmp_path):
    model, processor = build_vlm("llava")
    with pytest.raises(
        ValueError, match=r"^use_transformers_continuous_batching does not take a vision-language model"
    ):
        GRPOTrainer(
            model=model,
            reward_funcs=length_reward,
            args=config(tmp_path, use_transformers_continuous_batching=True),
            train_dataset=image_rows(),
            processing_class=processor,
        )


def test_the_check_before_loading_decodes_no_image(tmp_path, monkeypatch):
    """Checking every row before the model loads reads a datasets Image column undecoded (a large image set would
    otherwise be decoded once just to be checked); a file that exists but does not decode is named at first use."""
    import PIL.Image

    dataset = image_rows(6)
    opened = []
    real_open = PIL.Image.open
    monkeypatch.setattr(PIL.Image, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    model, processor = build_vlm("llava")
    GRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=config(tmp_path),
        train_dataset=dataset,
        processing_class=processor,
    )
    assert opened == []
    (tmp_path / "bad.png").write_text("not a png")
    rows = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "a"}], "image": str(tmp_path / "bad.png")}]
    )
    model, processor = build_vlm("llava")
    trainer = GRPOTrainer(
        model=model, reward_funcs=length_reward, args=config(tmp_path, per_device_train_batch_size=2),
        train_dataset=rows, processing_class=processor,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"^batch row 0: column 'image': '.*bad.png' is not a readable image"):
        trainer.train()


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_the_tiny_vlms_special_tokens_need_no_alignment(family):
    """transformers aligns a model's PAD/BOS/EOS with its tokenizer when a trainer starts, warning when it changes any
    ("The tokenizer has new PAD/BOS/EOS tokens..."): grpokit's own tiny models give it nothing to change."""
    from transformers.trainer_utils import align_special_tokens

    model, processor = build_vlm(family)
    names = ("pad_token_id", "eos_token_id", "bos_token_id")

    def ids():
        text = model.config.get_text_config()
        return [getattr(text, n) for n in names] + [getattr(model.generation_config, n) for n in names]

    before = ids()
    align_special_tokens(model, processor)
    tokenizer = processor.tokenizer
    assert ids() == before == [getattr(tokenizer, n) for n in names] * 2
