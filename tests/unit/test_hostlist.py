"""Hostlists are ClusterShell's NodeSet: the same expansion and folding as `nodeset -e` / `nodeset -f`."""

from __future__ import annotations

import pytest
from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet
from hypothesis import given
from hypothesis import strategies as st

from provisioner.spec import load_text
from provisioner.spec.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]),  # zero padding from the lower bound
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),  # several ranges in one group
        ("gpu[1-3,7]", ["gpu1", "gpu2", "gpu3", "gpu7"]),
        ("10.0.0.[11-13]", ["10.0.0.11", "10.0.0.12", "10.0.0.13"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),  # two dimensions, leftmost slowest
        ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("single", ["single"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("mlx5_[0-2]", ["mlx5_0", "mlx5_1", "mlx5_2"]),
        ("gpu[3,1]", ["gpu1", "gpu3"]),  # a set: sorted
        ("gpu[01-02,02]", ["gpu01", "gpu02"]),  # each name once
        ("login1,gpu[01-02]", ["gpu01", "gpu02", "login1"]),
        ("gpu[9,08]", ["gpu9", "gpu08"]),  # mixed padding: ClusterShell puts the unpadded numbers first
        ("[1-3]", ["1", "2", "3"]),
    ],
)
def test_expand(expr: str, want: list[str]) -> None:
    assert expand(expr) == want
    assert want == list(NodeSet(expr, resolver=RESOLVER_NOGROUP))  # what `nodeset -e` says


@pytest.mark.parametrize(
    "bad",
    ["", "  ", "gpu[", "gpu]", "gpu[3-1]", "gpu[a-b]", "gpu[]", "gpu[[1-2]]", "a,,b", ",a", "x[1-99999999]",
     "a[1-1000]b[1-1001]", "gpu[01-04]!gpu02", "@compute", "gpu01 gpu02", "gpu*", "a&b", "a^b"],
)
def test_expand_rejects(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand(bad)


@pytest.mark.parametrize(
    ("names", "folded"),
    [
        (["gpu03", "gpu07"], "gpu[03,07]"),  # the retry command the run summary prints: --limit gpu[03,07]
        ([f"gpu{i:03d}" for i in range(1, 129)], "gpu[001-128]"),
        (["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"], "gpu[01-04,07]"),
        (["r1n01", "r1n02", "r2n01", "r2n02"], "r[1-2]n[01-02]"),
        (["gpu1", "gpu01", "gpu002"], "gpu[1,01,002]"),  # mixed padding stays apart
        (["gpu9", "gpu10"], "gpu[9-10]"),
        (["gpu09", "gpu10"], "gpu[09-10]"),
        (["a", "n1", "n2", "n4"], "a,n[1-2,4]"),
        (["gpu07", "gpu03", "gpu03"], "gpu[03,07]"),
        (["mlx5_0", "mlx5_1"], "mlx5_[0-1]"),
        ([], ""),
    ],
)
def test_compress(names: list[str], folded: str) -> None:
    assert compress(names) == folded
    if names:
        assert folded == str(NodeSet.fromlist(names, resolver=RESOLVER_NOGROUP))  # what `nodeset -f` says


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("gpu[3,1]", "ascending"),
        ("gpu[01-02],gpu02", "more than once"),
        ("login1,gpu[01-02]", "write the items in that order"),
        ("gpu[08,9]", "ascending"),  # ClusterShell expands it as gpu9,gpu08
        ("10.0.0.[12,11]", "ascending"),
    ],
)
def test_ordered_refuses_what_would_not_pair_as_written(expr: str, why: str) -> None:
    expand(expr)  # a valid set
    with pytest.raises(HostlistError, match=why):
        expand(expr, ordered=True)


@pytest.mark.parametrize("expr", ["gpu[01-04,07]", "r[1-2]n[01-02]", "gpu[01-02],login1",
                                  "10.64.0.[11-210],10.64.1.[11-20]", "gpu[1-10/2]", "[1-16]",
                                  "gpu[9,08]", "gpu[00,10]", "n[8-12]"])
def test_ordered_accepts_what_pairs_as_written(expr: str) -> None:
    assert expand(expr, ordered=True) == expand(expr)


SPEC = """\
cluster: {name: t, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5"}
repositories: {offline: false}
profiles: {svc: {hcas: [{device: mlx5_0, rate: NDR}]}}
nodes:
  - {name: "NAMES", address: "ADDRS", profile: svc, roles: [subnet_manager]}
fabric: {rate: NDR, subnet_manager: {nodes: [{node: sm1, priority: 15}]}}
"""


def test_spec_pairs_names_and_addresses_in_clustershell_order() -> None:
    res = load_text(SPEC.replace("NAMES", "sm[1-2],x9").replace("ADDRS", "10.0.0.[2-3],10.0.0.9"), "c.yaml")
    assert not res.errors, [d.format() for d in res.errors]
    assert res.cluster is not None
    assert [(n.name, n.address) for n in res.cluster.nodes] == [("sm1", "10.0.0.2"), ("sm2", "10.0.0.3"),
                                                                 ("x9", "10.0.0.9")]


def test_spec_refuses_a_reordered_address_range_with_its_line() -> None:
    res = load_text(SPEC.replace("NAMES", "sm[1-2]").replace("ADDRS", "10.0.0.[3,2]"), "c.yaml")
    [d] = [d for d in res.errors if d.rule == "SPEC-HOSTLIST"]
    assert (d.line, "ascending" in d.message) == (6, True), d.format()


@given(
    st.lists(st.integers(min_value=0, max_value=999), min_size=1, max_size=40, unique=True),
    st.sampled_from(["gpu", "node-", "r1n"]),
    st.integers(min_value=1, max_value=4),
)
def test_compress_expand_roundtrip(nums: list[int], prefix: str, width: int) -> None:
    names = [f"{prefix}{str(n).zfill(width)}" for n in sorted(nums)]
    assert expand(compress(names)) == names
    assert expand(compress(names), ordered=True) == names
