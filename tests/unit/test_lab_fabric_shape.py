"""fabric.json as the lab writes it (hardware.write_lab_state) is what the simulated SM and MAD tools read.

The lab writer and the simulated tools were written apart; this test builds the lab state the
way ``lab_up`` does and runs the real scripts (``opensm --once``, ``iblinkinfo``, ``sminfo``)
against it, so a shape change on either side fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import parsers
from provisioner.lab import faults, hardware
from provisioner.lab.hardware import LabCable, LabHca, LabNodeSpec, LabSwitch
from provisioner.lab.simtools import labstate

TOOLS = Path(__file__).resolve().parents[2] / "provisioner" / "lab" / "simtools"
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

NODES = [
    LabNodeSpec("gpu01", gpu_count=2, hcas=(LabHca("mlx5_0", rail=0, gpu=0), LabHca("mlx5_1", rail=1, gpu=1))),
    LabNodeSpec("gpu02", gpu_count=2, hcas=(LabHca("mlx5_0", rail=0, gpu=0), LabHca("mlx5_1", rail=1, gpu=1))),
    LabNodeSpec("sm1", gpu_count=0, nvswitch=False, hcas=(LabHca("mlx5_0"),)),
]
SWITCHES = [LabSwitch("leaf1", 8), LabSwitch("leaf2", 8)]
CABLES = [
    LabCable("gpu01", "mlx5_0", 1, "leaf1", 1),
    LabCable("gpu02", "mlx5_0", 1, "leaf1", 2),
    LabCable("gpu01", "mlx5_1", 1, "leaf2", 1),
    LabCable("gpu02", "mlx5_1", 1, "leaf2", 2),
    LabCable("sm1", "mlx5_0", 1, "leaf1", 8),
]


def _tool(root: Path, name: str, *args: str, host: str = "sm1") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROVISIONER_LAB_ROOT": str(root), "PROVISIONER_LAB_HOST": host,
           "PROVISIONER_LAB_SM_STALE_S": "600"}
    return subprocess.run([PY, str(TOOLS / name), *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def _sweep_once(root: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    conf = tmp / "opensm.conf"
    conf.write_text(f"sm_priority 15\nlog_file {tmp / 'opensm.log'}\n")
    return _tool(root, "opensm", "-F", str(conf), "--once")


@pytest.fixture()
def lab(tmp_path: Path) -> Path:
    root = tmp_path / "lab"
    hardware.write_lab_state(str(root), "shape", NODES, SWITCHES, CABLES)
    return root


def test_fabric_json_has_the_documented_shape(lab: Path) -> None:
    fabric = labstate.load_fabric(str(lab))
    assert set(fabric) == {"cluster", "subnet_prefix", "nodes", "switches", "cables", "sm", "link_model"}
    assert {tuple(sorted(s)) for s in fabric["switches"]} == {("description", "guid", "name", "ports")}
    assert [s["description"] for s in fabric["switches"]] == ["leaf1", "leaf2"]
    assert fabric["cables"][0] == {"node": "gpu01", "device": "mlx5_0", "port": 1, "switch": "leaf1",
                                   "switch_port": 1}


def test_opensm_sweeps_the_lab_written_fabric(lab: Path, tmp_path: Path) -> None:
    done = _sweep_once(lab, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lids = set()
    for host in ("gpu01", "gpu02", "sm1"):
        for hca in labstate.load_node(str(lab), host)["hcas"]:
            assert hca["state"] == "active", (host, hca["device"])
            lids.add(hca["lid"])
    assert len(lids) == 5 and 0 not in lids
    sm_port = labstate.load_node(str(lab), "sm1")["hcas"][0]
    ibstat_text = (lab / "nodes/gpu01/sys/class/infiniband/mlx5_0/ports/1/sm_lid").read_text()
    assert int(ibstat_text, 16) == sm_port["lid"]
    master = json.loads((lab / "sm" / "sm.json").read_text())
    assert (master["host"], master["state"], master["lid"]) == ("sm1", "master", sm_port["lid"])


def test_uncabled_port_stays_init_when_cabling_is_declared(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    hardware.write_lab_state(str(root), "shape", NODES, SWITCHES, CABLES[:-2] + CABLES[-1:])
    assert _sweep_once(root, tmp_path).returncode == 0
    ports = {h["device"]: h["state"] for h in labstate.load_node(str(root), "gpu02")["hcas"]}
    assert ports == {"mlx5_0": "active", "mlx5_1": "init"}


def test_no_declared_cabling_means_every_linked_port_is_cabled(tmp_path: Path) -> None:
    root = tmp_path / "lab"
    hardware.write_lab_state(str(root), "shape", NODES)
    assert labstate.load_fabric(str(root))["cables"] == []
    assert _sweep_once(root, tmp_path).returncode == 0
    states = {h["state"] for n in ("gpu01", "gpu02") for h in labstate.load_node(str(root), n)["hcas"]}
    assert states == {"active"}


def test_iblinkinfo_shows_lab_cabling_and_a_swap(lab: Path, tmp_path: Path) -> None:
    assert _sweep_once(lab, tmp_path).returncode == 0
    out = _tool(lab, "iblinkinfo", host="gpu01").stdout
    links = parsers.parse("iblinkinfo", out)
    assert links, out
    assert 'Switch: 0x' in out and " leaf1:" in out
    assert '"leaf1"' in out and '"gpu02 mlx5_0"' in out
    before = [line for line in out.splitlines() if line.strip().startswith(tuple("0123456789")) and
              '"gpu02 mlx5_0"' in line]
    assert before and all("   2[  ]" in line for line in before), before
    faults.inject(str(lab), "gpu01", "cables_swapped", device="mlx5_0", other_host="gpu02",
                  other_device="mlx5_0", runner=lambda _cmd: None)
    swapped = _tool(lab, "iblinkinfo", host="gpu01").stdout
    assert swapped != out
    cable = next(c for c in labstate.load_fabric(str(lab))["cables"] if c["node"] == "gpu01"
                 and c["device"] == "mlx5_0")
    assert cable["switch_port"] == 2
