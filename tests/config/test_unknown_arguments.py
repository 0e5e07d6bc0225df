"""A mistyped keyword argument of GRPOConfig(...) or GRPOTrainer(...) is a TypeError, as Python's own, with the
nearest valid name; HfArgumentParser still builds GRPOConfig."""

import pytest

from grpokit import GRPOConfig, GRPOTrainer


def test_grpo_config_names_the_nearest_field(tmp_path):
    with pytest.raises(TypeError) as caught:
        GRPOConfig(output_dir=str(tmp_path), num_generation=4)
    assert str(caught.value) == (
        "GRPOConfig.__init__() got an unexpected keyword argument 'num_generation'; did you mean 'num_generations'?"
    )


def test_every_unknown_argument_one_line_and_renamed_keys_name_their_new_name(tmp_path):
    with pytest.raises(TypeError) as caught:
        GRPOConfig(output_dir=str(tmp_path), evaluation_strategy="no", zzzzzz=1)
    assert str(caught.value).splitlines() == [
        "GRPOConfig.__init__() got an unexpected keyword argument 'evaluation_strategy'; did you mean "
        "'eval_strategy'? (renamed to eval_strategy in transformers 4.46)",
        "GRPOConfig.__init__() got an unexpected keyword argument 'zzzzzz'",
    ]


def test_a_subclass_keeps_its_own_fields_and_name(tmp_path):
    from dataclasses import dataclass

    @dataclass
    class MyConfig(GRPOConfig):
        my_knob: int = 1

    assert MyConfig(output_dir=str(tmp_path), my_knob=3).my_knob == 3
    with pytest.raises(TypeError, match=r"^MyConfig\.__init__\(\) .* 'my_nob'; did you mean 'my_knob'\?$"):
        MyConfig(output_dir=str(tmp_path), my_nob=3)


def test_hf_argument_parser_still_builds_the_config(tmp_path):
    from transformers import HfArgumentParser

    (config,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--num_generations", "4", "--per_device_train_batch_size", "4"]
    )
    assert (config.num_generations, config.per_device_train_batch_size) == (4, 4)


def test_grpo_trainer_names_the_nearest_argument(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(TypeError) as caught:  # refused before any model loads: the model path is never read
        GRPOTrainer("no-such-model", reward_funcs=len, args=args, train_datset=[])
    assert str(caught.value) == (
        "GRPOTrainer.__init__() got an unexpected keyword argument 'train_datset'; did you mean 'train_dataset'?"
    )
