"""The command's side of the built-in demo (`grpokit train` with no arguments): its YAML and its run folder.

The demo's task itself (the tiny model, the prompts and the reward the YAML names) is `grpokit.demo`, in the library,
so that a config naming `grpokit.demo.copy_digit_reward` trains from Python as well.
"""

from __future__ import annotations

import os
from importlib import resources

DEMOS = {"digits": "demo.yaml", "tools": "demo_tools.yaml"}  # `grpokit train --demo [tools]`


def demo_config_path(kind: str = "digits") -> str:
    return str(resources.files(__package__).joinpath(DEMOS[kind]))


def make_demo_dir(path: str) -> None:
    """Create the demo's folder; one that grpokit creates gets a `.gitignore` of `*` (as a virtualenv does), so that
    the default `grpokit-demo/`, made wherever `grpokit train` runs, never shows up in a git checkout. A folder that
    already exists is left as it is: it may be the user's."""
    if os.path.isdir(path):
        return
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, ".gitignore"), "w", encoding="utf-8") as fh:
        fh.write("# created by grpokit for the demo's run: nothing here is meant for version control\n*\n")
