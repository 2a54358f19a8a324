"""GPUDirect RDMA: the peer-memory module is loaded, each GPU's nearest NIC is the one the spec pairs it with,
and ``ib_write_bw --use_cuda=<gpu>`` between two nodes reaches ``spec.verify.gpudirect.min_fraction``.

Without ``nvidia_peermem`` NCCL silently stages every transfer through host memory (about half the bus
bandwidth), so a missing module is an error when ``gpudirect.required`` (the default), a warning otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from provisioner.fabric import bandwidth
from provisioner.fabric.findings import CheckResult, Finding, Severity
from provisioner.fabric.perftest import PairRun
from provisioner.fabric.schedule import PairResult, verdict_findings
from provisioner.spec.cluster import Cluster, Node

CHECK = "gpudirect"
BW_CHECK = "gpudirect_bandwidth"
PEERMEM = "nvidia_peermem"

#: (server, client, rail) → outcome of ``ib_write_bw --use_cuda`` on that rail's GPU–NIC pair.
GdrRunner = Callable[[str, str, int], PairRun]


def gpu_nodes(cluster: Cluster) -> list[Node]:
    return sorted((n for n in cluster.nodes_with_role("compute") if n.gpu_count and n.rail_ports),
                  key=lambda n: n.name)


def peermem_findings(node: str, lsmod: Mapping[str, Any], required: bool) -> list[Finding]:
    """An error (warning when GPUDirect is optional) when nvidia_peermem is not loaded."""
    modules = lsmod.get("modules", {})
    if PEERMEM in modules:
        return []
    legacy = "nv_peer_mem" in modules
    sev: Severity = "error" if required else "warning"
    return [Finding(
        CHECK, sev, node, None, None, f"{PEERMEM} loaded", "nv_peer_mem (legacy)" if legacy else "not loaded",
        f"{node}: {PEERMEM} is not loaded; GPU memory cannot be registered with the HCA "
        "(NCCL falls back to host staging, about half the bandwidth)",
        "modprobe nvidia_peermem and add it to /etc/modules-load.d (the nvidia_peermem role does both); "
        "it needs the driver built against the installed OFED",
    )]


def topology_findings(node: Node, topo: Mapping[str, Any]) -> list[Finding]:
    """Warnings where the spec pairs a GPU with a NIC that ``nvidia-smi topo -m`` does not show as nearest."""
    affinity: Mapping[str, list[str]] = topo.get("gpu_nic_affinity", {})
    names: Mapping[str, str] = topo.get("nic_names", {})
    found: list[Finding] = []
    for p in node.rail_ports:
        if p.gpu is None:
            continue
        nearest = [names.get(n, n) for n in affinity.get(f"GPU{p.gpu}", [])]
        if not nearest or not all(n.startswith(("mlx", "ionic", "bnxt", "irdma")) for n in nearest):
            continue  # no legend to map NICn to a device name: nothing to compare
        if p.device not in nearest:
            found.append(Finding(
                CHECK, "warning", node.name, p.device, p.port, f"GPU{p.gpu} nearest", ", ".join(nearest),
                f"{node.name}: spec pairs GPU{p.gpu} with {p.device}, but its nearest NIC is {', '.join(nearest)}",
                "fix the spec's gpu: for this HCA (or NCCL_TOPO_FILE); a cross-socket pairing costs bandwidth",
                rail=p.rail,
            ))
    return found


def gpu_count_findings(node: Node, topo: Mapping[str, Any]) -> list[Finding]:
    """An error when ``nvidia-smi topo -m`` lists fewer GPUs than the spec (a GPU fell off the bus)."""
    seen = [str(g) for g in topo.get("gpus", [])]
    if not node.gpu_count or len(seen) >= node.gpu_count:
        return []
    missing = [f"GPU{i}" for i in range(node.gpu_count) if f"GPU{i}" not in seen]
    return [Finding(
        CHECK, "error", node.name, None, None, node.gpu_count, len(seen),
        f"{node.name}: nvidia-smi shows {len(seen)} of {node.gpu_count} GPUs"
        + (f" ({', '.join(missing)} missing)" if missing else ""),
        "a GPU that fell off the bus: nvidia-smi -q, dmesg | grep -i xid, lspci | grep -i nvidia; reseat or "
        "replace it (NCCL jobs with one rank per GPU fail on this node)",
    )]


def nic_gpus(cluster: Cluster, topo: Mapping[str, Mapping[str, Any] | None]) -> dict[tuple[str, str], int]:
    """(node, device) → the GPU to test with: the spec's when topo confirms it, else the nearest by topo.

    ``nvidia-smi topo -m`` decides (what NCCL will pair); the spec's pairing is the fallback when the node gave
    no usable matrix. A disagreement is reported by :func:`topology_findings`.
    """
    out: dict[tuple[str, str], int] = {}
    for node in gpu_nodes(cluster):
        tp = topo.get(node.name) or {}
        affinity: Mapping[str, list[str]] = tp.get("gpu_nic_affinity", {})
        names: Mapping[str, str] = tp.get("nic_names", {})
        for p in node.rail_ports:
            near = sorted(int(g[3:]) for g, nics in affinity.items()
                          if g[3:].isdigit() and p.device in [names.get(n, n) for n in nics])
            if p.gpu is not None and (not near or p.gpu in near):
                out[(node.name, p.device)] = p.gpu
            elif near:
                out[(node.name, p.device)] = near[0]
    return out


def gdr_bandwidth(cluster: Cluster, runner: GdrRunner, mode: str | None = None) -> CheckResult:
    """``ib_write_bw --use_cuda`` per rail GPU–NIC pair between the GPU nodes, scheduled and localised like
    the host-memory bandwidth check, so a node without GPUDirect is named (not whichever node served)."""
    cfg = cluster.spec.verify.gpudirect
    nodes = [n for n in gpu_nodes(cluster)]
    if len(nodes) < 2:
        return CheckResult.could_not_run(BW_CHECK, None, "needs two GPU nodes with rails")
    rates = bandwidth.line_rates(nodes)
    devices = {p.rail: p.device for n in nodes for p in n.rail_ports if p.rail is not None}
    measured: list[PairResult] = []
    found: list[Finding] = []
    for names, rails in sorted(bandwidth.rail_groups(nodes).items()):
        if len(names) < 2:
            continue
        measure = bandwidth.make_measure(runner, rates, cfg.min_fraction, measured)
        _, loc = bandwidth.run_schedule(names, rails, measure, mode or cluster.spec.verify.bandwidth.mode)
        found += verdict_findings(loc, device_by_rail=devices)
    found += bandwidth.unexplained_failures(measured, found, devices)
    found += bandwidth.pair_detail_findings(measured, devices)
    sev: Severity = "error" if cfg.required else "warning"
    found = [replace(f, check=BW_CHECK, severity=sev if f.severity == "error" else f.severity,
                     message=f"GPUDirect (--use_cuda) {f.message}") for f in found]
    figures: dict[str, float | int] = {"pairs_tested": len(measured),
                                       "pairs_passed": sum(1 for r in measured if r.passed)}
    for r in measured:
        if r.gbps is not None:
            figures[f"rail{r.rail} {r.pair.server}->{r.pair.client} gbps"] = r.gbps
    return CheckResult.from_findings(BW_CHECK, None, found, figures)


def check_gpudirect(
    cluster: Cluster,
    lsmod: Mapping[str, Mapping[str, Any] | None],
    topo: Mapping[str, Mapping[str, Any] | None],
    runner: GdrRunner | None,
    mode: str | None = None,
) -> list[CheckResult]:
    """Per-node results (module, topology) and one cluster result for the GPU–NIC bandwidth pair."""
    required = cluster.spec.verify.gpudirect.required
    nodes = gpu_nodes(cluster)
    results: list[CheckResult] = []
    for node in nodes:
        mods, tp = lsmod.get(node.name), topo.get(node.name)
        if mods is None:
            results.append(CheckResult.could_not_run(CHECK, node.name, "lsmod output unavailable"))
            continue
        found = peermem_findings(node.name, mods, required)
        if tp is not None:
            found += gpu_count_findings(node, tp) + topology_findings(node, tp)
        results.append(CheckResult.from_findings(CHECK, node.name, found))
    if runner is not None:
        results.append(gdr_bandwidth(cluster, runner, mode))
    return results
