"""links: port counters (flaps, bit errors) and ibstatus' width/speed; the lab's simulated counters behind them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from provisioner.fabric import bandwidth, links, schedule
from provisioner.fabric.findings import CheckResult
from provisioner.lab import faults, hardware
from provisioner.lab.hardware import LabHca, LabNodeSpec
from provisioner.lab.simtools import fabsim_common, labstate
from provisioner.parsers import parse
from provisioner.parsers.ibstatus import parse_rate
from provisioner.spec import Cluster, load_text
from tests.unit._parser_fixtures import load

SPEC = """
cluster: {name: ib, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: doca, version: "2.9.1"}}
profiles:
  g: {gpu: {model: H100-SXM5-80GB, count: 2}, hcas: [{device: "mlx5_[0-1]", rate: NDR}]}
nodes: [{name: "gpu[01-02]", address: "10.0.0.[1-2]", profile: g}]
fabric: {rate: NDR}
"""


def cluster() -> Cluster:
    res = load_text(SPEC, "cluster.yaml")
    assert res.cluster is not None, [str(d) for d in res.errors]
    return res.cluster


def cat_listing(text: str) -> dict[str, int]:
    """The gpud capture prints ``=== ./<name> ===`` then the value: turned into {counter: value}, numbers as is."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^=== \./(\w+) ===\n(\d+)$", text, re.M)}


def grep_lines(files: dict[str, str], prefix: str = "/") -> str:
    """What ``grep -Hs . <sysfs>/counters/*`` prints for the simulated sysfs files of a node."""
    return "".join(f"{prefix}{rel}:{text}" for rel, text in sorted(files.items()) if "/counters/" in rel)


# ---------------------------------------------------------------- parsing the probe


def test_probe_output_splits_into_its_three_tools() -> None:
    out = f"IBSTAT\n{links.IBSTATUS_MARK}\nSTATUS\n{links.COUNTERS_MARK}\nCOUNTERS\n"
    assert links.split_probe(out) == ("IBSTAT\n", "STATUS\n", "COUNTERS\n")
    assert links.split_probe("only ibstat\n") == ("only ibstat\n", "", "")  # an older probe or a fake remote


def test_counters_that_read_no_pma_are_no_counters() -> None:
    text = load("port-counters", "node_exporter_966_i40iw_no_pma.txt")
    assert len(text.splitlines()) == 7
    assert links.parse_counters(text) == {}
    node = cluster().node("gpu01")
    assert links.counter_findings(node, {}, {}) == []


def test_simulated_sysfs_counters_parse_to_zeros_on_a_healthy_port() -> None:
    node = hardware.node_state("c1", LabNodeSpec("gpu01", hcas=(LabHca("mlx5_0"), LabHca("mlx5_1", rail=1))))
    parsed = links.parse_counters(grep_lines(labstate.render_sysfs(node)))
    assert set(parsed) == {("mlx5_0", 1), ("mlx5_1", 1)}
    assert parsed[("mlx5_0", 1)] == dict.fromkeys(labstate.PORT_COUNTERS, 0)
    assert links.counter_findings(cluster().node("gpu01"), parsed, parsed) == []


# ---------------------------------------------------------------- judging the counters


def test_saturated_real_counters_warn_with_the_counter_names() -> None:
    counts = cat_listing(load("port-counters", "gpud_943_mlx5_1_saturated.txt"))
    assert counts["link_downed"] == 255 and counts["port_xmit_discards"] == 65535 and len(counts) == 21
    found = links.counter_findings(cluster().node("gpu01"), {("mlx5_1", 1): counts})
    assert [(f.severity, f.device, f.port) for f in found] == [("warning", "mlx5_1", 1)] * 2
    flap, errors = found
    assert "flapped 255 times since the counters were last cleared" in flap.message
    assert "perfquery -R" in flap.hint
    assert "excessive_buffer_overrun_errors 15 (> 0)" in errors.message
    assert "port_xmit_discards 65535 (> 100)" in errors.message
    assert "port_xmit_wait" not in errors.message  # congestion, not a fault of the link


def test_flap_counters_growing_during_the_run_are_an_error() -> None:
    node = cluster().node("gpu02")
    start = {("mlx5_0", 1): {"link_downed": 1, "link_error_recovery": 1, "symbol_error": 0},
             ("mlx5_1", 1): {"link_downed": 2, "link_error_recovery": 0}}
    end = {("mlx5_0", 1): {"link_downed": 2, "link_error_recovery": 3, "symbol_error": 0},
           ("mlx5_1", 1): {"link_downed": 2, "link_error_recovery": 0}}
    found = links.counter_findings(node, start, end)
    assert [(f.severity, f.device) for f in found] == [("error", "mlx5_0"), ("warning", "mlx5_1")]
    assert "flapped during this verify run (link_downed 1 -> 2, link_error_recovery 1 -> 3)" in found[0].message
    assert "only a warning" in found[0].hint
    assert "flapped 2 times" in found[1].message


def test_symbol_errors_below_the_threshold_are_quiet_above_it_a_warning() -> None:
    node = cluster().node("gpu01")
    quiet = links.counter_findings(node, {("mlx5_0", 1): {"symbol_error": 10}})
    loud = links.counter_findings(node, {("mlx5_0", 1): {"symbol_error": 11, "port_rcv_errors": 40}})
    assert quiet == []
    assert [f.message for f in loud] == [
        "mlx5_0/1 error counters above threshold: symbol_error 11 (> 10), port_rcv_errors 40 (> 10)"]


# ---------------------------------------------------------------- width vs speed (ibstatus)


def _status(device: str, rate: str) -> dict[str, object]:
    gbps, width, speed = parse_rate(rate)
    return {"ports": [{"device": device, "port": 1, "rate_gbps": gbps, "width": width, "speed": speed}]}


def _ibstat(device: str, gbps: float) -> dict[str, object]:
    port = {"port": 1, "state": "active", "physical_state": "linkup", "rate_gbps": gbps, "sm_lid": 1,
            "link_layer": "infiniband"}
    other = {**port, "rate_gbps": 400.0}
    name = "mlx5_1" if device == "mlx5_0" else "mlx5_0"
    return {"devices": [{"name": device, "ports": [port]}, {"name": name, "ports": [other]}], "errors": []}


@pytest.mark.parametrize(("rate", "cause"), [
    (labstate.rate_string(200, "2X", "NDR"), "width 2X, expected 4X"),
    (labstate.rate_string(200, "4X", "HDR"), "speed HDR, expected NDR"),
    (labstate.rate_string(100, "2X", "HDR"), "width 2X, expected 4X; speed HDR, expected NDR"),
])
def test_a_low_rate_names_width_or_speed_from_ibstatus(rate: str, cause: str) -> None:
    node = cluster().node("gpu01")
    gbps = float(rate.split()[0])
    found = links.port_findings(node, _ibstat("mlx5_1", gbps), _status("mlx5_1", rate))
    assert [(f.severity, f.device) for f in found] == [("error", "mlx5_1")]
    assert found[0].message.endswith(f": {cause}")
    without = links.port_findings(node, _ibstat("mlx5_1", gbps))
    assert cause not in without[0].message  # from ibstat alone it can only be inferred


def test_real_ibstatus_hdr_port_against_an_ndr_spec_is_a_speed_problem() -> None:
    status = parse("ibstatus", load("ibstatus", "hubutui_nccl_notes_mixed_down.txt"))
    port = next(p for p in cluster().node("gpu01").ports if p.device == "mlx5_1")
    assert links.rate_cause(port, links.status_by_port(status)[("mlx5_1", 1)]) == "speed HDR, expected NDR"


# ---------------------------------------------------------------- the lab's simulated counters


@pytest.fixture
def lab(tmp_path: Path) -> str:
    root = str(tmp_path)
    hardware.write_lab_state(root, "c1", [LabNodeSpec("gpu01", hcas=(LabHca("mlx5_0"), LabHca("mlx5_1", rail=1)))])
    return root


def _sysfs_counters(root: str) -> dict[tuple[str, int], dict[str, int]]:
    base = Path(labstate.sysfs_dir(root, "gpu01")).parent.parent
    files = {str(p.relative_to(base)): p.read_text() for p in base.rglob("counters/*")}
    return links.parse_counters(grep_lines(files))


def test_flapping_fault_shows_one_bounce_and_clearing_keeps_the_counts(lab: str) -> None:
    faults.inject(lab, "gpu01", "flapping", device="mlx5_1")
    after_inject = _sysfs_counters(lab)[("mlx5_1", 1)]
    assert {k: after_inject[k] for k in faults.FLAP_ON_INJECT} == faults.FLAP_ON_INJECT
    assert _sysfs_counters(lab)[("mlx5_0", 1)]["link_downed"] == 0
    faults.clear(lab, "gpu01", "flapping")
    assert _sysfs_counters(lab)[("mlx5_1", 1)]["link_downed"] == 1  # a fixed cable does not reset the HCA
    assert faults.reset_counters(lab, "gpu01") == 2
    assert _sysfs_counters(lab)[("mlx5_1", 1)] == dict.fromkeys(labstate.PORT_COUNTERS, 0)


def test_every_traffic_run_over_a_flapping_port_moves_its_counters(lab: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_LAB_ROOT", lab)
    faults.inject(lab, "gpu01", "flapping", device="mlx5_1")
    node = labstate.load_node(lab, "gpu01")
    steady, flapping = (labstate.find_hca(node, d) for d in ("mlx5_0", "mlx5_1"))
    runs = [str(r) for r in range(20)]
    assert all(fabsim_common.flap_counters(steady, r) == {} for r in runs)
    drops = [r for r in runs if fabsim_common.flaps_now(flapping, r)]
    assert 0 < len(drops) < len(runs)
    before = _sysfs_counters(lab)[("mlx5_1", 1)]
    for r in runs:
        fabsim_common.record_flap("gpu01", flapping, r)
    after = _sysfs_counters(lab)[("mlx5_1", 1)]
    assert after["link_error_recovery"] - before["link_error_recovery"] == len(runs)
    assert after["link_downed"] - before["link_downed"] == len(drops)
    assert after["symbol_error"] > before["symbol_error"]
    assert _sysfs_counters(lab)[("mlx5_0", 1)]["symbol_error"] == 0


def test_counters_saturate_like_the_pma(lab: str) -> None:
    labstate.bump_counters(lab, "gpu01", "mlx5_0", 1, {"link_downed": 300, "local_link_integrity_errors": 99})
    counts = _sysfs_counters(lab)[("mlx5_0", 1)]
    assert (counts["link_downed"], counts["local_link_integrity_errors"]) == (255, 15)
    with pytest.raises(ValueError, match="unknown port counter"):
        labstate.bump_counters(lab, "gpu01", "mlx5_0", 1, {"link_dropped": 1})


def test_a_swapped_board_counts_from_zero() -> None:
    node = hardware.node_state("c1", LabNodeSpec("gpu01", hcas=(LabHca("mlx5_0"),)))
    labstate.add_counters(node["hcas"][0], {"symbol_error": 7})
    hardware.regenerate_identity(node, 1, set())
    assert labstate.port_counters(node["hcas"][0])["symbol_error"] == 0


# ---------------------------------------------------------------- a flapping end of a failed pair


SPEC3 = SPEC.replace('"gpu[01-02]", address: "10.0.0.[1-2]"', '"gpu[01-03]", address: "10.0.0.[1-3]"')


def _pair_failed_once(bad: tuple[str, str], rail: int) -> list[schedule.Finding]:
    """The pairwise schedule on three nodes where only the pair ``bad`` failed on ``rail`` (a port that drops
    the link in some runs fails some pairs and not others): it blames the link between the two."""
    def measure(rnd: schedule.Round, rails: Sequence[int]) -> list[schedule.PairResult]:
        return [schedule.PairResult(p, r, passed={p.server, p.client} != set(bad) or r != rail)
                for p in rnd.pairs for r in rails]
    _, loc = schedule.run_quick(["gpu01", "gpu02", "gpu03"], [0, 1], measure)
    return schedule.verdict_findings(loc, device_by_rail={0: "mlx5_0", 1: "mlx5_1"})


def _flap_results(c: Cluster, node: str, device: str) -> list[CheckResult]:
    before = {(device, 1): {"link_downed": 0, "link_error_recovery": 0}}
    after = {(device, 1): {"link_downed": 1, "link_error_recovery": 1}}
    return [CheckResult.from_findings(links.CHECK, node, links.counter_findings(c.node(node), before, after))]


def test_a_failed_pair_is_given_to_the_end_whose_port_flapped_during_the_run() -> None:
    c = load_text(SPEC3, "cluster.yaml").cluster
    assert c is not None
    found = _pair_failed_once(("gpu01", "gpu03"), 1)
    assert [(f.node, f.peer, f.rail) for f in found] == [("gpu01", "gpu03", 1)]
    assert "link or route between them" in found[0].message
    pairwise = CheckResult.from_findings(bandwidth.CHECK, None, found)
    out = links.blame_flapping_ends([*_flap_results(c, "gpu03", "mlx5_1"), pairwise], c)
    moved = out[1].findings
    assert [(f.severity, f.node, f.device, f.peer, f.rail) for f in moved] == [("error", "gpu03", "mlx5_1", "gpu01", 1)]
    assert "gpu03's mlx5_1 flapped" in moved[0].message
    assert not out[1].passed and out[0] == _flap_results(c, "gpu03", "mlx5_1")[0]


def test_a_failed_pair_stays_on_the_link_when_the_flap_is_on_another_rail_or_on_both_ends() -> None:
    c = load_text(SPEC3, "cluster.yaml").cluster
    assert c is not None
    pairwise = CheckResult.from_findings(bandwidth.CHECK, None, _pair_failed_once(("gpu01", "gpu03"), 1))
    other_rail = links.blame_flapping_ends([*_flap_results(c, "gpu03", "mlx5_0"), pairwise], c)
    assert other_rail[1] is pairwise
    both = links.blame_flapping_ends(
        [*_flap_results(c, "gpu03", "mlx5_1"), *_flap_results(c, "gpu01", "mlx5_1"), pairwise], c)
    assert both[2] is pairwise
    # a warning for counts from before the run is no evidence about this run's failure
    old = {("mlx5_1", 1): {"link_downed": 3, "link_error_recovery": 0}}
    warned = CheckResult.from_findings(links.CHECK, "gpu03", links.counter_findings(c.node("gpu03"), old, old))
    assert [f.severity for f in warned.findings] == ["warning"]
    assert links.blame_flapping_ends([warned, pairwise], c)[1] is pairwise
