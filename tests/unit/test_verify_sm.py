"""The subnet-manager check: the spec's master SM is master, every planned SM answers, nobody else blamed."""

from __future__ import annotations

from typing import Any

from provisioner.fabric import sm_verify
from provisioner.fabric.sm import SmInfo, read_sminfo
from provisioner.spec import Cluster, load_text
from tests.unit._parser_fixtures import load

SPEC = """
cluster: {name: ib, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: doca, version: "2.9.1"}}
profiles:
  g: {gpu: {model: H100-SXM5-80GB, count: 2}, hcas: [{device: "mlx5_[0-1]", rate: NDR}]}
  s: {hcas: [{device: mlx5_0, rate: NDR}]}
nodes:
  - {name: "gpu[01-02]", address: "10.0.0.[1-2]", profile: g}
  - {name: "sm[1-2]", address: "10.0.0.[8-9]", profile: s, roles: [subnet_manager]}
fabric:
  rate: NDR
  subnet_manager: {kind: opensm, nodes: [{node: sm1, priority: 15}, {node: sm2, priority: 14}]}
"""
GUID = {"sm1": "0xa088c20300fc1666", "sm2": "0xa088c203004da084"}
LID = {"sm1": 1, "sm2": 11}


def cluster(text: str = SPEC) -> Cluster:
    res = load_text(text, "cluster.yaml")
    assert res.cluster is not None, [str(d) for d in res.errors]
    return res.cluster


def ibstat() -> dict[str, dict[str, Any]]:
    return {h: {"devices": [{"name": "mlx5_0", "ports": [{"port": 1, "port_guid": GUID[h], "base_lid": LID[h]}]}]}
            for h in GUID}


def info(host: str, state: str = "master", priority: int | None = None) -> SmInfo:
    return SmInfo(GUID[host], LID[host], priority if priority is not None else {"sm1": 15, "sm2": 14}[host], state)


def test_planned_master_and_standby_pass() -> None:
    own = {"sm1": info("sm1"), "sm2": info("sm2", "standby")}
    assert sm_verify.sm_findings(cluster(), ibstat(), info("sm1"), own, "gpu01") == []


def test_standby_took_over_names_the_dead_master_and_the_lid_move() -> None:
    found = sm_verify.sm_findings(cluster(), ibstat(), info("sm2"), {"sm1": None, "sm2": info("sm2")}, "gpu01")
    assert [(f.node, f.device, f.port, f.severity) for f in found] == [("sm1", "mlx5_0", 1, "error")]
    assert "sm2 (priority 14, LID 11) is" in found[0].message and "moved from 1 to 11" in found[0].message
    assert "no failover" in found[0].message


def test_dead_standby_is_named_and_no_sm_at_all_is_a_cluster_error() -> None:
    found = sm_verify.sm_findings(cluster(), ibstat(), info("sm1"), {"sm1": info("sm1"), "sm2": None}, "gpu01")
    assert [(f.node, f.severity, f.expected) for f in found] == [("sm2", "error", "standby")]
    none = sm_verify.sm_findings(cluster(), ibstat(), None, {"sm1": None, "sm2": None}, "gpu01")
    assert [f.node for f in none] == [None, "sm1", "sm2"]


def test_foreign_master_is_not_pinned_on_our_sms() -> None:
    foreign = read_sminfo(load("sminfo", "bda_master_prio14.txt"))  # a switch SM at LID 15, priority 14
    own = {"sm1": info("sm1", "standby"), "sm2": info("sm2", "standby")}
    found = sm_verify.sm_findings(cluster(), ibstat(), foreign, own, "gpu01")
    assert len(found) == 1 and found[0].node == "sm1" and "foreign SM 0x0010e0406d5aa0a0" in found[0].message
    assert "foreign SM" in found[0].hint


def test_switch_sm_only_needs_an_answer() -> None:
    switch = cluster(SPEC.replace("{kind: opensm, nodes: [{node: sm1, priority: 15}, {node: sm2, priority: 14}]}",
                                  "{kind: ufm}"))
    assert sm_verify.planned_sms(switch, ibstat()) == []
    assert sm_verify.sm_findings(switch, ibstat(), info("sm1"), {}, "gpu01") == []
    assert [f.node for f in sm_verify.sm_findings(switch, ibstat(), None, {}, "gpu01")] == [None]
