"""One cause, one message, the right place: traffic findings that a host-side cause explains say so.

A node without ``nvidia_peermem`` cannot register GPU memory with its HCAs, so ``ib_write_bw --use_cuda`` fails or
crawls on every rail of it and NCCL's follow-up names it slow. Judged on their own, the GPUDirect bandwidth verdicts
read "port is bad ... reseat or swap the cable and transceiver" for each rail, next to the module error: a technician
would pull good cables. The same holds for a GPU that fell off the bus (fewer GPUs in ``nvidia-smi topo -m``).

The host-side causes are the node-level errors of the gpudirect check (no device named: the module, the GPU count)
and every error of the pcie check on the node (a GPU or HCA trained below its PCIe link, ACS redirecting
peer-to-peer traffic through the root complex): the GPU path of that node crosses the fault whichever rail runs.
:func:`fold` rewrites the traffic findings on a node with such a cause to name it, with the cause's own hint and no
port or cable advice; their severity stays (the measurement did fail), so nothing passes that failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from provisioner.fabric import gpudirect, pcie
from provisioner.fabric.findings import CheckResult, Finding

TRAFFIC_RESULTS = (gpudirect.BW_CHECK, "nccl")
"""Results whose findings a host-side cause explains (host-memory bandwidth does not need the GPU path)."""


def is_host_cause(f: Finding) -> bool:
    """An error of the gpudirect check on a node as a whole, or any error of the pcie check on a node."""
    if f.severity != "error" or not f.node:
        return False
    return (f.check == gpudirect.CHECK and f.device is None) or f.check == pcie.CHECK


def host_causes(checks: Sequence[CheckResult]) -> dict[str, Finding]:
    """node -> its first host-side cause (:func:`is_host_cause`)."""
    causes: dict[str, Finding] = {}
    for check in checks:
        for f in check.findings:
            if is_host_cause(f):
                causes.setdefault(str(f.node), f)
    return causes


def _folded(f: Finding, cause: Finding) -> Finding:
    where = f"{f.node} rail {f.rail}" if f.rail is not None else str(f.node)
    what = "GPUDirect bandwidth" if f.check == gpudirect.BW_CHECK else "NCCL"
    return replace(f, message=f"{what} on {where} fails because of a host-side cause, not a port or cable: "
                              f"{cause.message}",
                   hint=f"{cause.hint} (no cable, transceiver or switch port is suspected)")


def fold(checks: Sequence[CheckResult]) -> list[CheckResult]:
    """``checks`` with every error or warning of a traffic result on a node with a host-side cause naming it."""
    causes = host_causes(checks)
    if not causes:
        return list(checks)
    out = []
    for check in checks:
        if check.name in TRAFFIC_RESULTS and any(f.node in causes for f in check.findings):
            findings = tuple(_folded(f, causes[f.node]) if f.node in causes and f.severity != "info" else f
                             for f in check.findings)
            check = replace(check, findings=findings)
        out.append(check)
    return out
