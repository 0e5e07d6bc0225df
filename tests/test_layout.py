"""The package's layout, read from the source with `ast` (imports inside functions included): the `grpokit` command
sits on top of the library and nothing below imports it; no import cycle between grpokit's units (its top-level
modules and packages) nor between the modules of one package; `config` is a leaf that imports only reward names and
the launch's count; the trainer stays glue.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "grpokit"
PACKAGE_MAP = Path(__file__).resolve().parents[1] / "docs" / "development.md"


def _module_names() -> dict[str, Path]:
    """{dotted module name: file}; a package is named by its `__init__.py`."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


MODULES = _module_names()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _known(name: str) -> str:
    """The grpokit module an imported name lands in: `grpokit.a.b.C` -> `grpokit.a.b`."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imported(name: str, node: ast.AST) -> list[str]:
    """The grpokit modules one import statement (or `importlib.import_module("...")` call) of module `name` loads.
    `from pkg import sub` counts as importing `pkg.sub` when `sub` is a module, else `pkg` itself."""
    if isinstance(node, ast.Import):
        return [_known(a.name) for a in node.names if a.name.split(".")[0] == "grpokit"]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".") if _is_package(name) else name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target.split(".")[0] != "grpokit":
            return []
        return [_known(f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target) for a in node.names]
    if (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and str(node.args[0].value).startswith("grpokit.")
    ):
        return [_known(node.args[0].value)]
    return []


def _import_graph() -> dict[str, set[str]]:
    graph = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            graph[name].update(t for t in _imported(name, node) if t != name)
    return graph


GRAPH = _import_graph()


def _unit(name: str) -> str:
    """`grpokit.config.parser` -> `grpokit.config`; `grpokit.trainer` -> itself."""
    return ".".join(name.split(".")[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


# The package root (the public API, lazily importing what it exports) and `python -m grpokit` stand above every unit.
ROOTS = {"grpokit", "grpokit.__main__"}


def _unit_graph() -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        if name in ROOTS:
            continue
        edges = units.setdefault(_unit(name), set())
        edges.update(_unit(t) for t in targets if t not in ROOTS and _unit(t) != _unit(name))
    return units


def test_the_checker_finds_what_it_must():
    # A cycle of three, a self-contained pair, and a chain without one.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    # Relative imports, `from pkg import submodule`, imports inside functions and import_module calls all count.
    assert "grpokit.config.rules" in GRAPH["grpokit.config.parser"]
    assert "grpokit.cli.launch_presets" in GRAPH["grpokit.cli.commands"]  # imported inside a function there
    assert "grpokit.launch" in GRAPH["grpokit.config.parser"]
    tree = ast.parse("import importlib\nimportlib.import_module('grpokit.tiny')")
    assert _imported("grpokit.demo", tree.body[1].value) == ["grpokit.tiny"]


def test_no_import_cycle_between_units():
    assert _cycles(_unit_graph()) == []


@pytest.mark.parametrize("package", sorted(n for n in MODULES if _is_package(n) and n != "grpokit"))
def test_no_import_cycle_inside_a_package(package):
    inside = {n: {t for t in GRAPH[n] if _unit_of(t, package)} for n in MODULES if _unit_of(n, package)}
    assert _cycles(inside) == []


def _unit_of(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_nothing_in_the_library_imports_the_command():
    importers = sorted(
        name
        for name, targets in GRAPH.items()
        if not _unit_of(name, "grpokit.cli") and name not in ROOTS and any(_unit_of(t, "grpokit.cli") for t in targets)
    )
    assert importers == []
    assert GRAPH["grpokit.__main__"] == {"grpokit.cli"}  # `python -m grpokit` is the command


def test_config_imports_only_reward_names_and_the_launch_count():
    assert _unit_graph()["grpokit.config"] <= {"grpokit.rewards", "grpokit.launch"}
    assert _unit_graph()["grpokit.launch"] == set()  # and the launch imports nothing of grpokit


# What each library unit may import: the package map of docs/development.md, kept true here. Every edge points down this table.
LEAVES = {
    "grpokit.algorithms",
    "grpokit.rewards",
    "grpokit.fastpath",
    "grpokit.launch",
    "grpokit.sharding",
    "grpokit.vision",
}
MAY_IMPORT = {
    "grpokit.trainer": {
        "grpokit.checkpoints",
        "grpokit.metrics",
        "grpokit.rollout",
        "grpokit.generation",
        "grpokit.scoring",
        "grpokit.data",
        "grpokit.models",
        "grpokit.config",
        "grpokit.dist",
        "grpokit.nan_guard",
        "grpokit.tiny",
        "grpokit.trl_compat",
        "grpokit.startup",
        "grpokit.records",
        "grpokit.routing",
    }
    | LEAVES,
    "grpokit.experimental": {
        "grpokit.trainer",
        "grpokit.config",
        "grpokit.generation",
        "grpokit.rollout",
        "grpokit.scoring",
        "grpokit.checkpoints",
        "grpokit.dist",
        "grpokit.sharding",
        "grpokit.vision",
    },
    "grpokit.service": {"grpokit.algorithms", "grpokit.generation", "grpokit.models", "grpokit.gguf"},
    "grpokit.records": {"grpokit.config", "grpokit.data"},
    "grpokit.startup": {"grpokit.config", "grpokit.launch", "grpokit.vision"},
    "grpokit.trl_compat": {
        "grpokit.agents",
        "grpokit.algorithms",
        "grpokit.config",
        "grpokit.dist",
        "grpokit.generation",
        "grpokit.rollout",
        "grpokit.sharding",
        "grpokit.vision",
    },
    "grpokit.agents": {"grpokit.generation", "grpokit.dist"},
    "grpokit.checkpoints": {"grpokit.config", "grpokit.models", "grpokit.launch", "grpokit.vision"},
    "grpokit.metrics": {"grpokit.algorithms", "grpokit.dist"},
    "grpokit.rollout": {
        "grpokit.generation",
        "grpokit.algorithms",
        "grpokit.rewards",
        "grpokit.models",
        "grpokit.config",
        "grpokit.dist",
        "grpokit.vision",
        "grpokit.routing",
    },
    "grpokit.generation": {
        "grpokit.scoring",
        "grpokit.fastpath",
        "grpokit.models",
        "grpokit.sharding",
        "grpokit.config",
        "grpokit.dist",
        "grpokit.vision",
    },
    "grpokit.scoring": {
        "grpokit.routing",
        "grpokit.algorithms",
        "grpokit.fastpath",
        "grpokit.models",
        "grpokit.sharding",
        "grpokit.vision",
    },
    "grpokit.data": {"grpokit.config", "grpokit.vision"},
    "grpokit.models": {"grpokit.sharding", "grpokit.vision", "grpokit.gguf", "grpokit.hub"},
    "grpokit.config": {"grpokit.rewards", "grpokit.launch"},
    "grpokit.demo": {"grpokit.tiny", "grpokit.gguf"},
    **{
        unit: set()
        for unit in LEAVES
        | {"grpokit.dist", "grpokit.nan_guard", "grpokit.tiny", "grpokit.gguf", "grpokit.hub", "grpokit.routing"}
    },
}


@pytest.mark.parametrize("unit", sorted(MAY_IMPORT))
def test_each_unit_imports_only_what_the_map_allows(unit):
    assert _unit_graph().get(unit, set()) - MAY_IMPORT[unit] == set()


def test_the_map_covers_every_library_unit():
    units = {u for u in _unit_graph() if u != "grpokit.cli"}
    assert units <= set(MAY_IMPORT)


def test_the_trainer_is_glue():
    lines = (PACKAGE / "trainer.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 600, f"trainer.py has {lines} lines"


def test_the_package_map_names_every_unit():
    """The package map (docs/development.md) names every unit, so a newcomer finds which room is theirs."""
    text = PACKAGE_MAP.read_text(encoding="utf-8")
    section = text[text.index("## Package map") :]
    units = sorted({_unit(n) for n in MODULES if n not in ROOTS})
    missing = [u for u in units if f"`{u.removeprefix('grpokit.')}" not in section]
    assert missing == []
