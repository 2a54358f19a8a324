"""roce_qos: its filters on real captured tool outputs, the lab's stand-in tools, and the rendered variables.

The filters decide whether the role changes a port, so they are checked on real outputs
(tests/fixtures/mlnx_qos, tests/fixtures/ibdev2netdev).  The simulated mlnx_qos/cma_roce_* must print
what the real tools print, so their output goes through the same filter and is compared line by line
with a real capture.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from provisioner.lab.hardware import LabHca, LabNodeSpec, write_lab_state
from provisioner.render import build_inventory
from provisioner.spec import load_cluster
from tests.unit._parser_fixtures import load

ROOT = Path(__file__).resolve().parents[2]
SIMTOOLS = ROOT / "provisioner" / "lab" / "simtools"
PLUGIN = ROOT / "roles" / "roce_qos" / "filter_plugins" / "roce_qos_filters.py"


def _filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location("roce_qos_filters", PLUGIN)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


F = _filters()


# ---------------------------------------------------------------- filters on real outputs


def test_mlnx_qos_capture_with_pfc_on_priority_3() -> None:
    state = F.mlnx_qos_state(load("mlnx_qos", "att_netarbiter_trust_dscp_pfc3.txt"))
    assert state == {"trust": "dscp", "pfc": [0, 0, 0, 1, 0, 0, 0, 0], "pfc_priorities": [3],
                     "dcbx": "OS controlled"}


def test_mlnx_qos_capture_with_several_pfc_priorities() -> None:
    state = F.mlnx_qos_state(load("mlnx_qos", "mellanox_doc2792_pfc_four_prios.txt"))
    assert state["trust"] == "dscp"
    assert state["pfc_priorities"] == [0, 2, 6, 7]


@pytest.mark.parametrize("text", ["", "DCBX mode: OS controlled\n", load("ibdev2netdev", "daocloud_roce_up.txt"),
                                  "Priority trust state: dscp\nPFC configuration:\n\tpriority 0 1 2 3\n"])
def test_mlnx_qos_rejects_what_it_is_not(text: str) -> None:
    with pytest.raises(F.RoceQosParseError):
        F.mlnx_qos_state(text)


def test_ibdev2netdev_captures() -> None:
    assert F.ibdev2netdev_map(load("ibdev2netdev", "daocloud_roce_up.txt")) == {
        "mlx5_0/1": "enp4s0f0np0", "mlx5_1/1": "enp4s0f1np1"}
    many = F.ibdev2netdev_map(load("ibdev2netdev", "imbue_h100_column_t.txt"))
    assert many["mlx5_1/1"] == "enp27s0f0np0" and many["mlx5_10/1"] == "ibp204s0"


def test_pfc_vector_and_port_resolution() -> None:
    assert F.pfc_vector(3) == [0, 0, 0, 1, 0, 0, 0, 0]
    assert F.pfc_vector(3, False) == [0] * 8
    with pytest.raises(F.RoceQosParseError):
        F.pfc_vector(8)
    found = {"mlx5_0/1": "enp23s0np0"}
    got = F.resolve_ports([{"device": "mlx5_0", "port": 1, "netdev": None},
                           {"device": "mlx5_1", "netdev": "enp41s0np0"}], found)
    assert got == [{"device": "mlx5_0", "port": 1, "netdev": "enp23s0np0", "discovered": "enp23s0np0"},
                   {"device": "mlx5_1", "port": 1, "netdev": "enp41s0np0", "discovered": ""}]


# ---------------------------------------------------------------- simulated tools


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    node = LabNodeSpec("roce1", gpu_count=2, hcas=(
        LabHca("mlx5_0", rail=0, gpu=0, rate_gbps=200, link_layer="Ethernet"),
        LabHca("mlx5_1", rail=1, gpu=1, rate_gbps=400),  # an InfiniBand port: no RoCE netdev
    ))
    write_lab_state(str(tmp_path), "roce", [node])
    return tmp_path


def run(lab: Path, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROVISIONER_LAB_ROOT": str(lab), "PROVISIONER_LAB_HOST": "roce1"}
    return subprocess.run([sys.executable, str(SIMTOOLS / tool), *args], capture_output=True, text=True, env=env,
                          check=False)


def test_mlnx_qos_starts_like_a_fresh_port(lab: Path) -> None:
    out = run(lab, "mlnx_qos", "-i", "enp23s0np0")
    assert out.returncode == 0, out.stderr
    assert F.mlnx_qos_state(out.stdout) == {"trust": "pcp", "pfc": [0] * 8, "pfc_priorities": [],
                                            "dcbx": "OS controlled"}


def test_mlnx_qos_keeps_state_and_prints_the_real_layout(lab: Path) -> None:
    assert run(lab, "mlnx_qos", "-i", "enp23s0np0", "--trust", "dscp").returncode == 0
    out = run(lab, "mlnx_qos", "-i", "enp23s0np0", "--pfc", "0,0,0,1,0,0,0,0")
    assert F.mlnx_qos_state(out.stdout)["pfc_priorities"] == [3]
    again = run(lab, "mlnx_qos", "-i", "enp23s0np0").stdout
    assert again == out.stdout
    # The real capture has its tabs expanded to 8 columns; every line of it that does not depend on
    # buffer support (older mlnx_qos prints no buffer rows) appears in the simulated output as well.
    real = [line for line in load("mlnx_qos", "att_netarbiter_trust_dscp_pfc3.txt").splitlines()]
    ours = [line.expandtabs(8) for line in again.splitlines()]
    assert [line for line in real if line.strip()] == [line for line in ours if not line.lstrip().startswith(
        ("Receive buffer", "buffer "))]


def test_mlnx_qos_refuses_bad_input(lab: Path) -> None:
    assert run(lab, "mlnx_qos").stdout.startswith("Interface name is required")
    assert run(lab, "mlnx_qos", "-i", "ibp23s0").returncode == 1  # no such RoCE netdev
    bad = run(lab, "mlnx_qos", "-i", "enp23s0np0", "--pfc", "0,0,1")
    assert bad.returncode == 1 and "pfc list must have 8 items" in bad.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="cma_roce_* refuse to run unless root, like the real scripts")
def test_cma_roce_tos_and_mode(lab: Path) -> None:
    assert run(lab, "cma_roce_tos", "-d", "mlx5_0", "-p", "1").stdout == "0\n"
    assert run(lab, "cma_roce_tos", "-d", "mlx5_0", "-p", "1", "-t", "104").stdout == "104\n"
    assert run(lab, "cma_roce_tos", "-d", "mlx5_0").stdout == "104\n"
    assert run(lab, "cma_roce_mode", "-d", "mlx5_0").stdout == "IB/RoCE v1\n"
    assert run(lab, "cma_roce_mode", "-d", "mlx5_0", "-p", "1", "-m", "2").stdout == "RoCE v2\n"
    assert run(lab, "cma_roce_mode", "-d", "mlx5_0").stdout == "RoCE v2\n"
    missing = run(lab, "cma_roce_tos", "-d", "mlx5_1", "-t", "104")
    assert missing.returncode == 1 and missing.stdout == "Device mlx5_1 port 1 does not exist\n"


def test_mlnx_tools_package_ships_the_stand_ins() -> None:
    from provisioner.lab.packages import VendorVersions, ofed_recipes

    tools = next(r for r in ofed_recipes(VendorVersions()) if r.name == "mlnx-tools")
    paths = {f.path: f.mode for f in tools.files}
    assert paths["/usr/bin/mlnx_qos"] == 0o755
    assert paths["/usr/sbin/cma_roce_tos"] == 0o755 and paths["/usr/sbin/cma_roce_mode"] == 0o755


# ---------------------------------------------------------------- rendering


def _allvars(spec: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    cluster, _ = load_cluster(ROOT / "examples" / spec)
    inv = build_inventory(cluster)
    return inv.groupvars["all"], inv.groupvars


def test_roce_spec_renders_the_role_vars() -> None:
    allv, groups = _allvars("roce-200g-4node.yaml")
    assert {k: v for k, v in allv.items() if k.startswith("roce_qos_")} == {
        "roce_qos_enabled": True, "roce_qos_trust": "dscp", "roce_qos_pfc_priority": 3, "roce_qos_ecn": True,
        "roce_qos_dscp": 26, "roce_qos_tos": 106, "roce_qos_mtu": 9000}
    ports = groups["profile_h100_roce"]["roce_qos_ports"]
    assert [p["device"] for p in ports] == [f"mlx5_{i}" for i in range(8)]
    assert all(p["port"] == 1 and p["netdev"] is None for p in ports)
    assert groups["profile_h100_roce"]["nccl_conf"]["NCCL_IB_GID_INDEX"] == "3"


def test_infiniband_spec_renders_no_roce_vars() -> None:
    allv, groups = _allvars("h100-ndr-8node.yaml")
    assert not [k for k in allv if k.startswith("roce_qos_")]
    assert not [k for g in groups.values() for k in g if k.startswith("roce_qos_")]
