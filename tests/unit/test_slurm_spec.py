"""The spec's slurm: and spares: sections: validation rules, the inventory they render, the swap records."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import UsageError
from provisioner.render.model import build_inventory
from provisioner.slurm.membership import (
    Membership,
    current,
    load_swaps,
    mark_returned,
    record_swap,
    run_vars,
    spec_membership,
)
from provisioner.spec.load import load_text
from tests.unit.test_plan import LAB, _cluster


def _diags(text: str) -> list[str]:
    res = load_text(text, "c.yaml")
    return [f"{d.rule}: {d.message}" for d in res.diagnostics if d.rule in ("SLURM-REFS", "SPARES", "SPEC-HOSTLIST")]


def test_the_lab_spec_is_clean() -> None:
    assert _diags(LAB) == []


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("controller: sm1", "controller: sm9", "SLURM-REFS: Slurm controller 'sm9' is not defined"),
    ('nodes: "gpu[01-02]", default: true', 'nodes: "gpu[01-05]", default: true',
     "SLURM-REFS: partition gpu names undefined node(s) gpu[04-05]"),
    ('    - {name: gpu, nodes: "gpu[01-02]", default: true}',
     '    - {name: gpu, nodes: "gpu[01-02]", default: true}\n    - {name: gpu, nodes: gpu01, default: true}',
     "SLURM-REFS: partition gpu is defined twice"),
    ("nodes: gpu03\n", "nodes: gpu02\n", "SPARES: spare gpu02 is in partition gpu"),
    ("nodes: gpu03\n", "nodes: sm1\n", "SPARES: spare sm1 is the Slurm controller"),
    ("nodes: gpu03\n", "nodes: gpu09\n", "SPARES: spare node(s) gpu09 not defined"),
])
def test_slurm_and_spare_mistakes_are_named(old: str, new: str, expected: str) -> None:
    text = LAB.replace(old, new)
    assert text != LAB
    assert any(d.startswith(expected) for d in _diags(text)), _diags(text)


def test_a_spare_of_another_profile_stands_in_for_nobody() -> None:
    text = LAB.replace('  - {name: sm1, address: 10.213.38.21, profile: svc, roles: [subnet_manager]}',
                       '  - {name: sm1, address: 10.213.38.21, profile: svc, roles: [subnet_manager]}\n'
                       '  - {name: svc2, address: 10.213.38.22, profile: svc}').replace("nodes: gpu03\n",
                                                                                  'nodes: "gpu03,svc2"\n')
    assert "SPARES: spare svc2 (profile svc) can stand in for no partition node (profiles: gpu2)" in _diags(text)


def test_a_spare_must_be_in_the_infiniband_partitions_of_the_nodes_it_stands_in_for() -> None:
    # gpu01-02 send with tenant_a's P_Key (NCCL_IB_PKEY): gpu03 in their place must be admitted by the SM already
    part = '  partitions:\n    - {name: tenant_a, pkey: 0x8001, members: "gpu[01-02]"}\n'
    anchor = "    adaptive_routing: true\n"
    assert anchor in LAB
    outside = LAB.replace(anchor, anchor + part)
    assert ("SPARES: spare gpu03 is not in InfiniBand partition tenant_a (P_Key 0x8001) of gpu[01-02]: in their "
            "place it could not reach their peers") in _diags(outside)
    inside = LAB.replace(anchor, anchor + part.replace("gpu[01-02]", "gpu[01-03]"))
    assert _diags(inside) == []


def test_spares_need_slurm() -> None:
    text = LAB.split("slurm:")[0] + "spares: {nodes: gpu03}\n" + "verify:" + LAB.split("verify:")[1]
    assert any(d.startswith("SPARES: spares without slurm") for d in _diags(text))


def test_the_inventory_has_the_slurm_groups_and_the_spec_membership() -> None:
    inv = build_inventory(_cluster(LAB))
    assert inv.groups["slurm_controller"] == ["sm1"]
    assert inv.groups["slurm_nodes"] == ["gpu01", "gpu02", "gpu03"] and inv.groups["spares"] == ["gpu03"]
    allv = inv.groupvars["all"]
    assert allv["slurm_partitions"] == [{"name": "gpu", "nodes": ["gpu01", "gpu02"], "default": True,
                                         "max_time": "INFINITE"}]
    assert allv["slurm_spares"] == ["gpu03"] and allv["slurm_gres"] is False
    assert allv["slurm_nodes"][0] == {"name": "gpu01", "address": "10.213.38.11", "gpus": 2}
    no_slurm = build_inventory(_cluster(LAB.split("slurm:")[0] + "verify:" + LAB.split("verify:")[1]))
    assert "slurm_controller" not in no_slurm.groups and "slurm_enabled" not in no_slurm.groupvars["all"]


def test_a_swap_is_recorded_applied_to_every_run_and_the_returned_node_becomes_a_spare(tmp_path: Path) -> None:
    c = _cluster(LAB)
    assert run_vars(c, tmp_path) == {}  # no swap: the rendered spec membership stands
    record_swap(tmp_path, "gpu01", "gpu03", ["gpu"], "gpu_count: 1 of 2 GPUs", when="2026-01-01T00:00:00Z")
    assert current(c, tmp_path) == Membership({"gpu": ["gpu02", "gpu03"]}, [], ["gpu01"])
    assert run_vars(c, tmp_path) == {
        "slurm_partitions": [{"name": "gpu", "nodes": ["gpu02", "gpu03"], "default": True, "max_time": "INFINITE"}],
        "slurm_spares": [], "slurm_failed": ["gpu01"]}
    assert mark_returned(tmp_path, "gpu01") and not mark_returned(tmp_path, "gpu01")
    assert current(c, tmp_path) == Membership({"gpu": ["gpu02", "gpu03"]}, ["gpu01"], [])
    assert [s.failed for s in load_swaps(tmp_path)] == ["gpu01"]


def test_a_swap_record_naming_a_node_that_is_no_spare_is_refused(tmp_path: Path) -> None:
    c = _cluster(LAB)
    record_swap(tmp_path, "gpu01", "gpu02", ["gpu"], "x")
    with pytest.raises(UsageError, match="gpu02 is no spare"):
        current(c, tmp_path)
    assert spec_membership(c).spares == ["gpu03"]


def test_the_slurm_role_declares_every_variable_the_inventory_and_a_run_give_it() -> None:
    import yaml

    root = Path(__file__).resolve().parents[2]
    options = set(yaml.safe_load((root / "roles/slurm/meta/argument_specs.yml").read_text())["argument_specs"]
                  ["main"]["options"])
    rendered = {k for k in build_inventory(_cluster(LAB)).groupvars["all"] if k.startswith("slurm_")}
    lab_site = {"slurm_proctrack_type", "slurm_task_plugin"}
    assert rendered | lab_site | {"slurm_failed"} <= options
    defaults = yaml.safe_load((root / "roles/slurm/defaults/main.yml").read_text())
    assert all(k.startswith("slurm_") for k in defaults)
