"""tinker-cookbook recipes, unchanged, trained through `grpokit tinker-serve` on the real SmolLM2-135M-Instruct with
LoRA: the math RL recipe (its arithmetic environment makes its own problems, offline) and the supervised chat recipe
on the cookbook's own example conversations. The cookbook pins transformers <= 5.5.4, so it runs from its own
environment (`.venv-tinker`, which .ci/run builds with the oldest tinker SDK this server supports); the test is
skipped where that environment is missing."""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COOKBOOK_PYTHON = Path(os.environ.get("GRPOKIT_TINKER_VENV", ROOT / ".venv-tinker")) / "bin" / "python"

pytestmark = pytest.mark.skipif(not COOKBOOK_PYTHON.exists(), reason=f"no cookbook environment at {COOKBOOK_PYTHON}")


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("tinker")
    from grpokit import gguf

    try:
        return gguf.smollm2()
    except ValueError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = tmp_path_factory.mktemp("cookbook-state")
    log = open(state / "server.log", "w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpokit",
            "tinker-serve",
            smollm2,
            "--port",
            str(port),
            "--state-dir",
            str(state),
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=2)
            break
        except OSError:
            assert process.poll() is None, (state / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the server did not answer in 180 s"
            time.sleep(0.5)
    yield url, smollm2
    process.terminate()
    process.wait(timeout=30)
    log.close()


def _recipe(module: str, args: list[str], log_path: Path) -> list[dict]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TINKER_API_KEY": "tml-local",
        "TINKER_TELEMETRY": "0",
    }
    run = subprocess.run(
        [str(COOKBOOK_PYTHON), "-m", module, *args, f"log_path={log_path}", "behavior_if_log_dir_exists=delete"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def _checkpoints(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]


def test_math_rl_recipe_trains_and_its_sampler_weights_reload(server, tmp_path):
    import tinker
    from tinker import types

    url, model = server
    rows = _recipe(
        "tinker_cookbook.recipes.math_rl.train",
        [
            f"model_name={model}",
            f"base_url={url}",
            "renderer_name=role_colon",
            "loss_fn=importance_sampling",
            "groups_per_batch=2",
            "group_size=4",
            "max_tokens=6",
            "lora_rank=8",
            "max_steps=2",
            "eval_every=0",
            "save_every=1",
        ],
        tmp_path / "rl",
    )
    assert [r["step"] for r in rows] == [0, 1]  # every step logged
    for row in rows:
        assert row["env/all/total_episodes"] == 8
        assert abs(row["optim/kl_sample_train_v1"]) < 1e-4  # the sampler's and the learner's logprobs agree
    sampler_path = _checkpoints(tmp_path / "rl")[-1]["sampler_path"]
    os.environ.setdefault("TINKER_API_KEY", "tml-local")
    client = tinker.ServiceClient(base_url=url).create_sampling_client(model_path=sampler_path).result(timeout=120)
    out = client.sample(types.ModelInput.from_ints([1, 2, 3]), 2, types.SamplingParams(max_tokens=3)).result(
        timeout=120
    )
    assert [len(s.tokens) for s in out.sequences] == [3, 3] or all(s.stop_reason == "stop" for s in out.sequences)


def test_supervised_chat_recipe_lowers_the_nll(server, tmp_path):
    url, model = server
    conversations = (
        Path(
            subprocess.run(
                [
                    str(COOKBOOK_PYTHON),
                    "-c",
                    "import tinker_cookbook, os; print(os.path.dirname(tinker_cookbook.__file__))",
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        / "example_data"
        / "conversations.jsonl"
    )
    rows = _recipe(
        "tinker_cookbook.recipes.chat_sl.train",
        [
            f"model_name={model}",
            f"base_url={url}",
            "renderer_name=role_colon",
            f"dataset={conversations}",
            "batch_size=8",
            "max_length=512",
            "max_steps=3",
            "eval_every=0",
            "lora_rank=8",
            "learning_rate=3e-4",
        ],
        tmp_path / "sl",
    )
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["grad_norm:mean"] > 0 for r in rows)
    assert rows[-1]["train_mean_nll"] < rows[0]["train_mean_nll"]
    assert _checkpoints(tmp_path / "sl")[-1]["sampler_path"].startswith("tinker://")
