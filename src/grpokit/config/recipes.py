"""Named recipes: YAML presets shipped with the package, one per paper. Each file's header cites its source."""

from __future__ import annotations

from importlib import resources

from .rules import ConfigError, Problem
from .suggest import closest


def recipe_names() -> list[str]:
    return sorted(
        p.name[: -len(".yaml")]
        for p in resources.files(__package__).joinpath("recipes").iterdir()
        if p.name.endswith(".yaml")
    )


def recipe_text(name: str) -> str:
    if name not in recipe_names():
        near = closest(name, recipe_names())
        hint = f"did you mean {near!r}?" if near else "available: " + ", ".join(recipe_names())
        raise ConfigError([Problem("recipe", "unknown recipe", name, hint)])
    return resources.files(__package__).joinpath("recipes", f"{name}.yaml").read_text(encoding="utf-8")


def recipe_summary(name: str) -> str:
    """The first sentence of a recipe's header comment, its paper: the comment lines up to the first that ends with a
    full stop (a citation may take two lines)."""
    words = []
    for line in recipe_text(name).splitlines():
        if not line.startswith("#"):
            break
        words.append(line.lstrip("# ").strip())
        if words[-1].endswith("."):
            break
    return " ".join(words)


def load_recipe(name: str) -> dict:
    from .yaml_io import load_yaml_text

    data, _ = load_yaml_text(recipe_text(name), f"recipe:{name}")
    return data
