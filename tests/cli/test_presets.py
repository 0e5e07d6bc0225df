"""Launch presets: `grpokit accelerate-configs [show NAME]`, and `grpokit train --accelerate_config NAME|FILE
[--num_processes N]`, which checks the configuration once here and then runs accelerate's launcher."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import yaml

from grpokit.cli import main
from grpokit.cli.launch_presets import LAUNCHED_ENV, preset_path

PRESETS = ["single_gpu", "multi_gpu", "multi_cpu", "zero1", "zero2", "zero3", "fsdp2"]
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", LAUNCHED_ENV)


@pytest.fixture(autouse=True)
def _not_launched(monkeypatch):
    """These tests run `grpokit train` as a user would: not under a launcher, whatever ran pytest."""
    for name in LAUNCHER_ENV + ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def run(capsys):
    """`run("train", ...)` -> (exit code, stdout, error lines), `grpokit.cli.main` in this process."""

    def _run(*args):
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, [line for line in err.splitlines() if line.startswith("error: ")]

    return _run


@pytest.fixture
def launches(monkeypatch):
    """Every subprocess.Popen call (the launch) is recorded instead of run; it "exits" with 7."""
    calls = []

    class FakeLaunch:
        def __init__(self, command, **kwargs):
            calls.append((list(command), kwargs.get("env")))

        def wait(self):
            return 7

    monkeypatch.setattr(subprocess, "Popen", FakeLaunch)
    return calls


@pytest.fixture
def recipe(tmp_path):
    """A valid training config that nothing loads before the launch (the model and data need not exist)."""
    path = tmp_path / "recipe.yaml"
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1="}\n')  # local data files are checked before a launch
    path.write_text(
        f"model_name_or_path: some-org/some-model\ndataset_name: {tmp_path / 'prompts.jsonl'}\nreward_funcs: [tag_count]\n"
        "num_generations: 4\nper_device_train_batch_size: 4\nreport_to: none\nbf16: false\n"
    )
    return str(path)


# ---- the presets


def test_list_names_every_preset_with_its_description(run):
    code, out, errors = run("accelerate-configs")
    assert code == 0 and not errors
    lines = []
    for line in out.splitlines():  # a long description wraps onto indented continuation lines
        if line.startswith(" "):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    assert [line.split()[0] for line in lines] == PRESETS
    described = dict(line.split(None, 1) for line in lines)
    assert described["zero3"].startswith("DeepSpeed ZeRO stage 3")
    assert described["multi_cpu"].startswith("Data parallel on the CPU")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("single_gpu", {"distributed_type": "NO", "num_processes": 1}),
        ("multi_gpu", {"distributed_type": "MULTI_GPU", "use_cpu": False, "num_processes": 8}),
        # MULTI_GPU + use_cpu: the only config file form that starts several CPU processes (MULTI_CPU starts one)
        ("multi_cpu", {"distributed_type": "MULTI_GPU", "use_cpu": True, "mixed_precision": "no", "num_processes": 2}),
        ("zero1", {"distributed_type": "DEEPSPEED", "deepspeed_config.zero_stage": 1}),
        ("zero2", {"distributed_type": "DEEPSPEED", "deepspeed_config.zero_stage": 2}),
        (
            "zero3",
            {
                "distributed_type": "DEEPSPEED",
                "deepspeed_config.zero_stage": 3,
                "deepspeed_config.zero3_init_flag": True,
                "deepspeed_config.zero3_save_16bit_model": True,
            },
        ),
        (
            "fsdp2",
            {
                "distributed_type": "FSDP",
                "fsdp_config.fsdp_version": 2,
                "fsdp_config.fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "fsdp_config.fsdp_state_dict_type": "FULL_STATE_DICT",
                "fsdp_config.fsdp_reshard_after_forward": True,
                "fsdp_config.fsdp_cpu_ram_efficient_loading": True,
            },
        ),
    ],
)
def test_show_prints_the_file_accelerate_reads(run, name, expected):
    code, out, errors = run("accelerate-configs", "show", name)
    assert code == 0 and not errors
    with open(preset_path(name), encoding="utf-8") as fh:
        assert out == fh.read()
    data = yaml.safe_load(out)
    for key, value in expected.items():
        node = data
        for part in key.split("."):
            node = node[part]
        assert node == value, key
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = load_config_from_file(preset_path(name))  # accelerate's own reading: no unknown key, valid values
    assert str(loaded.distributed_type).rsplit(".", 1)[-1] == expected["distributed_type"]


def test_show_a_typo(run):
    code, out, errors = run("accelerate-configs", "show", "zero33")
    assert code == 2 and out == ""
    assert errors == ["error: accelerate_config='zero33': neither a shipped preset nor a file; did you mean 'zero3'?"]


# ---- what is refused before anything is launched


def test_preset_typo_is_one_line_and_launches_nothing(run, launches, recipe):
    code, _, errors = run("train", "--config", recipe, "--accelerate_config", "zero33")
    assert code == 2 and launches == []
    assert errors == [
        "error: accelerate_config='zero33' (cli): neither a shipped preset nor a file; did you mean 'zero3'?"
    ]


def test_bad_training_config_fails_once_before_the_launch(run, launches, recipe):
    code, _, errors = run("train", "--config", recipe, "--accelerate_config", "multi_cpu", "--temperature", "-1")
    assert code == 2 and launches == []
    assert errors == ["error: temperature=-1.0 (cli): must be > 0; for example 1.0 (the default)"]


def test_geometry_is_checked_for_the_processes_of_the_launch(run, launches, recipe):
    # per_device_train_batch_size 2, num_generations 4: one process makes rounds of 2 completions (half a group) ...
    two = ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1"]
    code, _, errors = run("train", "--config", recipe, *two)
    assert code == 2 and len(errors) == 1 and "2 x 1 x 1" in errors[0]
    # ... multi_cpu's 2 processes make 2 x 2 = 4: whole groups, so the launch starts ...
    code, _, errors = run("train", "--config", recipe, *two, "--accelerate_config", "multi_cpu")
    assert (code, errors, len(launches)) == (7, [], 1)
    # ... and 3 processes make 6, not a multiple of 4: refused before launching.
    code, _, errors = run(
        "train", "--config", recipe, *two, "--accelerate_config", "multi_cpu", "--num_processes", "3"
    )
    assert code == 2 and len(launches) == 1
    assert len(errors) == 1 and "2 x 3 x 1" in errors[0] and "num_generations = 4" in errors[0]


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--num_processes", "2"],
            "error: num_processes (cli): a launch needs accelerate_config too (e.g. --accelerate_config multi_cpu on "
            "CPU, multi_gpu on GPUs; see grpokit accelerate-configs)",
        ),
        (["--accelerate_config", "multi_cpu", "--num_processes", "0"], "error: num_processes='0' (cli): must be an"),
        (
            ["--accelerate_config", "single_gpu", "--num_processes", "2"],
            "error: num_processes=2 (cli): accelerate config single_gpu runs one process (distributed_type NO), not 2",
        ),
        (
            ["--accelerate_config", "missing/launch.yaml"],
            "error: accelerate_config='missing/launch.yaml' (cli): no such",
        ),
        (["--accelerate_conf", "zero3"], "error: --accelerate_conf (cli): unknown argument; did you mean --accel"),
        (["--accelerate_config"], "error: --accelerate_config (cli): expects a value"),
    ],
)
def test_bad_launch_options(run, launches, recipe, flags, expected):
    code, _, errors = run("train", "--config", recipe, *flags)
    assert code == 2 and launches == []
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_fsdp_on_a_machine_without_cuda(run, launches, recipe, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, errors = run("train", "--config", recipe, "--accelerate_config", "fsdp2")
    assert code == 2 and launches == []
    assert errors == [
        "error: accelerate_config='fsdp2': FSDP needs CUDA GPUs and this machine has none (accelerate would run DDP "
        "instead); on CPU use --accelerate_config multi_cpu"
    ]


def test_user_files(run, launches, recipe, tmp_path):
    multi_cpu = tmp_path / "multi_cpu_wrong.yaml"  # MULTI_CPU in a config file starts ONE process in accelerate 1.x
    multi_cpu.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: 'no'\nuse_cpu: true\n")
    code, _, errors = run("train", "--config", recipe, "--accelerate_config", multi_cpu)
    assert code == 2 and launches == []
    assert errors == [
        f"error: accelerate_config={str(multi_cpu)!r} (cli): distributed_type MULTI_CPU makes accelerate start one "
        "process, not 2; write distributed_type: MULTI_GPU with use_cpu: true (as the multi_cpu preset does)"
    ]
    typo = tmp_path / "typo.yaml"
    typo.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nnum_procesess: 2\n")
    code, _, errors = run("train", "--config", recipe, "--accelerate_config", typo)
    assert code == 2 and launches == [] and len(errors) == 1
    assert errors[0].startswith(f"error: accelerate_config={str(typo)!r} (cli): accelerate rejects it: ")
    assert "unknown keys (['num_procesess'])" in errors[0]
    good = tmp_path / "two_gpus.yaml"
    good.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: 'no'\n")
    assert run("train", "--config", recipe, "--accelerate_config", good)[0] == 7
    ((command, env),) = launches
    assert command[3:5] == ["--config_file", str(good)] and "--num_processes" not in command
    assert "ACCELERATE_USE_CPU" not in env  # use_cpu is not set in that file


# ---- the launch


def test_launcher_command_for_a_preset(run, launches, recipe):
    code, _, errors = run(
        "train", "--config", recipe, "--accelerate_config", "zero2", "--learning_rate", "1e-5",
        "--num_processes=4", "--main_process_port", "29555",
    )  # fmt: skip
    assert (code, errors) == (7, [])  # the launcher's exit code
    ((command, env),) = launches
    assert command == [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", preset_path("zero2"),
        "--mixed_precision", "no",  # the training config's (bf16: false), not the preset's bf16
        "--num_processes", "4", "--main_process_port", "29555",
        "-m", "grpokit", "train", "--config", recipe, "--learning_rate", "1e-5",
    ]  # fmt: skip
    assert env[LAUNCHED_ENV] == "1" and "ACCELERATE_USE_CPU" not in env


def test_multi_cpu_launch_tells_the_processes_to_use_the_cpu(run, launches, recipe):
    assert run("train", "--config", recipe, "--accelerate_config", "multi_cpu")[0] == 7
    ((command, env),) = launches
    assert command[3:] == [
        "--config_file", preset_path("multi_cpu"), "--mixed_precision", "no", "-m", "grpokit", "train", "--config", recipe
    ]  # fmt: skip
    # accelerate does not pass the file's use_cpu on to the processes it starts: without this, each would run alone
    assert env["ACCELERATE_USE_CPU"] == "true"


def test_deepspeed_preset_with_use_cpu_is_refused_before_the_launch(run, launches, recipe):
    code, _, errors = run("train", "--config", recipe, "--accelerate_config", "zero3", "--use_cpu", "true")
    assert code == 2 and launches == []
    assert errors == [
        "error: use_cpu=True: accelerate turns DeepSpeed off when told to use the CPU (plain DDP would run); set "
        "use_cpu: false, DeepSpeed runs over gloo on a CPU machine without it"
    ]


def test_zero3_vllm_without_gathering_is_refused_before_the_launch(run, launches, recipe):
    flags = ["--use_vllm", "true", "--vllm_mode", "colocate", "--ds3_gather_for_generation", "false"]
    code, _, errors = run("train", "--config", recipe, "--accelerate_config", "zero3", *flags)
    assert code == 2 and launches == []
    # (this venv has no vLLM: that is said too, on its own line)
    assert any(e.startswith("error: ds3_gather_for_generation=False: with use_vllm") for e in errors)


def test_launch_options_in_the_yaml(run, launches, tmp_path, recipe):
    with_launch = tmp_path / "with_launch.yaml"
    with_launch.write_text(open(recipe).read() + "accelerate_config: multi_cpu\nnum_processes: 2\n")
    assert run("train", "--config", with_launch, "--num_processes", "4")[0] == 7  # the flag wins over the YAML
    ((command, _),) = launches
    assert command[3:] == [
        "--config_file", preset_path("multi_cpu"), "--mixed_precision", "no", "--num_processes", "4",
        "-m", "grpokit", "train", "--config", str(with_launch),
    ]  # fmt: skip


def test_launched_processes_do_not_launch_again(run, launches, tmp_path, recipe, monkeypatch):
    """A process started by the launch reads the same YAML (accelerate_config included): it trains, it does not
    launch. Here the training stops at the model (a hub id, offline), past the point where it would launch."""
    with_launch = tmp_path / "with_launch.yaml"
    with_launch.write_text(open(recipe).read() + "accelerate_config: multi_cpu\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(LAUNCHED_ENV, "1")
    code, _, errors = run("train", "--config", with_launch)
    assert code == 2 and launches == []
    assert len(errors) == 1 and errors[0].startswith("error: loading 'some-org/some-model' failed: "), errors


def test_launch_flags_under_someone_elses_launcher_are_ignored_with_a_warning(launches, recipe, capsys, monkeypatch):
    # e.g. `accelerate launch -m grpokit train --accelerate_config zero3`: accelerate's launchers set this variable
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    code = main(["train", "--config", recipe, "--accelerate_config", "zero3"])
    err = capsys.readouterr().err
    assert code == 2 and launches == []
    assert "warning: the launch options (accelerate_config) are ignored: this process was started by a launcher" in err


# ---- one real launch: 2 CPU processes in one gloo group


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "preset, extra",
    [
        ("multi_cpu", []),
        # DeepSpeed on CPU: not told "cpu" (the demo's own config says use_cpu: true); gloo is chosen for it. The
        # preset's bf16 gives way to the training config's precision (fp32 here).
        ("zero3", ["--use_cpu", "false"]),
    ],
)
def test_demo_really_runs_two_processes(tmp_path, preset, extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and not k.startswith("ACCELERATE_")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = tmp_path / "demo"
    command = [sys.executable, "-m", "grpokit", "train", "--demo", "--accelerate_config", preset, *extra]
    command += ["--num_processes", "2", "--main_process_port", str(_free_port())]
    command += ["--max_steps", "2", "--logging_steps", "1", "--output_dir", str(out)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout[-1500:], result.stderr[-3000:])
    assert f"grpokit: 2 process(es) with accelerate config {preset}" in result.stderr
    # Rank 0 derived the generation batch for 2 processes: 32 completions per process x 2 processes x 1 step.
    assert "generation_batch_size=64" in (out / "resolved_config.yaml").read_text()
    # The 4000 demo prompts x 8 completions, shared by 2 processes of 32 completions per step: 500 steps per epoch
    # (one process alone would take 1000), so one step is 0.002 epoch.
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["epoch"]) for r in rows if "reward" in r] == [(1, 0.002), (2, 0.004)]
    assert (out / "model.safetensors").is_file()
    if preset == "multi_cpu":  # the demo's text model uses every parameter: DDP is not told to look for unused ones
        assert "find_unused_parameters=True" not in result.stderr


def test_sigterm_to_a_two_process_launch_saves_one_checkpoint_and_stops_every_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and not k.startswith("ACCELERATE_")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = tmp_path / "demo"
    command = [sys.executable, "-m", "grpokit", "train", "--demo", "--accelerate_config", "multi_cpu"]
    command += ["--num_processes", "2", "--main_process_port", str(_free_port())]
    command += ["--max_steps", "400", "--logging_steps", "1", "--output_dir", str(out)]
    launch = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in launch.stdout:  # process 0's first progress line: both processes are training
        if line.startswith("step"):
            break
    launch.send_signal(signal.SIGTERM)  # to the grpokit process that started the launch, as a scheduler would
    _, err = launch.communicate(timeout=120)
    assert launch.returncode == 143, err[-3000:]
    saved = [line for line in err.splitlines() if "saved to" in line]
    assert len(saved) == 1, err[-3000:]  # only process 0, which wrote, says where
    step = int(saved[0].split("stopped after step ")[1].split(";")[0])
    assert saved[0] == (
        f"error: SIGTERM: stopped after step {step}; checkpoint saved to {out / f'checkpoint-{step}'} (continue with "
        "--resume_from_checkpoint true)"
    )
    # Both processes stopped at the same step and saved it together: one complete checkpoint, both RNG states.
    checkpoints = sorted(p.name for p in out.iterdir() if "checkpoint" in p.name)
    assert checkpoints == [f"checkpoint-{step}"]
    assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= set(os.listdir(out / checkpoints[0]))
    assert not (out / ".grpokit.lock").exists()


def test_the_demo_on_two_machines_each_with_its_own_folder(tmp_path):
    """Two machines on one host (accelerate's --num_machines 2, gloo), two processes each, and no shared filesystem: a
    folder per machine. Each machine writes its own demo model and data (the second one's used to lack the weights:
    transformers writes them on global rank 0 only), and both train."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and not k.startswith("ACCELERATE_")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="true")
    port = str(_free_port())
    machines = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "4"]
        command += ["--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1"]
        command += ["--main_process_port", port, "--mixed_precision", "no", "--dynamo_backend", "no"]
        command += ["-m", "grpokit", "train", "--demo", "--max_steps", "2", "--logging_steps", "1"]
        command += ["--output_dir", str(tmp_path / f"machine{rank}")]
        machines.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outputs = [machine.communicate(timeout=600) for machine in machines]
    finally:
        for machine in machines:
            if machine.poll() is None:
                machine.kill()
    for machine, (_, stderr) in zip(machines, outputs, strict=True):
        assert machine.returncode == 0, stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"machine{rank}" / "initial_model" / "model.safetensors").is_file()
    rows = [json.loads(line) for line in (tmp_path / "machine0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward" in r] == [1, 2]  # process 0 writes the run's records


def test_checkpoints_in_a_folder_per_machine_are_refused_in_one_line(tmp_path):
    """Two machines on one host with a folder each, and checkpoints to write: refused before the model loads, on both
    machines, naming the machine that cannot see process 0's folder (checkpoints need one shared output_dir)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and not k.startswith("ACCELERATE_")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="true")
    port = str(_free_port())
    machines = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
        command += ["--num_machines", "2", "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1"]
        command += ["--main_process_port", port, "--mixed_precision", "no", "--dynamo_backend", "no"]
        command += ["-m", "grpokit", "train", "--demo", "--max_steps", "2", "--save_strategy", "steps"]
        command += ["--save_steps", "1", "--output_dir", str(tmp_path / f"machine{rank}")]
        machines.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outputs = [machine.communicate(timeout=600) for machine in machines]
    finally:
        for machine in machines:
            if machine.poll() is None:
                machine.kill()
    for machine, (_, stderr) in zip(machines, outputs, strict=True):
        assert machine.returncode != 0
        assert "is not shared between machines: machine 1 does not see what process 0 writes there" in stderr
    assert not list((tmp_path / "machine0").glob("checkpoint-*"))
