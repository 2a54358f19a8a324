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
    return root


def env_for(lab: Path, host: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "NCCL_", "PROVISIONER_"))}
    env.update(
        PROVISIONER_LAB_ROOT=str(lab),
        PROVISIONER_LAB_HOST=host,
        PROVISIONER_LAB_LIBDIR=str(lab.parent / "lib"),
        PROVISIONER_LAB_RUN_ID="run-1",
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


def test_all_reduce_two_nodes_format_and_bandwidth(lab: Path) -> None:
    activate_all(lab)
    result = run_tool(
        lab, "gpu01", "all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "2", NCCL_TESTS_HOSTS="gpu01,gpu02"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "# nThread 1 nGpus 2 minBytes 1073741824 maxBytes 8589934592 step: 2(factor)"
        " warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0"
    )
    assert sum(1 for line in lines if line.startswith("#  Rank ")) == 4
    assert "#  Rank  2 Group  0 Pid" in result.stdout and "on      gpu02 device  0 [0x18]" in result.stdout
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


def test_all_reduce_rail_down_and_no_peermem_lower(lab: Path) -> None:
    activate_all(lab)
    args = ("-b", "8G", "-e", "8G", "-g", "2")
    full = avg_busbw(run_tool(lab, "gpu01", "all_reduce_perf", *args, NCCL_TESTS_HOSTS="gpu01,gpu02").stdout)
    set_port(lab, "gpu02", 1, state="down", phys_state="polling")
    one_rail = avg_busbw(run_tool(lab, "gpu01", "all_reduce_perf", *args, NCCL_TESTS_HOSTS="gpu01,gpu02").stdout)
    assert 0.45 < one_rail / full < 0.55
    set_port(lab, "gpu02", 1, state="active", phys_state="linkup")
    labstate.save_modules(str(lab), "gpu01", ["mlx5_core"])
    no_gdr = avg_busbw(run_tool(lab, "gpu01", "all_reduce_perf", *args, NCCL_TESTS_HOSTS="gpu01,gpu02").stdout)
    assert 0.45 < no_gdr / full < 0.55


def test_all_reduce_single_node_uses_nvlink_and_mpi_rank_quiet(lab: Path) -> None:
    result = run_tool(lab, "gpu01", "all_reduce_perf", "-b", "8G", "-e", "8G", "-g", "2")
    assert result.returncode == 0, result.stderr
    assert 450.0 < avg_busbw(result.stdout) < 490.0
    quiet = run_tool(
        lab,
        "gpu02",
        "all_reduce_perf",
        "-g",
        "1",
        OMPI_COMM_WORLD_SIZE="2",
        OMPI_COMM_WORLD_RANK="1",
        NCCL_TESTS_HOSTS="gpu01,gpu02",
    )
    assert quiet.returncode == 0 and quiet.stdout == ""


def test_all_reduce_fails_on_flapping_rail_and_without_driver(lab: Path) -> None:
    activate_all(lab)
    set_port(lab, "gpu02", 0, flapping=True)
    codes = set()
    for run in ("a", "b", "c", "d", "e", "f"):
        res = run_tool(
            lab, "gpu01", "all_reduce_perf", "-g", "2", NCCL_TESTS_HOSTS="gpu01,gpu02", PROVISIONER_LAB_RUN_ID=run
        )
        codes.add(res.returncode)
        if res.returncode:
            assert "NCCL WARN NET/IB : Got completion from peer" in res.stderr
            assert "Test NCCL failure" in res.stderr
    assert codes == {0, 1}
    (lab.parent / "lib" / "nvidia-driver.version").unlink()
    res = run_tool(lab, "gpu01", "all_reduce_perf")
    assert res.returncode == 1
    assert "Test CUDA failure" in res.stderr


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
            return run_tool(lab, "gpu02", "saquery", "-s", PROVISIONER_LAB_SM_STALE_S="5").stdout

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
    nccl = run_tool(lab, "gpu01", "all_reduce_perf", "-b", "8G", "-e", "8G", "-g", "2", NCCL_TESTS_HOSTS="gpu01,gpu02")
    assert parsers.parse("nccl-tests", nccl.stdout)["avg_busbw_gbs"] == avg_busbw(nccl.stdout)
    assert parsers.parse("iblinkinfo", run_tool(lab, "gpu01", "iblinkinfo").stdout)
    text = "sminfo: sm lid 1 sm guid 0xa088c20300010000, activity count 5 priority 14 state 3 SMINFO_MASTER\n"
    record = {"lid": 1, "guid": "0xa088c20300010000", "activity_count": 5, "priority": 14, "state": "master"}
    assert fabsim_sm.sminfo_text(1, [record]) == text.rstrip("\n")
    assert parsers.parse("sminfo", text)
