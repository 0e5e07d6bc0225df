"""Every reason a `GRPOTrainer` cannot start, found at once before any model or tokenizer loads: arguments and
settings grpokit does not implement, hardware and launch mismatches, rewards and their weights, datasets."""

from __future__ import annotations

import logging

from transformers.utils import is_datasets_available

from .config.precision import hardware_problems
from .config.rules import reference_problems
from .config.support import unsupported_settings
from .launch import engine_problems, launch_problems, launched_engine

logger = logging.getLogger("grpokit.trainer")  # the trainer's start warnings, under its logger name

# Constructor arguments of TRL's GRPOTrainer that grpokit accepts only to refuse them clearly.
TRL_ONLY_ARGUMENTS = ("quantization_config",)


def check_before_loading(args, reward_funcs, train_dataset, trl_only, owned_rewards: bool = False) -> None:
    """Every reason not to start, at once, before any model or tokenizer loads."""
    problems = []
    for name, value in trl_only.items():
        if name not in TRL_ONLY_ARGUMENTS:
            raise TypeError(f"GRPOTrainer.__init__() got an unexpected keyword argument {name!r}")
        if value is not None:
            problems.append(f"{name}: this GRPOTrainer argument is not supported yet")
    problems += unsupported_settings(args)
    problems += hardware_problems(vars(args))
    state = getattr(args, "distributed_state", None)
    if state is not None:
        problems += launch_problems(args.world_size, str(state.distributed_type))
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
    if is_datasets_available():
        import datasets

        if isinstance(train_dataset, datasets.IterableDataset):
            problems.append(
                "train_dataset: iterable (streaming) datasets are not supported yet; use a map-style Dataset"
            )
    if problems:
        raise ValueError("GRPOTrainer cannot start:\n  " + "\n  ".join(problems))
