"""The `grpokit` command, and only it: subcommands (`main`), `train` with its checks before anything loads, run folder,
records, plot, stop signals and launch presets, the config command's plan, schema and rendering, the demo's folder,
and `vllm-serve`. It sits on top of the library: nothing in `grpokit` outside this package imports it.
"""

from grpokit.cli.commands import main

__all__ = ["main"]
