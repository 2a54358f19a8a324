"""Bad input never produces a traceback: validate, render, --limit and parse, fuzzed (about 2,500 cases).

Random bytes, YAML-shaped noise, mutated specs, hostile YAML (aliases, nesting, long numbers, tags), junk
overlays, --limit patterns and mutated real tool outputs each end in located diagnostics, a clean result or
the one documented exception. What validates must render, and the rendered inventory must be YAML whose every
string is Ansible-unsafe. Bounded for CI: well under a minute on two busy cores.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.errors import ParseError, UsageError
from provisioner.hostpattern import select_hosts
from provisioner.parsers import PARSERS, parse
from provisioner.render import render_files
from provisioner.render.model import build_inventory
from provisioner.spec import load_cluster, load_text
from tests.unit._parser_fixtures import all_fixtures, load

ROOT = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((ROOT / "examples" / "h100-ndr-8node.yaml").read_text())
LAB_TEXT = (ROOT / "examples" / "lab" / "cluster.yaml").read_text()

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**40), max_value=2**40), st.floats(allow_nan=True),
    st.text(max_size=30), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                                               max_size=2),
    st.sampled_from(["gpu[01-", "mlx5_[9-1]", "0x8001", "NDR", "../../etc/passwd", "a;b", "$(reboot)", "", "ä"]),
)


def paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(data, dict):
        for k, v in data.items():
            out.extend(paths(v, (*prefix, k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.extend(paths(v, (*prefix, i)))
    return out


ALL_PATHS = [p for p in paths(BASE) if p]


def mutate(data: Any, path: tuple[Any, ...], action: str, value: Any) -> Any:
    doc = copy.deepcopy(data)
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "rename" and isinstance(parent, dict):
        parent[f"{last}x"] = parent.pop(last)
    else:
        parent[last] = value
    return doc


class _TagLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Reads a rendered file, keeping Ansible's !unsafe strings apart from plain ones."""


_TagLoader.add_constructor("!unsafe", lambda loader, node: ("!unsafe", loader.construct_scalar(node)))


def _plain_strings(data: Any) -> list[str]:
    if isinstance(data, dict):
        return [x for v in data.values() for x in _plain_strings(v)]
    if isinstance(data, list):
        return [x for v in data for x in _plain_strings(v)]
    # a string YAML would read as a number or boolean when plain ('550', '0x0001') is written quoted without the
    # tag: it has no character a template starts with, and ansible-core would turn `!unsafe '550'` into 550
    plain_text = isinstance(data, str) and yaml.resolver.Resolver().resolve(
        yaml.ScalarNode, data, (True, False)) == "tag:yaml.org,2002:str"
    return [data] if plain_text else []


def check_render(cluster: Any) -> None:
    for rel, text in render_files(cluster).items():
        data = yaml.load(text, Loader=_TagLoader)
        if rel != "hosts.yml":
            assert _plain_strings(data) == [], rel


def check(text: str, overlay: Any = None, files: tuple[str, ...] = ("fuzz.yaml",)) -> None:
    res = load_text(text, "fuzz.yaml", overlay)
    for d in res.diagnostics:
        line = d.format()
        assert line.startswith(tuple(f"{f}:" for f in files)) and "\n" not in line
        assert d.line >= 1 and d.col >= 1
    if res.cluster is not None and not res.errors:
        check_render(res.cluster)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL_PATHS), st.sampled_from(["set", "delete", "rename"]), JUNK)
def test_mutated_specs_give_clean_diagnostics(path: tuple[Any, ...], action: str, value: Any) -> None:
    doc = mutate(BASE, path, action, value)
    check(yaml.safe_dump(doc, allow_unicode=True))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes(data: bytes) -> None:
    check(data.decode("utf-8", errors="replace"))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab:-[]{},\n #'\"&*!|>%@`0x1")), max_size=200))
def test_yaml_shaped_noise(text: str) -> None:
    check(text)


# --- hostile YAML: aliases, nesting, long numbers, tags -----------------------------------------------------------
def _bomb(levels: int, fan: int, leaf: str) -> str:
    lines = [f"a0: &a0 [{', '.join([repr(leaf)] * fan)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


HOSTILE = st.one_of(
    st.builds(_bomb, st.integers(1, 12), st.integers(1, 12), st.text(max_size=20)),
    st.builds(lambda d, o, c: "x: " + o * d + "1" + c * d + "\n", st.integers(1, 3000),
              st.sampled_from(["[", "{a: "]), st.sampled_from(["]", "}"])),
    st.builds(lambda d: "".join("  " * i + "- \n" for i in range(d)), st.integers(1, 300)),
    st.builds(lambda sign, n, base: f"x: {sign}{base}{'7' * n}\n", st.sampled_from(["", "-", "+"]),
              st.integers(1, 6000), st.sampled_from(["", "0x", "0o"])),
    st.builds(lambda tag, v: f"x: {tag} {v}\n", st.sampled_from(["!!python/object:os.system", "!!binary",
                                                                 "!!timestamp", "!!set", "!foo", "!!str", "!!int",
                                                                 "!!float", "!!merge", "!unsafe"]),
              st.sampled_from(["1", "abc", "{a: 1}", "[1]", "''", "2001-12-14", "=", "~"])),
    st.builds(lambda v: f"base: &b {v}\nx:\n  <<: *b\n  y: 1\n", st.sampled_from(["1", "[1, 2]", "{a: 1}",
                                                                                    "[{a: 1}, 2]", "null"])),
    st.builds(lambda n: "a: &a [*a]\n" if n % 2 else "a: &a {b: *a}\n", st.integers(0, 1)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HOSTILE, st.booleans())
def test_hostile_yaml_is_bounded(text: str, in_a_spec: bool) -> None:
    check(LAB_TEXT + text.replace("x: ", "site_vars: ", 1) if in_a_spec else text)


# --- junk overlays merged onto the lab spec ---------------------------------------------------------------------
OVERLAY = st.dictionaries(
    st.sampled_from(["ssh", "site_vars", "addresses", "repositories", "cluster", "nodes", "bogus", "fabric"]),
    st.one_of(JUNK, st.dictionaries(st.sampled_from(["user", "port", "gpu01", "sm1", "nope", "ansible_host",
                                                     "preflight_gpu_evidence", "known_hosts", "offline"]),
                                    JUNK, max_size=3)),
    max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OVERLAY)
def test_junk_overlays_give_clean_diagnostics(overlay: dict[str, Any]) -> None:
    check(LAB_TEXT, overlay, files=("fuzz.yaml", "<overlay>"))


# --- --limit patterns ------------------------------------------------------------------------------------------
LAB_CLUSTER, _ = load_cluster(ROOT / "examples" / "lab" / "cluster.yaml")
LAB_HOSTS = [n.name for n in LAB_CLUSTER.nodes]
LAB_GROUPS = build_inventory(LAB_CLUSTER).groups
WORDS = [*LAB_HOSTS, *LAB_GROUPS, "all", "*", "gpu0*", "~sm.", "gpu[01-02]", "compute[0:1]", "compute[9]", "x",
         "gpu[", "~(", "", " "]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "!", "&"]), st.sampled_from(WORDS)), max_size=5),
       st.sampled_from([",", ":", ", "]))
def test_limit_patterns_select_known_hosts_or_say_why(terms: list[tuple[str, str]], sep: str) -> None:
    pattern = sep.join(op + word for op, word in terms)
    try:
        chosen = select_hosts(pattern, LAB_HOSTS, LAB_GROUPS)
    except UsageError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert chosen and set(chosen) <= set(LAB_HOSTS)
    assert chosen == [h for h in LAB_HOSTS if h in chosen]  # spec order


# --- parsers on mutated real outputs --------------------------------------------------------------------------
SAMPLES = [(tool, load(tool, name)) for tool, name in all_fixtures()]


def _mutate_text(text: str, ops: list[tuple[str, int, str]]) -> str:
    lines = text.splitlines()
    for op, at, junk in ops:
        if not lines:
            break
        i = at % len(lines)
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][: len(lines[i]) // 2]
        elif op == "junk":
            lines[i] = junk
        elif op == "digits":
            lines[i] = "".join(("9" * 30 if ch.isdigit() else ch) for ch in lines[i])
        elif op == "end":
            lines = lines[:i]
    return "\n".join(lines) + "\n"


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SAMPLES), st.sampled_from(sorted(PARSERS)),
       st.lists(st.tuples(st.sampled_from(["drop", "dup", "cut", "junk", "digits", "end"]), st.integers(0, 10 ** 6),
                          st.text(max_size=40)), min_size=1, max_size=4),
       st.booleans())
def test_parsers_on_mutated_outputs(sample: tuple[str, str], tool: str, ops: list[tuple[str, int, str]],
                                    own: bool) -> None:
    name, text = sample
    tool = name if own else tool
    try:
        out = parse(tool, _mutate_text(text, ops))
    except ParseError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert out["tool"] == tool and isinstance(out["warnings"], list)
