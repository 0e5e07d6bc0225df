"""Vision-language prompts through vLLM colocate and server (the real CPU build; run in the vLLM venv). The tiny model is an
Idefics3 (SmolVLM's family): vLLM's modules for LLaVA, Gemma3 and Qwen2-VL import torchvision, which does not load
with the CPU torch. vLLM gets each prompt's images with the image placeholders unexpanded and expands them itself; the
test checks it arrives at the trainer's processor's tokens and samples with the trainer's probabilities."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("vllm")

from _serve import free_port, running_server  # noqa: E402

from grpokit import vision  # noqa: E402
from grpokit.generation import GenerationError  # noqa: E402
from grpokit.generation.vllm_colocate import VLLMColocateGenerator  # noqa: E402
from grpokit.generation.vllm_server import VLLMServerGenerator  # noqa: E402
from grpokit.models import load_policy  # noqa: E402
from grpokit.scoring import score_tokens  # noqa: E402
from grpokit.tiny import random_image, save_tiny_vlm  # noqa: E402


def prompts():
    return [
        vision.attach_images([{"role": "user", "content": "What?"}], [random_image(0)], 0),
        vision.attach_images([{"role": "user", "content": "Hi there"}], [random_image(1), random_image(2)], 1),
        [{"role": "user", "content": [{"type": "text", "text": "no image"}]}],
    ]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # text head size 32: the smallest vLLM's CPU attention takes
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm"), "idefics3", hidden_size=64, num_heads=2)


@pytest.fixture(scope="module")
def generator(model_dir):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return VLLMColocateGenerator(
        enforce_eager=True,  # no compilation: the module's tests start fast
        model_path=model_dir,
        sampling={"temperature": 1.0, "max_tokens": 6, "logprobs": 0, "ignore_eos": True},
        eos_token_ids=[],
        dtype="float32",
        max_model_length=256,
        max_num_seqs=8,
    )


def assert_trainer_probabilities(out, ids, rows, model_dir):
    """Each completion's vLLM logprobs equal the policy's (transformers, with the row's own image inputs)."""
    model = load_policy(model_dir, None, False)
    gaps = []
    for i, completion in enumerate(out.completion_ids):
        assert len(completion) == 6
        with torch.no_grad():
            scores = score_tokens(
                model,
                torch.tensor([ids[i] + completion]),
                torch.ones(1, len(ids[i]) + len(completion), dtype=torch.long),
                len(completion),
                vision=rows.select([i]),
            )
        gaps.append((scores.logps[0] - torch.tensor(out.logprobs[i])).abs().max().item())
    assert max(gaps) < 1e-4, gaps


def test_vllm_samples_image_prompts_with_the_trainers_probabilities(generator, model_dir):
    from transformers import AutoProcessor

    ids, rows = vision.encode_vision_prompts(AutoProcessor.from_pretrained(model_dir), prompts())
    assert_trainer_probabilities(generator.generate(ids, vision=rows), ids, rows, model_dir)


def test_a_prompt_vllm_encodes_differently_is_refused(generator, model_dir):
    """Sending the processor's already-expanded tokens (as TRL does) makes vLLM's Idefics3 processor expand the
    placeholders again: a prompt the trainer would never score. It is refused, not trained on."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    ids, rows = vision.encode_vision_prompts(processor, prompts()[:1])
    expanded = vision.EnginePrompt(ids[0], rows.engine_prompts[0].images)
    with pytest.raises(
        GenerationError, match=r"vLLM encoded image prompt 0 as \d+ tokens where the trainer's processor gives 15"
    ):
        generator.generate(ids, vision=vision.VisionRows(rows.rows, [expanded]))


SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, datasets
    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.tiny import random_image

    rows = [{"prompt": [{"role": "user", "content": f"Describe {i}"}], "images": [random_image(i)] * (1 + i % 2)}
            for i in range(4)]
    args = GRPOConfig(output_dir=sys.argv[2], per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=6, max_steps=3, learning_rate=1e-2, report_to="none", save_strategy="no",
                      logging_steps=1, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=256)
    trainer = GRPOTrainer(model=sys.argv[1], reward_funcs=lambda completions, **kw: [
                          float(sum(map(ord, c[0]["content"])) % 7) for c in completions], args=args, train_dataset=datasets.Dataset.from_list(rows))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    logs = [e for e in trainer.state.log_history if "sampling/sampling_logp_difference/max" in e]
    print("RESULT " + json.dumps({"changed": changed, "logs": logs}))
    """
)


def test_grpo_trains_a_vision_language_model_with_vllm_colocate(model_dir, tmp_path):
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    (tmp_path / "train.py").write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "train.py"), model_dir, str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert any("vision_model" in n for n in report["changed"]) and any("text_model" in n for n in report["changed"])
    assert len(report["logs"]) == 3
    # On-policy, vLLM samples with the trainer's probabilities except that the image token (never to be sampled)
    # gets a -100 logit bias: vLLM's logprobs are renormalised without its mass, about 1/110 of it in a random
    # model over 110 tokens, log(1 - 1/110) = -0.009 (the first test, without the bias, agrees to 1e-4); measured
    # 0.011-0.013 at every step. After each push the engine must drop the image embeddings it cached with the old
    # vision tower: without that the third round stopped with vLLM's "Encoder cache miss", and an engine left with
    # the first weights differs by 0.5 after one step.
    for entry in report["logs"]:
        assert entry["sampling/sampling_logp_difference/max"] < 0.02, report["logs"]


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    with running_server(model_dir, tmp_path_factory.mktemp("server") / "vllm.log") as running:
        yield running


def test_the_server_samples_image_prompts_with_the_trainers_probabilities(server, model_dir):
    """Each prompt twice (a group of 2: one request with n = 2), images and text rows mixed."""
    from transformers import AutoProcessor

    repeated = [p for p in prompts() for _ in range(2)]
    ids, rows = vision.encode_vision_prompts(AutoProcessor.from_pretrained(model_dir), repeated)
    generator = VLLMServerGenerator(
        base_url=server.url,
        timeout=30,
        group_port=free_port(),
        sampling={"temperature": 1.0, "max_tokens": 6, "ignore_eos": True},
        num_generations=2,
        eos_token_ids=[],
        model_name=model_dir,
    )
    assert_trainer_probabilities(generator.generate(ids, vision=rows), ids, rows, model_dir)


def test_grpo_trains_a_vision_language_model_against_the_server(server, model_dir, tmp_path):
    launcher = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    script = SCRIPT.replace(
        'vllm_mode="colocate", vllm_max_model_length=256',
        'vllm_mode="server", ' + (f"vllm_server_port={server.port}, vllm_group_port={free_port()}"),
    )
    (tmp_path / "train.py").write_text(script)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "train.py"), model_dir, str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert any("vision_model" in n for n in report["changed"]) and any("text_model" in n for n in report["changed"]), (
        report
    )
    assert len(report["logs"]) == 3
    for entry in report["logs"]:  # as in colocate: only the image token's -100 bias separates the two
        assert entry["sampling/sampling_logp_difference/max"] < 0.02, report["logs"]
