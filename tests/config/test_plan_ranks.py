"""`grpokit config plan --accelerate_config NAME|FILE --num_processes N`: the batch geometry for N processes and the
memory per process, divided as the engine shards it. Every expected number is worked out by hand below."""

import json

import pytest
from _config_helpers import plan_rows

GIB = 1024**3

# Qwen2-7B's dimensions (its config.json, untied embeddings).
QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
# head_dim 3584 / 28 = 128, so k and v project to 4 x 128 = 512. Per layer: q and o 3584 x 3584 each, k and v
# 3584 x 512 each, gate/up/down 3584 x 18944 each, 2 RMSNorm weights of 3584, Qwen2's q/k/v biases 3584 + 512 + 512.
PER_LAYER = 2 * 3584 * 3584 + 2 * 3584 * 512 + 3 * 3584 * 18944 + 2 * 3584 + (3584 + 2 * 512)
# 28 layers, input embedding and LM head of 152064 x 3584 each, the final norm.
PARAMS = 28 * PER_LAYER + 2 * 152064 * 3584 + 3584
assert PARAMS == 7_615_616_512  # Qwen2-7B's published size: 7.62B


@pytest.fixture
def qwen2_7b(tmp_path):
    path = tmp_path / "qwen2-7b"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(QWEN2_7B))
    return str(path)


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.2f} GiB"


def plan(cli, *args):
    result = cli("config", "plan", *args)
    assert result.code == 0, result.err
    known = "unknown: model_name_or_path" not in result.out  # no model directory: no memory rows
    return plan_rows(result.out, "batch geometry"), plan_rows(
        result.out, "memory per process (estimate)"
    ) if known else {}


def test_zero3_on_8_processes_for_a_7b_model(cli, qwen2_7b):
    geometry, memory = plan(
        cli, "--model_name_or_path", qwen2_7b, "--accelerate_config", "zero3", "--num_processes", "8",
        "--beta", "0.04", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
        "--num_generations", "8",
    )  # fmt: skip
    assert geometry["processes"] == ("8", "num_processes (cli)")
    # 4 completions x 8 processes x 2 steps per round = 64 completions = 8 prompts of 8
    assert geometry["generation_batch_size"][0] == "64" and geometry["prompts_per_generation"][0] == "8"
    assert geometry["completions_per_optimizer_step"][0] == "64"
    assert memory["parameters"][1].startswith("7,615,616,512 weights")
    # bf16 (the preset's mixed precision; the config leaves bf16 unset): DeepSpeed holds weights and gradients in
    # 16-bit, 2 bytes each; AdamW's 2 fp32 moments + the fp32 master copy are 12 bytes per weight. ZeRO-3 divides all
    # of it, and the reference model (16-bit), by 8.
    assert memory["weights"][0] == gib(PARAMS * 2 / 8) == "1.77 GiB"
    assert memory["gradients"][0] == gib(PARAMS * 2 / 8) == "1.77 GiB"
    assert memory["optimizer state"][0] == gib(PARAMS * 12 / 8) == "10.64 GiB"
    assert memory["reference model"][0] == gib(PARAMS * 2 / 8) == "1.77 GiB"
    assert memory["model states"][0] == gib(PARAMS * (2 + 2 + 12 + 2) / 8) == "15.96 GiB"
    assert "fp32 master copy under bf16 mixed precision" in memory["optimizer state"][1]
    for item in ("weights", "gradients", "optimizer state", "reference model"):
        assert memory[item][1].endswith("/ 8: ZeRO-3 shards it over 8 processes"), item


# Bytes per weight (weights, gradients, optimizer state, reference model) and which of them are divided by 8, for the
# 7B model with dtype float32 (the default), bf16 from the preset, beta 0.04.
DDP = (4, 4, 8, 4)  # PyTorch: everything in the weights' dtype, AdamW's 2 moments
DEEPSPEED_BF16 = (2, 2, 12, 2)  # 16-bit model, fp32 master + 2 fp32 moments
FSDP_BF16 = (4, 4, 8, 4)  # accelerate keeps FSDP's sharded weights in fp32; the reference model stays float32


@pytest.mark.parametrize(
    "preset, per_weight, divided",
    [
        ("multi_gpu", DDP, ()),
        ("zero1", DEEPSPEED_BF16, ("optimizer state",)),
        ("zero2", DEEPSPEED_BF16, ("gradients", "optimizer state")),
        ("zero3", DEEPSPEED_BF16, ("weights", "gradients", "optimizer state", "reference model")),
        ("fsdp2", FSDP_BF16, ("weights", "gradients", "optimizer state", "reference model")),
    ],
)
def test_what_each_preset_divides(cli, qwen2_7b, preset, per_weight, divided):
    _, memory = plan(cli, "--model_name_or_path", qwen2_7b, "--accelerate_config", preset, "--beta", "0.04")
    items = ("weights", "gradients", "optimizer state", "reference model")
    total = 0
    for item, n_bytes in zip(items, per_weight, strict=True):
        size = PARAMS * n_bytes / (8 if item in divided else 1)  # the GPU presets' num_processes: 8
        total += size
        assert memory[item][0] == gib(size), item
        assert ("/ 8:" in memory[item][1]) == (item in divided), memory[item][1]
    assert memory["model states"][0] == gib(total)


def test_user_config_shard_grad_op_and_no_mixed_precision(cli, qwen2_7b, write):
    fsdp = write(
        "fsdp_grad_op.yaml",
        "distributed_type: FSDP\nnum_processes: 4\nmixed_precision: 'no'\n"
        "fsdp_config:\n  fsdp_version: 1\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n",
    )
    geometry, memory = plan(cli, "--model_name_or_path", qwen2_7b, "--accelerate_config", fsdp, "--dtype", "bfloat16")
    assert geometry["processes"] == ("4", f"num_processes of accelerate config {fsdp}")
    # bfloat16 weights, no mixed precision: 2 bytes each for weights and gradients, 2 x 2 for the moments; gradients
    # and optimizer state / 4, the weights whole.
    assert memory["weights"][0] == gib(PARAMS * 2) == "14.19 GiB"
    assert memory["gradients"][0] == gib(PARAMS * 2 / 4) == "3.55 GiB"
    assert memory["optimizer state"][0] == gib(PARAMS * 4 / 4) == "7.09 GiB"
    assert "FSDP SHARD_GRAD_OP" in memory["gradients"][1]
    assert memory["reference model"][0] == "0"  # beta = 0


def test_zero3_without_mixed_precision(cli, qwen2_7b):
    _, memory = plan(
        cli,
        "--model_name_or_path",
        qwen2_7b,
        "--accelerate_config",
        "zero3",
        "--num_processes",
        "4",
        "--bf16",
        "false",
    )
    # float32 throughout, no master copy: 4 + 4 + 8 bytes per weight, all / 4
    assert memory["weights"][0] == gib(PARAMS * 4 / 4) == "7.09 GiB"
    assert memory["optimizer state"][0] == gib(PARAMS * 8 / 4) == "14.19 GiB"
    assert "master" not in memory["optimizer state"][1]


def test_one_process_plan_is_unchanged(cli, qwen2_7b):
    geometry, memory = plan(cli, "--model_name_or_path", qwen2_7b)
    assert geometry["processes"][0] == "1"
    assert memory["weights"] == (gib(PARAMS * 4), "float32")
    assert memory["optimizer state"][0] == gib(PARAMS * 8)
    assert memory["gradients"] == (gib(PARAMS * 4), "all weights")


GEOMETRY = ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2", "--num_generations", "8"]


def test_generation_batch_is_derived_for_the_planned_processes(cli):
    # 8 completions x 4 processes x 2 steps per round = 64 completions = 8 prompts; one process would make 16
    geometry, _ = plan(cli, *GEOMETRY, "--num_processes", "4")
    assert {k: geometry[k][0] for k in ("processes", "generation_batch_size", "prompts_per_generation")} == {
        "processes": "4",
        "generation_batch_size": "64",
        "prompts_per_generation": "8",
    }
    result = cli("config", "show", "--format", "json", *GEOMETRY, "--accelerate_config", "multi_cpu")
    shown = json.loads(result.out)
    assert shown["generation_batch_size"] == {"value": 32, "source": "derived"}  # 8 x 2 (multi_cpu) x 2
    assert "note: launch: accelerate config multi_cpu, 2 process(es)" in result.err


def test_generation_batch_under_world_size(cli, monkeypatch):
    """Under a launcher's WORLD_SIZE the rows agree: before, generation_batch_size was derived for 1 process while
    the processes row said 4."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    geometry, _ = plan(cli, *GEOMETRY)
    assert geometry["processes"][0] == "4" and geometry["generation_batch_size"][0] == "64"


def test_the_group_check_uses_the_planned_processes(cli):
    args = ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--num_generations", "4"]
    assert cli("config", "validate", *args, "--num_processes", "2").code == 0  # 2 x 2 x 1 = 4: one whole group
    result = cli("config", "validate", *args, "--num_processes", "3")  # 2 x 3 x 1 = 6: not whole groups of 4
    assert result.code == 2 and len(result.errors) == 1 and "2 x 3 x 1" in result.errors[0]


def test_launch_keys_in_yaml_are_not_unknown(cli, write):
    path = write("launch.yaml", "accelerate_config: zero2\nnum_processes: 2\nnum_generations: 4\n")
    geometry, _ = plan(cli, "--config", path)
    assert geometry["processes"] == ("2", f"num_processes (yaml:{path}:2)")
    typo_path = write("typo.yaml", "accelerate_confg: zero2\n")
    typo = cli("config", "validate", "--config", typo_path)
    assert typo.code == 2
    assert typo.errors == [
        f"error: accelerate_confg (yaml:{typo_path}:1): unknown key; did you mean 'accelerate_config'?"
    ]


def test_bf16_with_float32_weights_says_how_to_load_them_in_16_bit(cli, qwen2_7b):
    _, memory = plan(cli, "--model_name_or_path", qwen2_7b, "--bf16", "true")
    size, how = memory["weights"]
    assert size == gib(PARAMS * 4) and how.startswith("float32 (bf16 casts only the compute; dtype: bfloat16 would")
    _, memory = plan(cli, "--model_name_or_path", qwen2_7b, "--bf16", "true", "--dtype", "bfloat16")
    size, how = memory["weights"]
    assert size == gib(PARAMS * 2) and how == "bfloat16"


# ---- TRL's geometry at the planned process count, worked out here from TRL's rules:
# generation_batch_size = per_device_train_batch_size x processes x steps_per_generation, where steps_per_generation
# defaults to gradient_accumulation_steps, or is generation_batch_size / (per_device x processes) when that is given.


def trl_geometry(per_device, accum, num_gen, processes, generation_batch_size=None, steps_per_generation=None):
    if generation_batch_size is not None:
        steps = generation_batch_size // (per_device * processes)
    else:
        steps = steps_per_generation or accum
    gen_batch = per_device * processes * steps
    return {
        "processes": str(processes),
        "generation_batch_size": str(gen_batch),
        "steps_per_generation": str(steps),
        "prompts_per_generation": str(gen_batch // num_gen),
        "completions_per_optimizer_step": str(per_device * processes * accum),
        "optimizer_steps_per_generation": str(round(steps / accum, 4)),  # num_iterations 1
        "on_policy": str(accum % steps == 0),
    }


def test_world_size_8_geometry_by_hand(cli, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    geometry, _ = plan(
        cli, "--model_name_or_path", "X", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "32",
        "--num_generations", "16",
    )  # fmt: skip
    # 4 completions x 8 processes x 32 steps = 1024 completions a round = 64 prompts of 16; the optimizer step takes
    # 4 x 8 x 32 = 1024 completions too, so one round feeds exactly one step
    assert {k: v for k, (v, _) in geometry.items()} == {
        "processes": "8",
        "per_device_train_batch_size": "4",
        "gradient_accumulation_steps": "32",
        "num_generations": "16",
        "generation_batch_size": "1024",
        "steps_per_generation": "32",
        "prompts_per_generation": "64",
        "completions_per_optimizer_step": "1024",
        "optimizer_steps_per_generation": "1.0",
        "num_iterations": "1",
        "on_policy": "True",
    }


@pytest.mark.parametrize("processes", [1, 2, 8])
@pytest.mark.parametrize("how", ["--num_processes", "WORLD_SIZE"])
@pytest.mark.parametrize(
    "given",
    [
        {},
        {"generation_batch_size": 256},  # a multiple of 4 x 8: 64, 32 and 8 steps per round at 1, 2 and 8 processes
        {"steps_per_generation": 8},  # 4 x N x 8 completions a round, N x 2 groups of 16
    ],
)
def test_plan_follows_trls_rules_at_the_planned_count(cli, monkeypatch, processes, how, given):
    per_device, accum, num_gen = 4, 32, 16
    args = ["--per_device_train_batch_size", per_device, "--gradient_accumulation_steps", accum]
    args += ["--num_generations", num_gen]
    for name, value in given.items():
        args += [f"--{name}", value]
    if how == "WORLD_SIZE":
        monkeypatch.setenv("WORLD_SIZE", str(processes))
    else:
        args += ["--num_processes", processes]
    geometry, _ = plan(cli, *args)
    expected = trl_geometry(per_device, accum, num_gen, processes, **given)
    assert {k: geometry[k][0] for k in expected} == expected


def test_plan_with_explicit_generation_batch_at_2_processes(cli):
    # 96 completions a round over 3 x 2 per micro-step: 16 steps per round; 96 / 8 = 12 prompts; an optimizer step
    # is 3 x 2 x 4 = 24 completions, so one round feeds 16 / 4 = 4 optimizer steps (off-policy after the first)
    geometry, _ = plan(
        cli, "--per_device_train_batch_size", "3", "--gradient_accumulation_steps", "4", "--num_generations", "8",
        "--generation_batch_size", "96", "--num_processes", "2",
    )  # fmt: skip
    assert {k: geometry[k][0] for k in ("steps_per_generation", "prompts_per_generation")} == {
        "steps_per_generation": "16",
        "prompts_per_generation": "12",
    }
    assert geometry["completions_per_optimizer_step"][0] == "24"
    assert geometry["optimizer_steps_per_generation"][0] == "4.0" and geometry["on_policy"][0] == "False"


def test_plan_without_a_count_shows_the_broken_group_as_a_fraction(cli):
    geometry, _ = plan(
        cli,
        "--num_generations", "14", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "4",
        "--geometry-notes",
    )  # fmt: skip
    # 64 completions at 1 process are 64 / 14 = 4.57 groups: the note says which counts make whole ones
    assert geometry["prompts_per_generation"][0] == "4.57"
    assert "not whole groups at 1 process(es)" in geometry["prompts_per_generation"][1]


# ---- memory: the total rows and the weights' real dtype


def _size(n_bytes: float) -> str:
    """The plan's own units (KiB under 1 MiB, MiB under 1 GiB), written out here."""
    if n_bytes < 1024**2:
        return f"{n_bytes / 1024:.1f} KiB"
    if n_bytes < 1024**3:
        return f"{n_bytes / 1024**2:.1f} MiB"
    return gib(n_bytes)


@pytest.mark.parametrize("processes", [1, 2, 8])
def test_total_memory_rows_for_a_tiny_model(cli, tiny_model_dir, processes):
    with open(f"{tiny_model_dir}/config.json") as fh:
        config = json.load(fh)
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    _, memory = plan(
        cli, "--model_name_or_path", tiny_model_dir, "--num_processes", processes, "--dtype", "float32",
        "--per_device_train_batch_size", "2", "--max_prompt_length", "16", "--max_completion_length", "16",
        "--gradient_checkpointing", "true", "--num_generations", "2", "--gradient_accumulation_steps", "1",
    )  # fmt: skip
    params = int(memory["parameters"][1].split(" weights")[0].replace(",", ""))
    states = params * (4 + 4 + 8)  # float32 weights and gradients, AdamW's 2 float32 moments; beta 0: no reference
    logits = 2 * 16 * vocab * 4  # 2 completions x 16 tokens x vocab, float32
    activations = 2 * 32 * layers * hidden * 4  # checkpointing keeps one hidden state per token and layer
    assert memory["model states"][0] == _size(states)
    assert memory["total per process"] == (_size(states + logits + activations), "model states + logits + activations")
    name = f"total, {processes} process{'es' if processes > 1 else ''}"
    # DDP keeps everything whole on every process: the launch needs `processes` times one process's memory
    assert memory[name] == (
        _size(processes * (states + logits + activations)),
        f"{processes} x total per process: the whole launch",
    )


def test_total_memory_under_zero3_divides_the_states(cli, qwen2_7b):
    _, memory = plan(
        cli, "--model_name_or_path", qwen2_7b, "--accelerate_config", "zero3", "--num_processes", "8",
        "--per_device_train_batch_size", "1", "--max_prompt_length", "256", "--max_completion_length", "256",
        "--num_generations", "8", "--gradient_accumulation_steps", "1",
    )  # fmt: skip
    states = PARAMS * (2 + 2 + 12) / 8  # bf16 (the preset's) weights and gradients, fp32 master + moments; all / 8
    logits = 1 * 256 * 152064 * 4
    activations = 1 * 512 * 28 * 3584 * 4  # float32 dtype (the default), one hidden state per token and layer
    per_process = states + logits + activations
    assert memory["total per process"][0] == gib(per_process)
    assert memory["total, 8 processes"][0] == gib(8 * per_process)


def test_weights_dtype_comes_from_model_init_kwargs_then_dtype_then_the_checkpoint(cli, qwen2_7b, write):
    _, memory = plan(cli, "--model_name_or_path", qwen2_7b, "--model_init_kwargs", '{"dtype": "bfloat16"}')
    assert memory["weights"] == (gib(PARAMS * 2), "bfloat16 (model_init_kwargs)")
    _, memory = plan(
        cli, "--model_name_or_path", qwen2_7b, "--dtype", "bfloat16", "--model_init_kwargs", '{"dtype": "float32"}'
    )  # model_init_kwargs win over dtype, as grpokit train merges them
    assert memory["weights"] == (gib(PARAMS * 4), "float32 (model_init_kwargs)")
    # dtype auto: the checkpoint's config.json says; this one names none, so float32 is assumed
    _, memory = plan(cli, "--model_name_or_path", qwen2_7b, "--dtype", "auto")
    assert memory["weights"] == (gib(PARAMS * 4), "float32 (dtype auto, and config.json names no dtype: assumed)")


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_dtype_auto_reads_the_checkpoints_dtype(cli, tmp_path, key):
    path = tmp_path / "qwen2-7b-bf16"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**QWEN2_7B, key: "bfloat16"}))
    _, memory = plan(cli, "--model_name_or_path", str(path), "--dtype", "auto")
    assert memory["weights"] == (gib(PARAMS * 2), "bfloat16 (dtype auto: the checkpoint's, from config.json)")
    assert memory["optimizer state"][0] == gib(PARAMS * 2 * 2)  # AdamW's 2 moments in the weights' dtype
