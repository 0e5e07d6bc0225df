"""A hostile YAML file cannot stall a check: alias expansion and size are bounded, in well under a second."""

import time

import pytest

from grpokit.config import yaml_io
from grpokit.config.rules import ConfigError


def laughs(depth: int, width: int = 9) -> str:
    """The "billion laughs" pattern inside model_init_kwargs: level k repeats level k-1 `width` times."""
    lines = ["model_init_kwargs:", '  l0: &l0 "lol"']
    for k in range(1, depth + 1):
        lines.append(f"  l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_at_once():
    text = laughs(9)  # 9**9 = 387,420,489 strings once expanded, from under 600 bytes
    assert len(text) < 600
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        yaml_io.load_yaml_text(text, "bad.yaml")
    assert time.perf_counter() - start < 1.0
    (problem,) = info.value.problems
    assert problem.line() == (
        "config: bad.yaml: with its aliases expanded the document holds more than 200,000 values; write the values "
        "out instead"
    )


def test_a_few_aliases_are_fine():
    # depth 3 expands to about a thousand values: far under the limit, and built as written
    data, _ = yaml_io.load_yaml_text(laughs(3), "ok.yaml")
    assert data["model_init_kwargs"]["l2"] == [["lol"] * 9] * 9
    assert len(data["model_init_kwargs"]["l3"]) == 9


def test_expanded_size_counts_each_alias_again():
    import yaml

    node = yaml.compose("a: &x [1, 2]\nb: *x\nc: [*x, *x]\n")
    # mapping 1 + keys 3 + a: (1 + 2) + b: (1 + 2) + c: 1 + 2 * 3 = 17
    assert yaml_io._expanded_size(node, {}, 100) == 17
    with pytest.raises(ValueError):
        yaml_io._expanded_size(node, {}, 16)


def test_recursive_alias_is_refused():
    with pytest.raises(ConfigError) as info:
        yaml_io.load_yaml_text("a: &x [1, *x]\n", "loop.yaml")
    assert "refers to the value that contains it" in info.value.problems[0].line()


def test_oversized_file_is_refused():
    with pytest.raises(ConfigError) as info:
        yaml_io.load_yaml_text("beta: 0.1\n" + "#" * yaml_io.MAX_BYTES, "big.yaml")
    assert "more than a config file may hold" in info.value.problems[0].line()
