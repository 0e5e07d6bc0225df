"""The batch geometry at the intended process count. `grpokit config validate|show|plan` check the rules at the count
training will use (--num_processes, a YAML key, an accelerate config's num_processes, WORLD_SIZE, the accelerate
default config file, else 1), and a rule broken there is an error, as in `grpokit train`. Only with --geometry-notes,
and given no count, is a rule that fails only because of the count (1 assumed) a note naming the counts that satisfy
it."""

import json

import pytest

from grpokit.config.rules import ConfigError, check_geometry, valid_process_counts

# open-r1's setting: 16 completions x N processes x 4 steps per round, groups of 14. 14 = 2 x 7 and 16 x 4 = 2^6, so
# the generation batch 64N holds whole groups when 7 divides N: at 7, 14, 21 ... processes.
OPEN_R1 = ["--num_generations", "14", "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "4"]
OPEN_R1_VALUES = {"num_generations": 14, "per_device_train_batch_size": 16, "gradient_accumulation_steps": 4}

NOTE = (
    "note: no process count given, so checked at 1 process: num_generations=14 (cli): the generation batch 64 "
    "(per_device_train_batch_size x processes x steps_per_generation = 16 x 1 x 4) must be divisible by "
    "num_generations = 14, so that it holds whole groups; the batch geometry holds at 7, 14 or 21 processes (pass "
    "--num_processes N to check one)"
)


ERROR = (
    "error: num_generations=14 (cli): the generation batch 64 (per_device_train_batch_size x processes x "
    "steps_per_generation = 16 x 1 x 4) must be divisible by num_generations = 14, so that it holds whole groups; "
    "nearest valid: per_device_train_batch_size 14 or 21; generation_batch_size 112; num_generations 16; or 7, 14 or "
    "21 processes"
)


@pytest.mark.parametrize("sub", ["validate", "show", "plan"])
def test_without_a_process_count_the_group_rule_is_an_error_at_one(cli, sub):
    result = cli("config", sub, *OPEN_R1)
    assert result.code == 2 and result.out == ""
    assert result.err.splitlines() == [ERROR]  # train's line: nearest valid values and the counts that work


@pytest.mark.parametrize("sub", ["validate", "show", "plan"])
def test_with_geometry_notes_the_group_rule_is_a_note(cli, sub):
    result = cli("config", sub, *OPEN_R1, "--geometry-notes")
    assert result.code == 0, result.err
    assert result.errors == []
    assert NOTE in result.err.splitlines()
    if sub == "validate":
        assert result.out == "ok\n"


def test_the_noted_geometry_is_still_derived_for_one_process(cli):
    shown = json.loads(cli("config", "show", "--format", "json", *OPEN_R1, "--geometry-notes").out)
    assert shown["generation_batch_size"] == {"value": 64, "source": "derived"}  # 16 x 1 x 4
    assert shown["steps_per_generation"] == {"value": 4, "source": "derived"}


def test_at_a_valid_count_no_note(cli):
    result = cli("config", "validate", *OPEN_R1, "--num_processes", "7")  # 16 x 7 x 4 = 448 = 32 groups of 14
    assert result.code == 0 and result.out == "ok\n"
    assert "no process count given" not in result.err


def test_at_a_given_invalid_count_one_error_naming_the_valid_counts(cli):
    result = cli("config", "validate", *OPEN_R1, "--num_processes", "2")  # 16 x 2 x 4 = 128, not a multiple of 14
    assert result.code == 2 and result.out == ""
    assert result.errors == [
        "error: num_generations=14 (cli): the generation batch 128 (per_device_train_batch_size x processes x "
        "steps_per_generation = 16 x 2 x 4) must be divisible by num_generations = 14, so that it holds whole groups; "
        "nearest valid: per_device_train_batch_size 14 or 21; generation_batch_size 224; num_generations 16; "
        "or 7, 14 or 21 processes"
    ]


@pytest.mark.parametrize("world_size, code", [("1", 2), ("2", 2), ("7", 0), ("14", 0)])
def test_world_size_is_a_given_count(cli, monkeypatch, world_size, code):
    monkeypatch.setenv("WORLD_SIZE", world_size)
    result = cli("config", "validate", *OPEN_R1)
    assert result.code == code, result.err
    assert "no process count given" not in result.err


def test_yaml_key_and_accelerate_configs_are_given_counts(cli, write):
    assert cli("config", "validate", "--config", write("seven.yaml", "num_processes: 7\n"), *OPEN_R1).code == 0
    assert cli("config", "validate", "--config", write("two.yaml", "num_processes: 2\n"), *OPEN_R1).code == 2
    # multi_gpu's num_processes is 8 (16 x 8 x 4 = 512) and single_gpu's 1: both given, both checked
    for preset in ("multi_gpu", "single_gpu"):
        result = cli("config", "validate", *OPEN_R1, "--accelerate_config", preset)
        assert result.code == 2 and len(result.errors) == 1 and "or 7, 14 or 21 processes" in result.errors[0]
    seven = write("seven_gpus.yaml", "distributed_type: MULTI_GPU\nnum_processes: 7\n")
    assert cli("config", "validate", *OPEN_R1, "--accelerate_config", seven).code == 0
    # an accelerate config without num_processes gives no count: 1 is assumed, as without a launch
    unstated = write("no_count.yaml", "distributed_type: MULTI_GPU\n")
    result = cli("config", "validate", *OPEN_R1, "--accelerate_config", unstated)
    assert result.code == 2 and result.errors == [ERROR]
    result = cli("config", "validate", *OPEN_R1, "--accelerate_config", unstated, "--geometry-notes")
    assert result.code == 0 and NOTE in result.err.splitlines()


def test_grpokit_train_refuses_it_at_its_count(capsys):
    from grpokit.cli.preflight import check_train_args

    resolution, problems = check_train_args([*OPEN_R1, "--max_steps", "1"])
    assert resolution is None and problems == []  # the configuration's problems were printed
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "16 x 1 x 4" in errors[0] and errors[0].endswith("or 7, 14 or 21 processes")


def test_a_python_config_refuses_it_at_its_world_size():
    from grpokit import GRPOConfig

    with pytest.raises(ConfigError, match="or 7, 14 or 21 processes"):
        GRPOConfig(output_dir="unused", **OPEN_R1_VALUES)


@pytest.mark.parametrize(
    "values, counts",
    [
        # 64N whole groups of 14: 7 | N
        (OPEN_R1_VALUES, [7, 14, 21]),
        # 3 x N x 2 = 6N, groups of 8: 4 | 3N, so 4 | N
        ({"num_generations": 8, "per_device_train_batch_size": 3, "gradient_accumulation_steps": 2}, [4, 8, 12]),
        # steps_per_generation 5 instead of the accumulation: 2 x N x 5 = 10N, groups of 4: 2 | N
        (
            {
                "num_generations": 4,
                "per_device_train_batch_size": 2,
                "gradient_accumulation_steps": 1,
                "steps_per_generation": 5,
            },
            [2, 4, 6],
        ),
        # explicit generation_batch_size 48: a multiple of 4 x N (N | 12), and 48 = 6 groups of 8 at any N
        (
            {
                "num_generations": 8,
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 1,
                "generation_batch_size": 48,
            },
            [1, 2, 3],
        ),
        # explicit generation_batch_size 30 never holds groups of 4, whatever the count
        (
            {
                "num_generations": 4,
                "per_device_train_batch_size": 3,
                "gradient_accumulation_steps": 1,
                "generation_batch_size": 30,
            },
            [],
        ),
        # evaluation: 3 x N completions in groups of 4 needs 4 | N (the training batch 4N x 1 is whole at any N)
        (
            {
                "num_generations": 4,
                "per_device_train_batch_size": 4,
                "gradient_accumulation_steps": 1,
                "eval_strategy": "steps",
                "per_device_eval_batch_size": 3,
            },
            [4, 8, 12],
        ),
        # colocated vLLM with tensor parallelism 4 needs 4 | N; groups of 6 in 3 x N x 1 need 2 | N
        (
            {
                "num_generations": 6,
                "per_device_train_batch_size": 3,
                "gradient_accumulation_steps": 1,
                "use_vllm": True,
                "vllm_tensor_parallel_size": 4,
            },
            [4, 8, 12],
        ),
        # num_generations 1021 (a prime): 1021 | N, the only count up to 1024
        ({"num_generations": 1021, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}, [1021]),
    ],
)
def test_valid_process_counts(values, counts):
    assert valid_process_counts(values) == counts
    for n in counts:
        assert check_geometry(values, n)[1] == []


def test_a_rule_no_count_mends_stays_an_error_without_a_count(cli):
    result = cli(
        "config", "validate", "--num_generations", "4", "--per_device_train_batch_size", "3",
        "--generation_batch_size", "30",
    )  # fmt: skip
    assert result.code == 2 and len(result.errors) == 1 and "processes" not in result.errors[0]


def test_other_problems_are_still_errors_with_the_note_held_back(cli):
    result = cli("config", "validate", *OPEN_R1, "--top_p", "2", "--geometry-notes")
    assert result.code == 2 and len(result.errors) == 1 and "top_p=2.0" in result.errors[0]


@pytest.mark.parametrize(
    "default_config, code",
    [
        # accelerate launch (no --config_file) would start 7 processes: 16 x 7 x 4 = 448 = 32 groups of 14
        ("distributed_type: MULTI_GPU\nnum_processes: 7\n", 0),
        ("distributed_type: MULTI_GPU\nnum_processes: 2\n", 2),
        # distributed_type NO starts one process whatever num_processes says: 64 is not whole groups of 14
        ("distributed_type: 'NO'\nnum_processes: 7\n", 2),
    ],
)
def test_the_accelerate_default_config_file_gives_the_count(cli, tmp_path, monkeypatch, default_config, code):
    home = tmp_path / "hf"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text(default_config)
    monkeypatch.setenv("HF_HOME", str(home))
    result = cli("config", "validate", *OPEN_R1, "--geometry-notes")  # a count is given: no note form
    assert result.code == code, result.err
    assert "no process count given" not in result.err
    if code == 0:
        assert result.out == "ok\n"


def test_the_default_config_file_is_where_accelerate_looks(monkeypatch, tmp_path):
    from grpokit.config.accelerate_default import default_config_path

    assert default_config_path({"HF_HOME": "/x/hf"}) == "/x/hf/accelerate/default_config.yaml"
    assert default_config_path({"XDG_CACHE_HOME": "/c"}) == "/c/huggingface/accelerate/default_config.yaml"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_config_path({}) == f"{tmp_path}/.cache/huggingface/accelerate/default_config.yaml"


def test_plan_names_the_default_config_file_as_the_count(cli, tmp_path, monkeypatch):
    home = tmp_path / "hf"
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 7\n")
    monkeypatch.setenv("HF_HOME", str(home))
    result = cli("config", "plan", *OPEN_R1)
    assert result.code == 0, result.err
    assert f"num_processes of the accelerate default config {home}/accelerate/default_config.yaml" in result.out
