"""Reading a spec is bounded (issue #16, item 2): alias bombs, nesting, numbers, file type and size."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from provisioner.errors import UsageError
from provisioner.spec import load_text
from provisioner.spec.load import MAX_SPEC_BYTES, load_spec, read_spec_text
from provisioner.spec.yamlload import MAX_DEPTH, load_yaml

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "examples" / "h100-ndr-8node.yaml"

# The classic "billion laughs": nine levels of nine aliases, 9**9 strings once expanded (about 350 bytes).
BOMB = "\n".join(
    ["cluster: {name: x, os: debian-12}", 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
) + "\n"


def rules(text: str) -> list[tuple[int, str]]:
    return [(d.line, d.rule) for d in load_text(text, "c.yaml").diagnostics]


def test_alias_bomb_is_refused_quickly() -> None:
    assert len(BOMB) < 400
    started = time.monotonic()
    res = load_text(BOMB, "bomb.yaml")
    took = time.monotonic() - started
    assert res.cluster is None
    [d] = res.errors
    assert d.rule == "YAML-ALIAS" and d.file == "bomb.yaml" and 2 <= d.line <= 10, d.format()
    assert took < 10, f"{took:.1f} s"  # the unbounded loader took 51 s and 3.7 GB on this document


def test_recursive_alias_is_an_error_not_a_recursion() -> None:
    found = rules("cluster: {name: x, os: debian-12}\na: &a [1, *a]\n")
    assert (2, "YAML-ALIAS") in found, found


def test_a_few_aliases_still_work() -> None:
    text = H100.read_text().replace("  hgx-h100:\n", "  hgx-h100: &hgx\n").replace(
        "  mgmt:\n    hcas:\n      - {device: mlx5_0, rate: NDR, netdev: ibp12s0}\n    management_interface: eno1\n",
        "  mgmt: *hgx\n")
    assert "*hgx" in text
    res = load_text(text, "c.yaml")
    assert not res.errors, [d.format() for d in res.errors]


def test_merge_of_a_scalar_is_a_located_error() -> None:
    assert (2, "YAML-VALUE") in rules("cluster: {name: x, os: debian-12}\nssh: {<<: 1}\n")


def test_deep_nesting_is_located() -> None:
    deep = "cluster: {name: x, os: debian-12}\nnodes:\n" + "".join("  " * i + "- \n" for i in range(1, 400))
    located, problems = load_yaml(deep, "d.yaml")
    assert located is None
    [p] = problems
    assert p.rule == "YAML-DEPTH" and p.mark.line == MAX_DEPTH + 2, p  # line 3 holds level 2
    flow = "a: " + "{b: " * 5000 + "1" + "}" * 5000 + "\n"
    [p] = load_yaml(flow, "d.yaml")[1]
    assert p.rule == "YAML-DEPTH" and p.mark.line == 1


@pytest.mark.parametrize("number", ["9" * 5000, "0x" + "f" * 200000, "1" * 41, "-" + "1" * 4400],
                         ids=["5000-digits", "hex", "41-digits", "negative"])
def test_huge_numbers_are_located(number: str) -> None:
    text = H100.read_text().replace("uplinks: 32", f"uplinks: {number}")
    found = load_text(text, "c.yaml").diagnostics
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if number in ln)
    on_line = [d.rule for d in found if d.line == line]
    assert on_line == ["YAML-VALUE"], [d.format()[:120] for d in found]


def test_ordinary_numbers_still_read() -> None:
    text = H100.read_text().replace("message_size: 1048576", "message_size: 1048576").replace(
        "bandwidth: {min_fraction: 0.9, mode: quick}", "bandwidth: {min_fraction: 0.9, mode: quick, "
        "message_size: 1073741824}")
    res = load_text(text, "c.yaml")
    assert not res.errors and res.cluster is not None
    assert res.cluster.spec.verify.bandwidth.message_size == 1 << 30


def test_fifo_is_refused_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        read_spec_text(fifo)  # the old reader blocked here for ever (no writer)


def test_device_is_refused() -> None:
    with pytest.raises(UsageError, match="not a regular file"):
        read_spec_text("/dev/zero")  # the old reader read until memory ran out


def test_size_is_checked_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:  # sparse: nothing is written, the size says 64 GiB (the old reader read it all)
        fh.truncate(1 << 36)
    with pytest.raises(UsageError, match="too large"):
        read_spec_text(big)
    assert MAX_SPEC_BYTES < 1 << 36


def test_overlay_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "overlay.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="not a regular file"):
        load_spec(H100, fifo)
