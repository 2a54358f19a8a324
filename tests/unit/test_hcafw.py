"""HCA firmware and mlxconfig pins (#25 item 4): the spec, the tools' query output, drift and ``provision plan``.

Query outputs are real captures (tests/fixtures/flint, tests/fixtures/mlxconfig, each headed by its source); the
manifests are the manifest role's JSON as tests/unit/test_drift.py builds them (mlx5_0: MT_0000000838, 28.39.1002).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner import hcafw
from provisioner.day2.plan import make_plan, summary_lines
from provisioner.drift import compare
from provisioner.render import build_inventory
from provisioner.slurm.membership import spec_membership
from provisioner.spec import load_spec
from provisioner.spec.cluster import Cluster
from provisioner.spec.load import load_text
from provisioner.spec.reserved import why_reserved
from tests.unit._parser_fixtures import load
from tests.unit.test_drift import manifest

ROOT = Path(__file__).resolve().parents[2]
LAB = (ROOT / "tests" / "lab" / "slurm_cluster.yaml").read_text()
OFED_LINE = '  ofed: {flavor: doca, version: "2.9.1"}\n'
PINS = OFED_LINE + """  hca_firmware:
    mirror: /srv/mirror/hca-firmware
    pins:
      MT_0000000838: {version: "28.39.1050", image: fw-ConnectX7-rel-28_39_1050-MCX75310AAS-NEA_Ax.bin}
    mlxconfig: {ATS_ENABLED: true, ADVANCED_PCI_SETTINGS: true, PCI_WR_ORDERING: 1}
"""


def _cluster(software: str = PINS) -> Cluster:
    assert OFED_LINE in LAB
    res = load_text(LAB.replace(OFED_LINE, software), "cluster.yaml")
    assert res.cluster is not None and not res.errors, [d.format() for d in res.errors]
    return res.cluster


def _converged(c: Cluster, fw: str = "28.39.1050", **mlx: str) -> dict[str, dict[str, Any]]:
    """Every node converged to the pins; ``mlx`` overrides a next-boot value on every node."""
    out = {}
    for n in c.nodes:
        m = manifest(bool(n.gpu_count))
        m["hcas"]["mlx5_0"] |= {"fw_ver": fw, "mlxconfig": {"ATS_ENABLED": "True(1)", "ADVANCED_PCI_SETTINGS":
                                                             "True(1)", "PCI_WR_ORDERING": "force_relax(1)"} | mlx}
        out[n.name] = m
    return out


# ---------------------------------------------------------------------------------------------------------
# the tools' output

def test_flint_query_of_a_card_running_its_flash_image() -> None:
    assert hcafw.parse_flint_query(load("flint", "cx6_mt0000000228.txt")) == {
        "psid": "MT_0000000228", "fw_version": "20.35.1012", "fw_running": "20.35.1012"}


def test_flint_query_after_a_burn_names_the_image_still_running() -> None:
    assert hcafw.parse_flint_query(load("flint", "cx6_burned_pending_reset.txt")) == {
        "psid": "MT_0000000228", "fw_version": "20.35.1012", "fw_running": "20.34.1002"}


def test_flint_parser_refuses_what_is_not_a_query() -> None:
    with pytest.raises(ValueError, match="PSID"):
        hcafw.parse_flint_query("-E- Cannot open Device: mlx5_9. No such file or directory\n")


def test_mlxconfig_plain_query_reads_the_next_boot_column() -> None:
    assert hcafw.parse_mlxconfig_query(load("mlxconfig", "mft_doc_connectx3_query.txt")) == {
        "SRIOV_EN": "True(1)", "NUM_OF_VFS": "16", "WOL_MAGIC_EN_P1": "False(0)", "WOL_MAGIC_EN_P2": "False(0)"}


def test_mlxconfig_verbose_query_reads_the_last_column_and_skips_the_footnote() -> None:
    assert hcafw.parse_mlxconfig_query(load("mlxconfig", "mft_doc_connectx4lx_verbose.txt")) == {
        "NUM_OF_VFS": "5", "SRIOV_EN": "True(1)"}


def test_mlxconfig_parser_refuses_a_grep_without_the_header() -> None:
    with pytest.raises(ValueError, match="Configurations"):
        hcafw.parse_mlxconfig_query(load("mlxconfig", "nvaie_connectx7_ats.txt"))


@pytest.mark.parametrize(("observed", "want", "same"), [
    ("True(1)", "1", True), ("True(1)", "TRUE", True), ("False(0)", "1", False), ("force_relax(1)", "1", True),
    ("16", "16", True), ("16", "8", False), ("per_mkey(0)", "FORCE_RELAX", False)])
def test_mlxconfig_values_compare_by_number_or_name(observed: str, want: str, same: bool) -> None:
    assert hcafw.value_matches(observed, want) is same


# ---------------------------------------------------------------------------------------------------------
# the spec and the rendered variables

def test_the_pins_reach_the_roles_and_site_vars_cannot_set_them() -> None:
    allv = build_inventory(_cluster()).groupvars["all"]
    assert allv["doca_ofed_firmware_mirror"] == "/srv/mirror/hca-firmware"
    assert allv["doca_ofed_firmware_pins"] == {"MT_0000000838": {
        "version": "28.39.1050", "image": "fw-ConnectX7-rel-28_39_1050-MCX75310AAS-NEA_Ax.bin"}}
    assert allv["doca_ofed_mlxconfig_settings"] == {"ADVANCED_PCI_SETTINGS": "1", "ATS_ENABLED": "1",
                                                    "PCI_WR_ORDERING": "1"}
    assert allv["manifest_mlxconfig_keys"] == ["ADVANCED_PCI_SETTINGS", "ATS_ENABLED", "PCI_WR_ORDERING"]
    assert allv["preflight_firmware_pins"] == allv["doca_ofed_firmware_pins"]
    assert allv["preflight_firmware_mirror"] == "/srv/mirror/hca-firmware"
    ours = [k for k in allv if k.startswith(("doca_ofed_", "manifest_", "preflight_"))]
    assert [k for k in ours if why_reserved(k) is None] == []


def test_without_pins_nothing_is_rendered() -> None:
    allv = build_inventory(_cluster(OFED_LINE)).groupvars["all"]
    assert not [k for k in allv if "firmware" in k or "mlxconfig" in k]


@pytest.mark.parametrize("bad", [
    "image: ../../etc/shadow", "image: sub/dir.bin", "version: 28.39", "image: 'a b.bin'"])
def test_a_bad_pin_is_a_schema_error_at_its_line(tmp_path: Path, bad: str) -> None:
    key, _, value = bad.partition(": ")
    good = {"version": '"28.39.1050"', "image": "fw.bin"} | {key: value}
    text = LAB.replace(OFED_LINE, OFED_LINE + "  hca_firmware:\n    mirror: /srv/fw\n    pins:\n      MT_0000000838: "
                       f"{{version: {good['version']}, image: {good['image']}}}\n")
    spec = tmp_path / "c.yaml"
    spec.write_text(text)
    res = load_spec(spec)
    assert [d.rule for d in res.errors] == ["SPEC-SCHEMA"], res.errors
    assert res.errors[0].line == text.splitlines().index(next(ln for ln in text.splitlines()
                                                              if "MT_0000000838" in ln)) + 1


@pytest.mark.parametrize("mlx", ["{ats_enabled: true}", "{ATS_ENABLED: 'x;reboot'}", "{ATS_ENABLED: [1]}"])
def test_a_bad_mlxconfig_setting_is_refused(tmp_path: Path, mlx: str) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(LAB.replace(OFED_LINE, OFED_LINE + f"  hca_firmware:\n    mirror: /srv/fw\n    mlxconfig: {mlx}\n"))
    res = load_spec(spec)
    assert res.errors and {d.rule for d in res.errors} == {"SPEC-SCHEMA"} and res.cluster is None


# ---------------------------------------------------------------------------------------------------------
# drift and plan

def test_a_converged_fleet_has_no_firmware_drift() -> None:
    c = _cluster()
    assert [f for f in compare(c, _converged(c)) if f.kind == "spec"] == []


def test_old_firmware_and_a_differing_mlxconfig_value_are_named_with_node_device_want_and_have() -> None:
    c = _cluster()
    m = _converged(c)
    m["gpu02"]["hcas"]["mlx5_0"]["fw_ver"] = "28.39.1002"
    m["gpu03"]["hcas"]["mlx5_0"]["mlxconfig"]["ATS_ENABLED"] = "False(0)"
    del m["sm1"]["hcas"]["mlx5_0"]["mlxconfig"]["PCI_WR_ORDERING"]
    found = [(f.node, f.item, f.expected, f.observed, f.severity) for f in compare(c, m) if f.kind == "spec"]
    assert found == [("gpu02", "firmware:mlx5_0", "28.39.1050", "28.39.1002", "error"),
                     ("gpu03", "mlxconfig:ATS_ENABLED:mlx5_0", "1", "False(0)", "error"),
                     ("sm1", "mlxconfig:PCI_WR_ORDERING:mlx5_0", "1", None, "error")]
    msgs = [f.message for f in compare(c, m) if f.kind == "spec"]
    assert msgs[0] == "gpu02 mlx5_0: firmware is 28.39.1002, the spec pins 28.39.1050"
    assert msgs[2] == "sm1 mlx5_0: mlxconfig PCI_WR_ORDERING is not reported, the spec pins 1"


def test_a_board_without_a_pin_is_drift_too() -> None:
    c = _cluster()
    m = _converged(c)
    m["gpu01"]["hcas"]["mlx5_0"]["board_id"] = "MT_0000001070"
    found = [(f.node, f.item, f.expected, f.message) for f in compare(c, m) if f.kind == "spec"]
    assert found == [("gpu01", "firmware:mlx5_0", "a pin for PSID MT_0000001070", "gpu01 mlx5_0: firmware 28.39.1050, "
                      "and the spec has no pin for its board (a pin for PSID MT_0000001070)")]


def test_plan_shows_a_firmware_pin_change_as_reboot_class_in_the_ofed_phase() -> None:
    c = _cluster()
    m = _converged(c, fw="28.39.1002", ATS_ENABLED="False(0)")
    plan = make_plan(c, m, {}, spec_membership(c))
    gpu01 = plan.nodes["gpu01"]
    assert [(ch.item, ch.current, ch.wanted, ch.phase, ch.effect) for ch in gpu01.changes] == [
        ("firmware:mlx5_0", "28.39.1002", "28.39.1050", "ofed", "reboot"),
        ("mlxconfig:ATS_ENABLED:mlx5_0", "False(0)", "1", "ofed", "reboot")]
    assert gpu01.effects == ["reboot"] and gpu01.phases == ["ofed"]
    assert any("firmware:mlx5_0 28.39.1002 -> 28.39.1050 [ofed] reboot" in ln for ln in summary_lines(plan))
    assert all("reboot" in b.effects for b in plan.batches) and plan.batches


def test_plan_without_pins_ignores_the_firmware() -> None:
    c = _cluster(OFED_LINE)
    plan = make_plan(c, _converged(c, fw="1.2.3"), {}, spec_membership(c))
    assert plan.batches == []
