"""One cause, one message, the right place: traffic findings that a host-side cause explains say so.

A node without ``nvidia_peermem`` cannot register GPU memory with its HCAs, so ``ib_write_bw --use_cuda`` fails or
crawls on every rail of it and NCCL's follow-up names it slow. Judged on their own, the GPUDirect bandwidth verdicts
read "port is bad ... reseat or swap the cable and transceiver" for each rail, next to the module error: a technician
would pull good cables. The same holds for a GPU that fell off the bus (fewer GPUs in ``nvidia-smi topo -m``).

A critical Xid in the node's kernel log (:mod:`provisioner.fabric.xid`: the GPU fell off the bus, an uncorrectable
ECC error, an NVLink or GSP error) is one too, and the one named when the node has several.

The host-side causes are the node-level errors (no device named) of the gpudirect check (the module, the GPU
count), of the dcgm check (a test DCGM's diagnostic failed) and of the NVSwitch fabric state (fabric manager), and
every error of the pcie check on the node (a GPU or HCA trained below its PCIe link, ACS redirecting peer-to-peer
traffic through the root complex): the GPU path of that node crosses the fault whichever rail runs.
:func:`fold` rewrites the traffic findings on a node with such a cause to name it (and the host-memory bandwidth
findings of an HCA whose own PCIe link trained below capability: a technician would otherwise reseat its cable),
with the cause's own hint and no port or cable advice; their severity stays (the measurement did fail), so nothing
passes that failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from provisioner.fabric import dcgm, gpudirect, nccl_node, pcie, xid
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.schedule import CHECK_NAME

CAUSE_RESULTS = (gpudirect.CHECK, dcgm.CHECK, dcgm.FABRIC_CHECK, nccl_node.CHECK)
"""Checks whose node-level errors are host-side causes: the GPUDirect module and GPU count, a failed DCGM
diagnostic, an NVSwitch fabric fabric manager has not trained, an all-reduce across the node's own GPUs (network
disabled) below its floor or failing."""
TRAFFIC_RESULTS = (gpudirect.BW_CHECK, "nccl")
"""Results whose findings a host-side cause on the node explains (host-memory bandwidth does not need the GPU path,
so only a cause on the HCA itself explains it: :func:`hca_causes`)."""
PAIRWISE = CHECK_NAME


def is_host_cause(f: Finding) -> bool:
    """An error of a :data:`CAUSE_RESULTS` check on a node as a whole, or any error of the pcie or xid check on a
    node (those name the GPU or HCA at fault)."""
    if f.severity != "error" or not f.node:
        return False
    return (f.check in CAUSE_RESULTS and f.device is None) or f.check in (pcie.CHECK, xid.CHECK)


def host_causes(checks: Sequence[CheckResult]) -> dict[str, Finding]:
    """node -> its host-side cause (:func:`is_host_cause`): a critical Xid first (it says why: a GPU missing from
    nvidia-smi is the effect of the Xid 79 that took it off the bus), else the first one."""
    causes: dict[str, Finding] = {}
    found = [f for check in checks for f in check.findings if is_host_cause(f)]
    for f in sorted(found, key=lambda f: f.check != xid.CHECK):
        causes.setdefault(str(f.node), f)
    return causes


def hca_causes(checks: Sequence[CheckResult]) -> dict[tuple[str, str], Finding]:
    """(node, HCA) -> a pcie error on that HCA itself (its link trained below capability): host-memory traffic
    through that HCA crosses the slow link too, so its plain bandwidth verdicts are explained by it as well."""
    return {(str(f.node), str(f.device)): f for c in checks for f in c.findings
            if f.check == pcie.CHECK and f.severity == "error" and f.node and f.device
            and str(f.device).startswith(HCA_PREFIXES)}


HCA_PREFIXES = ("mlx5_", "mlx4_", "ibp", "bnxt_re", "irdma")
_WHAT = {gpudirect.BW_CHECK: "GPUDirect bandwidth", "nccl": "NCCL", PAIRWISE: "Bandwidth"}


def _folded(f: Finding, cause: Finding) -> Finding:
    where = f"{f.node} rail {f.rail}" if f.rail is not None else str(f.node)
    what = _WHAT.get(f.check, f.check)
    return replace(f, message=f"{what} on {where} fails because of a host-side cause, not a port or cable: "
                              f"{cause.message}",
                   hint=f"{cause.hint} (no cable, transceiver or switch port is suspected)")


def fold(checks: Sequence[CheckResult]) -> list[CheckResult]:
    """``checks`` with every error or warning of a traffic result on a node with a host-side cause naming it."""
    causes, hcas = host_causes(checks), hca_causes(checks)
    if not causes and not hcas:
        return list(checks)

    def cause_of(check: str, f: Finding) -> Finding | None:
        if f.severity == "info":
            return None
        if check in TRAFFIC_RESULTS and f.node in causes:
            return causes[str(f.node)]
        return hcas.get((str(f.node), str(f.device))) if check == PAIRWISE else None

    out = []
    for check in checks:
        folded = tuple(_folded(f, c) if (c := cause_of(check.name, f)) is not None else f for f in check.findings)
        out.append(replace(check, findings=folded) if folded != check.findings else check)
    return out
