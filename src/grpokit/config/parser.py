"""`TrlParser`: TRL's parser API over a strict, layered resolution of every dataclass at once.

Layers, lowest to highest: dataclass defaults -> recipe -> YAML files (`--config`, later files win) -> command-line
flags. Every value, whatever its layer, is coerced by its field's type (`types.coerce`), every rule is checked
(`rules`), and every problem is reported at once before any dataclass is built. Each resolved value remembers where
it came from (`Resolution.sources`). The resolution itself is `resolver.Resolver`, which needs neither transformers
nor torch; this module adds transformers' HfArgumentParser (argparse help, TRL's API) and the real GRPOConfig.
"""

from __future__ import annotations

import dataclasses
import sys

from transformers import HfArgumentParser

from grpokit.launch import under_launcher  # noqa: F401 - offered here before the resolution moved to resolver.py

from .grpo_config import GRPOConfig
from .model_config import ModelConfig
from .redaction import redact
from .resolver import (  # noqa: F401 - the names this module has always offered
    DERIVED_FIELDS,
    OPENR1_CODE_FIELDS,
    OPENR1_REWARD_PARAMETERS,
    RESERVED_KEYS,
    LaunchOptions,
    Resolution,
    Resolver,
    plain,
    pop_keys,
    reward_defaults,
    reward_problems,
    take_flags,
)
from .rules import ConfigError
from .script_args import DatasetMixtureConfig, GRPOScriptArguments

DEFAULT_TYPES = (GRPOScriptArguments, GRPOConfig, ModelConfig, DatasetMixtureConfig)


def machine_notes(values) -> list[str]:
    """What depends on this machine rather than on the configuration, and vLLM fields that have no effect (see
    `resolver.machine_notes`), against GRPOConfig's defaults."""
    from .resolver import machine_notes as notes

    return notes(values, {f.name: f.default for f in dataclasses.fields(GRPOConfig)})


class TrlParser(Resolver, HfArgumentParser):
    """Parse dataclasses from YAML files (`--config`), a recipe (`--recipe`) and command-line flags, strictly.

    Drop-in for `trl.TrlParser`: `TrlParser([GRPOScriptArguments, GRPOConfig, ModelConfig]).parse_args_and_config()`
    returns the instances. Bad input prints one line per problem and exits with status 2, like argparse does.
    """

    def __init__(self, dataclass_types=None, **kwargs):
        if dataclass_types is None:
            dataclass_types = DEFAULT_TYPES
        elif not isinstance(dataclass_types, (list, tuple)):
            dataclass_types = [dataclass_types]
        kwargs.setdefault("allow_abbrev", False)
        HfArgumentParser.__init__(self, dataclass_types, **kwargs)
        for dtype in self.dataclass_types:
            taken = {f.name for f in dataclasses.fields(dtype)} & set(RESERVED_KEYS[:1] + RESERVED_KEYS[2:])
            if taken:
                raise ValueError(f"{dtype.__name__} has a field named {taken.pop()!r}, which the parser reserves")
        self.add_argument("--config", action="append", metavar="FILE", help="YAML config file (repeatable).")
        if not any("recipe" in {f.name for f in dataclasses.fields(t)} for t in self.dataclass_types):
            self.add_argument("--recipe", metavar="NAME", help="Named recipe under your YAML and flags.")
        self.resolution: Resolution | None = None

    # ---- TRL's API ----

    def parse_args_and_config(self, args=None, return_remaining_strings=False, fail_with_unknown_args=True):
        """Resolve the dataclasses from `args` (default `sys.argv[1:]`). Unknown arguments are an error unless
        `return_remaining_strings=True`, which returns them (as `--key value` strings) after the instances.
        `fail_with_unknown_args` is accepted for TRL compatibility; unknown arguments always fail otherwise."""
        del fail_with_unknown_args  # strict whatever the caller asks: a typo must never be silently dropped
        try:
            resolution = self.resolve(args, allow_remaining=return_remaining_strings)
        except ConfigError as exc:
            for problem in exc.problems:
                print(f"error: {redact(problem.line())}", file=sys.stderr)
            sys.exit(2)
        for warning in resolution.warnings:
            print(f"warning: {redact(warning)}", file=sys.stderr)
        if return_remaining_strings:
            return (*resolution.instances, resolution.remaining)
        return tuple(resolution.instances)

    def parse_args_into_dataclasses(
        self,
        args=None,
        return_remaining_strings=False,
        look_for_args_file=True,
        args_filename=None,
        args_file_flag=None,
    ):
        """`HfArgumentParser`'s method with its return shape (one instance per dataclass, then the remaining strings
        when asked), resolved as `parse_args_and_config` does: strictly, with `--config` YAML files and `--recipe`
        (TRL's version rejects `--config` here). The `.args` files of `HfArgumentParser` (`args_filename`,
        `args_file_flag`) are refused in one line: use `--config FILE.yaml`. `look_for_args_file` is accepted for
        compatibility and no such file is looked for."""
        del look_for_args_file
        if args_filename is not None or args_file_flag is not None:
            raise ValueError(
                "TrlParser.parse_args_into_dataclasses: `.args` files (args_filename, args_file_flag) are not read; "
                "put the arguments in a YAML file and pass --config FILE.yaml"
            )
        return self.parse_args_and_config(args, return_remaining_strings=return_remaining_strings)
