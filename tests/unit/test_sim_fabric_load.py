"""The lab's fabric between the leaves: switch faults, routes over the surviving uplinks, shared capacity.

The pure parts (routes, max-min fair share) are tested directly; the simulated ``ib_write_bw`` runs as
subprocesses on the lab state ``provision lab up`` writes (test_sim_fabric_topology's two-leaf lab), several
at once, so the flows really find each other in ``<lab root>/flows/``. The MAD tools' view of the switch faults
goes through the product's parsers and its switch-link and switch-port checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from provisioner import parsers
from provisioner.errors import LabError
from provisioner.fabric import switchlinks, switchports
from provisioner.lab import faults, fromspec, hardware
from provisioner.lab.simtools import fabsim_fabric, fabsim_pma, labstate
from tests.unit import test_sim_fabric_topology as topo
from tests.unit.test_simtools_fabric import free_port

ROW_GBPS = 3
"""Column of the average bandwidth in perftest's result row."""


@pytest.fixture()
def lab(tmp_path: Path) -> Path:
    root = tmp_path / "lab"
    hardware.write_lab_state(str(root), "topo", topo.NODES, topo.SWITCHES, topo.CABLES)
    fromspec.write_switch_links(str(root), topo.UPLINKS)
    # a static engine (NVIDIA's opensm would route with ar_updn without this line): every flow takes one path
    topo._sweep(root, tmp_path, "routing_engine updn\n")
    master = json.loads((root / "sm" / "sm.json").read_text())  # the --once SM has exited: keep it "running"
    (root / "sm" / f"{master['guid']}.json").write_text(json.dumps({**master, "heartbeat": time.time()}))
    return root


def _flow(root: Path, src: tuple[str, str], dst: tuple[str, str], port: int,
          **env: str) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Start one ib_write_bw pair: a server on ``dst``, a client on ``src`` (not waited for)."""
    base = {"PROVISIONER_LAB_ROOT": str(root), "PROVISIONER_LAB_FLOW_SETTLE_S": "0.4",
            "PROVISIONER_LAB_PERFTEST_RETRY_S": "20", **env}
    common = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    server = subprocess.Popen([topo.PY, str(topo.TOOLS / "ib_write_bw"), "-d", dst[1], "-p", str(port),
                               "--report_gbits", "-D", "1"],
                              env={**common, **base, "PROVISIONER_LAB_HOST": dst[0]}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    client = subprocess.Popen([topo.PY, str(topo.TOOLS / "ib_write_bw"), "-d", src[1], "-p", str(port),
                               "--report_gbits", "-D", "1", "127.0.0.1"],
                              env={**common, **base, "PROVISIONER_LAB_HOST": src[0]}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return server, client


def _gbps(procs: tuple[subprocess.Popen[str], subprocess.Popen[str]]) -> float | None:
    server, client = procs
    out, err = client.communicate(timeout=60)
    server.communicate(timeout=60)
    parsed = parsers.parse("perftest", out + err)
    return parsed.get("bw_avg_gbps") if parsed.get("ok") else None


CROSS = [(("gpu01", "mlx5_0"), ("gpu02", "mlx5_1")), (("gpu02", "mlx5_0"), ("gpu01", "mlx5_1"))]
"""Two flows from leaf1 up through spine1 down to leaf2 (leaf1's two uplinks carry one each)."""


def _run(root: Path, flows: list[tuple[tuple[str, str], tuple[str, str]]], **env: str) -> list[float | None]:
    started = [_flow(root, src, dst, free_port(), **env) for src, dst in flows]
    return [_gbps(p) for p in started]


# ---------------------------------------------------------------- routes and shares (pure)


def test_max_min_shares_a_link_and_gives_the_rest_to_the_others() -> None:
    flows = {"a": {("isl", "L", 7): 1.0, ("tx", "x"): 1.0}, "b": {("isl", "L", 7): 1.0, ("tx", "y"): 1.0},
             "c": {("tx", "z"): 1.0}}
    cap = {("isl", "L", 7): 400.0, ("tx", "x"): 400.0, ("tx", "y"): 100.0, ("tx", "z"): 400.0}
    assert fabsim_fabric.max_min(flows, cap) == {"a": 300.0, "b": 100.0, "c": 400.0}


def test_static_routes_spread_destinations_over_uplinks_and_follow_the_survivors(lab: Path) -> None:
    fabric = labstate.load_fabric(str(lab))
    t = fabsim_fabric.Topology(fabric)
    _, dests = fabsim_fabric.port_capacity(str(lab))
    tables = fabsim_fabric.static_tables(t, dests)
    to_leaf2 = {d: p for d, p in tables["leaf1"].items() if d[1] == "mlx5_1"}
    assert sorted(to_leaf2.values()) == [7, 8]  # gpu01 and gpu02 rail 1: one uplink each
    fabric["switch_links"][0]["state"] = "down"  # leaf1 port 7
    t = fabsim_fabric.Topology(fabric)
    tables = fabsim_fabric.static_tables(t, dests)
    assert {p for d, p in tables["leaf1"].items() if d[1] == "mlx5_1"} == {8}
    path = fabsim_fabric.route(t, ("gpu01", "mlx5_0", 1), ("gpu02", "mlx5_1", 1), False, tables)
    assert path is not None
    assert sorted(r for r in path if r[0] == "isl") in ([("isl", "leaf1", 8), ("isl", "spine1", 3)],
                                                        [("isl", "leaf1", 8), ("isl", "spine1", 4)])


def test_adaptive_routing_spreads_a_flow_over_every_shortest_path(lab: Path) -> None:
    t = fabsim_fabric.Topology(labstate.load_fabric(str(lab)))
    path = fabsim_fabric.route(t, ("gpu01", "mlx5_0", 1), ("gpu02", "mlx5_1", 1), True, None)
    assert path is not None
    assert path[("isl", "leaf1", 7)] == path[("isl", "leaf1", 8)] == 0.5
    assert path[("isl", "spine1", 3)] == path[("isl", "spine1", 4)] == 0.5


# ---------------------------------------------------------------- ib_write_bw over the shared fabric


def test_cross_leaf_flows_share_the_uplinks_that_are_left(lab: Path) -> None:
    healthy = _run(lab, CROSS)
    assert all(g is not None and 385 < g < 400 for g in healthy), healthy  # one uplink each: line rate
    faults.inject(str(lab), "leaf1", "uplink_down", port=7)
    one_up = _run(lab, CROSS)
    assert all(g is not None and 190 < g < 200 for g in one_up), one_up  # both on leaf1 port 8
    alone = _run(lab, CROSS[:1])
    assert alone[0] is not None and alone[0] > 385  # alone, the surviving uplink is all its own
    assert fabsim_fabric.running(str(lab)) == {}  # every flow unregistered itself


def test_a_degraded_uplink_and_a_dead_spine(lab: Path) -> None:
    faults.inject(str(lab), "leaf1", "uplink_degraded", port=8, width="2X")
    got = _run(lab, CROSS)
    assert sorted(round(g or 0, -1) for g in got) == [200.0, 390.0], got  # one flow on the 2X uplink
    faults.clear(str(lab), "leaf1")
    faults.inject(str(lab), "spine1", "switch_down")
    assert _run(lab, CROSS[:1]) == [None]  # no way from leaf1 to leaf2: the QP's retries run out
    same_leaf = _run(lab, [(("gpu01", "mlx5_0"), ("gpu02", "mlx5_0"))])
    assert same_leaf[0] is not None and same_leaf[0] > 385  # within a leaf nothing changed


def test_same_leaf_flows_do_not_wait_for_others(lab: Path) -> None:
    start = time.monotonic()
    got = _run(lab, [(("gpu01", "mlx5_0"), ("gpu02", "mlx5_0"))], PROVISIONER_LAB_FLOW_SETTLE_S="5")
    assert got[0] is not None and time.monotonic() - start < 5


# ---------------------------------------------------------------- switch faults in the MAD tools and the checks


def test_switch_faults_are_named_by_the_switch_link_check(lab: Path) -> None:
    cluster = topo._cluster(topo.SPEC)
    planned = switchlinks.plan(cluster)
    for tool in ("iblinkinfo", "ibnetdiscover"):
        view = switchlinks.live_view(cluster, parsers.parse(tool, topo._tool(lab, tool).stdout))
        assert switchlinks.compare(cluster, planned, view).findings == [], tool
    faults.inject(str(lab), "leaf1", "uplink_down", port=7)
    faults.inject(str(lab), "leaf2", "uplink_degraded", port=8, speed="HDR")
    for tool in ("iblinkinfo", "ibnetdiscover"):
        view = switchlinks.live_view(cluster, parsers.parse(tool, topo._tool(lab, tool).stdout))
        found = switchlinks.compare(cluster, planned, view).findings
        msgs = sorted(f.message for f in found if f.severity == "error")
        assert msgs[0].startswith("leaf1 port 7 ↔ spine1 port 1: missing"), (tool, msgs)
        assert msgs[1] == ("leaf2 port 8 ↔ spine1 port 4: degraded to 200 Gb/s (speed HDR, planned NDR), planned "
                           "400 Gb/s"), (tool, msgs)
        assert {(f.switch, f.port) for f in found if f.severity == "error"} == {("leaf1", 7), ("leaf2", 8)}
        over = sorted(f.message for f in found if f.severity == "warning")
        assert over == ["leaf1: 1 of 2 uplinks up → 3.00:1 (planned 1.50:1; 1200 Gb/s down, 400 of 800 Gb/s up)",
                        "leaf2: 2 of 2 uplinks up, 1 degraded → 1.33:1 (planned 1.00:1; 800 Gb/s down, 600 of 800 "
                        "Gb/s up)"], over
    faults.clear(str(lab), "leaf1")
    faults.clear(str(lab), "leaf2")
    faults.inject(str(lab), "spine1", "switch_down")
    view = switchlinks.live_view(cluster, parsers.parse("iblinkinfo", topo._tool(lab, "iblinkinfo").stdout))
    found = [f for f in switchlinks.compare(cluster, planned, view).findings if f.severity == "error"]
    assert [(f.switch, f.message) for f in found] == [(
        "spine1", "spine1: not in the fabric (no port of it answers); its 4 planned links are down: leaf1 port "
                  "7-8; leaf2 port 7-8")]
    faults.clear(str(lab), "spine1")
    assert switchlinks.compare(cluster, planned, switchlinks.live_view(
        cluster, parsers.parse("iblinkinfo", topo._tool(lab, "iblinkinfo").stdout))).findings == []


def test_switch_port_counters_from_ibqueryerrors(lab: Path) -> None:
    cluster = topo._cluster(topo.SPEC)
    clean = topo._tool(lab, "ibqueryerrors", "--switch")
    assert clean.returncode == 0 and clean.stdout.startswith("\n## Summary: 3 nodes checked, 0 bad nodes found\n")
    assert switchports.read_counters(cluster, parsers.parse("ibqueryerrors", clean.stdout)) == {}
    faults.inject(str(lab), "leaf1", "uplink_degraded", port=7)
    before = switchports.read_counters(cluster, parsers.parse("ibqueryerrors",
                                                              topo._tool(lab, "ibqueryerrors", "--switch").stdout))
    assert before == {("leaf1", 7): {"symbol_error": 12, "link_error_recovery": 1},
                      ("spine1", 1): {"symbol_error": 12, "link_error_recovery": 1}}
    found = switchports.port_findings(before)
    assert sorted((f.severity, f.switch, f.port, f.message) for f in found)[0] == (
        "warning", "leaf1", 7, "leaf1 port 7 error counters above threshold: symbol_error 12 (> 10)")
    faults.inject(str(lab), "leaf1", "uplink_down", port=8)  # link_downed grows on leaf1 8 and spine1 2 now
    after = switchports.read_counters(cluster, parsers.parse("ibqueryerrors",
                                                             topo._tool(lab, "ibqueryerrors", "--switch").stdout))
    grew = [f for f in switchports.port_findings(before, after) if f.severity == "error"]
    assert [(f.switch, f.port) for f in grew] == [("leaf1", 8), ("spine1", 2)]
    assert grew[0].message == "leaf1 port 8 flapped during this verify run (link_downed 0 -> 1)"
    done = topo._tool(lab, "ibqueryerrors", "--switch", "-k")
    assert done.returncode == 1 and "Errors for 0x" in done.stdout
    assert topo._tool(lab, "ibqueryerrors", "--switch").returncode == 0  # -k cleared them


def test_switch_fault_parameters_and_targets(lab: Path) -> None:
    with pytest.raises(LabError, match="leaf1 port 3 has no switch-to-switch link"):
        faults.inject(str(lab), "leaf1", "uplink_down", port=3)
    with pytest.raises(LabError, match="leaf1 is a switch"):
        faults.inject(str(lab), "leaf1", "port_down", device="mlx5_0")
    with pytest.raises(LabError, match="uplink_down needs port"):
        faults.check_params("uplink_down", {})
    faults.inject(str(lab), "leaf2", "switch_down")
    gone = {h: labstate.load_node(str(lab), h)["hcas"] for h in ("gpu01", "gpu02")}
    assert [(h["device"], h["state"], h["phys_state"]) for hs in gone.values() for h in hs if h["device"] ==
            "mlx5_1"] == [("mlx5_1", "down", "polling")] * 2
    assert faults.list_faults(str(lab), "leaf2") == [{"kind": "switch_down", "switch": "leaf2"}]
    with pytest.raises(LabError, match="already injected"):
        faults.inject(str(lab), "leaf2", "switch_down")
    assert [r["kind"] for r in faults.clear(str(lab), "leaf2")] == ["switch_down"]
    back = labstate.load_node(str(lab), "gpu01")["hcas"][1]
    assert (back["state"], back["phys_state"]) == ("active", "linkup") and back["lid"] > 0
    assert fabsim_pma.switch_counters(labstate.load_fabric(str(lab))["switches"][2], 3) == {
        **dict.fromkeys(labstate.PORT_COUNTERS, 0), "link_downed": 1}  # spine1's port to leaf2 saw it go


def test_lab_state_cables_the_planned_links_between_tiers(tmp_path: Path) -> None:
    """lab_up (hardware.write_lab_state) cables what the spec plans between tiers, as verify expects it."""
    cluster = topo._cluster(topo.SPEC)
    root = str(tmp_path / "lab")
    hardware.write_lab_state(root, "topo", fromspec.lab_nodes(cluster), fromspec.lab_switches(cluster),
                             fromspec.lab_cables(cluster))
    fabric = labstate.load_fabric(root)
    assert fabric["switch_links"] == [
        {"switch": lk.switch, "port": lk.port, "peer": lk.peer, "peer_port": lk.peer_port, "width": lk.width,
         "speed": lk.speed} for lk in fromspec.lab_switch_links(cluster)]
    faults.inject(root, "spine1", "switch_down")
    hardware.write_lab_state(root, "topo", fromspec.lab_nodes(cluster), fromspec.lab_switches(cluster),
                             fromspec.lab_cables(cluster))  # lab up again: the dead switch stays dead
    assert next(s for s in labstate.load_fabric(root)["switches"] if s["name"] == "spine1")["down"] is True
