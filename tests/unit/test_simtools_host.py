"""Host-side simulated tools: run the scripts against a temp lab root and check the formats."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SIMTOOLS = Path(__file__).resolve().parents[2] / "provisioner" / "lab" / "simtools"


def _node(numa_split: int = 4, nvswitch: bool = True) -> dict[str, Any]:
    gpus = [
        {
            "index": i,
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": f"00000000:{0x18 + 16 * i:02X}:00.0",
            "uuid": f"GPU-5b6f6d1e-1111-2222-3333-00000000000{i}",
            "serial": f"16523220123{i:02d}",
            "memory_mib": 81559,
            "numa_node": 0 if i < numa_split else 1,
            "present": True,
        }
        for i in range(8)
    ]
    hcas = [
        {
            "device": f"mlx5_{i}",
            "port": 1,
            "rail": i,
            "gpu": i,
            "numa_node": 0 if i < numa_split else 1,
            "pci": f"0000:{0x17 + 16 * i:02x}:00.0",
            "ca_type": "MT4129",
            "fw_ver": "28.39.1002",
            "netdev": f"ibp{0x17 + 16 * i}s0",
            "link_layer": "InfiniBand",
            "state": "active",
            "phys_state": "linkup",
        }
        for i in range(8)
    ]
    return {"hostname": "gpu01", "reachable": True, "gpus": gpus, "hcas": hcas, "nvswitch": nvswitch, "faults": []}


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    (tmp_path / "root/nodes/gpu01").mkdir(parents=True)
    (tmp_path / "root/nodes/gpu01/node.json").write_text(json.dumps(_node()))
    lib = tmp_path / "sys/usr/lib/provisioner-lab"
    lib.mkdir(parents=True)
    (lib / "nvidia-driver.version").write_text(json.dumps({"version": "550.90.07", "cuda": "12.4", "flavor": "open"}))
    (lib / "dcgm.version").write_text(json.dumps({"version": "3.3.9"}))
    (tmp_path / "sys/var/run").mkdir(parents=True)
    (tmp_path / "sys/var/run/nvhostengine.pid").write_text(f"{os.getpid()}\n")  # a live process: the host engine
    (lib / "ofed.version").write_text(
        json.dumps(
            {"kind": "doca", "version": "24.10-1.1.4.0", "packages": {"ofed-scripts": "24.10.OFED.24.10.1.1.4.0-1"}}
        )
    )
    return tmp_path


def run(lab: Path, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PROVISIONER_LAB_ROOT": str(lab / "root"),
        "PROVISIONER_LAB_HOST": "gpu01",
        "PROVISIONER_LAB_SYSROOT": str(lab / "sys"),
    }
    return subprocess.run(
        [sys.executable, str(SIMTOOLS / tool), *args], capture_output=True, text=True, env=env, check=False
    )


def test_scripts_are_executable_stdlib_python() -> None:
    for tool in ("nvidia-smi", "ofed_info", "ibdev2netdev"):
        path = SIMTOOLS / tool
        assert path.read_text().startswith("#!/usr/bin/python3\n")
        assert os.access(path, os.X_OK)


def test_nvidia_smi_table_has_the_r550_geometry(lab: Path) -> None:
    out = run(lab, "nvidia-smi")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert re.match(r"\| NVIDIA-SMI 550\.90\.07 +Driver Version: 550\.90\.07 +CUDA Version: 12\.4 +\|$", lines[2])
    # Every table line is 91 columns, cells 41/24/22 wide, like the real R550 output.
    assert {len(line) for line in lines[1:]} == {91}
    rows = [line for line in lines if "NVIDIA H100 80GB HBM3" in line]
    assert len(rows) == 8
    assert [len(cell) for cell in rows[0].split("|")] == [0, 41, 24, 22, 0]
    assert "00000000:18:00.0" in rows[0] and "81559MiB" in out.stdout


def test_nvidia_smi_list_and_query(lab: Path) -> None:
    listing = run(lab, "nvidia-smi", "-L").stdout.splitlines()
    assert listing[0] == "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5b6f6d1e-1111-2222-3333-000000000000)"
    q = run(
        lab, "nvidia-smi", "--query-gpu=name,driver_version,memory.total,pci.bus_id,uuid,serial", "--format=csv"
    ).stdout.splitlines()
    assert q[0] == "name, driver_version, memory.total [MiB], pci.bus_id, uuid, serial"
    assert q[1].split(", ")[:4] == ["NVIDIA H100 80GB HBM3", "550.90.07", "81559 MiB", "00000000:18:00.0"]
    bare = run(lab, "nvidia-smi", "--query-gpu=memory.total,serial", "--format=csv,noheader,nounits")
    assert bare.stdout.splitlines()[0] == "81559, 1652322012300"
    bad = run(lab, "nvidia-smi", "--query-gpu=bogus", "--format=csv")
    assert bad.returncode == 2 and 'Field "bogus" is not a valid field to query.' in bad.stdout


def test_nvidia_smi_topo_matrix_from_placement(lab: Path) -> None:
    out = run(lab, "nvidia-smi", "topo", "-m").stdout
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in out.splitlines() if line.startswith(("GPU", "NIC"))}
    header = out.splitlines()[0].split("\t")[1:]
    gpu0 = dict(zip(header, rows["GPU0"], strict=False))
    assert gpu0["GPU0"] == " X " and gpu0["GPU1"] == "NV18"
    assert gpu0["NIC0"] == "PIX" and gpu0["NIC1"] == "NODE" and gpu0["NIC4"] == "SYS"
    assert gpu0["CPU Affinity"] == "0-47,96-143" and gpu0["NUMA Affinity"] == "0"
    assert "  NIC7: mlx5_7" in out and "  NV#  = Connection traversing a bonded set of # NVLinks" in out


def test_nvidia_smi_without_nvswitch_uses_pcie_paths(lab: Path) -> None:
    (lab / "root/nodes/gpu01/node.json").write_text(json.dumps(_node(nvswitch=False)))
    out = run(lab, "nvidia-smi", "topo", "-m").stdout
    gpu0 = out.splitlines()[1].split("\t")
    assert gpu0[2] == "NODE" and gpu0[5] == "SYS"


def test_nvidia_smi_fails_like_the_real_one(lab: Path) -> None:
    (lab / "root/nodes/gpu01/modules.json").write_text(json.dumps({"loaded": ["mlx5_core"]}))
    out = run(lab, "nvidia-smi")
    assert out.returncode == 9 and "couldn't communicate with the NVIDIA driver" in out.stdout
    (lab / "root/nodes/gpu01/modules.json").write_text(json.dumps({"loaded": ["nvidia", "mlx5_core"]}))
    assert run(lab, "nvidia-smi", "-L").returncode == 0
    node = _node()
    for gpu in node["gpus"]:
        gpu["present"] = False
    (lab / "root/nodes/gpu01/node.json").write_text(json.dumps(node))
    gone = run(lab, "nvidia-smi")
    assert gone.returncode == 6 and gone.stdout == "No devices were found\n"
    (lab / "sys/usr/lib/provisioner-lab/nvidia-driver.version").unlink()
    assert run(lab, "nvidia-smi").returncode == 9


def test_nvidia_smi_q_keys(lab: Path) -> None:
    out = run(lab, "nvidia-smi", "-q").stdout
    assert "==============NVSMI LOG==============" in out
    assert re.search(r"^Driver Version +: 550\.90\.07$", out, re.M)
    assert re.search(r"^    GPU UUID +: GPU-5b6f6d1e-1111-2222-3333-000000000000$", out, re.M)
    assert out.count("Product Name") == 8


def test_nvidia_smi_q_fabric_and_nvlink_status_follow_nvswitch_and_nvlink_down(lab: Path) -> None:
    from provisioner.parsers.nvidia_query import parse_nvidia_smi_fabric

    gpus = parse_nvidia_smi_fabric(run(lab, "nvidia-smi", "-q").stdout)["gpus"]
    assert len(gpus) == 8 and {(g["state"], g["status"]) for g in gpus} == {("Completed", "Success")}
    node = _node()
    node["nvlink_down"] = [2]
    (lab / "root/nodes/gpu01/node.json").write_text(json.dumps(node))
    status = run(lab, "nvidia-smi", "nvlink", "-s").stdout
    assert "GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-5b6f6d1e-1111-2222-3333-000000000002)\n\t Link 0: <inactive>\n" \
        in status
    assert status.count("<inactive>") == 1 and status.count("\t Link 17: 26.562 GB/s") == 8
    gpus = parse_nvidia_smi_fabric(run(lab, "nvidia-smi", "-q").stdout)["gpus"]
    assert {(g["state"], g["status"]) for g in gpus} == {("Completed", "Success")}  # the fabric stays trained
    (lab / "root/nodes/gpu01/node.json").write_text(json.dumps(_node(nvswitch=False)))
    gpus = parse_nvidia_smi_fabric(run(lab, "nvidia-smi", "-q").stdout)["gpus"]
    assert {(g["state"], g["status"]) for g in gpus} == {("N/A", "N/A")}


def test_dcgmi_without_a_driver_prints_dcgmis_no_host_engine_lines(lab: Path) -> None:
    assert run(lab, "dcgmi", "diag", "-r", "1").returncode == 0
    (lab / "sys/usr/lib/provisioner-lab/nvidia-driver.version").unlink()
    done = run(lab, "dcgmi", "diag", "-r", "1")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == ("Error: Unable to connect to host engine. Host engine connection "
                                            "invalid/disconnected.")
    assert run(lab, "dcgmi", "diag").returncode == 2  # no level: usage


def test_ofed_info_forms(lab: Path) -> None:
    assert run(lab, "ofed_info", "-s").stdout == "OFED-internal-24.10-1.1.4.0:\n"
    assert run(lab, "ofed_info", "-n").stdout == "24.10-1.1.4.0\n"
    (lab / "sys/usr/lib/provisioner-lab/ofed.version").write_text(
        json.dumps({"kind": "mlnx", "version": "5.8-3.0.7.0", "packages": {}})
    )
    assert run(lab, "ofed_info", "-s").stdout == "MLNX_OFED_LINUX-5.8-3.0.7.0:\n"
    assert run(lab, "ofed_info").stdout.startswith("MLNX_OFED_LINUX-5.8-3.0.7.0 (OFED-5.8-3.0.7):\n")
    (lab / "sys/usr/lib/provisioner-lab/ofed.version").unlink()
    assert run(lab, "ofed_info", "-s").returncode == 127


def test_ibdev2netdev_plain_and_verbose(lab: Path) -> None:
    node = _node()
    node["hcas"][2]["state"] = "init"
    node["hcas"].extend(dict(node["hcas"][0], device=f"mlx5_{i}", netdev=f"ibp{200 + i}s0") for i in (10, 11))
    (lab / "root/nodes/gpu01/node.json").write_text(json.dumps(node))
    plain = run(lab, "ibdev2netdev").stdout.splitlines()
    assert plain[0] == "mlx5_0 port 1 ==> ibp23s0 (Up)"
    assert [line.split()[0] for line in plain[:4]] == ["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_11"]  # ls order
    assert "mlx5_2 port 1 ==> ibp55s0 (Down)" in plain
    verbose = run(lab, "ibdev2netdev", "-v").stdout.splitlines()
    assert verbose[0] == "0000:17:00.0 mlx5_0 (MT4129 - NA)  fw 28.39.1002 port 1 (ACTIVE) ==> ibp23s0 (Up)"
    assert "port 1 (INIT  ) ==> ibp55s0 (Down)" in "\n".join(verbose)
    pattern = re.compile(r"^(\S+) port (\d+) ==> (\S+) \((Up|Down)\)$")
    assert all(pattern.match(line) for line in plain)


def test_outputs_parse_with_project_parsers(lab: Path) -> None:
    parsers = pytest.importorskip("provisioner.parsers")
    parse = parsers.parse
    topo = parse("nvidia-smi-topo", run(lab, "nvidia-smi", "topo", "-m").stdout)
    assert topo["nic_names"]["NIC0"] == "mlx5_0" and len(topo["gpus"]) == 8
    for args in (("-s",), ()):
        ofed = parse("ofed_info", run(lab, "ofed_info", *args).stdout)
        assert ofed["version"] == "24.10-1.1.4.0" and ofed["family"] == "doca_ofed"
    for args in ((), ("-v",)):
        maps = parse("ibdev2netdev", run(lab, "ibdev2netdev", *args).stdout)["mappings"]
        assert maps[0] == {"device": "mlx5_0", "port": 1, "netdev": "ibp23s0", "netdev_up": True,
                           "pci": "0000:17:00.0" if args else None}
        assert len(maps) == 8


def test_dcgmi_answers_only_while_the_host_engine_runs_and_reports_the_installed_dcgm(lab: Path) -> None:
    healthy = run(lab, "dcgmi", "diag", "-r", "1")
    assert healthy.returncode == 0
    assert "| DCGM Version              | 3.3.9" in healthy.stdout
    (lab / "sys/usr/lib/provisioner-lab/dcgm.version").write_text(json.dumps({"version": "3.3.8"}))
    assert "| DCGM Version              | 3.3.8" in run(lab, "dcgmi", "diag", "-r", "1").stdout
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout
    pid_file = lab / "sys/var/run/nvhostengine.pid"
    for stopped in (dead, None):  # a PID file naming a process that ended, then none at all (nvidia-dcgm stopped)
        if stopped is None:
            pid_file.unlink()
        else:
            pid_file.write_text(stopped)
        done = run(lab, "dcgmi", "diag", "-r", "1")
        assert done.returncode == 1
        assert done.stdout.splitlines()[-1] == ("Error: Unable to connect to host engine. Host engine connection "
                                                "invalid/disconnected.")


def test_nv_hostengine_keeps_one_instance_through_its_pid_file_and_removes_it_when_stopped(lab: Path) -> None:
    pid_file = lab / "sys/var/run/nvhostengine.pid"
    pid_file.unlink()
    env = {**os.environ, "PROVISIONER_LAB_SYSROOT": str(lab / "sys")}
    engine = Path(__file__).resolve().parents[2] / "provisioner/lab/packages/files/nv-hostengine"
    proc = subprocess.Popen([sys.executable, str(engine), "-n", "--service-account", "nvidia-dcgm"], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "DCGM initialized\n"
        assert proc.stdout.readline() == "Started host engine version 3.3.9 using port number: 5555\n"
        assert pid_file.read_text() == f"{proc.pid}\n"
        assert run(lab, "dcgmi", "diag", "-r", "1").returncode == 0
        second = subprocess.run([sys.executable, str(engine), "-n"], env=env, capture_output=True, text=True,
                                check=False)
        assert (second.returncode, second.stderr) == (1, f"Host engine already running with pid {proc.pid}\n")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0 and not pid_file.exists()
    assert run(lab, "dcgmi", "diag", "-r", "1").returncode == 1
