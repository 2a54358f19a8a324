"""GPUDirect RDMA: the peer-memory module is loaded, each GPU's nearest NIC is the one the spec pairs it with,
and ``ib_write_bw --use_cuda=<gpu>`` between two nodes reaches ``spec.verify.gpudirect.min_fraction``.

Without ``nvidia_peermem`` NCCL silently stages every transfer through host memory (about half the bus
bandwidth), so a missing module is an error when ``gpudirect.required`` (the default), a warning otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from provisioner.fabric.findings import CheckResult, Finding, Severity
from provisioner.fabric.perftest import PairRun
from provisioner.spec.cluster import Cluster, Node

CHECK = "gpudirect"
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


def gdr_pair_findings(cluster: Cluster, a: str, b: str, runner: GdrRunner) -> tuple[list[Finding], dict[str, float]]:
    """``ib_write_bw --use_cuda`` per rail GPU–NIC pair from ``a`` (server) to ``b`` (client)."""
    cfg = cluster.spec.verify.gpudirect
    sev: Severity = "error" if cfg.required else "warning"
    found: list[Finding] = []
    figures: dict[str, float] = {}
    for p in cluster.node(a).rail_ports:
        if p.gpu is None or p.rail is None:
            continue
        run = runner(a, b, p.rail)
        floor = cfg.min_fraction * p.rate_gbps
        if run.gbps is not None:
            figures[f"rail{p.rail}_gpu{p.gpu}_gbps"] = run.gbps
        if run.gbps is None or run.gbps < floor:
            got = "no result" if run.gbps is None else f"{run.gbps:.1f} Gb/s"
            found.append(Finding(
                CHECK, sev, a, p.device, p.port, f">= {floor:.1f} Gb/s", got if run.gbps is None else run.gbps,
                f"GPUDirect {a} GPU{p.gpu}/{p.device} → {b}: {got}, floor {floor:.1f} Gb/s "
                f"({cfg.min_fraction:.0%} of {p.rate_gbps:g})" + (f": {run.detail}" if run.detail else ""),
                "check nvidia_peermem on both nodes, PCIe ACS/IOMMU settings (ACS must be off on the GPU–NIC "
                "switch path) and that the GPU and NIC share a PCIe switch",
                rail=p.rail, peer=b,
            ))
    return found, figures


def check_gpudirect(
    cluster: Cluster,
    lsmod: Mapping[str, Mapping[str, Any] | None],
    topo: Mapping[str, Mapping[str, Any] | None],
    runner: GdrRunner | None,
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
            found += topology_findings(node, tp)
        results.append(CheckResult.from_findings(CHECK, node.name, found))
    if runner is not None and len(nodes) >= 2:
        a, b = nodes[0].name, nodes[1].name
        found, figures = gdr_pair_findings(cluster, a, b, runner)
        results.append(CheckResult.from_findings(f"{CHECK}_bandwidth", None, found, {"pair": f"{a}->{b}", **figures}))
    elif runner is not None:
        results.append(CheckResult.could_not_run(f"{CHECK}_bandwidth", None, "needs two GPU nodes with rails"))
    return results
