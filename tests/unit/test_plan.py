"""``provision plan``: changes per node from the manifests against the spec's pins, what they disrupt, the batches.

The manifests are the manifest role's own JSON (tests/unit/test_drift.py builds them); the cluster is the Slurm
lab spec (two partition nodes, a spare, an SM that is the controller) grown by a standby SM and an NFS server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.day2.plan import batch_count, cached_manifests, make_plan, summary_lines
from provisioner.errors import UsageError
from provisioner.slurm.membership import Membership, apply_swaps, spec_membership
from provisioner.spec.cluster import Cluster
from provisioner.spec.load import load_text
from tests.unit.test_drift import manifest

ROOT = Path(__file__).resolve().parents[2]
LAB = (ROOT / "tests" / "lab" / "slurm_cluster.yaml").read_text()
BIG = LAB.replace(
    '  - {name: sm1, address: 10.213.38.21, profile: svc, roles: [subnet_manager]}',
    '  - {name: "sm[1-2]", address: "10.213.38.[21-22]", profile: svc, roles: [subnet_manager]}\n'
    '  - {name: nfs1, address: 10.213.38.31, profile: svc, roles: [nfs_server]}\n'
    '  - {name: "gpu[04-05]", address: "10.213.38.[14-15]", profile: gpu2}').replace(
    'nodes: [{node: sm1, priority: 15}]', 'nodes: [{node: sm2, priority: 14}, {node: sm1, priority: 15}]').replace(
    'nodes: "gpu[01-02]", default: true', 'nodes: "gpu[01-02,04-05]", default: true')
GPUS = ["gpu01", "gpu02", "gpu03"]


def _cluster(text: str) -> Cluster:
    res = load_text(text, "cluster.yaml")
    assert res.cluster is not None and not res.errors, [d.format() for d in res.errors]
    return res.cluster


@pytest.fixture(scope="module")
def lab() -> Cluster:
    return _cluster(LAB)


@pytest.fixture(scope="module")
def big() -> Cluster:
    return _cluster(BIG)


def fleet(c: Cluster, **gpu_packages: str) -> dict[str, dict[str, Any]]:
    return {n.name: manifest(bool(n.gpu_count), **(gpu_packages if n.gpu_count else {})) for n in c.nodes}


def test_a_converged_cluster_has_nothing_to_do(lab: Cluster) -> None:
    plan = make_plan(lab, fleet(lab), {}, spec_membership(lab))
    assert plan.batches == [] and sorted(plan.unchanged) == ["gpu01", "gpu02", "gpu03", "sm1"]
    assert summary_lines(plan)[-1] == "nothing to do"


def test_a_driver_change_reboots_gpu_nodes_spare_first_a_batch_at_a_time(lab: Cluster) -> None:
    # the nodes run 550.90.07 with the module loaded; the spec moves to the newer build of the branch
    c = _cluster(LAB.replace('version: "550.90.07"', 'version: "550.127.05"'))
    plan = make_plan(c, fleet(c), {}, spec_membership(c), batch="1")
    gpu01 = plan.nodes["gpu01"]
    assert {ch.item for ch in gpu01.changes} == {"driver", "fabric_manager"}
    driver = next(ch for ch in gpu01.changes if ch.item == "driver")
    assert (driver.current, driver.wanted, driver.phase, driver.effect) == ("550.90.07-0ubuntu1", "550.127.05",
                                                                          "gpu_stack", "reboot")
    assert gpu01.phases == ["gpu_stack"] and gpu01.effects == ["reboot", "service restart"]
    assert [(b.nodes, b.drain, b.phases) for b in plan.batches] == [
        (["gpu03"], ["gpu03"], ["gpu_stack"]), (["gpu01"], ["gpu01"], ["gpu_stack"]),
        (["gpu02"], ["gpu02"], ["gpu_stack"])]
    assert plan.batches[0].note.startswith("spares first")
    assert plan.unchanged == ["sm1"]
    text = "\n".join(summary_lines(plan))
    assert "gpu01 (compute): driver 550.90.07-0ubuntu1 -> 550.127.05 [gpu_stack] reboot" in text
    assert "2: gpu01: drain gpu01, converge gpu_stack; reboot, service restart" in text


def test_a_driver_change_without_the_module_loaded_needs_no_reboot(lab: Cluster) -> None:
    c = _cluster(LAB.replace('version: "550.90.07"', 'version: "550.127.05"'))
    manifests = fleet(c)
    del manifests["gpu02"]["modules"]["nvidia"]
    plan = make_plan(c, manifests, {}, spec_membership(c))
    assert next(ch for ch in plan.nodes["gpu02"].changes if ch.item == "driver").effect == "none"
    assert next(ch for ch in plan.nodes["gpu01"].changes if ch.item == "driver").effect == "reboot"


def test_a_library_change_disrupts_nothing(lab: Cluster) -> None:
    c = _cluster(LAB.replace('nccl: "2.21.5"', 'nccl: "2.23.4"'))
    manifests = fleet(c)
    plan = make_plan(c, manifests, {}, spec_membership(c), batch="2")
    assert plan.nodes["gpu01"].effects == ["none"]
    # spare first, then the two partition nodes: a batch of 2 takes gpu03+gpu01, then gpu02
    assert [b.nodes for b in plan.batches] == [["gpu03", "gpu01"], ["gpu02"]]


def test_an_ofed_change_restarts_openibd_and_the_sms_come_last_standby_first(big: Cluster) -> None:
    c = _cluster(BIG.replace('ofed: {flavor: doca, version: "2.9.1"}', 'ofed: {flavor: doca, version: "3.2.2"}'))
    plan = make_plan(c, fleet(c), {}, spec_membership(c), batch="2")
    assert plan.nodes["gpu01"].effects == ["ofed restart"] and plan.nodes["gpu01"].phases == ["ofed"]
    assert plan.nodes["sm1"].effects == ["sm restart"] and plan.nodes["sm1"].phases == ["ofed", "fabric"]
    assert plan.nodes["nfs1"].kind == "storage" and plan.nodes["nfs1"].effects == ["ofed restart"]
    assert [(b.kind, b.nodes) for b in plan.batches] == [
        ("compute", ["gpu03", "gpu01"]), ("compute", ["gpu02", "gpu04"]), ("compute", ["gpu05"]),
        ("service", ["sm2"]), ("service", ["sm1"]), ("service", ["nfs1"])]
    assert [b.note for b in plan.batches[3:]] == ["standby SM (priority 14), one at a time",
                                                  "master SM, last, one at a time", "storage server, one at a time"]
    assert all(b.drain == [] for b in plan.batches[3:])


def test_a_share_rounds_up_and_a_batch_never_drains_a_whole_partition(big: Cluster) -> None:
    assert batch_count("25%", 5) == 2 and batch_count("100%", 3) == 3 and batch_count(None, 4, "50%") == 2
    for bad in ("0", "-1", "0%", "150%", "x"):
        with pytest.raises(UsageError, match="--batch"):
            batch_count(bad, 4)
    c = _cluster(LAB.replace('nccl: "2.21.5"', 'nccl: "2.23.4"'))
    with pytest.raises(UsageError, match="every node of partition gpu"):
        make_plan(c, fleet(c), {}, spec_membership(c), batch="3")


def test_a_node_without_manifest_gets_every_converge_phase(lab: Cluster) -> None:
    manifests = fleet(lab)
    del manifests["gpu02"]
    plan = make_plan(lab, manifests, {"gpu02": "unreachable: timed out"}, spec_membership(lab))
    assert plan.nodes["gpu02"].phases == ["preflight", "repos", "ofed", "gpu_stack", "fabric", "storage", "slurm"]
    assert plan.nodes["gpu02"].effects == ["unknown"]
    assert [b.nodes for b in plan.batches] == [["gpu02"]]
    assert "gpu02 (compute): no manifest (unreachable: timed out)" in "\n".join(summary_lines(plan))


def test_after_a_failover_the_failed_node_is_still_drained_and_the_spare_is_a_partition_node(lab: Cluster) -> None:
    from provisioner.slurm.membership import Swap

    now = apply_swaps(spec_membership(lab), [Swap("gpu01", "gpu03", ("gpu",), "t")],
                      {n.name: i for i, n in enumerate(lab.nodes)})
    assert now == Membership({"gpu": ["gpu02", "gpu03"]}, [], ["gpu01"])
    c = _cluster(LAB.replace('nccl: "2.21.5"', 'nccl: "2.23.4"'))
    plan = make_plan(c, fleet(c), {}, now)
    assert plan.nodes["gpu03"].kind == "compute"
    assert [b.drain for b in plan.batches] == [["gpu01"], ["gpu02"], ["gpu03"]]


def test_cached_manifests_are_read_from_the_state_dir(lab: Cluster, tmp_path: Path) -> None:
    import json

    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "gpu01.json").write_text(json.dumps(manifest(True)))
    (tmp_path / "manifests" / "gpu02.json").write_text("{not json")
    found, missing = cached_manifests(tmp_path, ["gpu01", "gpu02", "gpu03"])
    assert list(found) == ["gpu01"]
    assert "unreadable" in missing["gpu02"] and "no cached manifest" in missing["gpu03"]


def test_the_spec_name_in_the_summary_is_one_line(lab: Cluster) -> None:
    """Issue #26: a spec file name with a newline or an escape sequence was printed raw in the plan's first line."""
    from dataclasses import replace

    odd = replace(lab, file="/srv/c\n\x1b[2Jx.yaml")
    lines = summary_lines(make_plan(odd, fleet(odd), {}, spec_membership(odd)))
    assert lines[0].startswith(f"plan for {odd.name} (/srv/c\\n\\x1b[2Jx.yaml; "), lines[0]
    assert not any("\x1b" in ln for ln in lines)


def test_cgroup_v1_for_slurm_is_a_reboot_of_the_slurm_nodes_booted_v2(lab: Cluster) -> None:
    # slurm.cgroup: v1 (the way out for Ubuntu 22.04's Slurm 21.08): the kernel command line changes at boot only
    c = _cluster(LAB.replace("slurm:\n", "slurm:\n  cgroup: v1\n"))
    manifests = fleet(c)
    for name, m in manifests.items():
        m["cgroup"] = "v1" if name == "gpu02" else "v2"
    plan = make_plan(c, manifests, {}, spec_membership(c), batch="1")
    gpu01 = plan.nodes["gpu01"]
    assert [(ch.item, ch.current, ch.wanted, ch.phase, ch.effect) for ch in gpu01.changes] == [
        ("cgroup", "v2", "v1", "slurm", "reboot")]
    assert "systemd.unified_cgroup_hierarchy=0" in gpu01.changes[0].why
    assert plan.nodes["gpu02"].changes == []               # booted v1 already
    assert plan.nodes["sm1"].changes == []                 # the controller runs no slurmd: no cgroup of jobs
    assert "gpu01 (compute): cgroup v2 -> v1 [slurm] reboot" in "\n".join(summary_lines(plan))
    # v2 (the default) pins nothing: a node's hierarchy is not planned when the spec does not ask for v1
    assert not any(ch.item == "cgroup" for p in make_plan(lab, manifests, {}, spec_membership(lab)).nodes.values()
                   for ch in p.changes)
