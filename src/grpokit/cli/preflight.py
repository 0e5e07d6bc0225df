"""What `grpokit train` checks before anything loads (model, data, rewards) or anything is written: the configuration
(parsed strictly, at the process count of the launch), what this machine lacks for it, local model and data paths
(with the nearest name beside them), the packages the chosen rewards need, the checkpoint to resume from, and the
output folder. Each problem is one line; `grpokit train` prints them all and stops with exit 2.
"""

from __future__ import annotations

import os
import sys


def print_error(line: str) -> None:
    """One `error:` line on stderr, secrets redacted."""
    from grpokit.config.redaction import redact

    print(f"error: {redact(line)}", file=sys.stderr)


def _local_path_problems(path: str) -> list[str]:
    """A model path written as a local one (absolute, ./, ../, ~) must be a folder: said here, with the nearest
    sibling folder, instead of transformers trying the hub with it ("Repo id must use alphanumeric chars")."""
    expanded = os.path.expanduser(path)
    if os.path.isdir(expanded):
        return []
    hint = _nearest_sibling(path, folders_only=True)
    written_as_local = path.startswith(("/", "./", "../", "~")) or os.sep + ".." in path
    # A bare name (`tiny-modle`) or `org/name` may be a hub id: taken for a local typo only when a folder of nearly
    # that name is there (`tiny-model`), so that the hub is never tried for it.
    if not written_as_local and not hint:
        return []
    what = "is a file, not a model folder" if os.path.exists(expanded) else "does not exist"
    return [f"model_name_or_path={path!r}: {what}{hint}"]


def _nearest_sibling(path: str, *, folders_only: bool) -> str:
    """ "; did you mean 'NEAR'?" for the entry beside `path` whose name is nearest to its own, or "" for none."""
    from grpokit.config.suggest import closest

    expanded = os.path.expanduser(path).rstrip(os.sep)
    parent = os.path.dirname(expanded) or "."
    if not os.path.isdir(parent):
        return ""
    names = sorted(n for n in os.listdir(parent) if not folders_only or os.path.isdir(os.path.join(parent, n)))
    near = closest(os.path.basename(expanded), names)
    return f"; did you mean {os.path.join(os.path.dirname(path.rstrip(os.sep)), near)!r}?" if near else ""


_DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".arrow", ".txt")


def _local_data_problems(script_args, mixture) -> list[str]:
    """A dataset written as a local file (a data-file suffix, or a local-looking path) must exist: said here, with the
    nearest file beside it, instead of after the model loaded. So must a local eval file (`dataset_test_split`)."""
    paths = [("dataset_name", script_args.dataset_name)] if script_args.dataset_name else []
    paths += [(f"datasets[{i}].path", d.path) for i, d in enumerate(mixture.datasets)]
    split = script_args.dataset_test_split
    if isinstance(split, str) and split.endswith(_DATA_SUFFIXES):  # an eval file, not the name of a split
        paths.append(("dataset_test_split", split))
    problems = []
    for key, path in paths:
        looks_local = path.endswith(_DATA_SUFFIXES) or path.startswith(("/", "./", "../", "~"))
        if looks_local and not os.path.exists(os.path.expanduser(path)):
            problems.append(f"{key}={path!r}: no such file or folder{_nearest_sibling(path, folders_only=False)}")
    return problems


def _reward_dependency_problems(script_args) -> list[str]:
    """Built-in rewards that check answers with math-verify need it installed: said before anything loads."""
    import importlib.util

    from grpokit.rewards import MATH_REWARD_NAMES

    names = [spec.get("name") if isinstance(spec, dict) else spec for spec in script_args.reward_funcs or []]
    needing = [name for name in names if name in MATH_REWARD_NAMES]
    if not needing or importlib.util.find_spec("math_verify") is not None:
        return []
    listed = ", ".join(repr(n) for n in needing)
    return [
        f"reward_funcs: {listed} check(s) answers with math-verify, which is not installed: "
        "pip install 'grpokit[math]' (or math-verify)"
    ]


def config_file_problems(resolution) -> list[str]:
    """What `grpokit train` refuses from the configuration and the files it names, not from this machine: settings
    not implemented, the tool loop without tools, a local model folder or data file that is not there, a checkpoint
    to resume that is missing or does not match, and, for a launch with an accelerate config, what its engine cannot
    honour. `grpokit config validate` refuses the same (`tests/cli/test_validate_refuses.py` walks them)."""
    from grpokit.config.agents import tool_loop_problems
    from grpokit.config.support import unsupported_settings

    script_args, training_args, model_args, mixture = resolution.instances
    problems = unsupported_settings(*resolution.instances)
    problems += tool_loop_problems(resolution.values, resolution.sources)
    if model_args.model_name_or_path:
        problems += _local_path_problems(model_args.model_name_or_path)
    problems += _local_data_problems(script_args, mixture)
    if resolution.values.get("resume_from_checkpoint") is not None:
        from grpokit.checkpoints import check_resume

        problems += check_resume(resolution)
    launch = resolution.launch
    if launch is not None and launch.config is not None:
        from grpokit.cli.launch_presets import engine_settings
        from grpokit.launch import engine_problems

        problems += engine_problems(
            **engine_settings(launch.config),
            use_cpu=bool(resolution.values.get("use_cpu")),
            use_vllm=bool(resolution.values.get("use_vllm")),
            ds3_gather_for_generation=bool(resolution.values.get("ds3_gather_for_generation")),
        )
    return problems


def installation_notes(resolution) -> list[str]:
    """What this installation lacks for the configuration (a note in `grpokit config validate`, an error in
    `grpokit train`): the packages the chosen rewards need."""
    return _reward_dependency_problems(resolution.instances[0])


def light_config_errors(argv) -> bool:
    """Resolve `argv` on the light path first (no transformers or torch: `grpokit.config.light`, as `config validate`
    does) and print its problems: True when there were any, so that a mistyped flag is refused in a fraction of a
    second instead of after the heavy imports. A configuration the light path cannot judge alone says nothing here."""
    from grpokit.cli.launch_presets import LAUNCH
    from grpokit.config.light import light_resolver
    from grpokit.config.resolver import FullPathNeeded
    from grpokit.config.rules import ConfigError

    try:
        light_resolver().resolve(argv, launch_options=LAUNCH)
    except FullPathNeeded:
        return False
    except ConfigError as exc:
        for problem in exc.problems:
            print_error(problem.line())
        return True
    return False


def check_train_args(argv):
    """What `grpokit train` checks before loading anything: (resolution, problem lines), or (None, []) after printing
    the configuration's problems. Launch options are taken (`resolution.launch`), and the batch geometry is checked
    for the processes they ask for."""
    from grpokit.checkpoints import check_resume
    from grpokit.cli.launch_presets import LAUNCH
    from grpokit.config.agents import tool_loop_problems
    from grpokit.config.parser import TrlParser
    from grpokit.config.precision import hardware_problems
    from grpokit.config.redaction import redact
    from grpokit.config.rules import ConfigError
    from grpokit.config.support import unsupported_settings

    try:
        resolution = TrlParser().resolve(argv, launch_options=LAUNCH)
    except ConfigError as exc:
        for problem in exc.problems:
            print_error(problem.line())
        return None, []
    for warning in resolution.warnings:
        print(f"warning: {redact(warning)}", file=sys.stderr)
    script_args, training_args, model_args, mixture = resolution.instances
    problems = unsupported_settings(*resolution.instances) + hardware_problems(resolution.values)
    problems += tool_loop_problems(resolution.values, resolution.sources)
    if not model_args.model_name_or_path:
        problems.append("model_name_or_path is not set: give a local model directory or a hub id")
    else:
        problems += _local_path_problems(model_args.model_name_or_path)
    # An environment may own the reward (its `get_reward`), as in TRL; GRPOTrainer says so if none does.
    if (
        not script_args.reward_funcs
        and not script_args.reward_model_name_or_path
        and not script_args.environment_factory
    ):
        problems.append("no reward: set reward_funcs and/or reward_model_name_or_path")
    if not script_args.dataset_name and not mixture.datasets:
        problems.append("no training data: set dataset_name or a `datasets:` mixture")
    problems += _local_data_problems(script_args, mixture) + _reward_dependency_problems(script_args)
    # resume_from_checkpoint: true/last -> the latest complete checkpoint; a missing one, or settings changed since
    # the checkpoint (batch geometry, processes, num_generations, loss_type, beta, model), refused here.
    problems += check_resume(resolution)
    if training_args.process_index == 0:  # the other processes of a launch leave the folder to process 0
        from grpokit.cli.run_dir import checkpoint_bytes, output_dir_problems

        problems += output_dir_problems(
            training_args.output_dir,
            resuming=training_args.resume_from_checkpoint is not None,  # check_resume made it a folder or None
            overwrite=bool(training_args.overwrite_output_dir),
            checkpoint_bytes=checkpoint_bytes(resolution.values),
        )
    return resolution, problems
