"""provisioner/day2/peers.py: the one verification of nodes against their peers, its checks from the registry."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from provisioner import verify as verify_mod
from provisioner.day2 import peers
from provisioner.fabric.findings import CheckResult
from provisioner.report import VerifyReport
from provisioner.spec.cluster import Cluster
from tests.unit.test_plan import LAB, _cluster


@pytest.fixture
def lab() -> Cluster:
    return _cluster(LAB)


def test_a_batch_holding_the_sm_checks_it_and_a_replaced_sm_node_its_links_alone(lab: Cluster) -> None:
    assert lab.sm_nodes() == ["sm1"]
    assert peers.checks(lab, ["sm1"], []) == (["links", "versions", "sm"], [])
    assert peers.checks(lab, ["sm1"], [], new_hardware=True) == (["links", "versions"], [])
    together, pair = peers.checks(lab, ["gpu01", "gpu02"], ["gpu03"])
    wanted = set(lab.spec.verify.tests)
    assert together == ["links", "versions", *[t for t in ("bandwidth", "nccl") if t in wanted]]
    assert pair == (["gpudirect"] if "gpudirect" in wanted else [])


def test_verify_measures_the_nodes_with_their_peers_and_the_sm_then_each_gpu_node_with_one_peer(
        lab: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], list[str], dict[str, Any]]] = []
    written: list[VerifyReport] = []
    now = datetime.now(UTC)

    def fake(cluster: Cluster, tests: list[str], **kw: Any) -> Any:
        calls.append(([n.name for n in cluster.nodes], list(tests), kw))
        result = CheckResult.could_not_run(tests[0], cluster.nodes[0].name, "fake")
        return SimpleNamespace(report=VerifyReport(cluster.name, now, now, (result,)), inventory={"n": {}})

    monkeypatch.setattr(verify_mod, "verify", fake)
    monkeypatch.setattr(verify_mod, "write_reports", lambda report, d, inv: written.append(report))
    monkeypatch.setattr(lab.spec.verify, "tests", ["links", "bandwidth", "gpudirect", "nccl"])
    report = peers.verify(lab, ["gpu01", "sm1"], ["gpu03"], tmp_path, lambda _m: None)
    assert [(n, t) for n, t, _ in calls] == [
        (["gpu01", "gpu03", "sm1"], ["links", "versions", "sm", "bandwidth", "nccl"]),
        (["gpu01", "gpu03"], ["gpudirect"])]
    assert calls[0][2]["nccl_launcher"] == "mpirun" and all(kw["include_busy"] for _, _, kw in calls)
    assert [c.name for c in report.checks] == ["links", "gpudirect"] and written == [report]
