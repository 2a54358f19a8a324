"""Bad input never produces a traceback: random bytes and mutated specs end in diagnostics, or a clean result."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.render import render_files
from provisioner.spec import load_text

BASE = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "h100-ndr-8node.yaml").read_text())

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


def check(text: str) -> None:
    res = load_text(text, "fuzz.yaml")
    for d in res.diagnostics:
        line = d.format()
        assert line.startswith("fuzz.yaml:") and "\n" not in line
        assert d.line >= 1 and d.col >= 1
    if res.cluster is not None and not res.errors:
        render_files(res.cluster)


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
