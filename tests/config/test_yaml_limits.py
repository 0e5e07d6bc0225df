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


@pytest.mark.parametrize("opening", ["[", "{a: "])
def test_deep_nesting_is_one_line_not_a_recursion_error(opening):
    closing = "]" if opening == "[" else "}"
    text = "model_init_kwargs: " + opening * 500 + "1" + closing * 500 + "\n"  # about 1.5 KB
    with pytest.raises(ConfigError) as info:
        yaml_io.load_yaml_text(text, "deep.yaml")
    (problem,) = info.value.problems
    assert problem.line() == "config: deep.yaml:1: nested more than 64 levels deep; flatten it"


def test_nesting_up_to_the_limit_is_read():
    # the top-level mapping is level 1, so 63 lists inside it make 64 levels: read; one more is refused
    data, _ = yaml_io.load_yaml_text("x: " + "[" * 63 + "]" * 63 + "\n", "ok.yaml")
    inner = data["x"]
    for _ in range(62):
        (inner,) = inner
    assert inner == []
    with pytest.raises(ConfigError):
        yaml_io.load_yaml_text("x: " + "[" * 64 + "]" * 64 + "\n", "deep.yaml")


def test_deep_block_mapping_in_config_validate(tmp_path, capsys):
    from grpokit.cli import main

    path = tmp_path / "deep.yaml"
    path.write_text("model_init_kwargs:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 400)))
    assert main(["config", "validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: config: {path}:65: nested more than 64 levels deep; flatten it"]
