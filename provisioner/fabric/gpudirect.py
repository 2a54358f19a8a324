"""GPUDirect RDMA: the peer-memory module is loaded, each GPU's nearest NIC is the one the spec pairs it with,
and ``ib_write_bw --use_cuda=<gpu>`` between two nodes reaches ``spec.verify.gpudirect.min_fraction``.

Without ``nvidia_peermem`` NCCL silently stages every transfer through host memory (about half the bus
bandwidth), so a missing module is an error when ``gpudirect.required`` (the default), a warning otherwise.
With ``gpudirect.mode: dmabuf`` the GPU memory is registered through Linux DMA-BUF instead: no module is
required and the bandwidth test adds ``--use_cuda_dmabuf``.

The bandwidth test needs a perftest built with CUDA (and with DMA-BUF in dmabuf mode); distribution builds have
neither. Each node's ``ib_write_bw --help`` is read first: a node whose build lacks the options makes the test
*skipped* with that reason (never passed, never a hardware fault), as does a run the build refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from provisioner.fabric import bandwidth, xid
from provisioner.fabric.findings import CheckResult, Finding, Severity
from provisioner.fabric.perftest import PairRun
from provisioner.fabric.schedule import PairResult, verdict_findings
from provisioner.parsers.perftest import cuda_options
from provisioner.remote import Completed
from provisioner.spec.cluster import Cluster, Node

CHECK = "gpudirect"
BW_CHECK = "gpudirect_bandwidth"
PEERMEM = "nvidia_peermem"

#: (server, client, rail) → outcome of ``ib_write_bw --use_cuda`` on that rail's GPU–NIC pair.
GdrRunner = Callable[[str, str, int], PairRun]

NODE_PROBE = f"lsmod; rc=$?; {xid.PROBE_SECTIONS}; exit $rc"
"""What the check reads on each GPU node in one round trip: ``lsmod`` (nvidia_peermem), then the GPUs' bus ids and
the kernel log's Xid lines for the :mod:`provisioner.fabric.xid` results (a GPU that fell off the bus, ECC)."""
PERFTEST_PROBE = 'b=$(command -v ib_write_bw) || exit 127; echo "$b"; "$b" --help 2>&1'
"""The binary the check will run (first on root's PATH) and its usage, which lists the CUDA options it has."""
INSTALL_HINT = ("install a perftest built with CUDA on the GPU nodes (the perftest_cuda role builds the pinned "
                "release with ./configure CUDA_H_PATH=<cuda>/include/cuda.h into /usr/local/bin)")


@dataclass(frozen=True, slots=True)
class PerftestCuda:
    """What one node's ``ib_write_bw`` can do with GPU memory (from :data:`PERFTEST_PROBE`)."""

    path: str | None
    use_cuda: bool
    use_cuda_dmabuf: bool


def perftest_support(done: Completed) -> PerftestCuda | None:
    """The probe's answer; None when it did not come back (unreachable, timed out)."""
    if done.unreachable or done.timed_out:
        return None
    first, _, rest = done.stdout.partition("\n")
    if done.rc == 127 or not first.strip():
        return PerftestCuda(None, False, False)
    opts = cuda_options(rest)
    return PerftestCuda(first.strip(), bool(opts["use_cuda"]), bool(opts["use_cuda_dmabuf"]))


def dmabuf_mode(cluster: Cluster) -> bool:
    return cluster.spec.gpudirect.mode == "dmabuf"


def perftest_problems(cluster: Cluster, support: Mapping[str, PerftestCuda | None]) -> dict[str, str]:
    """node → why its perftest cannot run the GPUDirect test.

    Nodes not probed, or whose probe did not come back (unreachable), are left to the runs, which report
    them as they report any unreachable node.
    """
    need_dmabuf = dmabuf_mode(cluster)
    out: dict[str, str] = {}
    for node in gpu_nodes(cluster):
        s = support.get(node.name)
        if s is None:
            continue
        if s.path is None:
            out[node.name] = f"{node.name}: no ib_write_bw on the PATH"
        elif not s.use_cuda:
            out[node.name] = f"{node.name}: {s.path} was built without CUDA (its --help lists no --use_cuda)"
        elif need_dmabuf and not s.use_cuda_dmabuf:
            out[node.name] = (f"{node.name}: {s.path} was built without CUDA DMA-BUF support (its --help lists no "
                              "--use_cuda_dmabuf; needs CUDA >= 11.7 headers and rdma-core with ibv_reg_dmabuf_mr)")
    return out


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


def _not_measured(cluster: Cluster, result: CheckResult) -> CheckResult:
    """No CUDA perftest to measure with: where the spec requires GPUDirect (the default) that is a test that could
    not run (a tool missing), so the run is INCOMPLETE (exit 2), never PASS; where the site made GPUDirect optional
    it is a skip. The reason and the per-node warnings stay either way."""
    if not cluster.spec.verify.gpudirect.required:
        return result
    return replace(result, error=result.skipped, skipped=None)


def _skipped(cluster: Cluster, reason: str, nodes: list[str]) -> CheckResult:
    """The bandwidth test could not be run by these perftest builds: skipped, with a warning per node."""
    warn = [Finding(BW_CHECK, "warning", n, None, None, "ib_write_bw with --use_cuda", "not supported by its build",
                    f"{n}: GPUDirect bandwidth not measured: its perftest cannot use GPU memory", INSTALL_HINT)
            for n in nodes]
    return _not_measured(cluster, CheckResult.skip(BW_CHECK, None, f"GPUDirect bandwidth not measured: {reason}",
                                                   warn))


def gdr_bandwidth(cluster: Cluster, runner: GdrRunner, mode: str | None = None,
                  perftest: Mapping[str, PerftestCuda | None] | None = None) -> CheckResult:
    """``ib_write_bw --use_cuda`` per rail GPU–NIC pair between the GPU nodes, scheduled and localised like
    the host-memory bandwidth check, so a node without GPUDirect is named (not whichever node served).

    ``perftest`` (node → probe result) skips the test before any pair runs when a node's build lacks the
    options; a run that a build refused anyway skips it after.
    """
    cfg = cluster.spec.verify.gpudirect
    nodes = [n for n in gpu_nodes(cluster)]
    if len(nodes) < 2:
        return CheckResult.could_not_run(BW_CHECK, None, "needs two GPU nodes with rails")
    problems = perftest_problems(cluster, perftest or {})
    if problems:
        return _skipped(cluster, "; ".join(problems[n] for n in sorted(problems)), sorted(problems))
    rates = bandwidth.line_rates(nodes)
    devices = {p.rail: p.device for n in nodes for p in n.rail_ports if p.rail is not None}
    refused: list[str] = []

    def run(server: str, client: str, rail: int) -> PairRun:
        out = runner(server, client, rail)
        if out.tool_refused:
            refused.append(out.tool_refused)
        return out

    measured: list[PairResult] = []
    found: list[Finding] = []
    for names, rails in sorted(bandwidth.rail_groups(nodes).items()):
        if len(names) < 2:
            continue
        measure = bandwidth.make_measure(run, rates, cfg.min_fraction, measured)
        _, loc = bandwidth.run_schedule(names, rails, measure, mode or cluster.spec.verify.bandwidth.mode)
        found += verdict_findings(loc, device_by_rail=devices)
    if refused:
        first = sorted(set(refused))[0]  # runs are parallel: report the same line whatever their order
        return _not_measured(cluster, CheckResult.skip(
            BW_CHECK, None, f"GPUDirect bandwidth not measured: the perftest build refused the GPU memory options "
            f"(built without CUDA{' DMA-BUF' if dmabuf_mode(cluster) else ''}): {first}",
            [Finding(BW_CHECK, "warning", None, None, None, "ib_write_bw with --use_cuda", first,
                     "GPUDirect bandwidth not measured: perftest refused --use_cuda", INSTALL_HINT)]))
    found += bandwidth.unexplained_failures(measured, found, devices)
    found += bandwidth.pair_detail_findings(measured, devices)
    sev: Severity = "error" if cfg.required else "warning"
    flags = "--use_cuda --use_cuda_dmabuf" if dmabuf_mode(cluster) else "--use_cuda"
    found = [replace(f, check=BW_CHECK, severity=sev if f.severity == "error" else f.severity,
                     message=f"GPUDirect ({flags}) {f.message}") for f in found]
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
    perftest: Mapping[str, PerftestCuda | None] | None = None,
) -> list[CheckResult]:
    """Per-node results (module, topology) and one cluster result for the GPU–NIC bandwidth pair.

    In dmabuf mode nvidia_peermem is not required (DMA-BUF registers GPU memory without it).
    """
    required = cluster.spec.verify.gpudirect.required
    nodes = gpu_nodes(cluster)
    results: list[CheckResult] = []
    for node in nodes:
        mods, tp = lsmod.get(node.name), topo.get(node.name)
        if mods is None:
            results.append(CheckResult.could_not_run(CHECK, node.name, "lsmod output unavailable"))
            continue
        found = [] if dmabuf_mode(cluster) else peermem_findings(node.name, mods, required)
        if tp is not None:
            found += gpu_count_findings(node, tp) + topology_findings(node, tp)
        results.append(CheckResult.from_findings(CHECK, node.name, found))
    if runner is not None:
        results.append(gdr_bandwidth(cluster, runner, mode, perftest))
    return results
