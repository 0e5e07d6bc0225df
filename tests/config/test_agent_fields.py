"""`tools` and `environment_factory` in a configuration (issue 20, item 3): parsed from YAML and the command line,
checked by `grpokit config validate` without importing the user's modules, shown in the schema and in help; and
`max_tool_calling_iterations` refused without them."""

import json
import sys

import pytest

from grpokit.cli.help import grouped_fields
from grpokit.config.grpo_config import GRPOConfig
from grpokit.config.parser import TrlParser
from grpokit.config.rules import ConfigError
from grpokit.config.support import NOT_IMPLEMENTED, unsupported_settings

SPELLING = "'package.module.function' or 'package.module:function'"


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """A module and a package of the user's in tmp_path (on sys.path), each leaving a mark in `imported.log` when
    imported: a check that imports nothing leaves no mark."""
    log = tmp_path / "imported.log"
    mark = f"open({str(log)!r}, 'a').write(__name__ + '\\n')\n"
    (tmp_path / "agfield_tools.py").write_text(
        mark
        + "def search(query: str) -> str:\n    return query\n\n\n"
        + "def lookup(key: str) -> str:\n    return key\n\n\n"
        + "class Counter:\n    def reset(self):\n        return None\n"
    )
    package = tmp_path / "agfield_pkg"
    (package / "envs").mkdir(parents=True)
    (package / "__init__.py").write_text(mark)
    (package / "envs" / "__init__.py").write_text(mark)
    (package / "envs" / "maze.py").write_text(mark + "class Maze:\n    def reset(self):\n        return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield log
    assert not log.exists(), f"a check imported the user's code: {log.read_text()}"
    assert not [name for name in sys.modules if name.startswith("agfield_")]


def resolve(*args):
    return TrlParser().resolve([str(a) for a in args], planning=True)


def problems(*args) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        resolve(*args)
    return [p.line() for p in exc.value.problems]


# ---- parsing ----


def test_yaml_list_single_string_and_mapping(tmp_path, user_code):
    path = tmp_path / "agent.yaml"
    path.write_text(
        "tools:\n  - agfield_tools.search\n  - agfield_tools:lookup\n"
        "environment_factory:\n  maze: agfield_pkg.envs.maze:Maze\n  counter: agfield_tools.Counter\n"
    )
    r = resolve("--config", path)
    script_args = r.instances[0]
    assert script_args.tools == ["agfield_tools.search", "agfield_tools:lookup"]
    assert script_args.environment_factory == {
        "maze": "agfield_pkg.envs.maze:Maze",
        "counter": "agfield_tools.Counter",
    }
    assert r.sources["tools"] == f"yaml:{path}:1" and r.sources["environment_factory"] == f"yaml:{path}:4"

    single = tmp_path / "single.yaml"
    single.write_text("tools: agfield_tools:search\nenvironment_factory: agfield_tools:Counter\n")
    script_args = resolve("--config", single).instances[0]
    assert script_args.tools == ["agfield_tools:search"]  # one string is a list of one, as for reward_funcs
    assert script_args.environment_factory == "agfield_tools:Counter"


def test_command_line(user_code):
    r = resolve(
        "--tools", "agfield_tools:search", "agfield_tools.lookup", "--environment_factory", "agfield_tools:Counter"
    )
    assert r.instances[0].tools == ["agfield_tools:search", "agfield_tools.lookup"]
    assert r.instances[0].environment_factory == "agfield_tools:Counter"
    assert r.sources["tools"] == r.sources["environment_factory"] == "cli"
    # a repeated list flag extends the list; a mapping on the command line is JSON
    r = resolve("--tools", "agfield_tools:search", "--tools", "agfield_tools:lookup",
                "--environment_factory", '{"maze": "agfield_pkg.envs.maze.Maze"}')  # fmt: skip
    assert r.instances[0].tools == ["agfield_tools:search", "agfield_tools:lookup"]
    assert r.instances[0].environment_factory == {"maze": "agfield_pkg.envs.maze.Maze"}


def test_unset_by_default():
    r = resolve()
    assert r.instances[0].tools is None and r.instances[0].environment_factory is None
    assert r.sources["tools"] == r.sources["environment_factory"] == "default"


def test_wrong_types(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("tools: {a: b}\n")
    assert problems("--config", path) == [f"tools (yaml:{path}:1): item 0: {{'a': 'b'}} is not a string"]
    path.write_text("environment_factory: [a.b]\n")
    assert problems("--config", path) == [
        f"environment_factory (yaml:{path}:1): ['a.b'] is not a mapping or a string or null"
    ]


# ---- checks without importing ----


@pytest.mark.parametrize(
    "path, message",
    [
        ("agfield_tools", f"not a valid dotted path {SPELLING}"),
        ("agfield_tools..search", f"not a valid dotted path {SPELLING}"),
        ("agfield_tools:search:x", f"not a valid dotted path {SPELLING}"),
        ("agfield_tools:", f"not a valid dotted path {SPELLING}"),
        ("no_such_agfield_module.search", "no module named 'no_such_agfield_module' in the working directory or on "
         "sys.path"),
        ("agfield_pkg.envs.maez:Maze", "no module named 'agfield_pkg.envs.maez'; did you mean 'maze'?"),
    ],
)  # fmt: skip
def test_tools_that_cannot_be_found(user_code, path, message):
    assert problems("--tools", "agfield_tools:search", path) == [f"tools (cli): entry 1: {path!r}: {message}"]


def test_a_name_the_module_does_not_define(tmp_path, user_code):
    module = tmp_path / "agfield_tools.py"
    assert problems("--tools", "agfield_tools:serch") == [
        f"tools (cli): entry 0: 'agfield_tools:serch': module 'agfield_tools' ({module}) defines no 'serch' at its "
        "top level; did you mean 'search'?"
    ]
    maze = tmp_path / "agfield_pkg" / "envs" / "maze.py"
    assert problems("--environment_factory", "agfield_pkg.envs.maze.Maz") == [
        f"environment_factory (cli): 'agfield_pkg.envs.maze.Maz': module 'agfield_pkg.envs.maze' ({maze}) defines "
        "no 'Maz' at its top level; did you mean 'Maze'?"
    ]


def test_environment_mapping_entries(tmp_path, user_code):
    path = tmp_path / "envs.yaml"
    path.write_text("environment_factory:\n  maze: agfield_pkg.envs.maze:Maze\n  counter: agfield_tools.Countr\n")
    module = tmp_path / "agfield_tools.py"
    assert problems("--config", path) == [
        f"environment_factory (yaml:{path}:1): entry 'counter': 'agfield_tools.Countr': module 'agfield_tools' "
        f"({module}) defines no 'Countr' at its top level; did you mean 'Counter'?"
    ]
    path.write_text("environment_factory:\n  1: agfield_tools.Counter\n")
    assert problems("--config", path) == [
        f"environment_factory (yaml:{path}:1): key 1 is not an environment name (a non-empty string, the rows' "
        "`environment` value)"
    ]
    path.write_text("environment_factory: {}\n")
    assert problems("--config", path) == [
        f"environment_factory={{}} (yaml:{path}:1): is an empty mapping: it names no environment; give "
        "{environment name: dotted path}, or one dotted path, or leave it unset"
    ]


def test_found_paths_are_accepted_and_nothing_is_imported(user_code, cli):
    result = cli("config", "validate", "--tools", "agfield_tools.search", "agfield_tools:lookup",
                 "--environment_factory", "agfield_pkg.envs.maze:Maze")  # fmt: skip
    assert (result.code, result.out, result.errors) == (0, "ok\n", [])
    # the user_code fixture checks that no module of the user's was imported (no mark, nothing in sys.modules)


def test_a_file_that_does_not_parse(tmp_path, monkeypatch):
    (tmp_path / "agfield_broken.py").write_text("def search(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert problems("--tools", "agfield_broken.search") == [
        f"tools (cli): entry 0: 'agfield_broken.search': module 'agfield_broken' does not parse "
        f"({tmp_path / 'agfield_broken.py'}:1: invalid syntax)"
    ]


def test_names_made_at_run_time_are_left_to_training(tmp_path, monkeypatch):
    # `from x import *` and a module __getattr__ bind names that reading the file cannot tell: not refused here
    (tmp_path / "agfield_star.py").write_text("from json import *\n")
    (tmp_path / "agfield_lazy.py").write_text("def __getattr__(name):\n    return len\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve("--tools", "agfield_star.anything", "agfield_lazy:whatever").instances[0].tools == [
        "agfield_star.anything",
        "agfield_lazy:whatever",
    ]


# ---- max_tool_calling_iterations ----


def test_max_tool_calling_iterations_needs_tools(tmp_path, user_code, cli):
    result = cli("config", "validate", "--max_tool_calling_iterations", "3")
    assert result.code == 2 and result.errors == [
        "error: max_tool_calling_iterations=3 (cli): caps the tool-calling loop and has no effect without tools; "
        "set tools or environment_factory, or remove it"
    ]
    path = tmp_path / "cap.yaml"
    path.write_text("learning_rate: 1.0e-6\nmax_tool_calling_iterations: 4\n")
    result = cli("config", "validate", "--config", path)
    assert result.errors == [
        f"error: max_tool_calling_iterations=4 (yaml:{path}:2): caps the tool-calling loop and has no effect without "
        "tools; set tools or environment_factory, or remove it"
    ]
    for agent in (["--tools", "agfield_tools:search"], ["--environment_factory", "agfield_tools:Counter"]):
        result = cli("config", "validate", "--max_tool_calling_iterations", "3", *agent)
        assert (result.code, result.out, result.errors) == (0, "ok\n", [])


def test_the_tool_caps_set_without_tools_are_refused(tmp_path, user_code, cli):
    """tool_round_timeout and max_tool_result_chars always have their defaults; set by the user with no tools, they
    would do nothing: refused, each in one line naming where it was set."""
    result = cli("config", "validate", "--tool_round_timeout", "30", "--max_tool_result_chars", "100")
    assert result.code == 2 and result.errors == [
        "error: tool_round_timeout=30.0 (cli): caps the time of a round of tool calls and has no effect without "
        "tools; set tools or environment_factory, or remove it",
        "error: max_tool_result_chars=100 (cli): caps the length of a tool result and has no effect without tools; "
        "set tools or environment_factory, or remove it",
    ]
    result = cli("config", "validate", "--tool_round_timeout", "30", "--tools", "agfield_tools:search")
    assert (result.code, result.errors) == (0, [])


def test_max_tool_calling_iterations_is_no_longer_refused_as_unsupported(tmp_path):
    assert "max_tool_calling_iterations" not in NOT_IMPLEMENTED
    # GRPOTrainer in Python takes the tools as arguments: the config alone is not refused
    assert unsupported_settings(GRPOConfig(output_dir=str(tmp_path), max_tool_calling_iterations=2)) == []
    # the parser (TRL scripts) leaves it alone too; only the grpokit commands, which own the tools, refuse it
    assert resolve("--max_tool_calling_iterations", "2").values["max_tool_calling_iterations"] == 2


# ---- schema, help, show ----


def test_schema(cli):
    result = cli("config", "schema")
    properties = json.loads(result.out)["properties"]
    tools, env = properties["tools"], properties["environment_factory"]
    assert tools["default"] is None and env["default"] is None
    assert tools["description"].startswith("Tool functions the model may call")
    assert env["description"].startswith("Environment of an agent run")
    path = tools["anyOf"][0]["items"]
    assert tools["anyOf"] == [{"type": "array", "items": path}, {"type": "null"}]
    assert env["anyOf"] == [
        path,
        {"type": "object", "additionalProperties": path, "minProperties": 1},
        {"type": "null"},
    ]
    import re

    for good in ("a.b", "a.b:c", "a:c", "pkg.mod.Cls.method", "a.b:C.m"):
        assert re.match(path["pattern"], good), good
    for bad in ("a", "a..b", "a:b:c", ":f", "a.", "1a.b"):
        assert not re.match(path["pattern"], bad), bad


def test_help_groups_the_agent_fields():
    groups = dict(grouped_fields())
    assert groups["agents (tool calling)"] == [
        "tools",
        "environment_factory",
        "max_tool_calling_iterations",
        "tool_timeout",
        "tool_round_timeout",
        "max_tool_result_chars",
    ]


def test_show_yaml_round_trips(tmp_path, user_code, cli):
    result = cli("config", "show", "--format", "yaml", "--tools", "agfield_tools:search",
                 "--environment_factory", '{"maze": "agfield_pkg.envs.maze:Maze"}')  # fmt: skip
    assert result.code == 0, result.err
    written = tmp_path / "shown.yaml"
    written.write_text(result.out)
    script_args = resolve("--config", written).instances[0]
    assert script_args.tools == ["agfield_tools:search"]
    assert script_args.environment_factory == {"maze": "agfield_pkg.envs.maze:Maze"}
