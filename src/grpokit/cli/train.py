"""`grpokit train`: parse strictly, check everything that can be checked, then load data, model and rewards, train,
and leave the whole run in output_dir (model, tokenizer, resolved_config.yaml, metrics.jsonl, reward_curve.png).

Also runs under `accelerate launch -m grpokit train --config recipe.yaml` (every process parses; rank 0 writes), or
starts that launch itself: `grpokit train --accelerate_config NAME|FILE [--num_processes N] ...` checks the
configuration here, once, then runs accelerate's launcher with the same arguments less the launch flags and returns
its exit code (see `grpokit.cli.launch_presets`).
"""

from __future__ import annotations

import os
import sys

from grpokit.cli.preflight import check_train_args, light_config_errors, print_error
from grpokit.cli.records import closing_message, library_progress_bars


def run_train(argv) -> int:
    argv = list(argv)
    demo = not argv or argv[0] == "--demo"
    if light_config_errors(_demo_argv(argv[1:]) if demo else argv):  # before anything heavy loads: a second, not 6
        return 2
    # One progress line per log, none of the libraries' tqdm bars between them (see library_progress_bars).
    library_progress_bars()
    try:
        if demo:
            return run_demo(argv[1:] if argv else [])
        return _train(argv, relaunch_argv=argv)
    finally:
        from grpokit.dist import leave_process_group

        leave_process_group()  # under a launcher; see grpokit.dist


def _prepare_in_a_child(out: str, tools: bool) -> tuple[str, str]:
    """The demo's model and data written under `out` by a fresh interpreter (no process group); their paths."""
    import json
    import subprocess

    name = "prepare_tools_demo" if tools else "prepare_demo"
    code = f"import json, sys\nfrom grpokit.demo import {name}\nprint(json.dumps({name}(sys.argv[1])))"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    done = subprocess.run([sys.executable, "-c", code, out], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise RuntimeError(f"preparing the demo in {out} failed: {said}")
    model_dir, data_path = json.loads(done.stdout.strip().splitlines()[-1])
    return model_dir, data_path


def _demo_argv(extra_args: list[str]) -> list[str]:
    """The demo's configuration with `extra_args` over it, for the light check (the model and data it writes next are
    named by placeholders: only the configuration is checked)."""
    from grpokit.cli.demo import demo_config_path

    kind = extra_args[0] if extra_args[:1] in (["tools"], ["async"], ["real"]) else "digits"
    rest = extra_args[1:] if kind != "digits" else extra_args
    config = demo_config_path(kind)
    return ["--config", config, "--model_name_or_path", "demo-model", "--dataset_name", "demo.jsonl", *rest]


def run_demo(extra_args) -> int:
    """The built-in demo: `--demo` (a tiny model learns to repeat a digit), `--demo tools` (it learns to call a
    tool) or `--demo async` (the digits with generation overlapped with training); any other arguments override
    the demo's config."""
    from grpokit.cli.demo import demo_config_path, make_demo_dir
    from grpokit.demo import prepare_demo, prepare_tools_demo

    kind = extra_args[0] if extra_args[:1] in (["tools"], ["async"], ["real"]) else "digits"
    tools = kind == "tools"
    extra_args = extra_args[1:] if kind != "digits" else extra_args
    prepare = prepare_tools_demo if tools else prepare_demo
    out = {"digits": "grpokit-demo", "tools": "grpokit-demo-tools", "async": "grpokit-demo-async"}.get(kind)
    out = out or f"grpokit-demo-{kind}"
    for i, arg in enumerate(extra_args):
        if arg == "--output_dir" and i + 1 < len(extra_args):
            out = extra_args[i + 1]
        elif arg.startswith("--output_dir="):
            out = arg.split("=", 1)[1]
    import torch
    from accelerate import PartialState

    # Under `accelerate launch`, one process per machine writes the demo's files. On a CPU machine the state must be
    # built for the CPU: otherwise every rank takes itself for the local main process and they all write them. The
    # exception is DeepSpeed, which accelerate drops when told "cpu"; on CPU it needs the gloo backend instead.
    cpu = not torch.cuda.is_available()
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    state = PartialState(cpu=cpu and not deepspeed, **({"backend": "gloo"} if cpu and deepspeed else {}))
    # Process 0 writes the demo's files first; then, machine by machine, the local main process, then the others.
    # Where they share the folder, the others find the model written; a machine that does not (a folder per machine)
    # writes its own, in a fresh interpreter: once a process group exists, transformers' save_pretrained writes the
    # weights on global rank 0 only.
    held_out = None
    with state.main_process_first(), state.local_main_process_first():
        make_demo_dir(out)
        written = os.path.isfile(os.path.join(out, "initial_model", "config.json"))
        if kind == "real":
            from grpokit.demo import prepare_real_demo

            try:
                model_dir, data_path, held_out = prepare_real_demo(out)
            except ValueError as exc:  # the real model is not installed
                print_error(f"--demo real: {exc}")
                return 2
        elif state.process_index != 0 and not written:
            model_dir, data_path = _prepare_in_a_child(out, tools)
        else:
            model_dir, data_path = prepare(out)
    from grpokit.cli.launch_presets import take_launch_flags
    from grpokit.launch import under_launcher

    launching = bool(take_launch_flags(extra_args)[0]) and not under_launcher()  # the launched processes say it
    if state.is_main_process and not launching:
        if tools:
            print(f"grpokit demo: a tiny model learns to open a vault with a tool before it answers ({out}/)")
        elif kind == "async":
            print(
                f"grpokit demo: a tiny model learns to repeat the digit of prompts like '7=', generating the next "
                f"batches while it trains on this one ({out}/)"
            )
        elif kind == "real":
            print(
                f"grpokit demo: SmolLM2-135M-Instruct, a real chat model, learns to answer sums like 'What is 4 + 8?' "
                f"with the number alone ({out}/)"
            )
        else:
            print(f"grpokit demo: a tiny random-init model learns to repeat the digit of prompts like '7=' ({out}/)")
    args = [
        "--config",
        demo_config_path(kind),
        "--model_name_or_path",
        model_dir,
        "--dataset_name",
        data_path,
        "--output_dir",
        out,
        "--overwrite_output_dir",  # the demo's folder is grpokit's: a second demo replaces the first
        "true",
        *extra_args,
    ]
    relaunch = ["--demo", *([kind] if kind != "digits" else []), *extra_args]
    if held_out is not None:
        args = [*args[: len(args) - len(extra_args)], "--dataset_test_split", held_out, *extra_args]  # theirs win
        return _train(args, demo=held_out, relaunch_argv=relaunch)
    if kind != "async":
        return _train(args, demo=True, relaunch_argv=relaunch)
    from grpokit.cli.demo import demo_server

    with demo_server(model_dir, os.path.join(out, "vllm-serve.log")) as url:
        if url is None:  # no vLLM here: the rollout worker generates with its own copy of the policy
            args += ["--use_vllm", "false"]
        else:
            print(f"grpokit demo: the rollout worker generates with a vLLM server of the demo's model at {url}")
            args += ["--use_vllm", "true", "--vllm_mode", "server", "--vllm_server_base_url", url]
        return _train(args, demo=True, relaunch_argv=relaunch)


def _engine_inputs(training_args) -> dict:
    return {
        "use_cpu": bool(training_args.use_cpu),
        "use_vllm": bool(training_args.use_vllm),
        "ds3_gather_for_generation": bool(training_args.ds3_gather_for_generation),
    }


def _train(argv, *, demo: bool | str = False, relaunch_argv=None) -> int:
    """Check the configuration; then train in this process, or, given launch options (`--accelerate_config`) outside
    a launcher, start the launch with `relaunch_argv` (the `grpokit train` arguments) less the launch flags."""
    from grpokit.cli.launch_presets import machine_problems, run_launch
    from grpokit.launch import LAUNCHED_ENV, under_launcher

    launched = under_launcher()  # before the configuration is resolved: that may set environment variables
    resolution, problems = check_train_args(argv)
    if resolution is None:
        return 2
    launch = resolution.launch
    will_launch = launch is not None and not launched
    if will_launch:
        problems += machine_problems(launch)
        if launch.config is not None:
            from grpokit.cli.launch_presets import engine_settings
            from grpokit.launch import engine_problems

            training_args = resolution.instances[1]
            problems += engine_problems(**engine_settings(launch.config), **_engine_inputs(training_args))
        if launch.config is None:
            given = " and ".join(f"{k} ({s})" for k, s in launch.sources.items())
            problems.append(
                f"{given}: a launch needs accelerate_config too (e.g. --accelerate_config multi_cpu on CPU, multi_gpu "
                "on GPUs; see grpokit accelerate-configs)"
            )
    if problems:
        for line in problems:
            print_error(line)
        return 2
    if will_launch:
        from grpokit.config.precision import launch_mixed_precision

        precision = launch_mixed_precision(resolution.instances[1])
        return run_launch(launch, argv if relaunch_argv is None else relaunch_argv, precision)
    if launch is not None and LAUNCHED_ENV not in os.environ:
        print(
            "warning: the launch options (" + ", ".join(launch.sources) + ") are ignored: this process was started "
            "by a launcher already",
            file=sys.stderr,
        )
    library_progress_bars(resolution)  # bars back on only if asked: explicit `disable_tqdm: false` or a YAML env
    return _train_here(resolution, demo=demo)


def _train_here(resolution, *, demo: bool | str) -> int:
    """Train in this process. The writing process (process 0) holds output_dir's lock for the whole run; a folder
    this start made is removed again when the run ends before anything was written into it."""
    from grpokit.cli.run_dir import RunDirError, RunLock

    training_args = resolution.instances[1]
    out = training_args.output_dir
    made = not os.path.exists(out)
    lock = RunLock(out)
    if training_args.process_index == 0:
        try:
            lock.acquire()
        except (RunDirError, OSError) as exc:
            print_error(str(exc))
            return 2
        if lock.stale:
            print(f"warning: took over the lock of {out} left by {lock.stale}, which has ended", file=sys.stderr)
    try:
        return _load_and_train(resolution, demo=demo)
    finally:
        lock.release()
        if made and training_args.process_index == 0 and os.path.isdir(out) and not os.listdir(out):
            os.rmdir(out)


def _load_and_train(resolution, *, demo: bool | str) -> int:
    """Load, train and save. `demo`: True for a demo, or the held-out file of `--demo real` (scored greedily before
    and after training, and drawn in the plot)."""
    script_args, training_args, model_args, mixture = resolution.instances

    from grpokit.data import DataError, load_train_eval

    try:
        rewards = _resolve_rewards(script_args, training_args)
        agent_arguments = _import_agent_arguments(script_args)  # {} unless tools / environment_factory are set
        train_dataset, eval_dataset = load_train_eval(
            script_args, mixture, want_eval=str(getattr(training_args.eval_strategy, "value", "no")) != "no"
        )
    except (DataError, ValueError) as exc:
        print_error(str(exc))
        return 2

    _finish_model_kwargs(training_args, model_args)
    from grpokit.generation import GenerationError
    from grpokit.trainer import GRPOTrainer

    if training_args.async_grpo:  # generation overlapped with training (grpokit.experimental.async_grpo)
        from grpokit.experimental.async_grpo import AsyncGRPOTrainer as GRPOTrainer
    if training_args.progress_lines is None:  # the command's console: one line per log (see grpokit.records)
        training_args.progress_lines = True
    try:
        trainer = GRPOTrainer(
            model=model_args.model_name_or_path,
            reward_funcs=rewards,
            args=training_args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            quantization_config=_quantization_config(model_args),
            peft_config=_peft_config(model_args),
            **agent_arguments,
        )
    except (OSError, ValueError, TypeError, GenerationError) as exc:
        message = " ".join(str(exc).split())[:500]
        if isinstance(exc, OSError):  # transformers' loading errors often leave out what was being loaded
            message = f"loading {model_args.model_name_or_path!r} failed: {message}"
        print_error(message)
        return 2
    # The trainer's own recorder writes the records (grpokit.records), resolved_config.yaml from this resolution.
    recorder = trainer.run_recorder
    recorder.resolution = resolution
    from grpokit.checkpoints import processes_source

    # Where each setting a checkpoint records came from (grpokit_run.json, checked when a run resumes).
    trainer.config_sources = {**resolution.sources, "num_processes": processes_source(resolution)}
    if script_args.ignore_bias_buffers:  # before training: DDP wraps the model when training starts
        from grpokit.models import ignore_boolean_buffers

        ignore_boolean_buffers(trainer.accelerator.unwrap_model(trainer.model))
    from grpokit.cli.stopping import GracefulStop

    stop = GracefulStop(announce=trainer.is_world_process_zero())
    trainer.add_callback(stop)
    held_out = None
    if isinstance(demo, str):
        from grpokit.demo import held_out_callback

        held_out = held_out_callback(demo)
        trainer.add_callback(held_out)
    resuming = training_args.resume_from_checkpoint is not None
    if training_args.process_index == 0:  # every check passed and the model loaded: now the folder is written
        if training_args.overwrite_output_dir and not resuming:
            from grpokit.cli.run_dir import clear_previous_run

            cleared = clear_previous_run(training_args.output_dir)
            if cleared:
                print(f"overwrite_output_dir: removed the previous run's {', '.join(cleared)}", file=sys.stderr)
    stop.install()
    try:
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    except BaseException as exc:  # noqa: BLE001 - every failure saves what was trained, then reports
        stop.uninstall()
        return _after_failure(trainer, training_args, exc, first_step=recorder.first_step)
    finally:
        stop.uninstall()
    from grpokit.nan_guard import NonFiniteWeightsError

    if stop.stopped_at is not None:
        if trainer.is_world_process_zero():
            checkpoint = os.path.join(training_args.output_dir, f"checkpoint-{stop.stopped_at}")
            print_error(
                f"{stop.signal_name}: stopped after step {stop.stopped_at}; checkpoint saved to {checkpoint} "
                "(continue with --resume_from_checkpoint true)"
            )
        return stop.exit_code
    try:
        trainer.save_model(training_args.output_dir)
    except NonFiniteWeightsError as exc:
        print_error(str(exc))
        return 1
    if trainer.is_world_process_zero():
        out = training_args.output_dir  # reward_curve.png: drawn by the recorder when training ended
        # a PEFT run saves the adapter only
        print(closing_message(out, recorder.plot_path, adapter=bool(model_args.use_peft), records=recorder.write))
        if demo and recorder.write:
            _demo_verdict(out)
        if held_out is not None and held_out.after is not None and recorder.write:
            _record_held_out(out, held_out)
    return 0


def _after_failure(trainer, training_args, exc: BaseException, *, first_step) -> int:
    """Training stopped on `exc` (a reward or generation failure, non-finite training, a second Ctrl-C/SIGTERM, a
    full disk, or anything unexpected): save what this run trained, never non-finite weights, then say why in one
    line. Only the process that writes says where; every process returns non-zero."""
    import traceback

    from grpokit.checkpoints import latest_checkpoint
    from grpokit.cli.run_dir import is_disk_full
    from grpokit.generation import GenerationError
    from grpokit.nan_guard import NonFiniteTrainingError, NonFiniteWeightsError
    from grpokit.rollout.rewards import RewardError
    from grpokit.sharding import is_sharded

    out, step = training_args.output_dir, trainer.state.global_step
    writer = trainer.is_world_process_zero()
    code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    last = latest_checkpoint(out)
    resume = f"; the last checkpoint is {last} (--resume_from_checkpoint true)" if last else ""
    if is_disk_full(exc, out):
        if writer:
            _remove_staged_checkpoints(out)
            print_error(f"disk full at step {step}: the checkpoint being written was removed{resume}; free some space")
        return 1
    if isinstance(exc, NonFiniteWeightsError):  # a checkpoint refused
        print_error(str(exc))
        return 1
    known = (RewardError, GenerationError, NonFiniteTrainingError, KeyboardInterrupt)
    reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else " ".join(str(exc).split())
    if not isinstance(exc, known):
        traceback.print_exception(exc)  # a bug, not a bad input: its traceback, then the line below
        reason = f"{type(exc).__name__}: {reason}"
    if isinstance(exc, NonFiniteTrainingError):
        reason = exc.summary
    if first_step is None or step <= first_step:
        print_error(f"{reason} (no step was trained: nothing saved{resume})")
        return code
    # Under ZeRO-3/FSDP every process must take part in a save; after a failure of one process alone (anything but a
    # reward failure or non-finite training, which every process raises together) the others are elsewhere.
    together = isinstance(exc, (RewardError, NonFiniteTrainingError)) or training_args.world_size == 1
    if is_sharded(trainer.model) and not together:
        print_error(
            f"{reason} (weights at step {step} not saved: the processes of a sharded run save together{resume})"
        )
        return code
    saved = os.path.join(out, f"interrupted-step-{step}")
    try:
        trainer.save_model(saved)  # writes on the saving process only (all of them take part when sharded)
    except NonFiniteWeightsError as refusal:
        print_error(f"{reason} ({refusal}{resume})")
        return code
    except Exception as failure:  # noqa: BLE001 - the save itself failed (disk full, ...): say so, keep the cause
        print_error(f"{reason}; saving the weights failed too: {' '.join(str(failure).split())[:300]}{resume}")
        return code
    if isinstance(exc, RewardError):
        # Every process raises a reward failure together (see produce_rollout); none may exit, and so have the
        # launcher stop the others, before process 0 has written the weights.
        trainer.accelerator.wait_for_everyone()
    if not writer:
        print_error(reason)
    elif isinstance(exc, NonFiniteTrainingError):
        print_error(f"{exc.summary}; the last finite weights ({exc.weights}) are saved to {saved}")
    else:
        print_error(f"{reason} (weights at step {step} saved to {saved}{resume})")
    return code


def _remove_staged_checkpoints(output_dir: str) -> None:
    """Remove `tmp-checkpoint-*` folders: a checkpoint write that failed; complete checkpoints are never touched."""
    import shutil

    from grpokit.checkpoints import STAGING_PREFIX

    for name in os.listdir(output_dir) if os.path.isdir(output_dir) else ():
        if name.startswith(STAGING_PREFIX):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


def _resolve_rewards(script_args, training_args) -> list:
    """Reward model first (TRL's order, which reward_weights follows), then each reward function."""
    from grpokit.config.parser import reward_defaults
    from grpokit.rewards import resolve_reward

    rewards = []
    if script_args.reward_model_name_or_path:
        rewards.append(script_args.reward_model_name_or_path)
    from grpokit.rewards.registry import working_directory_first

    working_directory_first()  # dotted paths to the user's own modules, as TRL's script allows
    for spec in script_args.reward_funcs or []:
        rewards.append(resolve_reward(spec, defaults=reward_defaults({**vars(script_args), **vars(training_args)})))
    return rewards


def _import_agent_arguments(script_args) -> dict:
    """GRPOTrainer's `tools` / `environment_factory`, imported from their dotted paths (the user's modules, looked up
    in the working directory first, as reward paths are); only those set. ValueError (one line) when one fails."""
    if not script_args.tools and not script_args.environment_factory:
        return {}
    from grpokit.config.agents import import_agent_arguments
    from grpokit.rewards.registry import working_directory_first

    working_directory_first()
    return import_agent_arguments(script_args.tools, script_args.environment_factory)


def _finish_model_kwargs(training_args, model_args) -> None:
    """ModelConfig's loading options become model_init_kwargs (explicit model_init_kwargs win), as in TRL."""
    kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = {k: v for k, v in kwargs.items() if v is not None}


def _quantization_config(model_args):
    """load_in_4bit / load_in_8bit as a `BitsAndBytesConfig` for GRPOTrainer's quantization_config, as TRL's
    get_quantization_config builds it: 4-bit computes in the load dtype (float32 for 'auto' or unset)."""
    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return None
    from transformers import BitsAndBytesConfig

    if model_args.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_compute_dtype=model_args.dtype if model_args.dtype in ("bfloat16", "float16", "float32") else None,
        bnb_4bit_quant_type=model_args.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=model_args.use_bnb_nested_quant,
        bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage,
    )


def _peft_config(model_args):
    if not model_args.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        target_parameters=model_args.lora_target_parameters,
        modules_to_save=model_args.lora_modules_to_save,
        task_type=model_args.lora_task_type,
        use_rslora=model_args.use_rslora,
        use_dora=model_args.use_dora,
    )


def _record_held_out(output_dir, held_out) -> None:
    """The real demo's greedy held-out accuracy, before (step 0) and after training, as rows of metrics.jsonl
    (`held_out/greedy_accuracy`), and the plot redrawn with them."""
    import json

    from grpokit.records.plot import plot_run

    with open(os.path.join(output_dir, "metrics.jsonl"), "a", encoding="utf-8") as fh:
        for step, value in ((0, held_out.before), (held_out.steps, held_out.after)):
            fh.write(json.dumps({"step": step, "held_out/greedy_accuracy": value}) + "\n")
    plot_run(output_dir)
    print(f"demo: held-out accuracy (greedy) {held_out.before:.2f} -> {held_out.after:.2f}")


def _demo_verdict(output_dir) -> None:
    from grpokit.records.plot import read_metrics

    rows = [r for r in read_metrics(output_dir) if "reward" in r]
    if not rows:
        return
    tail = rows[-max(1, len(rows) // 10) :]
    first, last = rows[0]["reward"], sum(r["reward"] for r in tail) / len(tail)
    print(f"demo: mean reward {first:.3f} at the first logged step, {last:.3f} over the last tenth of logged steps")
    if "tools/call_frequency" in rows[0]:
        calls = [r.get("tools/call_frequency", 0.0) for r in rows]
        print(f"demo: tool calls per completion {calls[0]:.2f} at the first logged step, {calls[-1]:.2f} at the last")
