"""Every shipped example validates, with exactly the warnings its header promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

EXPECTED_WARNINGS = {
    "a100-10gbe-2node.yaml": {"RAIL-PER-GPU"},
    "a100-hdr-4node.yaml": {"SM-SINGLE"},
    "h100-ndr-8node.yaml": set(),
    "h100-ndr-8node-2hca.yaml": {"RAIL-PER-GPU"},
    "h100-ndr-64node-3tier.yaml": set(),
    "roce-200g-4node.yaml": set(),
    "lab/cluster.yaml": set(),
}


def all_examples() -> list[Path]:
    return sorted(EXAMPLES.rglob("*.yaml"))


def test_every_example_is_listed() -> None:
    top = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml")}
    assert top == set(EXPECTED_WARNINGS)


@pytest.mark.parametrize("path", all_examples(), ids=lambda p: p.name)
def test_example_validates(path: Path) -> None:
    res = load_spec(path)
    assert res.errors == [], [d.format() for d in res.errors]
    assert res.cluster is not None
    assert {d.rule for d in res.warnings} == EXPECTED_WARNINGS[str(path.relative_to(EXAMPLES))]


def test_h100_expansion_details() -> None:
    res = load_spec(EXAMPLES / "h100-ndr-8node.yaml")
    c = res.cluster
    assert c is not None
    assert [n.name for n in c.nodes][:3] == ["gpu01", "gpu02", "gpu03"]
    gpu01 = c.node("gpu01")
    assert gpu01.address == "10.10.0.11"
    assert [p.device for p in gpu01.rail_ports] == [f"mlx5_{i}" for i in range(8)]
    assert [p.rail for p in gpu01.rail_ports] == list(range(8))
    assert [p.gpu for p in gpu01.rail_ports] == list(range(8))
    assert all(p.rate_gbps == 400 for p in gpu01.rail_ports)
    storage = [p for p in gpu01.ports if p.purpose == "storage"]
    assert storage[0].device == "mlx5_8" and storage[0].rate_gbps == 200 and storage[0].rail is None
    assert len(c.cables) == 8 * 8 + 2
    assert c.rails() == list(range(8))


def test_64_node_three_tier() -> None:
    res = load_spec(EXAMPLES / "h100-ndr-64node-3tier.yaml")
    assert res.cluster is not None
    assert len(res.cluster.nodes) == 66
    assert len(res.cluster.cables) == 64 * 8 + 2
    assert {s.tier for s in res.cluster.switches} == {"leaf", "spine", "core"}
