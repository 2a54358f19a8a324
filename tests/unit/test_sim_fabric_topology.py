"""The lab's simulated fabric beyond one switch tier: ibnetdiscover, switch-to-switch links, AR in the SM log.

The simulated scripts run as subprocesses on lab state written the way ``provision lab up`` writes it
(``hardware.write_lab_state`` + ``fromspec.write_switch_links``); their output goes through the product's
parsers and checks, and its line layout is compared with a real NDR ibnetdiscover capture.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import parsers
from provisioner.fabric import cabling, sm
from provisioner.lab import faults, fromspec, hardware
from provisioner.lab.fromspec import LabSwitchLink
from provisioner.lab.hardware import LabCable, LabHca, LabNodeSpec, LabSwitch
from provisioner.lab.simtools import labstate
from provisioner.spec import Cluster, load_text
from tests.unit._parser_fixtures import FIXTURES, load

TOOLS = Path(__file__).resolve().parents[2] / "provisioner" / "lab" / "simtools"
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

NODES = [
    LabNodeSpec("gpu01", gpu_count=2, hcas=(LabHca("mlx5_0", rail=0, gpu=0), LabHca("mlx5_1", rail=1, gpu=1))),
    LabNodeSpec("gpu02", gpu_count=2, hcas=(LabHca("mlx5_0", rail=0, gpu=0), LabHca("mlx5_1", rail=1, gpu=1))),
    LabNodeSpec("sm1", gpu_count=0, nvswitch=False, hcas=(LabHca("mlx5_0"),)),
]
SWITCHES = [LabSwitch("leaf1", 8), LabSwitch("leaf2", 8), LabSwitch("spine1", 8)]
CABLES = [
    LabCable("gpu01", "mlx5_0", 1, "leaf1", 1),
    LabCable("gpu02", "mlx5_0", 1, "leaf1", 2),
    LabCable("gpu01", "mlx5_1", 1, "leaf2", 1),
    LabCable("gpu02", "mlx5_1", 1, "leaf2", 2),
    LabCable("sm1", "mlx5_0", 1, "leaf1", 3),
]
UPLINKS = [LabSwitchLink("leaf1", 7, "spine1", 1), LabSwitchLink("leaf1", 8, "spine1", 2),
           LabSwitchLink("leaf2", 7, "spine1", 3), LabSwitchLink("leaf2", 8, "spine1", 4)]

SPEC = """
cluster: {name: topo, os: debian-12}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5"}
profiles:
  g: {hcas: [{device: "mlx5_[0-1]", rate: NDR}]}
  s: {hcas: [{device: mlx5_0, rate: NDR}]}
nodes:
  - {name: "gpu[01-02]", address: "10.0.0.[1-2]", profile: g}
  - {name: sm1, address: 10.0.0.9, profile: s}
switches:
  - {name: "leaf[1-2]", tier: leaf, ports: 8, uplinks: 2}
  - {name: spine1, tier: spine, ports: 8}
fabric:
  rate: NDR
  topology:
    cabling:
      - {nodes: "gpu[01-02]", hca: mlx5_0, switch: leaf1, ports: 1-2}
      - {nodes: "gpu[01-02]", hca: mlx5_1, switch: leaf2, ports: 1-2}
      - {nodes: sm1, hca: mlx5_0, switch: leaf1, ports: "3"}
"""


def _cluster(text: str) -> Cluster:
    res = load_text(text, "cluster.yaml")
    assert res.cluster is not None, [str(d) for d in res.errors]
    return res.cluster


def _tool(root: Path, name: str, *args: str, host: str = "gpu01", **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PROVISIONER_LAB_ROOT": str(root), "PROVISIONER_LAB_HOST": host,
            "PROVISIONER_LAB_SM_STALE_S": "600", **env}
    return subprocess.run([PY, str(TOOLS / name), *args], env=full, capture_output=True, text=True, timeout=60,
                          check=False)


def _sweep(root: Path, tmp: Path, conf: str = "", **env: str) -> Path:
    log = tmp / "opensm.log"
    (tmp / "opensm.conf").write_text(f"sm_priority 15\nlog_file {log}\n{conf}")
    done = _tool(root, "opensm", "-F", str(tmp / "opensm.conf"), "--once", host="sm1", **env)
    assert done.returncode == 0, done.stdout + done.stderr
    return log


@pytest.fixture()
def lab(tmp_path: Path) -> Path:
    root = tmp_path / "lab"
    hardware.write_lab_state(str(root), "topo", NODES, SWITCHES, CABLES)
    assert fromspec.write_switch_links(str(root), UPLINKS)
    return root


def _shape(line: str) -> str:
    """A line with its quoted names, GUIDs and numbers blanked: what must match the real tool's layout."""
    line = re.sub(r'"[^"]*"', '""', line)
    line = re.sub(r"generated on .*", "generated on DATE", line)
    line = re.sub(r"\b\d+x([SDQFEHNX]DR)\b", r"Nx\1", line)
    return re.sub(r"\b(0x)?[0-9a-f]*\d[0-9a-f]*\b", "N", line)


# ---------------------------------------------------------------- switch-to-switch links from the spec


def test_three_tier_example_is_cabled_like_a_fat_tree() -> None:
    cluster = _cluster((EXAMPLES / "h100-ndr-64node-3tier.yaml").read_text())
    links = fromspec.lab_switch_links(cluster)
    up = [lk for lk in links if lk.switch.startswith("leaf")]
    assert len(up) == 16 * 32 and {lk.peer for lk in up} == {f"spine{i:02d}" for i in range(1, 17)}
    assert len([lk for lk in links if lk.switch.startswith("spine")]) == 16 * 31  # each spine keeps a port back
    assert {lk.port for lk in up if lk.switch == "leaf01"} == set(range(33, 65))  # the leaf's top ports
    assert {lk.peer_port for lk in up if lk.peer == "spine01"} == set(range(1, 33))  # below the spine's uplinks
    svc = [(lk.port, lk.peer, lk.peer_port) for lk in links if lk.switch == "svcleaf"]
    assert svc == [(39, "spine01", 33), (40, "spine02", 33)]  # the service leaf lands on the spare spine ports
    ends = [(lk.switch, lk.port) for lk in links] + [(lk.peer, lk.peer_port) for lk in links]
    assert len(ends) == len(set(ends))


def test_single_tier_has_no_switch_links() -> None:
    assert fromspec.lab_switch_links(_cluster(SPEC.replace("uplinks: 2", "uplinks: 0"))) == []
    two_tier = _cluster(SPEC)
    assert [(lk.switch, lk.port, lk.peer, lk.peer_port) for lk in fromspec.lab_switch_links(two_tier)] == [
        ("leaf1", 7, "spine1", 1), ("leaf1", 8, "spine1", 2), ("leaf2", 7, "spine1", 3), ("leaf2", 8, "spine1", 4)]


def test_switch_links_survive_a_second_lab_state_write(lab: Path) -> None:
    hardware.write_lab_state(str(lab), "topo", NODES, SWITCHES, CABLES)
    assert len(labstate.load_fabric(str(lab))["switch_links"]) == 4
    assert not fromspec.write_switch_links(str(lab), UPLINKS)


def test_iblinkinfo_shows_uplinks_from_both_switches(lab: Path, tmp_path: Path) -> None:
    before = parsers.parse("iblinkinfo", _tool(lab, "iblinkinfo").stdout)["links"]
    isl = [lk for lk in before if lk["switch"] in ("leaf1", "leaf2", "spine1") and lk["peer"] in ("leaf1", "leaf2",
                                                                                                    "spine1")]
    assert len(isl) == 8 and {lk["state"] for lk in isl} == {"init"}
    assert {(lk["switch"], lk["port"], lk["peer"], lk["peer_port"]) for lk in isl} >= {
        ("leaf2", 8, "spine1", 4), ("spine1", 4, "leaf2", 8)}
    _sweep(lab, tmp_path)
    after = parsers.parse("iblinkinfo", _tool(lab, "iblinkinfo").stdout)["links"]
    up = [lk for lk in after if lk["switch"] == "spine1" and lk["peer"]]
    assert [(lk["port"], lk["state"], lk["rate_gbps"]) for lk in up] == [(p, "active", 400.0) for p in (1, 2, 3, 4)]


# ---------------------------------------------------------------- ibnetdiscover


def test_ibnetdiscover_lines_have_the_real_tools_layout(lab: Path, tmp_path: Path) -> None:
    _sweep(lab, tmp_path)
    out = _tool(lab, "ibnetdiscover").stdout
    real = (FIXTURES / "ibnetdiscover" / "topograph_ndr_qm9701_excerpt.txt").read_text().splitlines()[2:]
    real_shapes = {_shape(line) for line in real}
    sim_shapes = {_shape(line) for line in out.splitlines()}
    assert sim_shapes == real_shapes, (sim_shapes ^ real_shapes)
    assert len(real_shapes) == 14  # header, node and all three kinds of port line are compared
    assert out.endswith("\n\n") and out.startswith("#\n# Topology file: generated on ")


def test_ibnetdiscover_parses_into_the_labs_fabric(lab: Path, tmp_path: Path) -> None:
    _sweep(lab, tmp_path)
    topo = parsers.parse("ibnetdiscover", _tool(lab, "ibnetdiscover").stdout)
    assert [s["name"] for s in topo["switches"]] == ["leaf2", "spine1", "leaf1"]  # reverse discovery order
    assert topo["cas"][-1]["name"] == "gpu01 mlx5_0"  # the initiating CA comes last, as in real captures
    assert len(topo["cas"]) == 5 and len(topo["links"]) == 5 + 4
    assert topo["warnings"] == [] and topo["errors"] == []
    lids = {s["name"]: s["lid"] for s in topo["switches"]}
    assert 0 not in lids.values() and len(set(lids.values())) == 3
    spine = next(s for s in topo["switches"] if s["name"] == "spine1")
    assert spine["ports"] == [1, 2, 3, 4] and spine["num_ports"] == 8


def test_ibnetdiscover_honours_faults(lab: Path, tmp_path: Path) -> None:
    _sweep(lab, tmp_path)
    root, quiet = str(lab), {"runner": lambda _cmd: None}
    faults.inject(root, "gpu02", "port_down", device="mlx5_1", **quiet)
    faults.inject(root, "gpu01", "cables_swapped", device="mlx5_0", other_host="gpu02", other_device="mlx5_0",
                  **quiet)
    old = labstate.load_node(root, "sm1")["hcas"][0]["node_guid"]
    faults.inject(root, "sm1", "hardware_swap", **quiet)
    topo = parsers.parse("ibnetdiscover", _tool(lab, "ibnetdiscover").stdout)
    names = {c["name"]: c["guid"] for c in topo["cas"]}
    assert "gpu02 mlx5_1" not in names  # its only port is down: unreachable, not printed
    assert names["sm1 mlx5_0"] != old and names["sm1 mlx5_0"] == labstate.load_node(root, "sm1")["hcas"][0][
        "node_guid"]
    where = {lk["to_name"]: lk["from_port"] for lk in topo["links"] if lk["from_name"] == "leaf1"}
    assert (where["gpu01 mlx5_0"], where["gpu02 mlx5_0"]) == (2, 1)


def test_ibnetdiscover_without_a_linked_port_fails_like_the_real_tool(lab: Path) -> None:
    for device in ("mlx5_0", "mlx5_1"):
        faults.inject(str(lab), "gpu01", "port_down", device=device, runner=lambda _cmd: None)
    done = _tool(lab, "ibnetdiscover")
    assert done.returncode == 255 and done.stdout == ""
    assert done.stderr == "ibnetdiscover: iberror: failed: discover failed\n"
    assert _tool(lab, "ibnetdiscover", "-p").returncode == 1


def test_cabling_check_reads_ibnetdiscover_like_iblinkinfo(lab: Path, tmp_path: Path) -> None:
    _sweep(lab, tmp_path)
    cluster = _cluster(SPEC)
    for tool in ("ibnetdiscover", "iblinkinfo"):
        assert cabling.cabling_findings(cluster, parsers.parse(tool, _tool(lab, tool).stdout)) == [], tool
    faults.inject(str(lab), "gpu01", "cables_swapped", device="mlx5_0", other_host="gpu02", other_device="mlx5_0",
                  runner=lambda _cmd: None)
    faults.inject(str(lab), "sm1", "port_down", device="mlx5_0", runner=lambda _cmd: None)
    for tool in ("ibnetdiscover", "iblinkinfo"):
        found = cabling.cabling_findings(cluster, parsers.parse(tool, _tool(lab, tool).stdout))
        msgs = sorted(f.message for f in found)
        assert msgs[:2] == ["gpu01 mlx5_0: expected leaf1 port 1, found leaf1 port 2",
                            "gpu02 mlx5_0: expected leaf1 port 2, found leaf1 port 1"], tool
        assert msgs[2].startswith("sm1 mlx5_0: expected leaf1 port 3, found "), tool


def test_real_ndr_capture_maps_cas_to_leaf_ports() -> None:
    topo = parsers.parse("ibnetdiscover", load("ibnetdiscover", "topograph_ndr_qm9701_excerpt.txt"))
    leaf = topo["switches"][0]
    assert (leaf["name"], leaf["num_ports"], leaf["lid"]) == ("MF0;A09-P1-IBLEAF-04-04:MQM9701/U1", 65, 73)
    uplinks = [lk for lk in topo["links"] if lk["from_guid"] == leaf["guid"] and "IBSPINE" in str(lk["to_name"])]
    assert len(uplinks) == 16 and {lk["rate_gbps"] for lk in uplinks} == {400.0}
    assert sorted(lk["from_port"] for lk in uplinks) == list(range(35, 51))
    isolated = parsers.parse("ibnetdiscover", load("ibnetdiscover", "topograph_gb200_isolated_ca.txt"))
    assert isolated["links"] == [] and isolated["cas"][0]["ports"] == []


# ---------------------------------------------------------------- adaptive routing in the SM log


def test_nvidia_sm_logs_ar_as_the_real_one_and_the_check_sees_it_live(lab: Path, tmp_path: Path) -> None:
    text = _sweep(lab, tmp_path, "routing_engine ar_updn\n").read_text()
    assert "\nAR Manager - Configuration cycle (number 1) completed successfully\n" in text
    assert "0x02 -> osm_ucast_mgr_process: ar_updn tables configured on all switches" in text
    assert "routing engine set up" not in text  # a DEBUG line in real opensm, absent with default flags
    report = sm.routing_from_log(text)
    assert report.adaptive_routing and report.ar_cycles == 1 and report.subnet_up and report.warnings == []
    assert sm.check_adaptive_routing(report, True, ["ar_updn"]) == []


@pytest.mark.parametrize(("conf", "env"), [("routing_engine ar_updn\n", {"PROVISIONER_LAB_OPENSM_FLAVOR": "upstream"}),
                                           ("routing_engine ar_nosuch\n", {}), ("routing_engine updn\n", {})])
def test_ar_on_upstream_or_unknown_engines_is_not_reported_active(lab: Path, tmp_path: Path, conf: str,
                                                                  env: dict[str, str]) -> None:
    text = _sweep(lab, tmp_path, conf, **env).read_text()
    assert "AR Manager" not in text
    report = sm.routing_from_log(text)
    assert not report.adaptive_routing and report.subnet_up
    assert report.engine_in_use in ("minhop", "updn")
    wanted = conf.split()[1]
    assert sm.check_adaptive_routing(report, True, [wanted]), conf
