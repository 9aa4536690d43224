"""YAML from users, read safely: no alias bombs, no silently dropped duplicate keys.

``yaml.safe_load`` builds no objects of the file's choosing, but it still (a) expands aliases:
nine levels of ``&a [*a, *a, ...]`` describe 10^9 entries in a few hundred bytes and every walk
over the result (validation, ``${VAR}`` expansion, merging) hangs (six levels: 42 s, 284 MB), and
(b) keeps the last of two equal keys, so a second ``datasets:`` silently replaces the first.

:func:`load_yaml` composes the node graph first (cheap: an alias is a shared node) and refuses, in
one line naming the file and the line, a document with more than :data:`MAX_ALIASES` aliases,
whose expansion would exceed :data:`MAX_NODES` nodes, whose aliases form a cycle, or with a key
given twice in one mapping (at any depth; ``<<`` merge keys are YAML's own override and allowed).
Anchors used a few times, as people write them, still work.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_ALIASES = 64
"""Most aliases (``*name``) one document may use."""
MAX_NODES = 200_000
"""Most nodes (scalars, lists, mappings) a document may hold with every alias expanded."""

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlRefused(ValueError):
    """A YAML file refused before it is built: an alias bomb or a key given twice."""


class _CountingLoader(yaml.SafeLoader):
    """A SafeLoader that stops composing at the ``MAX_ALIASES + 1``-th alias."""

    def __init__(self, stream: str | bytes | IO[Any], where: str) -> None:
        super().__init__(stream)
        self.where = where
        self.n_aliases = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self.n_aliases += 1
            if self.n_aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise YamlRefused(f"{self.where}, line {mark.line + 1}: more than {MAX_ALIASES} aliases (*name); "
                                  "write the values out instead")
        return super().compose_node(parent, index)  # type: ignore[no-any-return]


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _check(root: Node, where: str) -> None:
    """Duplicate keys, alias cycles and the expanded size, each node visited once (iteratively)."""
    size: dict[int, int] = {}
    state: dict[int, int] = {}  # 1: on the path being walked, 2: done
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        nid = id(node)
        if children_done:
            kids = _children(node)
            total = 1 + sum(size[id(k)] for k in kids)
            if total > MAX_NODES:
                raise YamlRefused(f"{where}, line {_line(node)}: the aliases expand to more than {MAX_NODES:,} "
                                  "values (an alias bomb?); write the values out instead")
            size[nid] = total
            state[nid] = 2
            continue
        if state.get(nid) == 2:
            continue
        if state.get(nid) == 1:
            raise YamlRefused(f"{where}, line {_line(node)}: an alias refers to a value that contains it (a cycle)")
        state[nid] = 1
        if isinstance(node, MappingNode):
            _check_duplicates(node, where)
        stack.append((node, True))
        for kid in _children(node):
            if state.get(id(kid)) == 1:
                raise YamlRefused(f"{where}, line {_line(kid)}: an alias refers to a value that contains it "
                                  "(a cycle)")
            if state.get(id(kid)) != 2:
                stack.append((kid, False))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_duplicates(node: MappingNode, where: str) -> None:
    seen: dict[tuple[str, str], int] = {}
    for key, _ in node.value:
        if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
            continue
        ident = (key.tag, key.value)
        if ident in seen:
            raise YamlRefused(f"{where}, line {_line(key)}: key {key.value!r} is given twice in one mapping "
                              f"(first at line {seen[ident]}); the first would be silently dropped: keep one")
        seen[ident] = _line(key)


def load_yaml(source: str | bytes | IO[Any], where: str | Path = "<yaml>") -> Any:
    """The first document of ``source`` (text, bytes or an open file), read with ``yaml.SafeLoader``
    after the checks of the module docstring; :class:`YamlRefused` (a ``ValueError``, one line
    naming ``where`` and the line) when one fails. Syntax errors stay ``yaml.YAMLError``."""
    loader = _CountingLoader(source, str(where))
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check(node, str(where))
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml_file(path: str | Path) -> Any:
    """:func:`load_yaml` of a file (UTF-8)."""
    p = Path(path)
    with p.open(encoding="utf-8") as fh:
        return load_yaml(fh, p)
