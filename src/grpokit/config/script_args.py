"""Script arguments: which data to train on and which rewards to use. Same names and defaults as TRL 1.16."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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
        metadata={
            "help": "Split used for evaluation, or a local .json/.jsonl/.csv/.parquet file holding the eval set "
            "(grpokit extension)."
        },
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
            "help": "Reward functions: built-in names (`grpokit rewards` lists them), dotted import paths "
            "(`my_pkg.rewards.fn`), or in YAML `{name: ..., kwargs: {...}}` entries."
        },
    )
    tools: list[str] | None = field(
        default=None,
        metadata={
            "help": "Tool functions the model may call while it generates (TRL's `tools` argument of GRPOTrainer): "
            "dotted paths `package.module.function` or `package.module:function`. `grpokit config validate` checks "
            "them without importing them; `grpokit train` imports them. grpokit extension."
        },
    )
    environment_factory: dict[str, str] | str | None = field(
        default=None,
        metadata={
            "help": "Environment of an agent run (TRL's `environment_factory` argument of GRPOTrainer): the dotted "
            "path of a callable taking no argument, usually a class, whose instances' public methods are tools; or, "
            "in YAML, a mapping of environment name -> dotted path, each row picking one by its `environment` "
            "column. Checked and imported like `tools`. grpokit extension."
        },
    )

    # ---- open-r1's reward fields: offered to the built-in reward factories (a reward's own kwargs win) ----
    cosine_min_value_wrong: float = field(
        default=0.0,
        metadata={
            "help": "`cosine` reward: score of a wrong answer of length 0 (it rises to cosine_max_value_wrong at "
            "cosine_max_len). open-r1 field, with its default 0.0 (the factory called from Python without a config "
            "uses -1.0)."
        },
    )
    cosine_max_value_wrong: float = field(
        default=-0.5,
        metadata={"help": "`cosine` reward: score of a wrong answer of cosine_max_len characters. open-r1 field."},
    )
    cosine_min_value_correct: float = field(
        default=0.5,
        metadata={"help": "`cosine` reward: score of a correct answer of cosine_max_len characters. open-r1 field."},
    )
    cosine_max_value_correct: float = field(
        default=1.0,
        metadata={"help": "`cosine` reward: score of a correct answer of length 0. open-r1 field."},
    )
    cosine_max_len: int = field(
        default=1000,
        metadata={
            "help": "`cosine` reward: length in characters at which the cosine schedule ends (the `max_len` "
            "parameter). open-r1 field."
        },
    )
    repetition_n_grams: int = field(
        default=3,
        metadata={
            "help": "`repetition_penalty` reward: n-gram size in words (the `ngram_size` parameter). open-r1 field."
        },
    )
    repetition_max_penalty: float = field(
        default=-1.0,
        metadata={
            "help": "`repetition_penalty` reward: penalty (<= 0) of a completion made only of repeated n-grams (the "
            "`max_penalty` parameter). open-r1 field."
        },
    )
    max_completion_len: int | None = field(
        default=None,
        metadata={
            "help": "`soft_overlong_punishment` reward: length in tokens where the penalty reaches -1. Unset follows "
            "max_completion_length (open-r1's default, 16384, would never punish a shorter max_completion_length). "
            "open-r1 field."
        },
    )
    soft_punish_cache: int | None = field(
        default=None,
        metadata={
            "help": "`soft_overlong_punishment` reward: the window, in tokens, before max_completion_len over which "
            "the penalty falls from 0 to -1. Unset: a quarter of max_completion_len (or of max_completion_length "
            "when that is unset too); open-r1's default is 4096. open-r1 field."
        },
    )
    # ---- open-r1's code-execution fields: offered to the code reward factories under these names ----
    code_language: Literal["python", "javascript", "r", "java", "bash", "cpp"] = field(
        default="python",
        metadata={"help": "Language of the code the code rewards extract and run. open-r1 field."},
    )
    code_eval_test_batch_size: int = field(
        default=1,
        metadata={
            "help": "Code rewards: test cases run at once per completion; evaluation stops at the first batch with "
            "a failure. open-r1 field."
        },
    )
    code_eval_scoring_mode: Literal["pass_fail", "partial", "weighted_sum"] = field(
        default="weighted_sum",
        metadata={
            "help": "open-r1's scoring of its Codeforces reward (cf_code): 'pass_fail', 'partial' or "
            "'weighted_sum'. grpokit has no cf_code reward, so a value other than the default is refused; `code` "
            "scores the fraction of tests passed and `binary_code` 1/0, as in open-r1. open-r1 field."
        },
    )
    parallel_code_exec_per_proc: int = field(
        default=2,
        metadata={"help": "Code rewards: code executions run in parallel by each training process. open-r1 field."},
    )
    code_provider: Literal["local", "e2b", "morph"] = field(
        default="local",
        metadata={
            "help": "Where the code rewards run code: 'local' (a sandbox on this machine) or the remote services "
            "'e2b' and 'morph', which grpokit's code rewards refuse (offline-first). open-r1 field; its default is "
            "'e2b'."
        },
    )
    ioi_provider: Literal["piston", "morph", "local"] = field(
        default="piston",
        metadata={
            "help": "Where the ioi_code reward runs programs: 'local' (this machine's sandbox; stdin/stdout tests "
            "given inline in a test_cases column, no grader files) or open-r1's remote 'piston' / 'morph' workers, "
            "which grpokit refuses (offline-first). open-r1 field and default."
        },
    )
    e2b_router_url: str | None = field(
        default=None,
        metadata={"help": "Code rewards: URL of an E2B router (code_provider 'e2b'). open-r1 field."},
    )
    morph_router_url: str | None = field(
        default=None,
        metadata={"help": "Code rewards: URL of a MorphCloud router (code_provider 'morph'). open-r1 field."},
    )
    dataset_mixture: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "open-r1's dataset mixture ({datasets: [{id, config, split, columns, weight}], seed, "
            "test_split_size}); refused when set: write it as a `datasets:` mixture (path, name, split, columns, "
            "fraction). open-r1 field."
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
            "help": "Hold out this fraction (in (0, 1)) or number of rows of the training data (the mixture, or "
            "dataset_name's train split) for evaluation, the same rows every run; unset holds out nothing."
        },
    )

    def __post_init__(self):
        self.datasets = [DatasetConfig(**d) if isinstance(d, dict) else d for d in self.datasets]
