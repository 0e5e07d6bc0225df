"""Malformed configurations: every one exits with status 2, without a traceback, naming the offending field (or
file:line for YAML syntax problems) and, where one exists, the nearest valid name or value.

The cases run in-process through `grpokit.cli.main` (the console script's own code path), which keeps the suite
fast; a handful also run through the real console script, in subprocesses started together.
"""

import importlib

import pytest
from _config_helpers import console_script

REWARDS = importlib.import_module("grpokit.rewards")
HAS_REWARD_CHECKS = hasattr(REWARDS, "check_reward_spec")
needs_reward_checks = pytest.mark.skipif(not HAS_REWARD_CHECKS, reason="grpokit.rewards.check_reward_spec missing")

# (id, YAML text or None, extra command-line arguments, substrings expected on stderr). `{file}` is the YAML file's
# path, `{tmp}` the test's temporary directory. Command-line arguments follow `grpokit config validate`.
# The batch-geometry cases give `--num_processes 1`: without a process count, a rule that only the count breaks is a
# note (tests/config/test_process_counts.py).
# fmt: off
YAML_CASES = [
    # ---- unknown keys, with the nearest valid name
    ("unknown-key", "num_generation: 8\n", [], ["num_generation (yaml:{file}:1): unknown key", "did you mean 'num_generations'?"]),
    ("unknown-key-line-3", "beta: 0.0\ntemperature: 0.9\nlerning_rate: 1.0e-5\n", [], ["lerning_rate (yaml:{file}:3)", "did you mean 'learning_rate'?"]),
    ("unknown-key-near-env", "evn:\n  A: 1\n", [], ["evn (yaml:{file}:1): unknown key", "did you mean 'env'?"]),
    ("unknown-key-plural", "reward_func: [format]\n", [], ["reward_func (yaml:{file}:1)", "did you mean 'reward_funcs'?"]),
    ("unknown-key-grpokit-extension", "max_prompt_lenght: 256\n", [], ["max_prompt_lenght", "did you mean 'max_prompt_length'?"]),
    # ---- types: a YAML value goes through the same coercion as a command-line string
    ("float-for-int", "num_generations: 8.5\n", [], ["num_generations (yaml:{file}:1): 8.5 is not an integer", "did you mean 8?"]),
    ("word-for-int", "num_generations: eight\n", [], ["num_generations", "'eight' is not an integer"]),
    ("bool-for-int", "num_generations: true\n", [], ["num_generations", "True is not an integer"]),
    ("list-for-scalar", "num_generations: [8]\n", [], ["num_generations", "[8] is not an integer"]),
    ("mapping-for-number", "learning_rate:\n  value: 1.0e-6\n", [], ["learning_rate", "{'value': 1e-06} is not a number"]),
    ("word-for-float", "temperature: hot\n", [], ["temperature", "'hot' is not a number"]),
    ("nan-for-float", "temperature: .nan\n", [], ["temperature", "is not a number"]),
    ("inf-for-int", "max_completion_length: .inf\n", [], ["max_completion_length", "inf is not an integer"]),
    ("date-for-float", "beta: 2025-01-01\n", [], ["beta", "is not a number"]),
    ("exponent-for-int", "max_completion_length: 1e3\n", [], ["max_completion_length", "is not an integer", "did you mean 1000?"]),
    ("word-for-bool", "bf16: maybe\n", [], ["bf16 (yaml:{file}:1): 'maybe' is not a boolean"]),
    ("null-for-required-int", "seed: null\n", [], ["seed", "null is not allowed"]),
    ("list-for-string", "output_dir: [a, b]\n", [], ["output_dir", "is not a string"]),
    ("word-in-number-list", "reward_funcs: [format, tag_count]\nreward_weights: [1.0, heavy]\n", [], ["reward_weights", "item 1: 'heavy' is not a number"]),
    ("list-for-kwargs", "lr_scheduler_kwargs: [0.1]\n", [], ["lr_scheduler_kwargs", "is not a mapping"]),
    # ---- YAML structure and syntax: file:line
    ("duplicate-key", "beta: 0.1\ntemperature: 1.0\nbeta: 0.2\n", [], ["{file}:3", "duplicate key 'beta' (first on line 1)"]),
    ("duplicate-nested-key", "generation_kwargs:\n  top_k: 5\n  top_k: 6\n", [], ["{file}:3", "duplicate key 'top_k'"]),
    ("python-object-tag", "beta: !!python/object/apply:os.system [echo hi]\n", [], ["{file}:1", "Python object"]),
    ("python-name-tag", "beta: 0.1\ntemperature: !!python/name:os.system\n", [], ["{file}:2", "Python object"]),
    ("custom-tag", "beta: !float 0.1\n", [], ["{file}:1", "'!float'"]),
    ("top-level-list", "- beta\n- 0.1\n", [], ["{file}", "top level must be a mapping", "not a list"]),
    ("top-level-scalar", "beta 0.1\n", [], ["{file}", "top level must be a mapping", "not a str"]),
    ("unclosed-bracket", "beta: 0.1\ntemperature: [1.0\nlearning_rate: 1.0e-5\n", [], ["{file}:3:14", "flow sequence that starts at line 2"]),
    ("unclosed-quote", "beta: 0.1\nsystem_prompt: 'Think first\n", [], ["{file}:3", "quoted scalar that starts at line 2"]),
    ("bad-indentation", "beta: 0.1\n  temperature: 1.0\n", [], ["{file}:2", "mapping values are not allowed here"]),
    ("tab-indentation", "beta: 0.1\n\ttemperature: 1.0\n", [], ["{file}:2", "'\\t'"]),
    ("two-documents", "beta: 0.1\n---\ntemperature: 1.0\n", [], ["{file}:2", "another document"]),
    ("non-string-key", "beta: 0.1\n8: num_generations\n", [], ["{file}:2", "key 8 is not a string"]),
    ("list-as-key", "beta: 0.1\n? [a, b]\n: 1\n", [], ["{file}:2", "a key must be a plain value"]),
    ("merge-of-scalar", "<<: 5\n", [], ["{file}:1", "for merging"]),
    # ---- enumerations: ours and TrainingArguments'
    ("loss-type", "loss_type: dapoo\n", [], ["loss_type (yaml:{file}:1): 'dapoo' is not one of", "did you mean 'dapo'?"]),
    ("loss-type-dash", "loss_type: dr-grpo\n", [], ["loss_type", "did you mean 'dr_grpo'?"]),
    ("scale-rewards", "scale_rewards: groups\n", [], ["scale_rewards", "did you mean 'group'?"]),
    ("importance-sampling-level", "importance_sampling_level: sequense\n", [], ["importance_sampling_level", "did you mean 'sequence'?"]),
    ("vllm-mode", "vllm_mode: colocated\n", [], ["vllm_mode", "did you mean 'colocate'?"]),
    ("vllm-importance-sampling-mode", "vllm_importance_sampling_mode: sequence_masks\n", [], ["vllm_importance_sampling_mode", "did you mean 'sequence_mask'?"]),
    ("multi-objective-aggregation", "multi_objective_aggregation: normalize_then_add\n", [], ["multi_objective_aggregation", "did you mean 'normalize_then_sum'?"]),
    ("lr-scheduler-type", "lr_scheduler_type: cosinee\n", [], ["lr_scheduler_type (yaml:{file}:1): 'cosinee' is not one of", "did you mean 'cosine'?"]),
    ("optim", "optim: adamw_torch_fuse\n", [], ["optim", "did you mean 'adamw_torch_fused'?"]),
    ("save-strategy", "save_strategy: epochs\n", [], ["save_strategy", "did you mean 'epoch'?"]),
    ("eval-strategy", "eval_strategy: step\n", [], ["eval_strategy", "did you mean 'steps'?"]),
    ("logging-strategy", "logging_strategy: stepz\n", [], ["logging_strategy", "did you mean 'steps'?"]),
    ("hub-strategy", "hub_strategy: every-save\n", [], ["hub_strategy", "did you mean 'every_save'?"]),
    ("dtype", "dtype: bfloat\n", [], ["dtype (yaml:{file}:1)", "did you mean 'bfloat16'?"]),
    ("bnb-quant-type", "bnb_4bit_quant_type: nf8\n", [], ["bnb_4bit_quant_type", "did you mean 'nf4'?"]),
    ("migrated-dtype-value", "torch_dtype: bf16\n", [], ["dtype (migrated:torch_dtype)", "did you mean 'bfloat16'?"]),
    ("migrated-eval-strategy-value", "evaluation_strategy: stepz\n", [], ["eval_strategy (migrated:evaluation_strategy)", "did you mean 'steps'?"]),
    # ---- ranges, with the nearest valid value where there is one
    ("num-generations-1", "num_generations: 1\n", [], ["num_generations=1 (yaml:{file}:1): must be >= 2", "nearest valid value: 2"]),
    ("temperature-0", "temperature: 0\n", [], ["temperature=0.0", "must be > 0", "for example 1.0 (the default)"]),
    ("temperature-negative", "temperature: -0.7\n", [], ["temperature=-0.7", "must be > 0"]),
    ("top-p-0", "top_p: 0\n", [], ["top_p=0.0", "must be > 0 and <= 1"]),
    ("top-p-above-1", "top_p: 1.5\n", [], ["top_p=1.5", "must be > 0 and <= 1", "nearest valid value: 1"]),
    ("min-p-negative", "min_p: -0.1\n", [], ["min_p=-0.1", "must be >= 0 and <= 1", "nearest valid value: 0"]),
    ("min-p-above-1", "min_p: 1.5\n", [], ["min_p=1.5", "nearest valid value: 1"]),
    ("beta-negative", "beta: -0.04\n", [], ["beta=-0.04", "must be >= 0", "nearest valid value: 0"]),
    ("epsilon-negative", "epsilon: -0.2\n", [], ["epsilon=-0.2", "must be >= 0"]),
    ("epsilon-high-negative", "epsilon_high: -0.28\n", [], ["epsilon_high=-0.28", "must be >= 0"]),
    ("delta-1", "delta: 1\n", [], ["delta=1.0", "must be > 1"]),
    ("delta-below-1", "delta: 0.5\n", [], ["delta=0.5", "must be > 1"]),
    ("max-completion-length-0", "max_completion_length: 0\n", [], ["max_completion_length=0", "must be >= 1", "nearest valid value: 1"]),
    ("num-iterations-0", "num_iterations: 0\n", [], ["num_iterations=0", "must be >= 1"]),
    ("steps-per-generation-0", "steps_per_generation: 0\n", [], ["steps_per_generation=0", "must be >= 1"]),
    ("gradient-accumulation-0", "gradient_accumulation_steps: 0\n", [], ["gradient_accumulation_steps=0", "must be >= 1"]),
    ("per-device-batch-0", "per_device_train_batch_size: 0\n", [], ["per_device_train_batch_size=0", "must be >= 1"]),
    ("learning-rate-negative", "learning_rate: -1.0e-6\n", [], ["learning_rate=-1e-06", "must be >= 0"]),
    ("top-entropy-quantile-0", "top_entropy_quantile: 0\n", [], ["top_entropy_quantile=0.0", "must be > 0 and <= 1"]),
    ("top-entropy-quantile-above-1", "top_entropy_quantile: 1.2\n", [], ["top_entropy_quantile=1.2", "nearest valid value: 1"]),
    ("ref-mixup-alpha-above-1", "ref_model_mixup_alpha: 1.5\n", [], ["ref_model_mixup_alpha=1.5", "must be >= 0 and <= 1"]),
    ("ref-mixup-alpha-negative", "ref_model_mixup_alpha: -0.1\n", [], ["ref_model_mixup_alpha=-0.1", "nearest valid value: 0"]),
    ("vllm-memory-0", "vllm_gpu_memory_utilization: 0\n", [], ["vllm_gpu_memory_utilization=0.0", "must be > 0 and <= 1"]),
    ("vllm-memory-above-1", "vllm_gpu_memory_utilization: 1.2\n", [], ["vllm_gpu_memory_utilization=1.2", "nearest valid value: 1"]),
    ("vllm-tensor-parallel-0", "vllm_tensor_parallel_size: 0\n", [], ["vllm_tensor_parallel_size=0", "must be >= 1"]),
    ("server-port-0", "vllm_server_port: 0\n", [], ["vllm_server_port=0", "must be >= 1 and <= 65535", "nearest valid value: 1"]),
    ("server-port-too-high", "vllm_server_port: 70000\n", [], ["vllm_server_port=70000", "nearest valid value: 65535"]),
    ("group-port-too-high", "vllm_group_port: 65536\n", [], ["vllm_group_port=65536", "nearest valid value: 65535"]),
    ("sapo-temperature-pos-0", "sapo_temperature_pos: 0\n", [], ["sapo_temperature_pos=0.0", "must be > 0"]),
    ("sapo-temperature-neg-negative", "sapo_temperature_neg: -1.05\n", [], ["sapo_temperature_neg=-1.05", "must be > 0"]),
    ("entropy-coef-min-above-max", "entropy_coef_min: 0.5\nentropy_coef_max: 0.1\n", [], ["entropy_coef_min=0.5 (yaml:{file}:1)", "must be <= entropy_coef_max (0.1)"]),
    ("vllm-regex-invalid", "vllm_structured_outputs_regex: '(ab'\n", [], ["vllm_structured_outputs_regex='(ab'", "is not a valid regular expression (missing ), unterminated subpattern at position 0)"]),
    ("vllm-url-no-scheme", "vllm_server_base_url: 127.0.0.1:8000\n", [], ["vllm_server_base_url='127.0.0.1:8000'", "must be an http(s) URL with a host, e.g. http://127.0.0.1:8000"]),
    ("vllm-url-bad-port", "vllm_server_base_url: http://localhost:99999\n", [], ["vllm_server_base_url='http://localhost:99999'", "must be an http(s) URL with a host"]),
    ("vllm-tp-does-not-divide", "use_vllm: true\nvllm_tensor_parallel_size: 2\n", ["--num_processes", "1"], ["vllm_tensor_parallel_size=2", "must divide the number of training processes (1)", "valid here: 1"]),
    ("vllm-tp-server-mode", "use_vllm: true\nvllm_mode: server\nvllm_tensor_parallel_size: 2\n", [], ["vllm_tensor_parallel_size=2", "applies to colocate mode", "grpokit vllm-serve MODEL --tensor-parallel-size 2"]),
    ("is-clip-min-above-max", "vllm_importance_sampling_clip_min: 3.0\nvllm_importance_sampling_clip_max: 2.0\n", [], ["vllm_importance_sampling_clip_min=3.0", "must be < vllm_importance_sampling_clip_max (2.0)"]),
    ("generation-kwargs-not-mapping", "generation_kwargs: [max_new_tokens, 5]\n", [], ["generation_kwargs (yaml:{file}:1)", "is not a mapping"]),
    ("chat-template-kwargs-not-mapping", "chat_template_kwargs: enable_thinking\n", [], ["chat_template_kwargs='enable_thinking'", "must be a mapping"]),
    ("model-init-kwargs-not-mapping", "model_init_kwargs: 5\n", [], ["model_init_kwargs='5'", "must be a mapping"]),
    ("pad-to-multiple-word", "pad_to_multiple_of: automatic\n", [], ["pad_to_multiple_of='automatic'", "did you mean 'auto'?"]),
    ("warmup-ratio-1", "warmup_ratio: 1.0\n", [], ["warmup_ratio=1.0", "must be < 1"]),
    ("reward-timeout-0", "reward_timeout: 0\n", [], ["reward_timeout=0.0 (yaml:{file}:1): must be > 0", "for example 600.0 (the default)"]),
    ("max-unscorable-rounds-0", "max_unscorable_rounds: 0\n", [], ["max_unscorable_rounds=0", "must be >= 1", "nearest valid value: 1"]),
    ("max-nonfinite-steps-0", "max_nonfinite_steps: 0\n", [], ["max_nonfinite_steps=0 (yaml:{file}:1)", "must be >= 1", "nearest valid value: 1"]),
    # ---- batch geometry, with the nearest valid values
    (
        "groups-do-not-fit",
        "per_device_train_batch_size: 3\nnum_generations: 4\n",
        ["--num_processes", "1"],
        ["num_generations=4 (yaml:{file}:2)", "generation batch 3", "must be divisible by num_generations = 4", "nearest valid: per_device_train_batch_size 4; generation_batch_size 12; num_generations 3"],
    ),
    ("groups-do-not-fit-default-batch", "num_generations: 3\n", ["--num_processes", "1"], ["num_generations=3", "generation batch 8", "per_device_train_batch_size 6 or 9; generation_batch_size 24; num_generations 4"]),
    ("generation-batch-vs-global-batch", "per_device_train_batch_size: 4\ngeneration_batch_size: 10\n", [], ["generation_batch_size=10 (yaml:{file}:2)", "divisible by the global batch", "nearest valid values: 8 or 12"]),
    ("generation-batch-vs-groups", "per_device_train_batch_size: 4\nnum_generations: 8\ngeneration_batch_size: 12\n", [], ["generation_batch_size=12", "must be divisible by num_generations = 8", "generation_batch_size 8 or 16; num_generations 6"]),
    ("generation-batch-and-steps", "generation_batch_size: 16\nsteps_per_generation: 4\n", [], ["generation_batch_size=16", "cannot both be set"]),
    ("eval-batch-vs-groups", "eval_strategy: steps\nnum_generations: 8\nper_device_eval_batch_size: 3\n", ["--num_processes", "1"], ["per_device_eval_batch_size=3 (yaml:{file}:3)", "evaluation group size 8", "nearest valid values: 8"]),
    ("eval-batch-vs-eval-groups", "eval_strategy: steps\nper_device_eval_batch_size: 4\nnum_generations_eval: 3\n", ["--num_processes", "1"], ["per_device_eval_batch_size=4", "evaluation group size 3", "nearest valid values: 3 or 6"]),
    ("auto-find-batch-size", "auto_find_batch_size: true\n", [], ["auto_find_batch_size=True", "not supported by GRPO"]),
    ("fp16-and-bf16", "fp16: true\nbf16: true\n", [], ["bf16=True", "fp16 and bf16 cannot both be true"]),
    # ---- QLoRA
    ("4bit-without-peft", "load_in_4bit: true\n", [], ["load_in_4bit=True (yaml:{file}:1): a quantised base model cannot be trained in full (its weights are frozen integers); set use_peft: true to train LoRA adapters on it (QLoRA)"]),
    ("quantization-without-peft", "model_init_kwargs:\n  quantization_config: {load_in_4bit: true}\n", [], ["model_init_kwargs={'quantization_config': {'load_in_4bit': True}}", "cannot be trained in full", "set use_peft: true"]),
    ("quantization-twice", "use_peft: true\nload_in_8bit: true\nmodel_init_kwargs:\n  quantization_config: {load_in_4bit: true}\n", [], ["load_in_8bit=True (yaml:{file}:2): model_init_kwargs sets quantization_config too; set the quantisation in one place"]),
    ("4bit-and-8bit", "use_peft: true\nload_in_8bit: true\nload_in_4bit: true\n", [], ["load_in_4bit=True", "load_in_8bit and load_in_4bit cannot both be true"]),
    # ---- rewards
    ("reward-weights-length", "reward_funcs: [format, tag_count]\nreward_weights: [1.0]\n", [], ["reward_weights=[1.0] (yaml:{file}:2)", "2 reward function(s)", "give 2 weight(s)"]),
    ("reward-weights-with-reward-model", "reward_funcs: [format]\nreward_model_name_or_path: my/rm\nreward_weights: [1.0]\n", [], ["reward_weights=[1.0]", "1 reward model + 1 reward function(s)", "give 2 weight(s)"]),
    # ---- recipes, env, datasets
    ("unknown-recipe", "recipe: dapoo\n", [], ["recipe='dapoo' (yaml:{file}:1): unknown recipe", "did you mean 'dapo'?"]),
    ("recipe-not-a-name", "recipe: [dapo]\n", [], ["recipe (yaml:{file}:1)", "is not a string"]),
    ("env-list", "env: [A, B]\n", [], ["env=['A', 'B'] (yaml:{file}:1)", "must be a mapping"]),
    ("env-string", "env: A=1\n", [], ["env='A=1'", "must be a mapping"]),
    ("env-nested-value", "env:\n  GRPOKIT_TEST_VAR: [1, 2]\n", [], ["env.GRPOKIT_TEST_VAR=[1, 2]", "plain value"]),
    ("dataset-without-path", "datasets:\n  - name: main\n", [], ["datasets (yaml:{file}:1)", "entry 0 has no `path`"]),
    ("dataset-unknown-key", "datasets:\n  - path: a.jsonl\n    splt: train\n", [], ["datasets", "unknown key 'splt'", "did you mean 'split'?"]),
    ("dataset-fraction-above-1", "datasets:\n  - path: a.jsonl\n    fraction: 1.5\n", [], ["datasets", "fraction must be > 0 and <= 1, got 1.5"]),
    ("dataset-fraction-0", "datasets:\n  - path: a.jsonl\n  - path: b.jsonl\n    fraction: 0\n", [], ["datasets", "entry 1, fraction must be > 0 and <= 1"]),
    ("datasets-not-a-list", "datasets: a.jsonl\n", [], ["datasets", "must be a list of dataset entries"]),
    ("dataset-entry-not-mapping", "datasets:\n  - a.jsonl\n", [], ["datasets", "entry 0 must be a mapping"]),
]
# fmt: on

# fmt: off
REWARD_CASES = [
    ("unknown-reward", "reward_funcs: [acuracy, format]\n", [], ["reward_funcs (yaml:{file}:1)", "entry 0", "did you mean 'accuracy'?"]),
    ("unknown-reward-kwarg", "reward_funcs:\n  - name: cosine\n    kwargs: {max_lenght: 100}\n", [], ["reward_funcs", "unknown kwarg 'max_lenght'", "did you mean 'max_len'?"]),
    ("reward-mapping-key", "reward_funcs:\n  - nam: format\n", [], ["reward_funcs", "unknown key 'nam'", "did you mean 'name'?"]),
    ("unknown-reward-cli", None, ["--reward_funcs", "format", "tag_cont"], ["reward_funcs (cli)", "entry 1", "did you mean 'tag_count'?"]),
]
# fmt: on

# fmt: off
CLI_CASES = [
    ("cli-unknown-flag", None, ["--lerning_rate", "1e-5"], ["--lerning_rate (cli): unknown argument", "did you mean --learning_rate?"]),
    ("cli-prefix", None, ["--num_gen", "4"], ["--num_gen (cli): unknown argument", "did you mean --num_generations?"]),
    ("cli-dashes-typo", None, ["--max-completion-lenght", "64"], ["--max_completion_lenght", "did you mean --max_completion_length?"]),
    ("cli-no-for-non-bool", None, ["--no_num_generations"], ["--no_num_generations (cli): unknown argument"]),
    ("cli-float-for-int", None, ["--num_generations", "8.5"], ["num_generations (cli): '8.5' is not an integer", "did you mean 8?"]),
    ("cli-inline-float-for-int", None, ["--num_generations=4.0"], ["num_generations (cli)", "did you mean 4?"]),
    ("cli-word-for-bool", None, ["--gradient_checkpointing", "perhaps"], ["gradient_checkpointing (cli)", "is not a boolean"]),
    ("cli-enum", None, ["--loss_type", "GRPO"], ["loss_type (cli)", "did you mean 'grpo'?"]),
    ("cli-enum-scheduler", None, ["--lr_scheduler_type", "cosine_min_lr"], ["lr_scheduler_type (cli)", "did you mean 'cosine_with_min_lr'?"]),
    ("cli-range", None, ["--num_generations", "1"], ["num_generations=1 (cli): must be >= 2", "nearest valid value: 2"]),
    ("cli-bad-json", None, ["--generation_kwargs", '{"max_new_tokens": 5'], ["generation_kwargs (cli)", "is not valid JSON"]),
    ("cli-kwargs-not-json", None, ["--model_init_kwargs", "dtype=bfloat16"], ["model_init_kwargs='dtype=bfloat16' (cli)", "must be a mapping"]),
    ("cli-flag-without-value", None, ["--learning_rate"], ["--learning_rate (cli): expects a value"]),
    ("cli-flag-without-value-before-flag", None, ["--learning_rate", "--beta", "0.1"], ["--learning_rate (cli): expects a value"]),
    ("cli-list-flag-without-value", None, ["--reward_funcs"], ["--reward_funcs (cli): expects at least one value"]),
    ("cli-two-values", None, ["--beta", "0.1", "0.2"], ["--beta='0.1 0.2' (cli): expects one value, got 2"]),
    ("cli-stray-value", None, ["stray"], ["unexpected value 'stray'"]),
    ("cli-config-without-value", None, ["--config"], ["--config (cli): expects a value"]),
    ("cli-recipe-without-value", None, ["--recipe"], ["--recipe (cli): expects a value"]),
    ("cli-unknown-recipe", None, ["--recipe", "gspo2"], ["recipe='gspo2' (cli): unknown recipe", "did you mean 'gspo'?"]),
    ("cli-migrated-warmup-ratio", None, ["--warmup_ratio", "1.5"], ["warmup_ratio='1.5' (cli)", "must be < 1"]),
    ("missing-config-file", None, ["--config", "{tmp}/missing.yaml"], ["config='{tmp}/missing.yaml'", "No such file or directory"]),
    ("config-is-a-directory", None, ["--config", "{tmp}"], ["config='{tmp}'", "Is a directory"]),
]
# fmt: on

# Whole command lines (not `config validate`): unknown commands and subcommands, bad options of the subcommands.
# fmt: off
COMMAND_CASES = [
    ("unknown-command", ["confg", "validate"], ["unknown command 'confg'", "did you mean 'config'?"]),
    ("unknown-command-train", ["trian"], ["unknown command 'trian'", "did you mean 'train'?"]),
    ("unknown-subcommand", ["config", "valdate"], ["config needs a subcommand", "did you mean 'validate'?"]),
    ("missing-subcommand", ["config"], ["config needs a subcommand (validate, show, plan, schema, diff)"]),
    ("show-unknown-format", ["config", "show", "--format", "xml"], ["--format must be one of table, yaml, json, not 'xml'"]),
    ("show-format-without-value", ["config", "show", "--format"], ["--format expects a value"]),
    ("diff-one-file", ["config", "diff", "a.yaml"], ["config diff needs two YAML files"]),
    ("recipes-show-unknown", ["recipes", "show", "dapoo"], ["recipe='dapoo': unknown recipe", "did you mean 'dapo'?"]),
    ("recipes-bad-usage", ["recipes", "list"], ["usage: grpokit recipes [show NAME]"]),
]
# fmt: on

ALL_IDS = [c[0] for c in YAML_CASES + REWARD_CASES + CLI_CASES + COMMAND_CASES] + ["not-utf8"]


def test_cases_are_distinct_and_many():
    assert len(ALL_IDS) == len(set(ALL_IDS))
    inputs = [(c[1], tuple(c[2])) for c in YAML_CASES + REWARD_CASES + CLI_CASES] + [
        tuple(c[1]) for c in COMMAND_CASES
    ]
    assert len(inputs) == len(set(inputs))
    assert len(ALL_IDS) >= 55


def fill(text: str, **subst) -> str:
    for key, value in subst.items():
        text = text.replace("{" + key + "}", str(value))
    return text


def check(result, expected, **subst):
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    assert "ok" not in result.out.split()
    assert result.errors, result.err
    for text in expected:
        assert fill(text, **subst) in result.err, result.err


def run_case(cli, write, tmp_path, yaml_text, args):
    argv = ["config", "validate", *(fill(a, tmp=tmp_path) for a in args)]
    file = None
    if yaml_text is not None:
        file = write("bad.yaml", yaml_text)
        argv += ["--config", file]
    return cli(*argv), file


@pytest.mark.parametrize(
    "case_id, yaml_text, args, expected", YAML_CASES + CLI_CASES, ids=[c[0] for c in YAML_CASES + CLI_CASES]
)
def test_malformed(cli, write, tmp_path, case_id, yaml_text, args, expected):
    result, file = run_case(cli, write, tmp_path, yaml_text, args)
    check(result, expected, file=file, tmp=tmp_path)


@needs_reward_checks
@pytest.mark.parametrize("case_id, yaml_text, args, expected", REWARD_CASES, ids=[c[0] for c in REWARD_CASES])
def test_malformed_rewards(cli, write, tmp_path, case_id, yaml_text, args, expected):
    result, file = run_case(cli, write, tmp_path, yaml_text, args)
    check(result, expected, file=file, tmp=tmp_path)


@pytest.mark.parametrize("case_id, argv, expected", COMMAND_CASES, ids=[c[0] for c in COMMAND_CASES])
def test_malformed_command(cli, case_id, argv, expected):
    check(cli(*argv), expected)


def test_not_utf8(cli, tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("beta: 0.1\nsystem_prompt: 'Réponds'\n".encode("latin-1"))
    check(cli("config", "validate", "--config", path), ["{file}:2: not UTF-8 text (byte 0xe9)"], file=path)


@pytest.mark.parametrize(
    "yaml_text, field_name",
    [
        ("accelerator_config: missing_accelerate_config.json\n", "accelerator_config"),
        ("deepspeed: 5\n", "deepspeed"),
        ("debug: everything\n", "debug"),
        ("fsdp: sideways\n", "fsdp"),
    ],
)
def test_rejected_by_transformers_without_traceback(cli, write, yaml_text, field_name):
    """Values only transformers' own `TrainingArguments.__post_init__` rejects: still one line, exit 2."""
    result = cli("config", "validate", "--config", write("bad.yaml", yaml_text))
    assert result.code == 2 and "Traceback" not in result.err
    assert len(result.errors) == 1
    assert result.errors[0].startswith(f"error: {field_name}=") and "GRPOConfig: " in result.errors[0]


def test_every_problem_at_once(cli, write):
    """Three problems in two layers: all three reported, one line each, in one run."""
    file = write("bad.yaml", "num_generation: 8\nbeta: -0.1\n")
    result = cli("config", "validate", "--config", file, "--temperature", "warm")
    check(
        result,
        [
            "num_generation (yaml:{file}:1): unknown key; did you mean 'num_generations'?",
            "beta=-0.1 (yaml:{file}:2): must be >= 0; nearest valid value: 0",
            "temperature (cli): 'warm' is not a number",
        ],
        file=file,
    )
    assert len(result.errors) == 3
    assert len(result.err.splitlines()) == 3  # one line per problem, nothing else


def test_every_problem_at_once_across_files(cli, write, tmp_path):
    """A broken file does not hide the problems of the other file and of the flags."""
    broken = write("broken.yaml", "beta: [0.1\n")
    other = write("other.yaml", "loss_type: dapoo\nnum_generations: 1\n")
    result = cli(
        "config",
        "validate",
        "--config",
        broken,
        "--config",
        other,
        "--config",
        tmp_path / "nope.yaml",
        "--num_gen",
        "4",
    )
    assert result.code == 2 and "Traceback" not in result.err
    assert len(result.errors) == 5, result.err
    for text in (
        f"{broken}:2",
        "did you mean 'dapo'?",
        "num_generations=1",
        "nope.yaml",
        "did you mean --num_generations?",
    ):
        assert text in result.err


def test_valid_input_still_passes(cli, write):
    """The suite's baseline: the same command on a good file says ok."""
    result = cli("config", "validate", "--config", write("good.yaml", "num_generations: 4\nbeta: 0.04\n"))
    assert result.code == 0 and result.out.strip() == "ok"


# ---- the real console script: a handful of cases, started together to keep the suite fast

SUBPROCESS_CASES = {
    "unknown-key": (
        "num_generation: 8\n",
        ["config", "validate"],
        ["num_generation", "did you mean 'num_generations'?"],
    ),
    "syntax-error": ("beta: 0.1\n  temperature: 1.0\n", ["config", "validate"], ["{file}:2"]),
    "prefix-flag": (None, ["config", "validate", "--num_gen", "4"], ["--num_gen", "did you mean --num_generations?"]),
    "enum": ("lr_scheduler_type: cosinee\n", ["config", "show"], ["lr_scheduler_type", "did you mean 'cosine'?"]),
    "unknown-subcommand": (None, ["config", "valdate"], ["did you mean 'validate'?"]),
}


@pytest.fixture(scope="module")
def console_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    started = {}
    for name, (yaml_text, argv, _) in SUBPROCESS_CASES.items():
        file = None
        if yaml_text is not None:
            file = tmp / f"{name}.yaml"
            file.write_text(yaml_text)
            argv = [*argv, "--config", str(file)]
        started[name] = (console_script(*argv), file)
    results = {}
    for name, (proc, file) in started.items():
        out, err = proc.communicate(timeout=120)
        results[name] = (proc.returncode, out, err, file)
    return results


@pytest.mark.parametrize("name", list(SUBPROCESS_CASES))
def test_console_script(console_results, name):
    code, out, err, file = console_results[name]
    assert code == 2, err
    assert "Traceback" not in err
    assert out == ""
    for text in SUBPROCESS_CASES[name][2]:
        assert fill(text, file=file) in err, err
