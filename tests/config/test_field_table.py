"""The field table (`grpokit/config/field_data.py`) is generated from the dataclasses, never kept by hand: a fresh one
equals the committed one, and the light GRPOConfig built from it has the real one's fields, types, defaults and help."""

from __future__ import annotations

import dataclasses

from grpokit.config import field_table
from grpokit.config.field_data import TABLE
from grpokit.config.grpo_config import GRPOConfig
from grpokit.config.light import light_grpo_config
from grpokit.config.types import field_choices, field_types, type_label


def test_the_committed_table_is_a_fresh_one():
    fresh = field_table.build_table()
    assert fresh == TABLE  # if not: python -m grpokit.config.field_table
    assert field_table.DATA_FILE.read_text(encoding="utf-8") == field_table.render(fresh)


def test_the_light_grpo_config_has_the_real_fields():
    real, light = dataclasses.fields(GRPOConfig), dataclasses.fields(light_grpo_config())
    assert [f.name for f in light] == [f.name for f in real]
    real_types, light_types = field_types(GRPOConfig), field_types(light_grpo_config())
    for r, lt in zip(real, light, strict=True):
        assert lt.init == r.init, r.name
        assert lt.metadata["help"] == r.metadata.get("help", ""), r.name
        assert type_label(light_types[r.name]) == type_label(real_types[r.name]), r.name
        assert field_choices(light_types[r.name]) == field_choices(real_types[r.name]), r.name
        if r.default is not dataclasses.MISSING:
            default = getattr(r.default, "value", r.default)  # an enum default is written by its value
            assert lt.default == default, r.name
        else:
            assert lt.default_factory() == r.default_factory(), r.name


def test_the_table_records_what_only_the_real_class_can_judge():
    # hand-checked against transformers 5's TrainingArguments.__post_init__: it reads these fields, among others
    assert {"deepspeed", "fsdp", "accelerator_config", "eval_steps", "output_dir"} <= set(TABLE["post_init_fields"])
    assert {"wandb", "tensorboard", "mlflow"} <= set(TABLE["integrations"])
    owners = {f["name"]: f["owner"] for f in TABLE["fields"]}
    assert owners["num_generations"] == "GRPOConfig" and owners["learning_rate"] == "GRPOConfig"  # GRPO's default
    assert owners["per_device_train_batch_size"] == "TrainingArguments"
