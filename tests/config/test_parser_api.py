"""`TrlParser` answers every `HfArgumentParser` method with TRL 1.16's return shape (worked out by running TRL's own
parser on the same arguments): one instance per dataclass, in order, then the remaining strings when asked for."""

import json
import sys

import pytest

from grpokit import GRPOConfig, ModelConfig, ScriptArguments, TrlParser

BASE = ["--output_dir", "out", "--use_cpu", "true", "--bf16", "false"]


def kinds(result):
    return [type(x).__name__ for x in result]


@pytest.fixture
def three():
    return TrlParser((ScriptArguments, GRPOConfig, ModelConfig))


def test_one_dataclass_gives_one_instance():
    (config,) = TrlParser((GRPOConfig,)).parse_args_into_dataclasses(BASE)  # TRL: (config,), no parser Namespace
    assert isinstance(config, GRPOConfig) and config.output_dir == "out"


def test_the_transformers_script_idiom_unpacks(three, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", *BASE, "--dataset_name", "d", "--model_name_or_path", "m"])
    script_args, training_args, model_args = three.parse_args_into_dataclasses()
    assert (script_args.dataset_name, training_args.output_dir, model_args.model_name_or_path) == ("d", "out", "m")


def test_remaining_strings_come_last(three):
    result = three.parse_args_into_dataclasses([*BASE, "--dataset_name", "d", "--foo", "1"], True)
    assert kinds(result) == ["ScriptArguments", "GRPOConfig", "ModelConfig", "list"]
    assert result[-1] == ["--foo", "1"]
    result = three.parse_args_and_config([*BASE, "--dataset_name", "d", "--foo", "1"], return_remaining_strings=True)
    assert kinds(result) == ["ScriptArguments", "GRPOConfig", "ModelConfig", "list"] and result[-1] == ["--foo", "1"]


def test_a_yaml_file_through_either_method(three, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("output_dir: out\ndataset_name: d\nuse_cpu: true\nbf16: false\nlearning_rate: 3.0e-6\n")
    for parse in (three.parse_args_and_config, three.parse_args_into_dataclasses):
        script_args, config, _ = parse(["--config", str(path)])
        assert (script_args.dataset_name, config.learning_rate) == ("d", 3e-6)
    result = three.parse_args_into_dataclasses(["--config", str(path)], return_remaining_strings=True)
    assert kinds(result) == ["ScriptArguments", "GRPOConfig", "ModelConfig", "list"] and result[-1] == []


def test_dict_yaml_and_json_files(three, tmp_path):
    values = {"output_dir": "out", "dataset_name": "d", "use_cpu": True, "bf16": False}
    (tmp_path / "c.json").write_text(json.dumps(values))
    (tmp_path / "c.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))
    for result in (
        three.parse_dict(values),
        three.parse_dict({**values, "foo": 1}, allow_extra_keys=True),
        three.parse_yaml_file(str(tmp_path / "c.yaml")),
        three.parse_json_file(str(tmp_path / "c.json")),
    ):
        assert kinds(result) == ["ScriptArguments", "GRPOConfig", "ModelConfig"]
        assert (result[0].dataset_name, result[1].output_dir) == ("d", "out")


def test_args_files_are_refused_in_one_line(three):
    with pytest.raises(ValueError, match=r"`\.args` files .* pass --config FILE\.yaml$"):
        three.parse_args_into_dataclasses(BASE, args_filename="train.args")
