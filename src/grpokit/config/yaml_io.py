"""Safe, strict YAML reading: duplicate keys, Python-object tags, non-mapping tops and syntax errors are errors
that name the file and line. Returns the data and the line of each top-level key (for provenance).

Bounded, so that a hostile file cannot stall a check: the text may hold at most `MAX_BYTES`, and the document, with
every alias (`*name`) expanded, at most `MAX_EXPANDED_NODES` values (a "billion laughs" file of a few hundred bytes
would expand to billions); both are measured before any value is built.
"""

from __future__ import annotations

import yaml

from .rules import ConfigError, Problem

MAX_BYTES = 4 * 1024 * 1024
MAX_EXPANDED_NODES = 200_000
# How deep mappings and lists may nest. A real config nests a few levels (a dataset mixture: 4); PyYAML composes
# nodes recursively, so a document of a few hundred `[` ends in a RecursionError instead of an answer.
MAX_DEPTH = 64


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys at any depth."""


_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue  # `<<: *anchor` merge keys are plain YAML; SafeLoader's construct_mapping merges them
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a plain value, not a {type(key).__name__}", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_file(path: str) -> tuple[dict, dict[str, int]]:
    """(top-level mapping, {key: 1-based line}) of a YAML config file, or raise ConfigError with one line."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError([Problem("config", f"cannot read {path}: {exc.strerror}", path)]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            [Problem("config", f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8")]
        ) from None
    return load_yaml_text(text, path)


def _expanded_size(node, memo: dict, limit: int) -> int:
    """How many values `node` stands for with every alias expanded (an alias counts its anchor's whole subtree again);
    raises ValueError above `limit` or for an alias inside its own anchor. Each distinct node is measured once."""
    key = id(node)
    if key in memo:
        if memo[key] is None:
            raise ValueError("an alias refers to the value that contains it (a recursive structure)")
        return memo[key]
    memo[key] = None  # being measured
    size = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    for child in children:
        size += _expanded_size(child, memo, limit)
        if size > limit:
            raise ValueError(f"with its aliases expanded the document holds more than {limit:,} values")
    memo[key] = size
    return size


def _check_depth(text: str, name: str) -> None:
    """Refuse a document nesting deeper than MAX_DEPTH, read from the parser's events (an iterative state machine,
    unlike the composer) before any node is built. Syntax errors are left to the full load, which places them."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1
                    raise ConfigError(
                        [Problem("config", f"{name}:{line}: nested more than {MAX_DEPTH} levels deep; flatten it")]
                    )
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        return


def load_yaml_text(text: str, name: str) -> tuple[dict, dict]:
    """(top-level mapping, {key: 1-based line}) of a YAML text; the keys of an `env:` mapping are there too, as
    ("env", KEY)."""
    if len(text) > MAX_BYTES:
        raise ConfigError(
            [Problem("config", f"{name}: {len(text):,} characters, more than a config file may hold ({MAX_BYTES:,})")]
        )
    _check_depth(text, name)
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            try:
                _expanded_size(node, {}, MAX_EXPANDED_NODES)
            except ValueError as exc:
                raise ConfigError([Problem("config", f"{name}: {exc}; write the values out instead")]) from None
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        what = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        start = exc.context_mark
        if exc.problem and exc.context and start is not None and mark is not None and start.line != mark.line:
            # e.g. an unclosed `[` or quote is only noticed lines later: say where it was opened too
            what += f" ({' '.join(str(exc.context).split())} that starts at line {start.line + 1})"
        if "could not determine a constructor for the tag" in what:
            tag = what.split("for the tag", 1)[1].strip()
            what = f"the tag {tag} would construct a Python object; only plain YAML values are read"
        raise ConfigError([Problem("config", f"{where}: {what}")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem("config", f"{name}: {' '.join(str(exc).split())}")]) from None
    finally:
        loader.dispose()
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(
            [
                Problem(
                    "config", f"{name}: the top level must be a mapping of field: value, not a {type(data).__name__}"
                )
            ]
        )
    # `node.value` now also holds the keys merged in by `<<:` (with the line of their anchor), before the file's own.
    lines = {key_node.value: key_node.start_mark.line + 1 for key_node, _ in node.value if key_node.tag == _STR_TAG}
    # The keys of an `env:` section, each credited to its own line: ("env", KEY) -> line.
    for key_node, value_node in node.value:
        if key_node.tag == _STR_TAG and key_node.value == "env" and isinstance(value_node, yaml.MappingNode):
            for env_key, _ in value_node.value:
                if env_key.tag == _STR_TAG:
                    lines[("env", env_key.value)] = env_key.start_mark.line + 1
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        line = next(k.start_mark.line + 1 for k, _ in node.value if k.tag not in (_STR_TAG, _MERGE_TAG))
        raise ConfigError([Problem("config", f"{name}:{line}: key {bad[0]!r} is not a string; quote it")])
    return data, lines
