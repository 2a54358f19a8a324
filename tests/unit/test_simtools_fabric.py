"""The lab's simulated fabric tools, run as subprocesses against a temporary lab root.

Each test builds its own lab root (node.json / fabric.json / modules.json written with
labstate) and points the scripts at it with PROVISIONER_LAB_ROOT; PROVISIONER_LAB_HOST
picks the node a process plays.  Waits poll a condition with a generous deadline; no
assertion depends on timing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from provisioner.lab import packages
from provisioner.lab.simtools import fabsim_nccl, fabsim_sm, labstate

TOOLS = Path(__file__).resolve().parents[2] / "provisioner" / "lab" / "simtools"
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def hca(i: int, host_no: int, **over: Any) -> dict[str, Any]:
    guid = f"0xa088c203{host_no:04x}{i:04x}"
    base = {
        "device": f"mlx5_{i}",
        "port": 1,
        "rail": i,
        "gpu": i,
        "numa_node": 0,
        "pci": f"0000:{0x17 + i:02x}:00.0",
        "ca_type": "MT4129",
        "board_id": "MT_0000000838",
        "fw_ver": "28.39.1002",
        "hw_rev": "0x0",
        "node_guid": guid,
        "sys_image_guid": guid,
        "port_guid": guid,
        "netdev": f"ibp{i}s0",
        "link_layer": "InfiniBand",
        "rate_gbps": 400,
        "width": "4X",
        "speed": "NDR",
        "state": "init",
        "phys_state": "linkup",
        "lid": 0,
        "sm_lid": 0,
        "bw_factor": 1.0,
        "flapping": False,
    }
    base.update(over)
    return base


def make_node(
    root: Path,
    host: str,
    host_no: int,
    nrails: int = 2,
    ngpus: int = 2,
    modules: tuple[str, ...] = ("mlx5_core", "nvidia_peermem"),
    **over: Any,
) -> dict[str, Any]:
    node = {
        "hostname": host,
        "reachable": True,
        "nvswitch": True,
        "nvlink_gbps": 450.0,  # the catalog's H100-SXM5-80GB figure, as hardware.node_state writes it
        "faults": [],
        "gpus": [
            {
                "index": g,
                "name": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": f"00000000:{0x18 + g:02x}:00.0",
                "present": True,
            }
            for g in range(ngpus)
        ],
        "hcas": [hca(i, host_no, **over) for i in range(nrails)],
    }
    labstate.save_node(str(root), node)
    labstate.save_modules(str(root), host, list(modules))
    return node


@pytest.fixture()
def lab(tmp_path: Path) -> Path:
    return build_lab(tmp_path)


def build_lab(tmp_path: Path) -> Path:
    """Two nodes, two leaves, a driver and NCCL installed, an empty /etc per node (the ``lab`` fixture)."""
    root = tmp_path / "lab"
    make_node(root, "gpu01", 1)
    make_node(root, "gpu02", 2)
    cables = [
        {"node": h, "device": f"mlx5_{i}", "port": 1, "switch": f"leaf0{i}", "switch_port": n}
        for n, h in enumerate(["gpu01", "gpu02"], start=1)
        for i in range(2)
    ]
    switches = [
        {"name": f"leaf0{i}", "guid": f"0x0c42a1030000{i:04x}", "ports": 2, "description": f"MF0;leaf0{i}:MQM9700/U1"}
        for i in range(2)
    ]
    labstate.save_fabric(str(root), {"cluster": "t", "switches": switches, "cables": cables})
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / "nvidia-driver.version").write_text("550.90.07\n")
    (libdir / "nccl.version").write_text('{"version": "2.21.5", "cuda": "12.4"}\n')
    for host in ("gpu01", "gpu02"):
        (tmp_path / "sysroot" / host / "etc").mkdir(parents=True)
    return root


def env_for(lab: Path, host: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "NCCL_", "PROVISIONER_"))}
    env.update(
        PROVISIONER_LAB_ROOT=str(lab),
        PROVISIONER_LAB_HOST=host,
        PROVISIONER_LAB_LIBDIR=str(lab.parent / "lib"),
        PROVISIONER_LAB_RUN_ID="run-1",
        PROVISIONER_LAB_SYSROOT=str(lab.parent / "sysroot" / host),
        PROVISIONER_LAB_NCCL_WAIT_S="20",
        PATH=f"{TOOLS}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    )
    env.update(extra)
    return env


def run_tool(lab: Path, host: str, tool: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, str(TOOLS / tool), *args], env=env_for(lab, host, **extra), capture_output=True, text=True, timeout=60
    )


def set_port(lab: Path, host: str, index: int, **fields: Any) -> None:
    node = labstate.load_node(str(lab), host)
    node["hcas"][index].update(fields)
    labstate.save_node(str(lab), node)


def activate_all(lab: Path) -> None:
    for host in ("gpu01", "gpu02"):
        node = labstate.load_node(str(lab), host)
        for i, port in enumerate(node["hcas"]):
            port.update(state="active", lid=10 * int(host[-1]) + i, sm_lid=1)
        labstate.save_node(str(lab), node)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def perftest_pair(
    lab: Path, server_args: list[str], client_args: list[str], tool: str = "ib_write_bw", **extra: str
) -> tuple[subprocess.CompletedProcess[str], ...]:
    port = str(free_port())
    server = subprocess.Popen(
        [PY, str(TOOLS / tool), "-p", port, *server_args],
        env=env_for(lab, "gpu01", **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = run_tool(
        lab, "gpu02", tool, "-p", port, *client_args, "127.0.0.1", PROVISIONER_LAB_PERFTEST_RETRY_S="20", **extra
    )
    try:
        out, err = server.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        out, err = server.communicate()
    return subprocess.CompletedProcess(server.args, server.returncode, out, err), client


ROW = re.compile(r"^ (\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", re.M)


# ---------------------------------------------------------------- ib_write_bw


def test_write_bw_ndr_pair_reports_line_rate(lab: Path) -> None:
    activate_all(lab)
    server, client = perftest_pair(
        lab,
        ["-d", "mlx5_0", "-F", "--report_gbits"],
        ["-d", "mlx5_0", "-F", "--report_gbits", "-s", "65536", "-n", "5000"],
    )
    assert client.returncode == 0, client.stderr
    assert server.returncode == 0, server.stderr
    assert "* Waiting for client to connect... *" in server.stdout
    assert "RDMA_Write BW Test" in client.stdout
    assert " local address: LID 0x14 QPN " in client.stdout
    assert " remote address: LID 0x0a QPN " in client.stdout
    assert "BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]" in client.stdout
    rows = ROW.findall(client.stdout)
    assert len(rows) == 1
    size, iters, _peak, avg, rate = rows[0]
    assert (size, iters) == ("65536", "5000")
    assert 388.0 < float(avg) < 396.0
    assert abs(float(rate) - float(avg) * 1e9 / 8 / 65536 / 1e6) < 0.01
    assert ROW.findall(server.stdout)[0][3] == avg  # both sides print the same measurement


def test_write_bw_slow_link_and_degraded_width(lab: Path) -> None:
    activate_all(lab)
    set_port(lab, "gpu01", 0, bw_factor=0.5)
    set_port(lab, "gpu02", 0, rate_gbps=200, width="2X")
    _server, client = perftest_pair(lab, ["-d", "mlx5_0", "--report_gbits"], ["-d", "mlx5_0", "--report_gbits"])
    assert client.returncode == 0, client.stderr
    avg = float(ROW.findall(client.stdout)[0][3])
    assert 192.0 < avg < 200.0  # min(400 x 0.5, 200) x 0.98


def test_write_bw_all_sizes_mb_units_small_sizes_rate_limited(lab: Path) -> None:
    activate_all(lab)
    _server, client = perftest_pair(lab, ["-d", "mlx5_1", "-a"], ["-d", "mlx5_1", "-a"], tool="ib_read_bw")
    assert client.returncode == 0, client.stderr
    assert "RDMA_Read BW Test" in client.stdout
    assert "BW average[MB/sec]" in client.stdout
    rows = ROW.findall(client.stdout)
    assert [int(r[0]) for r in rows] == [2**k for k in range(1, 24)]
    assert float(rows[0][3]) < 10.0  # 2-byte messages are message-rate bound
    assert 46000 < float(rows[-1][3]) < 47500  # 392 Gb/s in MiB/s


def test_write_bw_server_port_down_fails_like_perftest(lab: Path) -> None:
    activate_all(lab)
    set_port(lab, "gpu01", 0, state="down", phys_state="polling")
    result = run_tool(lab, "gpu01", "ib_write_bw", "-d", "mlx5_0")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [" Port number 1 state is Down", " Couldn't set the link layer"]


def test_write_bw_missing_device(lab: Path) -> None:
    result = run_tool(lab, "gpu01", "ib_write_bw", "-d", "mlx5_7")
    assert result.returncode == 1
    assert "IB device mlx5_7 not found" in result.stderr
    assert " Unable to find the Infiniband/RoCE device" in result.stderr


def test_write_bw_client_without_server(lab: Path) -> None:
    activate_all(lab)
    port = free_port()
    result = run_tool(lab, "gpu02", "ib_write_bw", "-p", str(port), "127.0.0.1", PROVISIONER_LAB_PERFTEST_RETRY_S="0")
    assert result.returncode == 1
    assert f"Couldn't connect to 127.0.0.1:{port}" in result.stderr
    assert "Unable to init the socket connection" in result.stderr


def cuda_build(lab: Path, version: str = "25.10.0-0.128", dmabuf: bool = True) -> Path:
    """A CUDA-enabled perftest stand-in, written the way the lab's ``perftest-cuda`` package writes it."""
    bindir = lab.parent / f"perftest-cuda-{version}-{int(dmabuf)}"
    bindir.mkdir(exist_ok=True)
    text = packages.perftest_tool_text({"version": version, "cuda": True, "cuda_dmabuf": dmabuf})
    tool = bindir / "ib_write_bw"
    tool.write_text(text)
    tool.chmod(0o755)
    return tool


def driver_flavor(lab: Path, flavor: str) -> None:
    """The version file the stand-in driver package writes (JSON with the module flavour)."""
    (lab.parent / "lib" / "nvidia-driver.version").write_text(
        json.dumps({"version": "550.90.07", "cuda": "12.4", "flavor": flavor}) + "\n")


def test_stock_write_bw_rejects_use_cuda_like_debian_perftest(lab: Path) -> None:
    # Debian bookworm's perftest 4.5+0.17 is built without CUDA_H_PATH: --use_cuda is not in its getopt table.
    activate_all(lab)
    result = run_tool(lab, "gpu02", "ib_write_bw", "-d", "mlx5_0", "--use_cuda=0", "127.0.0.1")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "ib_write_bw: unrecognized option '--use_cuda=0'",
        " Invalid Command or flag.",
        " Please check command line and run again.",
        "",
        " Parser function exited with Error",
    ]
    assert result.stdout.startswith("Usage:\n  ib_write_bw            start a server and wait for connection\n")
    assert "--use_cuda" not in result.stdout and "initializing CUDA" not in result.stdout


def test_help_lists_cuda_options_only_in_a_cuda_build(lab: Path) -> None:
    stock = run_tool(lab, "gpu01", "ib_write_bw", "--help")
    assert stock.returncode == 1 and stock.stderr == ""  # HELP_EXIT: perftest's main returns FAILURE
    assert "  -d, --ib-dev=<dev>  Use IB device <dev> (default first device found)" in stock.stdout
    assert "--use_cuda" not in stock.stdout
    cuda = subprocess.run([PY, str(cuda_build(lab)), "--help"], env=env_for(lab, "gpu01", PYTHONPATH=str(TOOLS)),
                          capture_output=True, text=True, timeout=60)
    assert "      --use_cuda=<cuda device id> Use CUDA specific device for GPUDirect RDMA testing" in cuda.stdout
    assert "      --use_cuda_dmabuf Use CUDA DMA-BUF for GPUDirect RDMA testing" in cuda.stdout
    no_dmabuf = subprocess.run([PY, str(cuda_build(lab, dmabuf=False)), "--help"],
                               env=env_for(lab, "gpu01", PYTHONPATH=str(TOOLS)), capture_output=True, text=True,
                               timeout=60)
    assert "--use_cuda=<cuda device id>" in no_dmabuf.stdout and "--use_cuda_dmabuf" not in no_dmabuf.stdout


def test_newer_release_without_cuda_says_unsupported_memory_type(lab: Path) -> None:
    # From 23.07 on the memory-type options are always parsed; a build without CUDA refuses them afterwards.
    tool = lab.parent / "ib_write_bw"
    tool.write_text(packages.perftest_tool_text({"version": "24.10.0-0.66", "cuda": False}))
    result = subprocess.run([PY, str(tool), "--use_cuda=0"], env=env_for(lab, "gpu01", PYTHONPATH=str(TOOLS)),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stdout == " Unsupported memory type\n"
    assert result.stderr == " Parser function exited with Error\n"


def run_cuda(lab: Path, host: str, tool: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, str(tool), *args], env=env_for(lab, host, PYTHONPATH=str(TOOLS), **extra),
                          capture_output=True, text=True, timeout=60)


def test_write_bw_cuda_needs_peermem(lab: Path) -> None:
    activate_all(lab)
    labstate.save_modules(str(lab), "gpu02", ["mlx5_core"])
    port = free_port()
    result = run_cuda(lab, "gpu02", cuda_build(lab), "--use_cuda=0", "-p", str(port), "127.0.0.1")
    assert result.returncode == 1
    # perftest issue #346 (a 25.x build without nvidia_peermem and without --use_cuda_dmabuf)
    assert result.stderr.splitlines()[:4] == [
        "Couldn't allocate MR with error=14", "failed to create mr", "Failed to create MR",
        " Couldn't create IB resources"]
    assert "initializing CUDA" in result.stdout


def test_write_bw_cuda_gdr_slightly_lower(lab: Path) -> None:
    activate_all(lab)
    tool = str(cuda_build(lab))
    _s, plain = perftest_pair(lab, ["--report_gbits"], ["--report_gbits"])
    _s, gdr = perftest_pair(lab, ["--report_gbits", "--use_cuda=0"], ["--report_gbits", "--use_cuda=1"],
                            tool=tool, PYTHONPATH=str(TOOLS))
    assert gdr.returncode == 0, gdr.stderr
    assert "Picking device No. 1" in gdr.stdout
    assert float(ROW.findall(gdr.stdout)[0][3]) < float(ROW.findall(plain.stdout)[0][3])


def test_write_bw_cuda_dmabuf_needs_open_modules_and_kernel_5_12_not_peermem(lab: Path) -> None:
    activate_all(lab)
    tool = str(cuda_build(lab))
    for host in ("gpu01", "gpu02"):
        labstate.save_modules(str(lab), host, ["mlx5_core", "nvidia"])  # no nvidia_peermem
    driver_flavor(lab, "open")
    dmabuf = ["--report_gbits", "--use_cuda=0", "--use_cuda_dmabuf"]
    _s, ok = perftest_pair(lab, dmabuf, dmabuf, tool=tool, PYTHONPATH=str(TOOLS))
    assert ok.returncode == 0, ok.stderr
    assert 380 < float(ROW.findall(ok.stdout)[0][3]) < 392
    # without --use_cuda_dmabuf the same node needs nvidia_peermem
    _s, peer = perftest_pair(lab, dmabuf[:2], dmabuf[:2], tool=tool, PYTHONPATH=str(TOOLS))
    assert peer.returncode == 1 and "Couldn't allocate MR with error=14" in peer.stderr
    # perftest issue #336: --use_cuda_dmabuf before --use_cuda is refused by the parser
    order = run_cuda(lab, "gpu02", Path(tool), "--use_cuda_dmabuf", "--use_cuda=0", "127.0.0.1")
    assert order.returncode == 1
    assert order.stderr.splitlines() == [
        "CUDA DMA-BUF cannot be used without CUDA", " Parser function exited with Error"]
    # proprietary modules: the GPU does not report CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (cuda_memory.c)
    driver_flavor(lab, "proprietary")
    prop = run_cuda(lab, "gpu02", Path(tool), *dmabuf, "127.0.0.1")
    assert prop.returncode == 1
    assert prop.stderr.splitlines() == [
        "DMA-BUF is not supported on this GPU", "Failed to init memory", " Couldn't create IB resources"]
    # a kernel older than 5.12 has no dma-buf memory registration in ib_uverbs
    driver_flavor(lab, "open")
    node = labstate.load_node(str(lab), "gpu02")
    node["kernel"] = "5.10.0-28-amd64"
    labstate.save_node(str(lab), node)
    old = run_cuda(lab, "gpu02", Path(tool), *dmabuf, "127.0.0.1")
    assert old.returncode == 1
    assert old.stderr.splitlines()[:4] == [
        "Couldn't allocate MR with error=93", "failed to create mr", "Failed to create MR",
        " Couldn't create IB resources"]


def test_write_bw_flapping_port_fails_deterministically(lab: Path) -> None:
    activate_all(lab)
    set_port(lab, "gpu02", 0, flapping=True)
    outcomes = {}
    for run in ("r1", "r2", "r3", "r4", "r5", "r6"):
        _s, client = perftest_pair(lab, [], [], PROVISIONER_LAB_RUN_ID=run)
        outcomes[run] = client.returncode
        if client.returncode:
            assert "Failed status 12" in client.stderr
    assert set(outcomes.values()) == {0, 1}  # intermittent across runs
    _s, again = perftest_pair(lab, [], [], PROVISIONER_LAB_RUN_ID="r1")
    assert again.returncode == outcomes["r1"]  # but the same run id replays the same outcome


# ---------------------------------------------------------------- all_reduce_perf


NCCL_ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+float\s+sum\s+-1\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+0\s", re.M)


def avg_busbw(text: str) -> float:
    match = re.search(r"^# Avg bus bandwidth    : ([\d.]+) $", text, re.M)
    assert match, text
    return float(match.group(1))


def shim_agent(lab: Path) -> Path:
    """An rsh agent for tests: runs the remote command here, playing the named host (its own sysroot)."""
    agent = lab.parent / "lab-rsh"
    agent.write_text(
        "#!/bin/sh\nhost=\"$1\"; shift\n"
        f"PROVISIONER_LAB_HOST=\"$host\" PROVISIONER_LAB_SYSROOT=\"{lab.parent}/sysroot/$host\" exec sh -c \"$*\"\n"
    )
    agent.chmod(0o755)
    return agent


def mpirun(lab: Path, *args: str, hosts: str = "gpu01:2,gpu02:2", **extra: str) -> subprocess.CompletedProcess[str]:
    """The stand-in mpirun on gpu01, reaching gpu02 through the test agent (as --mca plm_rsh_agent)."""
    argv = [PY, str(TOOLS / "mpirun"), "--allow-run-as-root", "--mca", "plm_rsh_agent", str(shim_agent(lab)),
            "-H", hosts, *args]
    return subprocess.run(argv, env=env_for(lab, "gpu01", **extra), capture_output=True, text=True, timeout=120)


def conf(lab: Path, host: str, text: str, where: str = "etc/nccl.conf") -> None:
    path = lab.parent / "sysroot" / host / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


PERF = ("all_reduce_perf", "-b", "8G", "-e", "8G", "-g", "1")


def test_all_reduce_two_nodes_format_and_bandwidth(lab: Path) -> None:
    activate_all(lab)
    result = mpirun(lab, "all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "# nThread 1 nGpus 1 minBytes 1073741824 maxBytes 8589934592 step: 2(factor)"
        " warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0"
    )
    assert lines.count(lines[0]) == 1  # one MPI job: rank 0 alone prints
    ranks = [line for line in lines if line.startswith("#  Rank ")]
    assert len(ranks) == 4
    assert re.match(r"#  Rank  2 Group  0 Pid +\d+ on      gpu02 device  0 \[0x18\] NVIDIA H100", ranks[2])
    assert "on      gpu02 device  1 [0x19]" in ranks[3]
    assert (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong"
    ) in lines
    rows = NCCL_ROW.findall(result.stdout)
    assert [int(r[0]) for r in rows] == [2**30, 2**31, 2**32, 2**33]
    assert "# Out of bounds values : 0 OK" in lines
    # 2 rails x 400 Gb/s x 0.94 = 94 GB/s per node; large sizes approach it.
    assert 90.0 < float(rows[-1][4]) < 96.0
    assert 85.0 < avg_busbw(result.stdout) < 96.0


def test_nccl_ib_hca_is_parsed_like_net_ib() -> None:
    node = {"hcas": [
        {"device": d, "port": 1, "state": "active", "phys_state": "linkup", "link_layer": "InfiniBand"}
        for d in ("mlx5_0", "mlx5_1", "mlx5_10", "mlx5_2")
    ]}

    def chosen(value: str | None) -> list[str]:
        settings = {} if value is None else {"NCCL_IB_HCA": value}
        return [h["device"] for h in fabsim_nccl.select_hcas(node, settings)]

    assert chosen(None) == ["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_2"]
    # one '=' for the whole list: "=mlx5_1" is taken as a device name and matches nothing
    assert chosen("=mlx5_0:1,=mlx5_1:1,=mlx5_2:1") == ["mlx5_0"]
    assert chosen("=mlx5_0:1,mlx5_1:1,mlx5_2:1") == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert chosen("mlx5_1") == ["mlx5_1", "mlx5_10"]  # a prefix without '='
    assert chosen("^mlx5_1") == ["mlx5_0", "mlx5_2"]
    assert chosen("^=mlx5_1") == ["mlx5_0", "mlx5_10", "mlx5_2"]
    assert chosen("=mlx5_0:2") == []  # port given and wrong
    assert chosen("") == ["mlx5_0", "mlx5_1", "mlx5_10", "mlx5_2"]
    node["hcas"][0]["state"] = "init"
    assert chosen("=mlx5_0") == []  # only Active ports
    assert chosen(None) and fabsim_nccl.select_hcas(node, {"NCCL_IB_DISABLE": "1"}) == []


def test_nccl_settings_come_from_env_then_user_file_then_etc(lab: Path, tmp_path: Path, monkeypatch: Any) -> None:
    sysroot = tmp_path / "sysroot" / "gpu01"
    monkeypatch.setenv("PROVISIONER_LAB_SYSROOT", str(sysroot))
    home = Path(fabsim_nccl.pwd.getpwuid(os.getuid()).pw_dir)
    conf(lab, "gpu01", "NCCL_IB_HCA=etc\nNCCL_IB_TC=106\n# NCCL_DEBUG=INFO\nno equals sign\n")
    conf(lab, "gpu01", "NCCL_IB_HCA=home\nNCCL_IB_GID_INDEX=3\n", str(home / ".nccl.conf").lstrip("/"))
    conf(lab, "gpu01", "NCCL_IB_HCA=custom\n", "opt/custom.conf")
    got = fabsim_nccl.nccl_settings({"NCCL_IB_TC": "41"}, "2.21.5")
    assert (got["NCCL_IB_HCA"], got["NCCL_IB_TC"], got["NCCL_IB_GID_INDEX"]) == ("home", "41", "3")
    assert got["# NCCL_DEBUG"] == "INFO"  # setEnvFile has no comments
    # NCCL_CONF_FILE replaces ~/.nccl.conf from NCCL 2.23 on; 2.21 ignores it
    assert fabsim_nccl.nccl_settings({"NCCL_CONF_FILE": "/opt/custom.conf"}, "2.21.5")["NCCL_IB_HCA"] == "home"
    newer = fabsim_nccl.nccl_settings({"NCCL_CONF_FILE": "/opt/custom.conf"}, "2.23.4")
    assert newer["NCCL_IB_HCA"] == "custom" and "NCCL_IB_GID_INDEX" not in newer
    assert fabsim_nccl.nccl_settings({"NCCL_IB_HCA": ""}, "2.21.5")["NCCL_IB_HCA"] == ""  # set, even empty


def test_all_reduce_carries_traffic_only_on_the_hcas_nccl_selects(lab: Path) -> None:
    activate_all(lab)
    for host in ("gpu01", "gpu02"):  # how provision render wrote NCCL_IB_HCA before
        conf(lab, host, "NCCL_IB_HCA==mlx5_0:1,=mlx5_1:1\n")
    old = mpirun(lab, "-x", "NCCL_DEBUG=INFO", "-x", "NCCL_DEBUG_SUBSYS=INIT,NET", *PERF)
    assert old.returncode == 0, old.stderr
    for host in ("gpu01", "gpu02"):
        conf(lab, host, "NCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n")
    new = mpirun(lab, "-x", "NCCL_DEBUG=INFO", "-x", "NCCL_DEBUG_SUBSYS=INIT,NET", *PERF)
    assert new.returncode == 0, new.stderr
    assert 0.45 < avg_busbw(old.stdout) / avg_busbw(new.stdout) < 0.55
    using = re.compile(r"^(gpu0\d):\d+:\d+ \[\d\] NCCL INFO NET/IB : Using (.*) ; OOB \S+:\S+<0>$", re.M)
    assert sorted(using.findall(old.stdout)) == [("gpu01", "[0]mlx5_0:1/IB")] * 2 + [("gpu02", "[0]mlx5_0:1/IB")] * 2
    assert {u for _, u in using.findall(new.stdout)} == {"[0]mlx5_0:1/IB [1]mlx5_1:1/IB"}
    assert "NCCL INFO NCCL_IB_HCA set to =mlx5_0:1,mlx5_1:1" in new.stdout
    assert new.stdout.count("NCCL version 2.21.5+cuda12.4") == 1
    quiet = mpirun(lab, *PERF)  # NCCL_DEBUG unset: no INFO lines
    assert " NCCL INFO " not in quiet.stdout and avg_busbw(quiet.stdout) == pytest.approx(avg_busbw(new.stdout), 0.05)
    conf(lab, "gpu02", "NCCL_IB_HCA=mlx5_9\n")  # matches nothing on gpu02: sockets
    sock = mpirun(lab, "-x", "NCCL_DEBUG=INFO", *PERF)
    assert "gpu02" in sock.stdout and "NCCL INFO NET/IB : No device found." in sock.stdout
    assert avg_busbw(sock.stdout) < 2.0


def test_all_reduce_rail_down_and_no_peermem_lower(lab: Path) -> None:
    activate_all(lab)
    full = avg_busbw(mpirun(lab, *PERF).stdout)
    set_port(lab, "gpu02", 1, state="down", phys_state="polling")
    one_rail = avg_busbw(mpirun(lab, *PERF).stdout)
    assert 0.45 < one_rail / full < 0.55
    set_port(lab, "gpu02", 1, state="active", phys_state="linkup")
    labstate.save_modules(str(lab), "gpu01", ["mlx5_core"])
    no_gdr = avg_busbw(mpirun(lab, *PERF).stdout)
    assert 0.45 < no_gdr / full < 0.55


def test_all_reduce_slow_nccl_with_healthy_links(lab: Path) -> None:
    """Lab fault nccl_slow: the run that includes the node reads x factor; its ports stay as they were."""
    activate_all(lab)
    full = avg_busbw(mpirun(lab, *PERF).stdout)
    node = labstate.load_node(str(lab), "gpu02")
    node["nccl_factor"] = 0.6
    labstate.save_node(str(lab), node)
    slow = avg_busbw(mpirun(lab, *PERF).stdout)
    assert 0.55 < slow / full < 0.65


def test_all_reduce_reports_the_tune_knobs_taken_and_they_change_nothing(lab: Path) -> None:
    """provision tune's knobs: each rank says it took them (NCCL's INFO ENV lines, a period after integers) and,
    with no public source for their effect on a cluster like the lab's, the bus bandwidth is the defaults'."""
    from provisioner.fabric import tune

    activate_all(lab)
    base = avg_busbw(mpirun(lab, *PERF).stdout)
    knobs = ("-x", "NCCL_DEBUG=INFO", "-x", "NCCL_DEBUG_SUBSYS=INIT,NET,ENV", "-x", "NCCL_ALGO=Tree",
             "-x", "NCCL_IB_QPS_PER_CONNECTION=4")
    result = mpirun(lab, *knobs, *PERF)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^\S+:\d+:\d+ \[\d+\] NCCL INFO NCCL_IB_QPS_PER_CONNECTION set by environment to 4\.$",
                     result.stdout, re.M), result.stdout
    assert tune.taken(result.stdout) == {"NCCL_ALGO": "Tree", "NCCL_IB_QPS_PER_CONNECTION": "4"}
    assert avg_busbw(result.stdout) == base


def test_all_reduce_started_by_srun_with_pmix_is_one_job_and_without_pmi_aborts(lab: Path) -> None:
    """A step of ``srun --mpi=pmix --ntasks-per-node=2`` over gpu01-02: each task has what slurmstepd's PMIx server
    gives it (tests/fixtures/slurm/srun_pmix_env.txt): one job of 4 ranks. Without PMIx, MPI_Init aborts."""
    activate_all(lab)
    procs = []
    for rank in range(4):
        host = "gpu01" if rank < 2 else "gpu02"
        step = {"PMIX_RANK": str(rank), "PMIX_NAMESPACE": "slurm.pmix.7.0", "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank % 2), "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
                "SLURM_STEP_ID": "0", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
        procs.append(subprocess.Popen([PY, str(TOOLS / "all_reduce_perf"), *PERF[1:]], env=env_for(lab, host, **step),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [e for _, e in outs]
    table = outs[0][0]
    assert sorted(int(r) for r in re.findall(r"^#\s+Rank\s+(\d+) ", table, re.M)) == [0, 1, 2, 3]
    assert avg_busbw(table) > 40.0 and all("#  Rank" not in o for o, _ in outs[1:])
    bare = run_tool(lab, "gpu01", *PERF, SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_NTASKS="2")
    assert bare.returncode == 1 and bare.stdout == ""
    assert 'The application appears to have been direct launched using "srun",' in bare.stderr
    assert re.search(r"^\[gpu01:\d+\] OPAL ERROR: Unreachable in file ext3x_client.c at line 111$", bare.stderr, re.M)


def test_all_reduce_without_launcher_is_one_process_on_one_node(lab: Path) -> None:
    activate_all(lab)
    result = run_tool(lab, "gpu01", "all_reduce_perf", "-b", "8G", "-e", "8G", "-g", "2")
    assert result.returncode == 0, result.stderr
    assert sum(1 for line in result.stdout.splitlines() if line.startswith("#  Rank ")) == 2
    assert "gpu02" not in result.stdout
    assert 360.0 < avg_busbw(result.stdout) < 380.0  # NCCL's effective 370 of H100's 450 (nccl-tests #212)
    one = run_tool(lab, "gpu01", "all_reduce_perf", "-b", "8G", "-e", "8G", "-g", "1")
    assert avg_busbw(one.stdout) == 0.0  # one rank: nothing to reduce across
    missing = run_tool(lab, "gpu01", "all_reduce_perf", "-g", "4")
    assert missing.returncode == 1 and "invalid device ordinal" in missing.stderr


def test_all_reduce_fails_on_flapping_rail_and_without_driver_or_nccl(lab: Path) -> None:
    activate_all(lab)
    set_port(lab, "gpu02", 0, flapping=True)
    codes = set()
    for run in ("a", "b", "c", "d", "e", "f"):
        res = mpirun(lab, "all_reduce_perf", "-g", "1", PROVISIONER_LAB_RUN_ID=run)
        codes.add(res.returncode)
        if res.returncode:
            assert "NCCL WARN NET/IB : Got completion from peer" in res.stderr
            assert "Test NCCL failure" in res.stderr
            assert "mpirun detected that one or more processes exited with non-zero status" in res.stderr
        if codes == {0, 1}:
            break
    assert codes == {0, 1}
    (lab.parent / "lib" / "nvidia-driver.version").unlink()
    res = run_tool(lab, "gpu01", "all_reduce_perf")
    assert res.returncode == 1
    assert "Test CUDA failure" in res.stderr
    (lab.parent / "lib" / "nccl.version").unlink()
    res = run_tool(lab, "gpu01", "all_reduce_perf")
    assert res.returncode == 127 and "libnccl.so.2: cannot open shared object file" in res.stderr


def test_all_reduce_pkey_index_must_name_a_shared_partition(lab: Path) -> None:
    activate_all(lab)
    for host in ("gpu01", "gpu02"):
        node = labstate.load_node(str(lab), host)
        for port in node["hcas"]:
            port["pkeys"] = ["0x7fff", "0x8001"]  # limited member of the default partition, full of 0x8001
        labstate.save_node(str(lab), node)
    default = mpirun(lab, "all_reduce_perf", "-g", "1")
    assert default.returncode == 1 and "Got completion from peer" in default.stderr  # two limited members
    assert mpirun(lab, "-x", "NCCL_IB_PKEY=1", "all_reduce_perf", "-g", "1").returncode == 0
    bad = mpirun(lab, "-x", "NCCL_IB_PKEY=5", "all_reduce_perf", "-g", "1")
    assert bad.returncode == 1 and "Call to ibv_modify_qp failed with error Invalid argument" in bad.stderr


# ---------------------------------------------------------------- the stand-in mpirun (Open MPI 4.1)


def test_mpirun_refuses_root_without_the_flag(lab: Path) -> None:
    argv = [PY, str(TOOLS / "mpirun"), "-np", "1", "true"]
    res = subprocess.run(argv, env=env_for(lab, "gpu01"), capture_output=True, text=True, timeout=30)
    if os.geteuid() != 0:
        pytest.skip("needs root to see the refusal")
    assert res.returncode == 1 and "mpirun has detected an attempt to run as root" in res.stderr
    ok = subprocess.run(argv, env=env_for(lab, "gpu01", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"),
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr


def test_mpirun_hostfile_slots_mapping_and_env(lab: Path) -> None:
    hostfile = lab.parent / "hosts"
    hostfile.write_text("# two nodes\ngpu01 slots=2\ngpu02 slots=2 max_slots=2\n")
    show = ["sh", "-c", 'echo "$PROVISIONER_LAB_HOST $OMPI_COMM_WORLD_RANK/$OMPI_COMM_WORLD_SIZE'
            ' $OMPI_COMM_WORLD_LOCAL_RANK/$OMPI_COMM_WORLD_LOCAL_SIZE $PMIX_NAMESPACE $FROM_X $OMPI_MCA_a_b"']
    res = mpirun(lab, "--hostfile", str(hostfile), "-x", "FROM_X=yes", "--mca", "a_b", "c", *show, hosts="x")
    assert res.returncode == 0, res.stderr
    got = sorted(line.split() for line in res.stdout.splitlines())
    assert [g[:3] for g in got] == [["gpu01", "0/4", "0/2"], ["gpu01", "1/4", "1/2"],
                                    ["gpu02", "2/4", "0/2"], ["gpu02", "3/4", "1/2"]]
    assert len({g[3] for g in got}) == 1 and {g[4] for g in got} == {"yes"} and {g[5] for g in got} == {"c"}
    ppr = mpirun(lab, "--hostfile", str(hostfile), "--map-by", "ppr:1:node", *show, hosts="x")
    assert sorted(line.split()[:2] for line in ppr.stdout.splitlines()) == [["gpu01", "0/2"], ["gpu02", "1/2"]]
    too_many = mpirun(lab, "--hostfile", str(hostfile), "-np", "5", "true", hosts="x")
    assert too_many.returncode == 1 and "There are not enough slots available in the system" in too_many.stderr
    npernode = mpirun(lab, "-N", "1", "-np", "3", "true")
    assert npernode.returncode == 1 and "more processes than the ppr" in npernode.stderr


def test_mpirun_reports_daemons_that_cannot_start_and_failing_ranks(lab: Path) -> None:
    agent = lab.parent / "refuse"
    agent.write_text("#!/bin/sh\necho 'Host key verification failed.' >&2\nexit 255\n")
    agent.chmod(0o755)
    argv = [PY, str(TOOLS / "mpirun"), "--allow-run-as-root", "--mca", "plm_rsh_agent", str(agent),
            "-H", "gpu01,gpu02", "true"]
    res = subprocess.run(argv, env=env_for(lab, "gpu01"), capture_output=True, text=True, timeout=30)
    assert res.returncode == 1
    assert "Host key verification failed." in res.stderr and "ORTE was unable to reliably start" in res.stderr
    fail = mpirun(lab, "sh", "-c", 'exit "$OMPI_COMM_WORLD_RANK"', hosts="gpu01,gpu02")
    assert fail.returncode == 1 and "Process name: [[" in fail.stderr and "Exit code:    1" in fail.stderr


def test_nccl_sizes_and_time_format() -> None:
    opts = fabsim_nccl.parse_args(["-b", "8", "-e", "64", "-f", "2"])
    assert fabsim_nccl.sizes(opts) == [8, 16, 32, 64]
    assert fabsim_nccl.fmt_time(12.9) == "  12.90"
    assert fabsim_nccl.fmt_time(1806.7) == " 1806.7"
    assert fabsim_nccl.fmt_time(10094.2) == "  10094"


# ---------------------------------------------------------------- opensm, sminfo, saquery, iblinkinfo


def wait_for(predicate: Any, deadline_s: float = 30.0) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def start_sm(lab: Path, host: str, conf: str, **extra: str) -> subprocess.Popen[str]:
    path = lab.parent / f"opensm-{host}.conf"
    path.write_text(conf)
    env = env_for(lab, host, PROVISIONER_LAB_SM_TICK_S="0.1", PROVISIONER_LAB_SM_STALE_S="0.6", **extra)
    return subprocess.Popen(
        [PY, str(TOOLS / "opensm"), "-F", str(path), "-f", str(lab.parent / f"{host}.log")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def sm_master(lab: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((lab / "sm" / "sm.json").read_text())
    except (OSError, ValueError):
        return {}
    return data


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=10)


def test_opensm_election_sweep_and_failover(lab: Path) -> None:
    g1 = labstate.load_node(str(lab), "gpu01")["hcas"][0]["port_guid"]
    g2 = labstate.load_node(str(lab), "gpu02")["hcas"][0]["port_guid"]
    low = start_sm(lab, "gpu02", f"guid {g2}\nsm_priority 10\nrouting_engine ar_updn\n")
    high = start_sm(lab, "gpu01", f"guid {g1}\nsm_priority 14\nrouting_engine ar_updn\n")
    try:
        assert wait_for(lambda: sm_master(lab).get("guid") == f"0x{int(g1, 16):016x}")
        assert sm_master(lab)["routing_engine"] == "ar_updn"
        assert wait_for(
            lambda: all(
                p["state"] == "active" for h in ("gpu01", "gpu02") for p in labstate.load_node(str(lab), h)["hcas"]
            )
        )
        node = labstate.load_node(str(lab), "gpu02")
        master_lid = sm_master(lab)["lid"]
        assert {p["sm_lid"] for p in node["hcas"]} == {master_lid}
        lids = {p["port_guid"]: p["lid"] for h in ("gpu01", "gpu02") for p in labstate.load_node(str(lab), h)["hcas"]}
        assert len(set(lids.values())) == 4  # unique LIDs
        sysfs = lab / "nodes" / "gpu02" / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
        assert (sysfs / "state").read_text() == "4: ACTIVE\n"
        info = run_tool(lab, "gpu02", "sminfo", PROVISIONER_LAB_SM_STALE_S="5")
        assert re.fullmatch(
            rf"sminfo: sm lid {master_lid} sm guid 0x{int(g1, 16):x}, activity count \d+ priority 14"
            r" state 3 SMINFO_MASTER\n",
            info.stdout,
        ), info

        def saquery() -> str:
            return run_tool(lab, "gpu02", "saquery", "SMIR", PROVISIONER_LAB_SM_STALE_S="5").stdout

        # The loser notices on its next sweep that it is standby.
        assert wait_for(lambda: "SMState...............2" in saquery())
        sa = subprocess.CompletedProcess([], 0, saquery(), "")
        assert sa.stdout.count("SMInfoRecord dump:") == 2
        assert "\t\tPriority..............10\n\t\tSMState...............2\n" in sa.stdout, sa.stdout
        high.kill()  # master dies without a word: the standby takes over once its heartbeat is stale
        high.wait(timeout=10)
        assert wait_for(lambda: sm_master(lab).get("guid") == f"0x{int(g2, 16):016x}")
        assert wait_for(
            lambda: {p["sm_lid"] for p in labstate.load_node(str(lab), "gpu01")["hcas"]} == {sm_master(lab)["lid"]}
        )
        # LIDs are stable per port GUID across the failover.
        assert {
            p["port_guid"]: p["lid"] for h in ("gpu01", "gpu02") for p in labstate.load_node(str(lab), h)["hcas"]
        } == lids
    finally:
        stop(low)
        stop(high)
    log = (lab.parent / "gpu02.log").read_text()
    assert "0x80 -> Entering STANDBY state" in log and "0x80 -> Entering MASTER state" in log


def test_opensm_bad_key_and_value_logged_like_real_one(lab: Path) -> None:
    conf = "bogus_key 1\nsm_priority 99\nlmc abc\n"
    path = lab.parent / "bad.conf"
    path.write_text(conf)
    res = run_tool(lab, "gpu01", "opensm", "-F", str(path), "-o", "-f", str(lab.parent / "o.log"))
    assert res.returncode == 0, res.stderr
    assert ' Unrecognized token: "bogus_key"' in res.stdout
    assert " Invalid Cached Option Value:sm_priority = 99:Using Default:0" in res.stdout
    assert "-E- Parsing error in field lmc, expected numeric input received: abc" in res.stdout
    assert sm_master(lab)["priority"] == 0


def test_opensm_unknown_guid_exits_and_upstream_has_no_ar(lab: Path) -> None:
    path = lab.parent / "g.conf"
    path.write_text("guid 0x1234\n")
    res = run_tool(lab, "gpu01", "opensm", "-F", str(path), "-f", str(lab.parent / "g.log"))
    assert res.returncode == 255
    assert "Error from osm_opensm_bind" in res.stdout
    path.write_text("routing_engine ar_updn\nenable_inc_mc_routing TRUE\n")
    res = run_tool(
        lab,
        "gpu01",
        "opensm",
        "-F",
        str(path),
        "-o",
        "-f",
        str(lab.parent / "u.log"),
        PROVISIONER_LAB_OPENSM_FLAVOR="upstream",
    )
    assert "OpenSM 3.3.23" in res.stdout
    assert ' Unrecognized token: "enable_inc_mc_routing"' in res.stdout
    assert sm_master(lab)["routing_engine"] == "minhop"
    assert "cannot find or setup routing engine 'ar_updn'" in (lab.parent / "u.log").read_text()


def sm_record(lab: Path, host: str) -> dict[str, Any]:
    """The heartbeat record of the SM running on ``host`` (empty when none)."""
    guid = f"0x{int(labstate.load_node(str(lab), host)['hcas'][0]['port_guid'], 16):016x}"
    try:
        data: dict[str, Any] = json.loads((lab / "sm" / f"{guid}.json").read_text())
    except (OSError, ValueError):
        return {}
    return data


def ticks_pass(lab: Path, host: str, count: int = 3) -> bool:
    """Wait until the SM on ``host`` has run ``count`` more sweeps (its activity count moved on)."""
    start = int(sm_record(lab, host).get("activity_count", 0))
    return wait_for(lambda: int(sm_record(lab, host).get("activity_count", 0)) >= start + count)


def test_opensm_sighup_rereads_partitions_and_only_runtime_options(lab: Path) -> None:
    """SIGHUP = heavy sweep: partitions.conf re-read, opensm.conf rescanned for can_update options only."""
    g1 = labstate.load_node(str(lab), "gpu01")["hcas"][0]["port_guid"]
    parts = lab.parent / "partitions.conf"
    parts.write_text("Default=0x7fff, ipoib : ALL=full ;\n")
    base = f"guid {g1}\nsm_priority 10\nlmc 0\nrouting_engine updn\npartition_config_file {parts}\n"
    proc = start_sm(lab, "gpu01", base)
    try:
        assert wait_for(lambda: sm_record(lab, "gpu01").get("state") == "master")
        assert wait_for(lambda: (lab / "sm" / "partitions.json").exists())
        parts.write_text("Default=0x7fff, ipoib : ALL=full ;\ntenant=0x8001 : ALL=full ;\n")
        assert ticks_pass(lab, "gpu01")  # light sweeps do not read partitions.conf
        assert [p["name"] for p in json.loads((lab / "sm" / "partitions.json").read_text())] == ["Default"]
        conf = lab.parent / "opensm-gpu01.conf"
        conf.write_text(base.replace("sm_priority 10", "sm_priority 12").replace("lmc 0", "lmc 1")
                        .replace("routing_engine updn", "routing_engine ar_updn"))
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: [p["name"] for p in json.loads((lab / "sm" / "partitions.json").read_text())]
                        == ["Default", "tenant"])
        assert wait_for(lambda: sm_record(lab, "gpu01").get("priority") == 12)
        record = sm_record(lab, "gpu01")
        assert record["routing_engine"] == "ar_updn"  # NVIDIA's opensm takes a new engine on HUP
        assert fabsim_sm.config_drift(record["config"], conf.read_text(), upstream=False) == ["lmc"]
        hist = fabsim_sm.load_history(str(lab))
        assert hist["reloads"] == {record["guid"]: 1} and hist["restarts"] == {}
        assert hist["mastership_changes"] == 0
        assert proc.poll() is None  # HUP does not end the daemon
    finally:
        stop(proc)
    log = (lab.parent / "gpu01.log").read_text()
    assert log.count("-> SUBNET UP") == 2 and "0x02 -> SUBNET UP" in log
    assert "0x02 -> osm_ucast_mgr_process: ar_updn tables configured on all switches" in log


def test_upstream_opensm_keeps_its_routing_engine_on_sighup(lab: Path) -> None:
    g1 = labstate.load_node(str(lab), "gpu01")["hcas"][0]["port_guid"]
    up = {"PROVISIONER_LAB_OPENSM_FLAVOR": "upstream"}
    proc = start_sm(lab, "gpu01", f"guid {g1}\nrouting_engine minhop\n", **up)
    try:
        assert wait_for(lambda: sm_record(lab, "gpu01").get("state") == "master")
        conf = lab.parent / "opensm-gpu01.conf"
        conf.write_text(f"guid {g1}\nrouting_engine updn\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: fabsim_sm.load_history(str(lab))["reloads"])
        assert ticks_pass(lab, "gpu01", 1)
        record = sm_record(lab, "gpu01")
        assert record["routing_engine"] == "minhop"  # can_update 0 in osm_subnet.c: a restart is needed
        assert fabsim_sm.config_drift(record["config"], conf.read_text(), upstream=True) == ["routing_engine"]
    finally:
        stop(proc)


def test_default_routing_engine_is_the_builds_own(lab: Path) -> None:
    """No routing_engine: NVIDIA's opensm (5.10 on) routes with ar_updn, upstream with minhop."""
    path = lab.parent / "none.conf"
    path.write_text("sm_priority 1\n")
    for env, engine in (({}, "ar_updn"), ({"PROVISIONER_LAB_OPENSM_FLAVOR": "upstream"}, "minhop")):
        res = run_tool(lab, "gpu01", "opensm", "-F", str(path), "-o", "-f", str(lab.parent / "d.log"), **env)
        assert res.returncode == 0, res.stderr
        assert sm_master(lab)["routing_engine"] == engine
    (lab.parent / "lib" / "opensm.version").write_text("5.9.0.MLNX20210617.e0fd7ba\n")
    run_tool(lab, "gpu01", "opensm", "-F", str(path), "-o", "-f", str(lab.parent / "d.log"))
    assert sm_master(lab)["routing_engine"] == "minhop"


def test_history_counts_restarts_mastership_changes_and_outages(lab: Path) -> None:
    g1 = labstate.load_node(str(lab), "gpu01")["hcas"][0]["port_guid"]
    g2 = labstate.load_node(str(lab), "gpu02")["hcas"][0]["port_guid"]
    master_conf, standby_conf = f"guid {g1}\nsm_priority 14\n", f"guid {g2}\nsm_priority 10\n"
    high = start_sm(lab, "gpu01", master_conf)
    assert wait_for(lambda: sm_record(lab, "gpu01").get("state") == "master")
    low = start_sm(lab, "gpu02", standby_conf)
    try:
        assert wait_for(lambda: sm_record(lab, "gpu02").get("state") == "standby")
        stop(low)  # standby first ...
        low = start_sm(lab, "gpu02", standby_conf)
        assert wait_for(lambda: sm_record(lab, "gpu02").get("state") == "standby")
        stop(high)  # ... then the master: the standby takes over, the master takes back
        assert wait_for(lambda: sm_master(lab).get("guid") == sm_record(lab, "gpu02").get("guid"))
        high = start_sm(lab, "gpu01", master_conf)
        assert wait_for(lambda: sm_master(lab).get("guid") == sm_record(lab, "gpu01").get("guid"))
        hist = fabsim_sm.load_history(str(lab))
        guids = {h: sm_record(lab, h)["guid"] for h in ("gpu01", "gpu02")}
        assert hist["restarts"] == {guids["gpu01"]: 1, guids["gpu02"]: 1}
        assert hist["mastership_changes"] == 2 and hist["outages"] == 0
        order = [(e["host"], e["event"]) for e in hist["events"] if e["event"] in ("start", "stop")]
        assert order[2:] == [("gpu02", "stop"), ("gpu02", "start"), ("gpu01", "stop"), ("gpu01", "start")]
    finally:
        stop(low)
        stop(high)
    assert fabsim_sm.load_history(str(lab))["outages"] == 1  # the last SM to stop leaves the fabric without one


def test_sminfo_without_sm_times_out(lab: Path) -> None:
    res = run_tool(lab, "gpu01", "sminfo")
    assert res.returncode == 255
    assert res.stderr.endswith("sminfo: iberror: failed: query\n")


def test_iblinkinfo_shows_cabling_and_down_port(lab: Path) -> None:
    activate_all(lab)
    set_port(lab, "gpu02", 1, state="down", phys_state="polling")
    text = run_tool(lab, "gpu01", "iblinkinfo").stdout
    assert "CA: gpu01 mlx5_0:" in text
    assert re.search(
        r"^      0xa088c20300010000     10    1\[  \] ==\( 4X        106.25 Gbps Active/  LinkUp\)==>"
        r"\s+0    1\[  \] \"MF0;leaf00:MQM9700/U1\" \( \)$",
        text,
        re.M,
    ), text
    assert '==(                Down/ Polling)==>             [  ] "" ( )' in text
    assert "Switch: 0x0c42a10300000001 MF0;leaf01:MQM9700/U1:" in text


def test_partitions_parse() -> None:
    parts = fabsim_sm.parse_partitions("Default=0x7fff, ipoib : ALL=full;\nstorage=0x8001 : 0xa088=full, ALL;\n")
    assert parts[0] == {"name": "Default", "pkey": "0x7fff", "members": [{"member": "ALL", "membership": "full"}]}
    assert parts[1]["members"][1] == {"member": "ALL", "membership": "limited"}


def test_election_rule() -> None:
    recs = [{"guid": "0x20", "priority": 5}, {"guid": "0x10", "priority": 5}, {"guid": "0x30", "priority": 1}]
    assert fabsim_sm.elect(recs) == {"guid": "0x10", "priority": 5}
    assert fabsim_sm.elect([*recs, {"guid": "0x99", "priority": 15}])["guid"] == "0x99"  # type: ignore[index]


# ---------------------------------------------------------------- the product's parsers read these outputs


def test_outputs_parse_with_product_parsers(lab: Path) -> None:
    parsers = pytest.importorskip("provisioner.parsers")
    activate_all(lab)
    _s, client = perftest_pair(lab, ["--report_gbits"], ["--report_gbits"])
    perf = parsers.parse("perftest", client.stdout)
    assert perf["ok"] and 388.0 < perf["bw_avg_gbps"] < 396.0
    nccl = mpirun(lab, "-x", "NCCL_DEBUG=INFO", *PERF)
    assert parsers.parse("nccl-tests", nccl.stdout)["avg_busbw_gbs"] == avg_busbw(nccl.stdout)
    assert parsers.parse("iblinkinfo", run_tool(lab, "gpu01", "iblinkinfo").stdout)
    text = "sminfo: sm lid 1 sm guid 0xa088c20300010000, activity count 5 priority 14 state 3 SMINFO_MASTER\n"
    record = {"lid": 1, "guid": "0xa088c20300010000", "activity_count": 5, "priority": 14, "state": "master"}
    assert fabsim_sm.sminfo_text(1, [record]) == text.rstrip("\n")
    assert parsers.parse("sminfo", text)


def test_sm_programs_pkey_tables_from_partitions_conf(lab: Path) -> None:
    text = ("Default=0x7fff, ipoib : ALL=limited, SELF=full ;\n"
            "training=0x0001, ipoib : 0xa088c20300010000=full, 0xa088c20300020000=full, 0xa088c20300020001=limited ;\n")
    parts = fabsim_sm.parse_partitions(text)
    assert fabsim_sm.pkey_table(parts, "0xa088c20300010000", False) == ["0x7fff", "0x8001"]
    assert fabsim_sm.pkey_table(parts, "0xa088c20300020001", False) == ["0x7fff", "0x0001"]
    assert fabsim_sm.pkey_table(parts, "0x1", True) == ["0xffff"]
    fabsim_sm.sweep(str(lab), 1, {}, ("gpu01", "mlx5_0", 1), parts)
    def pkeys(host: str, dev: str) -> list[str]:
        base = lab / "nodes" / host / "sys" / "class" / "infiniband" / dev / "ports" / "1" / "pkeys"
        return [(base / str(i)).read_text().strip() for i in range(len(list(base.iterdir())))]

    assert pkeys("gpu01", "mlx5_0") == ["0xffff", "0x8001"]  # the SM's own port: SELF=full
    assert pkeys("gpu02", "mlx5_1") == ["0x7fff", "0x0001"] and pkeys("gpu01", "mlx5_1") == ["0x7fff"]


def test_single_node_all_reduce_follows_the_catalog_nvlink_figure_and_nvlink_down() -> None:
    """One node's GPUs alone: the catalog's NVLink figure x NCCL's ring efficiency; a GPU with an NVLink down takes
    the ring over PCIe (the simulator's worst case, docs/lab-hardware-model.md); nccl_slow leaves NVLink alone."""
    from provisioner.lab import hardware

    assert hardware.nvlink_gbps("NVIDIA H100 80GB HBM3") == 450.0 and hardware.nvlink_gbps("NVIDIA L40S") == 0.0
    assert hardware.node_state("c", hardware.LabNodeSpec("gpu01"))["nvlink_gbps"] == 450.0  # the lab's default H100
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "present": True}] * 8
    node = {"nvswitch": True, "nvlink_gbps": 450.0, "gpus": gpus}
    records = [{"host": "gpu01", "ngpus": 8}]
    healthy = fabsim_nccl.peak_busbw(records, {"gpu01": node}, {})
    assert healthy == pytest.approx(450.0 * fabsim_nccl.NVLINK_RING_EFFICIENCY) and 365 < healthy < 375
    a100 = fabsim_nccl.peak_busbw(records, {"gpu01": {**node, "nvlink_gbps": 300.0}}, {})
    assert a100 == pytest.approx(246.0)  # 8 x A100 measure 235 (tests/fixtures/nccl-tests/oci_a100x8_single_node.txt)
    down = fabsim_nccl.peak_busbw(records, {"gpu01": {**node, "nvlink_down": [3]}}, {})
    assert down == fabsim_nccl.PCIE_BUSBW
    assert fabsim_nccl.peak_busbw(records, {"gpu01": {**node, "nccl_factor": 0.6}}, {}) == healthy
    assert fabsim_nccl.peak_busbw(records, {"gpu01": {**node, "nvswitch": False}}, {}) == fabsim_nccl.PCIE_BUSBW
