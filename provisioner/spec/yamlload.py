"""YAML loading that remembers where every key and value stood.

The spec is plain YAML, but every error we print must name the file, line and column, and duplicate keys
(silently merged by PyYAML) must be errors. We compose the node graph ourselves and build plain Python data
alongside a map from the data path (a tuple of keys and list indexes) to the source position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Mark:
    """A 1-based line and column in a file."""

    line: int
    col: int


@dataclass
class Located:
    """Plain data plus where each path of it came from."""

    data: Any
    file: str
    marks: dict[Path, Mark] = field(default_factory=dict)
    key_marks: dict[Path, Mark] = field(default_factory=dict)

    def mark(self, path: Path, *, key: bool = False) -> Mark:
        """The position of `path`, or of its nearest ancestor that has one."""
        table = self.key_marks if key else self.marks
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if key and p in self.marks:
                return self.marks[p]
            p = p[:-1]
        return self.marks.get((), Mark(1, 1))


@dataclass(frozen=True)
class YamlProblem:
    """A problem found while reading YAML: syntax, duplicate key, non-string key."""

    rule: str
    mark: Mark
    message: str
    hint: str


# libyaml's parser when present (a 16,384-node spec parses in a fraction of a second instead of seconds); its nodes
# carry the same marks and its errors are the same MarkedYAMLError/ReaderError classes as PyYAML's own parser.
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):  # type: ignore[misc]
    """SafeLoader whose plain scalars keep YAML 1.2-ish meaning for the spec (no sexagesimal, no yes/no)."""


# YAML 1.1 reads `on`, `yes`, `no` as booleans and 22:04 as a number; a spec is clearer with only true/false.
_REPLACED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag not in _REPLACED]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0x[0-9a-fA-F]+|0o[0-7]+)$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+)$"),
    list("-+0123456789."))


def _mark(node: Node) -> Mark:
    return Mark(node.start_mark.line + 1, node.start_mark.column + 1)


def load_yaml(text: str, file: str) -> tuple[Located | None, list[YamlProblem]]:
    """Parse `text`; return the located data (None when unreadable) and every problem found."""
    problems: list[YamlProblem] = []
    try:
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        m = exc.problem_mark or exc.context_mark
        mark = Mark(m.line + 1, m.column + 1) if m else Mark(1, 1)
        what = exc.problem or exc.context or "invalid YAML"
        problems.append(YamlProblem("YAML-SYNTAX", mark, f"YAML syntax error: {what}",
                                    "fix the indentation or quoting at this position"))
        return None, problems
    except yaml.reader.ReaderError as exc:
        before = text[: exc.position]
        mark = Mark(before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1)
        char = chr(exc.character) if isinstance(exc.character, int) else exc.character  # libyaml gives the code
        problems.append(YamlProblem("YAML-SYNTAX", mark, f"character {char!r} is not allowed in YAML",
                                    "remove it (binary data or a wrong encoding?)"))
        return None, problems
    except yaml.YAMLError as exc:
        what = " ".join(str(exc).split())
        problems.append(YamlProblem("YAML-SYNTAX", Mark(1, 1), f"YAML error: {what}", "check the file is YAML"))
        return None, problems
    if root is None:
        problems.append(YamlProblem("YAML-EMPTY", Mark(1, 1), "the file is empty",
                                    "start from one of the files in examples/"))
        return None, problems

    located = Located(data=None, file=file)
    constructor = _Loader("")

    def build(node: Node, path: Path) -> Any:
        located.marks[path] = _mark(node)
        if isinstance(node, MappingNode):
            constructor.flatten_mapping(node)
            out: dict[str, Any] = {}
            for knode, vnode in node.value:
                if not isinstance(knode, ScalarNode):
                    problems.append(YamlProblem("YAML-KEY", _mark(knode), "a mapping key must be a plain name",
                                                "use a string key"))
                    continue
                key = constructor.construct_object(knode)
                if not isinstance(key, str):
                    key = str(key)
                if key in out:
                    first = located.key_marks.get((*path, key), Mark(0, 0))
                    problems.append(YamlProblem(
                        "YAML-DUPLICATE-KEY", _mark(knode),
                        f"duplicate key '{key}' (first at line {first.line})",
                        "remove one of them: YAML would silently keep only the last"))
                    continue
                located.key_marks[(*path, key)] = _mark(knode)
                out[key] = build(vnode, (*path, key))
            return out
        if isinstance(node, SequenceNode):
            return [build(item, (*path, i)) for i, item in enumerate(node.value)]
        if node.tag == "tag:yaml.org,2002:str":  # what construct_yaml_str returns, without its call chain
            return node.value
        try:
            return constructor.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            problems.append(YamlProblem("YAML-VALUE", _mark(node), f"cannot read value: {exc.problem}",
                                        "quote the value"))
            return None

    try:
        located.data = build(root, ())
    except RecursionError:
        problems.append(YamlProblem("YAML-DEPTH", Mark(1, 1), "the document nests too deeply", "flatten it"))
        return None, problems
    return located, problems
