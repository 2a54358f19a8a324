"""Simulated nccl-tests ``all_reduce_perf``, stdlib only.

The participating nodes come from ``NCCL_TESTS_HOSTS=a,b,c`` (the lab's launcher) or
from Open MPI's environment (``OMPI_COMM_WORLD_SIZE``/``RANK``/``LOCAL_SIZE``, with the
host list in ``NCCL_TESTS_HOSTS`` or, failing that, this host only).  Rank 0 prints the
whole table; other ranks print nothing, as in nccl-tests.  Every node's state is read
from the shared lab root, so no traffic between nodes is needed.

Output follows nccl-tests' ``PRINT`` formats (rows ``%12li  %12li  %8s  %6s  %6i`` then
``  %7s  %6.2f  %6.2f  %5s`` twice; captured runs in aws/aws-k8s-tester PR #503,
coreweave/nccl-tests PR #43, NVIDIA/nccl-tests issue #252).

Bus-bandwidth model (large messages), see docs/notes/simtools-fabric.md:
- one node: the NVLink figure of the GPU model (H100/H200 ~480 GB/s with NVLS,
  nccl-tests issue #212; A100 ~230 GB/s); no NVSwitch: PCIe ~20 GB/s;
- several nodes: min over nodes of sum(Active rails' rate x bw_factor) / 8 x 0.94
  (NDR 400 Gb/s NIC -> 46-48 GB/s busbw, nccl-tests issues #290/#267), capped by the
  NVLink figure; x 0.5 when any node lacks ``nvidia_peermem`` (no GPUDirect RDMA:
  33 -> 93 GB/s once enabled in NVIDIA/nccl issue #1412, "half" in issue #465);
- latency 12 us (one node) / 20 us (several) added per operation, so small sizes are
  latency-bound as in real runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

try:
    from provisioner.lab.simtools import fabsim_common as common
    from provisioner.lab.simtools import labstate
except ImportError:  # inside a node
    import fabsim_common as common  # type: ignore[import-not-found,no-redef]
    import labstate  # type: ignore[import-not-found,no-redef]

NIC_EFFICIENCY = 0.94
NO_GDR_FACTOR = 0.5
SOCKET_BUSBW = 1.2
NVLINK_BUSBW = {"H100": 480.0, "H200": 480.0, "H800": 360.0, "A100": 230.0, "A800": 180.0, "B200": 700.0}
PCIE_BUSBW = 20.0
LAT_US = {True: 12.0, False: 20.0}


class NcclFailure(Exception):
    """A failure nccl-tests reports (NCCL WARN lines, then ``Test NCCL failure``)."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)


@dataclass(frozen=True)
class Options:
    min_bytes: int
    max_bytes: int
    factor: int
    step_bytes: int
    ngpus: int
    iters: int
    warmup: int
    check: int
    graph: int
    agg: int
    json_out: str | None


def parse_size(text: str) -> int:
    """nccl-tests' parsesize: a number with an optional K/M/G suffix (powers of 1024)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip()
    if text and text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def parse_args(argv: Sequence[str]) -> Options:
    parser = argparse.ArgumentParser(prog="all_reduce_perf", add_help=False, exit_on_error=False)
    parser.add_argument("-b", "--minbytes", default="32M")
    parser.add_argument("-e", "--maxbytes", default="32M")
    parser.add_argument("-f", "--stepfactor", type=int, default=1)
    parser.add_argument("-i", "--stepbytes", default="1M")
    parser.add_argument("-g", "--ngpus", type=int, default=1)
    parser.add_argument("-t", "--nthreads", type=int, default=1)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup_iters", type=int, default=5)
    parser.add_argument("-m", "--agg_iters", type=int, default=1)
    parser.add_argument("-c", "--check", type=int, default=1)
    parser.add_argument("-G", "--cudagraph", type=int, default=0)
    parser.add_argument("-J", "--output_file")
    for flag in ("-d", "-o", "-r", "-z", "-a", "-p", "-C"):
        parser.add_argument(flag)
    try:
        ns, unknown = parser.parse_known_args(list(argv))
    except argparse.ArgumentError as exc:
        raise NcclFailure([f"all_reduce_perf: {exc}"]) from exc
    if unknown:
        raise NcclFailure([f"all_reduce_perf: invalid option -- '{unknown[0].lstrip('-')}'"])
    return Options(
        parse_size(ns.minbytes),
        parse_size(ns.maxbytes),
        ns.stepfactor,
        parse_size(ns.stepbytes),
        ns.ngpus,
        ns.iters,
        ns.warmup_iters,
        ns.check,
        ns.cudagraph,
        ns.agg_iters,
        ns.output_file,
    )


def sizes(opts: Options) -> list[int]:
    """The sizes nccl-tests visits (rounded down to a multiple of 4 float elements)."""
    out: list[int] = []
    size = max(opts.min_bytes, 4)
    while size <= opts.max_bytes:
        out.append(size // 4 * 4)
        size = size * opts.factor if opts.factor > 1 else size + max(opts.step_bytes, 1)
    return out or [opts.max_bytes // 4 * 4]


def layout(env: dict[str, str], host: str, ngpus: int) -> tuple[list[str], int, int]:
    """(hosts, ranks per host, this process's world rank) from the launcher's env."""
    hosts_env = env.get("NCCL_TESTS_HOSTS", "")
    hosts = [h for h in hosts_env.split(",") if h] or [host]
    world = int(env.get("OMPI_COMM_WORLD_SIZE", "0") or 0)
    rank = int(env.get("OMPI_COMM_WORLD_RANK", "0") or 0)
    if world:
        per_host = max(world // len(hosts), 1) if hosts_env else world
        if not hosts_env:
            hosts = [host]
    else:
        per_host = int(env.get("NCCL_TESTS_PROCS_PER_HOST", "1"))
    return hosts, per_host * ngpus, rank


def gpu_family(name: str) -> str:
    for family in NVLINK_BUSBW:
        if family in name:
            return family
    return ""


def node_netbw(node: dict[str, Any]) -> float:
    """GB/s the node's Active rails carry for NCCL (sum over rails)."""
    total = 0.0
    for hca in node.get("hcas", []):
        if common.port_usable(hca):
            total += float(hca.get("rate_gbps", 0)) * float(hca.get("bw_factor", 1.0)) / 8 * NIC_EFFICIENCY
    return total


def peak_busbw(nodes: list[dict[str, Any]], modules: dict[str, list[str]], ranks_per_host: int) -> float:
    """Large-message bus bandwidth (GB/s) of the job."""
    gpus = [g for g in nodes[0].get("gpus", []) if g.get("present", True)]
    family = gpu_family(str(gpus[0].get("name", ""))) if gpus else ""
    intra = NVLINK_BUSBW.get(family, 370.0) if nodes[0].get("nvswitch") else PCIE_BUSBW
    if len(nodes) == 1:
        return intra if ranks_per_host > 1 else 0.0
    net = min(node_netbw(n) for n in nodes)
    if net == 0.0:
        return SOCKET_BUSBW
    if any("nvidia_peermem" not in modules.get(str(n["hostname"]), []) for n in nodes):
        net *= NO_GDR_FACTOR
    return min(intra, net)


def check_nodes(nodes: list[dict[str, Any]], ranks_per_host: int, run: str, me: str) -> None:
    """Fail the way NCCL does: missing GPUs, unreachable peers, a rail dropping mid-run."""
    pid = os.getpid()
    for node in nodes:
        host = str(node["hostname"])
        if not node.get("reachable", True):
            raise NcclFailure(
                [
                    f"{me}:{pid}:{pid} [0] NCCL WARN socketStartConnect: Connect to {host} failed : No route to host",
                    f"{me}: Test NCCL failure common.cu:1005 'remote process exited or there was a network error / '",
                ]
            )
        present = [g for g in node.get("gpus", []) if g.get("present", True)]
        if len(present) < ranks_per_host:
            raise NcclFailure([f"{host}: Test CUDA failure common.cu:892 'invalid device ordinal'"])
        if len(nodes) > 1:
            for hca in node.get("hcas", []):
                if common.port_usable(hca):
                    common.record_flap(host, hca, run)
                if common.port_usable(hca) and common.flaps_now(hca, run):
                    raise NcclFailure(
                        [
                            f"{host}:{pid}:{pid + 17} [{hca.get('gpu', 0)}] transport/net_ib.cc:1696 NCCL WARN"
                            f" NET/IB : Got completion from peer {nodes[0]['hostname']}<{40000 + pid % 20000}> with"
                            f" error 12, opcode 0, len 0, vendor err 129 (Recv) localGid fe80::{hca.get('port_guid')}",
                            f"{host}:{pid}:{pid + 17} [{hca.get('gpu', 0)}] NCCL INFO transport/net.cc:1293 -> 6",
                            f"{me}: Test NCCL failure common.cu:1005 'remote process exited or there was a network"
                            " error / NET/IB : Got completion from peer with error 12, opcode 0, len 0, vendor err"
                            " 129 (Recv)'",
                        ]
                    )


def fmt_time(us: float) -> str:
    """nccl-tests' time column: %7.0f from 10 ms, %7.1f from 100 us, else %7.2f."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def table(opts: Options, nranks: int, peak: float, single: bool, run: str) -> tuple[list[str], float]:
    """Rows and the average bus bandwidth (over out-of-place and in-place, as nccl-tests)."""
    rows: list[str] = []
    total, count = 0.0, 0
    factor = 2.0 * (nranks - 1) / nranks if nranks > 0 else 0.0
    wrong = "0" if opts.check else "N/A"
    for size in sizes(opts):
        cells = []
        for place in ("out", "in"):
            algbw_peak = peak / factor if factor else 0.0
            us = LAT_US[single] + (size / (algbw_peak * 1e3) if algbw_peak else 0.0)
            us *= common.jitter(0.01, "nccl", run, size, place)
            algbw = size / us / 1e3
            busbw = algbw * factor
            total += busbw
            count += 1
            cells.append(f"  {fmt_time(us)}  {algbw:6.2f}  {busbw:6.2f}  {wrong:>5s}")
        rows.append(f"{size:12d}  {size // 4:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}" + "".join(cells))
    return rows, (total / count if count else 0.0)


def header(opts: Options, hosts: list[str], nodes: dict[str, dict[str, Any]], per_host: int) -> list[str]:
    step = f"{opts.factor}(factor)" if opts.factor > 1 else f"{opts.step_bytes}(bytes)"
    lines = [
        f"# nThread 1 nGpus {opts.ngpus} minBytes {opts.min_bytes} maxBytes {opts.max_bytes} step: {step}"
        f" warmup iters: {opts.warmup} iters: {opts.iters} agg iters: {opts.agg} validation: {opts.check}"
        f" graph: {opts.graph}",
        "#",
        "# Using devices",
    ]
    rank = 0
    for host in hosts:
        gpus = [g for g in nodes[host].get("gpus", []) if g.get("present", True)]
        for local in range(per_host):
            gpu = gpus[local]
            bus = int(str(gpu.get("pci_bus_id", "0:0:0")).split(":")[1], 16)
            pid = 1000 + int(common.unit_hash("pid", host, local // opts.ngpus) * 60000)
            lines.append(
                f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10s} device {local:2d}"
                f" [0x{bus:02x}] {gpu.get('name', '')}"
            )
            rank += 1
    blank = ""
    lines += [
        "#",
        f"# {blank:>10s}  {blank:>12s}  {blank:>8s}  {blank:>6s}  {blank:>6s}           out-of-place"
        "                       in-place          ",
        f"# {'size':>10s}  {'count':>12s}  {'type':>8s}  {'redop':>6s}  {'root':>6s}  {'time':>7s}  {'algbw':>6s}"
        f"  {'busbw':>6s} {'#wrong':>6s}  {'time':>7s}  {'algbw':>6s}  {'busbw':>6s} {'#wrong':>6s}",
        f"# {'(B)':>10s}  {'(elements)':>12s}  {blank:>8s}  {blank:>6s}  {blank:>6s}  {'(us)':>7s}  {'(GB/s)':>6s}"
        f"  {'(GB/s)':>6s}  {blank:>5s}  {'(us)':>7s}  {'(GB/s)':>6s}  {'(GB/s)':>6s}  {blank:>5s}",
    ]
    return lines


def run(argv: Sequence[str], env: dict[str, str], out: TextIO, err: TextIO) -> int:
    """One process of the job; only world rank 0 prints."""
    me = common.this_host()
    try:
        opts = parse_args(argv)
        hosts, per_host, rank = layout(env, me, opts.ngpus)
        if rank != 0:
            return 0
        root = common.lab_root()
        if not common.driver_installed():
            raise NcclFailure(
                [
                    f"{me}: Test CUDA failure common.cu:892 'CUDA driver version is insufficient"
                    " for CUDA runtime version'"
                ]
            )
        nodes: dict[str, dict[str, Any]] = {}
        for host in hosts:
            try:
                nodes[host] = labstate.load_node(root, host)
            except FileNotFoundError as exc:
                raise NcclFailure(
                    [
                        f"{me}: Test NCCL failure common.cu:1005 'unhandled system error (run with"
                        f" NCCL_DEBUG=INFO for details) / no such host {host}'"
                    ]
                ) from exc
        run_key = common.run_id()
        ordered = [nodes[h] for h in hosts]
        check_nodes(ordered, per_host, run_key, me)
        print("\n".join(header(opts, hosts, nodes, per_host)), file=out, flush=True)
        modules = {h: labstate.load_modules(root, h) for h in hosts}
        peak = peak_busbw(ordered, modules, per_host)
        if env.get("NCCL_IB_DISABLE") == "1" and len(hosts) > 1:
            peak = min(peak, SOCKET_BUSBW)
        rows, avg = table(opts, len(hosts) * per_host, peak, len(hosts) == 1, run_key)
        print("\n".join(rows), file=out)
        print("# Out of bounds values : 0 OK", file=out)
        print(f"# Avg bus bandwidth    : {avg:g} ", file=out)
        print("#", file=out, flush=True)
        return 0
    except NcclFailure as failure:
        out.flush()
        print("\n".join(failure.lines), file=err)
        return 1


def main(argv: Sequence[str]) -> int:
    return run(argv[1:], dict(os.environ), sys.stdout, sys.stderr)
