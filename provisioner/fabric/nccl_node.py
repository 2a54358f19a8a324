"""NCCL inside one node: ``all_reduce_perf`` across each GPU node's own GPUs with the network disabled.

The multi-node all-reduce measures the rails and the GPUs' links together; a node whose NVLink or NVSwitch is
degraded shows up there only as "this node is slow in NCCL", which reads like a network fault. Run alone, one
process driving every GPU of the node (``-g <GPUs>``, no launcher: an MPI build of nccl-tests initialises as a
singleton), the all-reduce crosses nothing but the node's GPU links, so its bus bandwidth at the largest size is
compared with :func:`provisioner.spec.expected.intra_node`: the NVLink figure of the node's GPU model (one
direction, the catalog's), else a PCIe x16 link of its generation.

``NCCL_IB_DISABLE=1`` keeps NCCL off the InfiniBand/RoCE transport (NCCL's environment variables: "prevents the
IB/RoCE transport from being used by NCCL", falling back to IP sockets, which a single process never needs between
its own GPUs), so no HCA, cable or switch takes part in the figure. A node below the floor is a host-side fault on
that node (GPU links, NVSwitch, fabric manager, PCIe between GPUs), never a port or cable:
:mod:`provisioner.fabric.causes` folds that node's multi-node NCCL findings under it.

Floor: ``verify.nccl.min_single_node_busbw_gbps`` where the spec sets it, else ``min_single_node_fraction`` (0.7) of
the expected figure. Healthy single-node rings reach about 80 % of NVLink line rate (NCCL's maintainer: "with the
protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s" of H100's 450, NVIDIA/nccl-tests
issue #212; 8 x A100-SXM4 measured 235 GB/s of 300, the fixture ``oci_a100x8_single_node.txt``), NVLink SHARP
(NVLS) reads above 100 % (~480 GB/s on 8 H100, same issue); a GPU that lost its NVLink peers falls to PCIe, a
fraction of it. The inter-node default (0.8) would fail a healthy A100 node, hence the lower default.

Could not run, never failed: ``all_reduce_perf`` missing on the node, the node unreachable or the run timed out,
output that is not nccl-tests' (its first line quoted).
"""

from __future__ import annotations

from collections.abc import Mapping

from provisioner.errors import ParseError
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.nccl import read_busbw
from provisioner.parsers import parse
from provisioner.remote import Completed
from provisioner.spec import expected
from provisioner.spec.cluster import Cluster, Node
from provisioner.spec.models import NcclCheck

CHECK = "nccl_node"
NETWORK_OFF = ("NCCL_IB_DISABLE=1",)
"""NCCL's documented switch that keeps the run off InfiniBand/RoCE (docs.nvidia.com/deeplearning/nccl, Environment
Variables, NCCL_IB_DISABLE)."""
PROBE = ('command -v all_reduce_perf >/dev/null 2>&1 || { echo "all_reduce_perf: not found on the PATH" >&2; '
         'exit 127; }; exec env ' + " ".join(NETWORK_OFF) + ' NCCL_DEBUG=WARN '
         'all_reduce_perf -b 8 -e "$1" -f 2 -g "$2"')
"""Run as ``sh -c PROBE sh <max_bytes> <GPUs>``: the spec's values are arguments, never part of the script."""
TIMEOUT_S = 900.0
"""One node's sweep up to 8G takes a minute or two on 8 GPUs; PCIe GPUs are slower."""
HOST_HINT = ("a host-side fault inside the node (NVLink, NVSwitch, fabric manager, or PCIe between its GPUs), not a "
             "cable: read `nvidia-smi nvlink -s` (links <inactive>), `nvidia-smi topo -m` and the NVSwitch fabric "
             "state, then `dcgmi diag -r 2`; NVIDIA's GPU debug guidelines then decide between a GPU and a "
             "baseboard replacement")


def node_nodes(cluster: Cluster) -> list[Node]:
    """The nodes with at least two GPUs (one GPU has nothing to all-reduce with), by name."""
    return sorted((n for n in cluster.nodes if n.gpu_count >= 2), key=lambda n: n.name)


def argv(node: Node, cfg: NcclCheck) -> list[str]:
    return ["sh", "-c", PROBE, "sh", cfg.max_bytes, str(node.gpu_count)]


def efficiency(node: Node, cfg: NcclCheck, busbw: float | None) -> dict[str, float | str | None]:
    """The node's expected figure, efficiency and floor, as measurements (the keys of
    :data:`provisioner.fabric.nccl.EFFICIENCY_KEYS`)."""
    want = expected.intra_node(node)
    floor, source = expected.floor(cfg.min_single_node_busbw_gbps, want, cfg.min_single_node_fraction,
                                   "verify.nccl.min_single_node_busbw_gbps")
    return {"expected_busbw_gbps": want.busbw_gbps if want else None, "expected_from": want.why if want else None,
            "efficiency": round(busbw / want.busbw_gbps, 3) if want and busbw is not None else None,
            "floor_gbps": floor, "floor_from": source}


def _first_line(done: Completed) -> str:
    lines = [ln.strip() for ln in (done.stdout or done.stderr).splitlines() if ln.strip()]
    return lines[0][:200] if lines else "(no output)"


def _not_run(node: Node, done: Completed) -> str | None:
    """Why the run gave no measurement (None when it printed nccl-tests' output)."""
    if done.unreachable:
        return done.stderr.strip() or "unreachable"
    if done.timed_out:
        return f"all_reduce_perf on {node.name} timed out after {TIMEOUT_S:.0f} s"
    if done.rc == 127 and "all_reduce_perf: not found on the PATH" in done.stderr:
        return (f"no all_reduce_perf on {node.name}'s PATH: the nccl role installs nccl-tests on the GPU nodes "
                "(software.nccl_tests)")
    try:
        parse("nccl-tests", done.stdout)
    except ParseError:
        return f"all_reduce_perf on {node.name} printed no nccl-tests output [exit {done.rc}]: '{_first_line(done)}'"
    return None


def _below(node: Node, busbw: float, eff: Mapping[str, float | str | None], max_bytes: str) -> Finding:
    want, ratio = eff["expected_busbw_gbps"], eff["efficiency"]
    expected_text = (f"; expected {want:g} GB/s from {eff['expected_from']}, {ratio:.0%} of it"
                     if isinstance(want, int | float) and isinstance(ratio, float) else "")
    return Finding(CHECK, "error", node.name, None, None, eff["floor_gbps"], busbw,
                   f"single-node all-reduce on {node.name} ({node.gpu_count} GPUs, network disabled): bus bandwidth "
                   f"{busbw:.1f} GB/s at {max_bytes} is below the floor {eff['floor_gbps']:g} GB/s "
                   f"({eff['floor_from']}){expected_text}", HOST_HINT)


def node_result(node: Node, cfg: NcclCheck, done: Completed) -> CheckResult:
    """One node's single-node all-reduce judged against its floor (see the module docstring)."""
    why = _not_run(node, done)
    if why is not None:
        return CheckResult.could_not_run(CHECK, node.name, why)
    busbw, failure = read_busbw(done)
    eff = efficiency(node, cfg, busbw)
    measured: dict[str, float | int | str | None] = {"gpus": node.gpu_count, "busbw_gbps": busbw,
                                                     "max_bytes": cfg.max_bytes, **eff}
    floor = eff["floor_gbps"] if isinstance(eff["floor_gbps"], int | float) else None
    findings: list[Finding] = []
    if busbw is None or failure:
        findings.append(Finding(CHECK, "error", node.name, None, None, "a completed run with 0 wrong results",
                                failure or "no result rows",
                                f"single-node all-reduce on {node.name} ({node.gpu_count} GPUs, network disabled) "
                                f"failed: {failure or 'no result rows'}", HOST_HINT))
    elif floor is not None and busbw < floor:
        findings.append(_below(node, busbw, eff, cfg.max_bytes))
    return CheckResult.from_findings(CHECK, node.name, findings, measured)
