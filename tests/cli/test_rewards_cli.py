"""`grpokit rewards [show NAME]`: every registry name listed with what it scores, its kwargs and the extra it needs,
read from the registry; one reward in full; a wrong name is one line (exit 2); no torch or transformers loaded.
The real command in a subprocess."""

import os
import re
import subprocess
import sys

import pytest

from grpokit.rewards import sandbox
from grpokit.rewards.registry import (
    MATH_REWARD_NAMES,
    REFUSED_REWARDS,
    REWARD_FACTORIES,
    SANDBOX_REWARD_NAMES,
    reward_names,
)


def grpokit(*args, code: str | None = None) -> subprocess.CompletedProcess:
    """The real command (`python -m grpokit ARGS`), or `python -c CODE`, offline and with a wide terminal."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "119"}
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "grpokit", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def listing() -> dict[str, str]:
    """`grpokit rewards`: name -> its block of text (its first line and the indented lines under it)."""
    result = grpokit("rewards")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    blocks, name = {}, None
    for line in result.stdout.split("\n\n")[0].splitlines():
        if not line.startswith(" "):
            name, text = line.split(maxsplit=1)
            blocks[name] = text
        else:
            blocks[name] += " " + line.strip()
    return blocks


def test_every_registry_name_is_listed_once(listing):
    assert sorted(listing) == reward_names()


def test_each_entry_says_what_it_scores_its_kwargs_and_its_extra(listing):
    # The first paragraph of the docstring, then the kwargs an entry may set, with the signature's defaults.
    assert listing["reasoning_steps"].startswith("open-r1's `reasoning_steps`: min(1, #step markers / 3).")
    assert "kwargs: none" in listing["reasoning_steps"] and "needs:" not in listing["reasoning_steps"]
    assert "kwargs: ngram_size=3, max_penalty=-1.0" in listing["repetition_penalty"]
    assert "kwargs: max_completion_len=required, soft_punish_cache=required" in listing["get_soft_overlong_punishment"]
    # `solution` is the dataset column the trainer passes, not a setting.
    assert "kwargs: math_timeout=10.0; reads column: solution" in listing["accuracy"]
    for name in reward_names():
        math, code = "math-verify (pip install 'grpokit[math]')" in listing[name], "bubblewrap" in listing[name]
        assert (math, code) == (name in MATH_REWARD_NAMES, name in SANDBOX_REWARD_NAMES), name


def test_the_refused_reward_is_named_under_the_list():
    out = grpokit("rewards").stdout
    assert "refused by design: cf_code (grpokit rewards show NAME says why)." in out


def test_sandbox_set_is_the_rewards_that_need_the_sandbox(monkeypatch):
    # The set the listing reads is kept honest: exactly those factories refuse to build without the boundary.
    def no_boundary(owner="sandbox"):
        raise RuntimeError(f"{owner}: no sandbox here")

    monkeypatch.setattr(sandbox, "check_boundary", no_boundary)
    needing = set()
    for name, factory in REWARD_FACTORIES.items():
        kwargs = {"ioi_provider": "local"} if name == "ioi_code" else {}
        try:
            factory(**kwargs)
        except RuntimeError:
            needing.add(name)
        except TypeError:  # a required kwarg (TRL's factories): these are not code rewards
            pass
    assert needing == SANDBOX_REWARD_NAMES


def test_show_prints_one_reward_in_full():
    result = grpokit("rewards", "show", "cosine")
    assert result.returncode == 0 and result.stderr == ""
    out = result.stdout
    assert out.startswith("cosine: factory (called with its kwargs)\n")
    assert "correctness scaled by completion length in *characters*" in out
    assert re.search(r"^  max_len\s+1000$", out, re.M) and re.search(r"^  min_value_wrong\s+-1.0$", out, re.M)
    assert "needs: math-verify (pip install 'grpokit[math]')" in out
    assert ">>>" not in out  # the docstring's examples are left out


def test_show_of_a_plain_reward_function():
    out = grpokit("rewards", "show", "format").stdout
    assert out.startswith("format: reward function\n")
    assert "kwargs: none" in out and "needs: nothing beyond grpokit" in out and "use it: reward_funcs: [format]" in out


@pytest.mark.parametrize(
    "args, line",
    [
        (["show", "acuracy"], "error: unknown reward 'acuracy'; did you mean 'accuracy'?"),
        (["show", "zzz"], "error: unknown reward 'zzz'; grpokit rewards lists them"),
        (["show", "cf_code"], f"error: reward 'cf_code': {REFUSED_REWARDS['cf_code']}"),
        (["list"], "error: usage: grpokit rewards [show NAME]"),
    ],
)
def test_a_wrong_name_is_one_line_and_exit_2(args, line):
    result = grpokit("rewards", *args)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")


def test_cf_code_says_why_it_is_refused():
    assert "Piston/Morph graders" in REFUSED_REWARDS["cf_code"] and "checker" in REFUSED_REWARDS["cf_code"]


def test_rewards_loads_neither_torch_nor_transformers():
    code = (
        "import sys, contextlib, io\n"
        "from grpokit.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['rewards']) == 0 and main(['rewards', 'show', 'code']) == 0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))\n"
    )
    result = grpokit(code=code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def test_top_level_help_and_reward_funcs_help_point_at_rewards():
    assert re.search(r"^  rewards \[show NAME\]\s+list the built-in rewards", grpokit("--help").stdout, re.M)
    train_help = grpokit("train", "--help-all").stdout
    entry = train_help.split("\n  --reward_funcs ", 1)[1].split("\n  --", 1)[0]
    assert "grpokit rewards" in entry and "grpokit recipes" not in entry
