"""YAML loading that remembers where every key and value stood.

The spec is plain YAML, but every error we print must name the file, line and column, and duplicate keys
(silently merged by PyYAML) must be errors. We compose the node graph ourselves and build plain Python data
alongside a map from the data path (a tuple of keys and list indexes) to the source position.

A spec is input from people and scripts, so reading it is bounded: nesting depth (the composer recurses),
the number of values built, how much an alias may expand (a few hundred bytes of nested aliases would
otherwise build gigabytes), and the digits of a number. Each limit is a located problem, never an exception.
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


MAX_DEPTH = 64
"""Nesting levels of collections; a real spec needs fewer than ten."""
MAX_VALUES = 500_000
"""Values (scalars and collections) built from one document, aliases expanded."""
MAX_ALIAS_USES = 10_000
MAX_ALIAS_VALUES = 100_000
"""Values built through aliases, all together: what keeps an alias bomb to a few milliseconds."""
MAX_SCALAR_CHARS = 32 * 1024 * 1024
"""Characters of all scalars built, aliases expanded (a 16 MiB file read once is half of it)."""
MAX_NUMBER_CHARS = 40
"""A number longer than this is no port, size or key (a 64-bit integer has at most 20 digits)."""



class _TooDeep(yaml.MarkedYAMLError):
    """The document nests collections deeper than MAX_DEPTH."""


# libyaml's parser when present (a 16,384-node spec parses in a fraction of a second instead of seconds); its nodes
# carry the same marks and its errors are the same MarkedYAMLError/ReaderError classes as PyYAML's own parser.
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_SafeLoader):  # type: ignore[misc]
    """SafeLoader whose plain scalars keep YAML 1.2-ish meaning for the spec (no sexagesimal, no yes/no)."""


def check_depth(text: str) -> None:
    """Raise _TooDeep at the collection that opens level MAX_DEPTH + 1.

    The composers (libyaml's and PyYAML's) recurse once per nesting level, so an unbounded document would
    exhaust the stack; the parser's events come one at a time, so counting them here is safe at any depth
    (and about a third of the cost of composing)."""
    loader = _Loader(text)
    try:
        depth = 0
        while (event := loader.get_event()) is not None:
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _TooDeep(None, None, f"the document nests more than {MAX_DEPTH} levels deep",
                                   event.start_mark)  # type: ignore[arg-type]
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    finally:
        loader.dispose()


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


def _syntax_problem(exc: yaml.MarkedYAMLError, text: str, open_marks: list[Any]) -> YamlProblem:
    """A syntax error at the position a person has to look at.

    PyYAML names where it gave up (problem_mark) and, for many errors, where the construct it was reading
    began (context_mark). An unclosed bracket or quote is only noticed at the end of the file, so there the
    construct's start is what matters; inside a block mapping the start is the top of the mapping, and the
    place it gave up is what matters."""
    problem = exc.problem or "invalid YAML"
    pm, cm = exc.problem_mark, exc.context_mark
    hint = "fix the indentation or quoting at this position"
    if pm is not None and not text[pm.index:].strip():  # the parser reached the end of the file
        flows = [m for m in open_marks if m is not None and 0 <= m.index < len(text) and text[m.index] in "[{"]
        if flows:
            m = flows[-1]
            return YamlProblem("YAML-SYNTAX", Mark(m.line + 1, m.column + 1),
                               f"YAML syntax error: '{text[m.index]}' opened here is never closed "
                               f"(the parser reached the end of the file at line {pm.line + 1})",
                               f"close it with '{']' if text[m.index] == '[' else '}'}'")
    if cm is not None and exc.context and not exc.context.startswith("while parsing a block"):
        where = f" at line {pm.line + 1}" if pm is not None and pm.line != cm.line else ""
        return YamlProblem("YAML-SYNTAX", Mark(cm.line + 1, cm.column + 1),
                           f"YAML syntax error {exc.context} starting here: {problem}{where}", hint)
    m = pm or cm
    if m is None:
        return YamlProblem("YAML-SYNTAX", Mark(1, 1), f"YAML syntax error: {problem}", hint)
    mark = Mark(m.line + 1, m.column + 1)
    started = (f" ({exc.context.removeprefix('while parsing ')} started at line {cm.line + 1})"
               if cm is not None and exc.context and m is not cm and cm.line != m.line else "")
    return YamlProblem("YAML-SYNTAX", mark, f"YAML syntax error: {problem}{started}", hint)


class _Limit(Exception):
    """A bound of reading was exceeded at `path` (a problem is recorded; the data is dropped)."""

    def __init__(self, path: Path, rule: str, message: str, hint: str) -> None:
        super().__init__(message)
        self.path, self.rule, self.message, self.hint = path, rule, message, hint


def _explained_syntax_error(exc: yaml.MarkedYAMLError, text: str) -> YamlProblem:
    """The syntax error as PyYAML's own parser words and places it, with the collections still open there.

    libyaml finds the error first (the fast path); PyYAML's parser then reads the events up to the same error,
    one at a time (no recursion: the depth pass has already bounded the nesting before it), and keeps the marks
    of the collections it has open, which name where an unclosed bracket began."""
    parser = yaml.SafeLoader(text)
    try:
        while parser.get_event() is not None:  # type: ignore[no-untyped-call]
            pass
    except yaml.MarkedYAMLError as again:
        return _syntax_problem(again, text, list(getattr(parser, "marks", None) or []))
    except yaml.YAMLError:
        pass
    finally:
        parser.dispose()
    return _syntax_problem(exc, text, [])


def load_yaml(text: str, file: str) -> tuple[Located | None, list[YamlProblem]]:
    """Parse `text`; return the located data (None when unreadable) and every problem found."""
    root, problem = _compose(text)
    if problem is not None:
        return None, [problem]
    if root is None:
        return None, [YamlProblem("YAML-EMPTY", Mark(1, 1), "the file is empty",
                                  "start from one of the files in examples/")]
    builder = _Builder(file)
    try:
        builder.located.data = builder.build(root, ())
    except _Limit as exc:
        # an alias node carries the anchor's position: name the key that holds the use instead
        located = builder.located
        keyed = next((exc.path[:i] for i in range(len(exc.path), 0, -1) if exc.path[:i] in located.key_marks), ())
        mark = located.key_marks[keyed] if keyed else located.mark(exc.path)
        builder.problems.append(YamlProblem(exc.rule, mark, exc.message, exc.hint))
        return None, builder.problems
    return builder.located, builder.problems


def _compose(text: str) -> tuple[Node | None, YamlProblem | None]:
    """The document's node tree (None for an empty file), or the one problem that stops reading it."""
    loader: _Loader | None = None
    try:
        check_depth(text)
        loader = _Loader(text)
        return loader.get_single_node(), None
    except _TooDeep as exc:
        m = exc.problem_mark
        mark = Mark(m.line + 1, m.column + 1) if m else Mark(1, 1)
        return None, YamlProblem("YAML-DEPTH", mark, exc.problem or "the document nests too deeply",
                                 "flatten it: a cluster spec needs only a few levels")
    except yaml.MarkedYAMLError as exc:
        return None, _explained_syntax_error(exc, text)
    except yaml.reader.ReaderError as exc:
        before = text[: exc.position]
        mark = Mark(before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1)
        char = chr(exc.character) if isinstance(exc.character, int) else exc.character  # libyaml gives the code
        return None, YamlProblem("YAML-SYNTAX", mark, f"character {char!r} is not allowed in YAML",
                                 "remove it (binary data or a wrong encoding?)")
    except yaml.YAMLError as exc:
        what = " ".join(str(exc).split())
        return None, YamlProblem("YAML-SYNTAX", Mark(1, 1), f"YAML error: {what}", "check the file is YAML")
    finally:
        if loader is not None:
            loader.dispose()


class _Builder:
    """Builds the located data from the node tree, counting what aliases expand to against the limits."""

    def __init__(self, file: str) -> None:
        self.located = Located(data=None, file=file)
        self.problems: list[YamlProblem] = []
        self.constructor = _Loader("")
        self.counts = {"values": 0, "alias_uses": 0, "alias_values": 0, "chars": 0}
        self.seen: set[int] = set()      # nodes built once: meeting one again is an alias (or merge key) expanding
        self.building: set[int] = set()  # nodes on the current path: meeting one of them is a recursive alias
        self.alias_depth = 0
        self.alias_at: Path = ()         # where the outermost alias being expanded is used (its key is reported)

    def count(self, node: Node, path: Path) -> None:
        counts = self.counts
        counts["values"] += 1
        if self.alias_depth:
            counts["alias_values"] += 1
        if isinstance(node, ScalarNode):
            counts["chars"] += len(node.value)
        if counts["values"] > MAX_VALUES:
            raise _Limit(path, "YAML-SIZE", f"the document holds more than {MAX_VALUES} values",
                         "a cluster spec is far smaller: use hostlist ranges (gpu[001-128])")
        hint = "write the values out; a spec needs few aliases"
        if counts["alias_uses"] > MAX_ALIAS_USES:
            raise _Limit(self.alias_at, "YAML-ALIAS", f"more than {MAX_ALIAS_USES} aliases are expanded", hint)
        if counts["alias_values"] > MAX_ALIAS_VALUES:
            raise _Limit(self.alias_at, "YAML-ALIAS", f"aliases expand to more than {MAX_ALIAS_VALUES} values", hint)
        if counts["chars"] > MAX_SCALAR_CHARS:
            raise _Limit(self.alias_at or path, "YAML-ALIAS",
                         f"the values built exceed {MAX_SCALAR_CHARS} characters",
                         "aliases of long strings expand each time they are used")

    def build(self, node: Node, path: Path) -> Any:
        if id(node) in self.building:
            raise _Limit(path, "YAML-ALIAS", "an alias refers to a collection that contains it",
                         "a recursive structure cannot be a spec value")
        reused = id(node) in self.seen
        if reused:
            self.counts["alias_uses"] += 1
            if self.alias_depth == 0:
                self.alias_at = path
            self.alias_depth += 1
        self.seen.add(id(node))
        self.building.add(id(node))
        try:
            self.count(node, path)
            return self.build_node(node, path)
        finally:
            self.building.discard(id(node))
            if reused:
                self.alias_depth -= 1

    def build_node(self, node: Node, path: Path) -> Any:
        self.located.marks[path] = _mark(node)
        if isinstance(node, MappingNode):
            return self.mapping(node, path)
        if isinstance(node, SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self.scalar(node)

    def mapping(self, node: MappingNode, path: Path) -> dict[str, Any]:
        try:
            self.constructor.flatten_mapping(node)
        except yaml.MarkedYAMLError as exc:
            self.problems.append(YamlProblem("YAML-VALUE", _mark(node), f"cannot merge: {exc.problem}",
                                             "'<<' takes a mapping or a list of mappings"))
            return {}
        out: dict[str, Any] = {}
        for knode, vnode in node.value:
            if not isinstance(knode, ScalarNode):
                self.problems.append(YamlProblem("YAML-KEY", _mark(knode), "a mapping key must be a plain name",
                                                 "use a string key"))
                continue
            key = self.scalar(knode)
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                first = self.located.key_marks.get((*path, key), Mark(0, 0))
                self.problems.append(YamlProblem(
                    "YAML-DUPLICATE-KEY", _mark(knode),
                    f"duplicate key '{key}' (first at line {first.line})",
                    "remove one of them: YAML would silently keep only the last"))
                continue
            self.located.key_marks[(*path, key)] = _mark(knode)
            out[key] = self.build(vnode, (*path, key))
        return out

    def scalar(self, node: Node) -> Any:
        if node.tag == "tag:yaml.org,2002:str":  # what construct_yaml_str returns, without its call chain
            return node.value
        if node.tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float") and len(node.value) > MAX_NUMBER_CHARS:
            self.problems.append(YamlProblem("YAML-VALUE", _mark(node),
                                             f"a number of {len(node.value)} characters is too large",
                                             "quote it if it is text"))
            return None
        try:
            return self.constructor.construct_object(node, deep=True)
        except Exception as exc:
            what = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else f"{type(exc).__name__}: {exc}"
            self.problems.append(YamlProblem("YAML-VALUE", _mark(node), f"cannot read value: {what}",
                                             "quote the value"))
            return None
