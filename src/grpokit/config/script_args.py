"""Script arguments: which data to train on and which rewards to use. Same names and defaults as TRL 1.16."""

from __future__ import annotations

from dataclasses import dataclass, field

from .rules import validate_instance


@dataclass
class ScriptArguments:
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Dataset to train on: a hub id, a local directory, or a local .json/.jsonl/.csv/.parquet file. "
            "Ignored when a `datasets:` mixture is given."
        },
    )
    dataset_config: str | None = field(
        default=None,
        metadata={"help": "Configuration (subset) name of the dataset, the `name` of `datasets.load_dataset`."},
    )
    dataset_train_split: str = field(
        default="train",
        metadata={"help": "Split used for training."},
    )
    dataset_test_split: str = field(
        default="test",
        metadata={"help": "Split used for evaluation."},
    )
    dataset_streaming: bool = field(
        default=False,
        metadata={"help": "Stream the dataset instead of downloading and caching it whole."},
    )
    ignore_bias_buffers: bool = field(
        default=False,
        metadata={
            "help": "Distributed debugging aid: ignore boolean bias/mask buffers that DDP cannot broadcast "
            "(transformers issue 22482)."
        },
    )

    def __post_init__(self):
        validate_instance(self)


@dataclass
class GRPOScriptArguments(ScriptArguments):
    dataset_prompt_column: str = field(
        default="prompt",
        metadata={"help": "Dataset column holding the prompt (text or a list of chat messages). grpokit extension."},
    )
    system_prompt: str | None = field(
        default=None,
        metadata={
            "help": "Prepended to every prompt: a system message for conversational prompts, plain text otherwise. "
            "grpokit extension, as in open-r1 recipes."
        },
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Sequence-classification reward model (hub id or local directory) scored after the reward "
            "functions."
        },
    )
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions: built-in names (see `grpokit recipes` and the README), dotted import paths "
            "(`my_pkg.rewards.fn`), or in YAML `{name: ..., kwargs: {...}}` entries."
        },
    )


@dataclass
class DatasetConfig:
    path: str = field(metadata={"help": "Hub id, local directory or local data file of this dataset."})
    name: str | None = field(default=None, metadata={"help": "Configuration (subset) name of the dataset."})
    data_dir: str | None = field(default=None, metadata={"help": "Sub-directory of the dataset to load."})
    data_files: str | list[str] | dict[str, str] | None = field(
        default=None, metadata={"help": "Data file(s) of the dataset to load."}
    )
    split: str = field(default="train", metadata={"help": "Split to load."})
    columns: list[str] | None = field(
        default=None,
        metadata={"help": "Columns to keep; unset keeps all. Every dataset of a mixture must end with the same ones."},
    )
    fraction: float | None = field(
        default=None, metadata={"help": "Fraction of the split to keep, in (0, 1]; unset keeps it all."}
    )


@dataclass
class DatasetMixtureConfig:
    datasets: list[DatasetConfig] = field(
        default_factory=list,
        metadata={"help": "Datasets concatenated into the training set; each an entry with `path` and options."},
    )
    streaming: bool = field(default=False, metadata={"help": "Stream the datasets of the mixture."})
    test_split_size: float | None = field(
        default=None,
        metadata={
            "help": "Hold out this fraction (in (0, 1)) or number of rows of the mixture for evaluation; unset "
            "holds out nothing."
        },
    )

    def __post_init__(self):
        self.datasets = [DatasetConfig(**d) if isinstance(d, dict) else d for d in self.datasets]
