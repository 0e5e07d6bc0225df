"""Every reason a `GRPOTrainer` cannot start, found at once before any model or tokenizer loads: arguments and
settings grpokit does not implement, hardware and launch mismatches, rewards and their weights, datasets."""

from __future__ import annotations

import logging
import os

from .config.precision import hardware_problems, installed
from .config.rules import reference_problems
from .config.support import unsupported_settings
from .launch import engine_problems, launch_problems, launched_engine

logger = logging.getLogger("grpokit.trainer")  # the trainer's start warnings, under its logger name

# GRPOTrainer's keyword arguments (TRL 1.16's), offered by "did you mean" for a mistyped one.
TRAINER_ARGUMENTS = (
    "model",
    "reward_funcs",
    "args",
    "train_dataset",
    "eval_dataset",
    "processing_class",
    "reward_processing_classes",
    "callbacks",
    "optimizers",
    "quantization_config",
    "peft_config",
    "tools",
    "environment_factory",
    "rollout_func",
)


def refuse_unknown_arguments(kwargs) -> None:
    """A keyword argument GRPOTrainer does not take: a TypeError, as Python's own, with the nearest valid name."""
    unknown = [name for name in kwargs if name not in TRAINER_ARGUMENTS]
    if unknown:
        from .config.suggest import UnknownArgumentError

        raise UnknownArgumentError("GRPOTrainer.__init__", unknown, TRAINER_ARGUMENTS)


def quantization_problems(model, model_init_kwargs, quantization_config, peft_config) -> list[str]:
    """QLoRA's rules, before the model loads: the quantisation given in one place, bitsandbytes installed, and an
    adapter to train (a quantised base cannot be trained in full)."""
    in_kwargs = (model_init_kwargs or {}).get("quantization_config") if isinstance(model_init_kwargs, dict) else None
    if quantization_config is not None and in_kwargs is not None:
        return [
            "quantization_config: given both as a GRPOTrainer argument and in model_init_kwargs; set it in one place"
        ]
    config = quantization_config if quantization_config is not None else in_kwargs
    if config is None or not isinstance(model, str):  # an instantiated model is not loaded again (a warning says so)
        return []
    where = "quantization_config" if quantization_config is not None else "model_init_kwargs['quantization_config']"
    get = config.get if isinstance(config, dict) else lambda name, default=None: getattr(config, name, default)
    problems = []
    if get("load_in_4bit", False) and get("load_in_8bit", False):
        problems.append(f"{where}: load_in_4bit and load_in_8bit cannot both be true")
    method = get("quant_method", "bitsandbytes")
    if str(getattr(method, "value", method)) == "bitsandbytes" and not installed("bitsandbytes"):
        problems.append(f"{where}: bitsandbytes is not installed (pip install 'grpokit[qlora]')")
    if peft_config is None:
        problems.append(
            f"{where}: a quantised base model cannot be trained in full (its weights are frozen integers); pass "
            "peft_config (e.g. peft.LoraConfig) to train LoRA adapters on it (QLoRA)"
        )
    return problems


def check_before_loading(
    args, reward_funcs, train_dataset, owned_rewards=False, model=None, quantization_config=None, peft_config=None
) -> None:
    """Every reason not to start, at once, before any model or tokenizer loads (unknown keyword arguments were
    refused before: `refuse_unknown_arguments`)."""
    problems = quantization_problems(model, args.model_init_kwargs, quantization_config, peft_config)
    problems += unsupported_settings(args)
    problems += hardware_problems(vars(args))
    state = getattr(args, "distributed_state", None)
    if state is not None:
        problems += launch_problems(args.world_size, str(state.distributed_type))
        problems += unshared_output_dir(args, state)
    engine = launched_engine(deepspeed_plugin=getattr(args, "deepspeed_plugin", None))
    problems += engine_problems(
        **engine,
        use_cpu=False,  # what use_cpu does to DeepSpeed is visible in the state (launch_problems)
        use_vllm=args.use_vllm,
        ds3_gather_for_generation=args.ds3_gather_for_generation,
    )
    if engine["deepspeed_stage"] != 3 and not args.ds3_gather_for_generation:
        logger.warning("ds3_gather_for_generation=False has no effect: DeepSpeed ZeRO-3 is not running")
    if not reward_funcs and not owned_rewards:
        problems.append(
            "No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose environment defines a "
            "`get_reward` method."
        )
    if args.reward_weights is not None and len(args.reward_weights) != len(reward_funcs):
        problems.append(
            f"reward_weights={args.reward_weights!r}: {len(args.reward_weights)} weights for {len(reward_funcs)} "
            "reward functions; give one weight per reward function"
        )
    # The rule GRPOConfig checks when it is built, again for fields assigned after construction.
    problems += [problem.line() for problem in reference_problems(vars(args))]
    if train_dataset is not None:  # the rows' images open and fit their prompts (vision-language models)
        from .vision import VisionError, check_image_rows

        try:
            check_image_rows(train_dataset)
        except VisionError as exc:
            problems.append(str(exc))
    if problems:
        raise ValueError("GRPOTrainer cannot start:\n  " + "\n  ".join(problems))


def unshared_output_dir(args, state) -> list[str]:
    """With several machines, a run that writes checkpoints (or resumes one) needs one output_dir that every machine
    sees: process 0 writes each checkpoint, every process adds its RNG state to it, and on resume every process reads
    it back. Process 0 writes a token there; the first process of each machine looks for it (every process takes
    part: collectives). A run without checkpoints writes its records and final model on process 0's machine alone and
    reads nothing back, so it may use a folder per machine."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or world)
    strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
    if world <= local or (strategy == "no" and args.resume_from_checkpoint is None):
        return []
    import secrets

    from accelerate.utils import broadcast_object_list, gather_object

    marker = os.path.join(args.output_dir, ".grpokit-shared-output-dir")
    token = broadcast_object_list([secrets.token_hex(8) if state.process_index == 0 else None])[0]
    if state.process_index == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(token)
    state.wait_for_everyone()
    seen = True
    if state.local_process_index == 0:
        try:
            with open(marker, encoding="utf-8") as fh:
                seen = fh.read() == token
        except OSError:
            seen = False
    blind = sorted({machine for machine, ok in gather_object([(state.process_index // local, seen)]) if not ok})
    state.wait_for_everyone()
    if state.process_index == 0:
        os.remove(marker)
    if not blind:
        return []
    which = ", ".join(map(str, blind))
    return [
        f"output_dir={args.output_dir!r} is not shared between machines: machine {which} does not see what process 0 "
        "writes there, and checkpoints need it (process 0 writes them, every process adds its RNG state and reads "
        "them back on resume); put output_dir on a filesystem every machine mounts, or set save_strategy: no"
    ]
