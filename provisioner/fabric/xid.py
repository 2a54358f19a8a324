"""Xid: the NVIDIA driver's ``NVRM: Xid (PCI:<bus>): <code>, ...`` lines in a GPU node's kernel log.

An Xid NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog")
attributes to the GPU or that needs a GPU reset or a reboot (:data:`CRITICAL_XIDS`) is a host-side error of the node:
the GPU fell off the bus, returned uncorrectable memory errors, lost an NVLink or its GSP firmware stopped answering.
Its bandwidth and NCCL findings follow from it, so they are folded under it (:mod:`provisioner.fabric.causes`) and
no cable, transceiver or switch is suspected. The advice is the catalog's resolution (reset the GPU, reboot the
node, RMA when it recurs), per code in :data:`ACTIONS`.

Application Xids (13, 31, 43, 45, ...: a kernel fault, an MMU fault of a process, a stopped channel) are the
application's, not the node's: an info line at most.

Verify reads the log in the GPUDirect check's node probe (:data:`PROBE_SECTIONS`, after ``lsmod``: no round trip of
its own), with ``nvidia-smi``'s bus ids so a finding names ``gpu3`` rather than an address. The kernel keeps a line
until the node reboots: a GPU reset clears the fault, not the line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from provisioner.fabric import pcie
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.remote import Completed, split_sections

CHECK = "xid"
MARK = "--- provisioner xid:"
PROBE_SECTIONS = (
    f"echo '{MARK} gpus'; nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader 2>/dev/null; "
    f"echo '{MARK} kernel log'; dmesg 2>&1 | grep -e 'NVRM: Xid' -e '^dmesg: ' | tail -n 200"
)
"""Constant shell text (no spec value in it): the GPUs' bus ids, then the Xid lines of the kernel log (a ``dmesg:``
line when the log cannot be read, e.g. ``kernel.dmesg_restrict`` for a user that is not root)."""

CRITICAL_XIDS: dict[int, str] = {
    48: "double bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
"""Xids NVIDIA's Xid catalog attributes to hardware or that need a GPU reset or node reboot; a node logging one is
taken out of service (``provision watch``) and fails verify."""

_RESET = "drain the node and reset the GPU (nvidia-smi -r -i {index})"
_RMA = "if it recurs, run dcgmi diag -r 3 on it and RMA the GPU"
ACTIONS: dict[int, str] = {
    48: f"{_RESET}: the reset retires or remaps the failed memory; {_RMA}",
    62: f"{_RESET}; {_RMA}",
    63: f"{_RESET} to activate the remapped row; only a remapping failure (Xid 64) asks for an RMA",
    64: f"{_RESET}; a row remapping failure is an RMA criterion of NVIDIA's GPU memory error management",
    74: f"{_RESET} (the NVLink inside the node); {_RMA} or its baseboard",
    79: "drain and reboot the node: the GPU has left the PCIe bus and a GPU reset cannot reach it; if it recurs, "
        "check the GPU's power and seating in its slot and RMA it",
    92: f"{_RESET} when drained; {_RMA}",
    94: f"the application that touched the memory was stopped; {_RESET} to remap the row; {_RMA}",
    95: f"every application on the GPU was stopped: {_RESET}; {_RMA}",
    119: f"{_RESET}, reboot if the reset fails; if it recurs, read the driver's release notes for GSP fixes, then RMA",
    120: f"{_RESET}, reboot if the reset fails; if it recurs, read the driver's release notes for GSP fixes, then RMA",
    140: f"{_RESET}; {_RMA}",
}
"""The Xid catalog's resolution per critical code (reset the GPU, reboot the node, RMA on recurrence); ``{index}`` is
the GPU's nvidia-smi index (``<index>`` where nvidia-smi did not list it)."""

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),\s*(.*)$")


@dataclass(frozen=True)
class Xid:
    pci: str
    code: int
    text: str


def parse_xids(text: str) -> list[Xid]:
    """``NVRM: Xid`` lines of a kernel log (dmesg, with or without its time prefix)."""
    found: list[Xid] = []
    for line in text.splitlines():
        m = _XID.search(line)
        if m:
            found.append(Xid(m.group(1), int(m.group(2)), m.group(3).strip()))
    return found


def split_probe(stdout: str) -> tuple[str, dict[str, str]]:
    """The GPUDirect node probe's output: (what came before the first mark, i.e. lsmod; {section: text})."""
    return split_sections(stdout, MARK)


def _bus(pci: str) -> str:
    """``0000:48:00`` (the Xid line: domain, bus, device) -> ``0000:48:00.0`` as :func:`pcie.device_names` keys it."""
    domain, _, rest = pci.lower().partition(":")
    try:
        domain = f"{int(domain, 16):04x}"
    except ValueError:
        return pci.lower()
    return f"{domain}:{rest}" if "." in rest else f"{domain}:{rest}.0"


def _critical(node: str, xid: Xid, count: int, names: Mapping[str, str]) -> Finding:
    gpu = names.get(_bus(xid.pci))
    index = gpu[3:] if gpu else "<index>"
    where = f"{gpu} (PCI {xid.pci})" if gpu else f"the GPU at PCI {xid.pci} (not listed by nvidia-smi)"
    times = f" {count} times" if count > 1 else ""
    return Finding(
        CHECK, "error", node, gpu, None, "no critical Xid", f"Xid {xid.code}",
        f"{node}: {where} logged Xid {xid.code}{times}: {CRITICAL_XIDS[xid.code]} (NVIDIA's Xid catalog); "
        f"the driver said: {xid.text[:160]!r}",
        "host-side, the GPU itself: " + ACTIONS[xid.code].format(index=index),
    )


def findings(node: str, log: str, gpus: str) -> list[Finding]:
    """An error per critical (GPU, Xid) the log holds, once however often it repeats (the last line quoted), and
    one info line naming the other Xids: the applications', never the node's fault."""
    names = pcie.device_names(gpus)
    counts: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], Xid] = {}
    other: dict[int, None] = {}
    for x in parse_xids(log):
        if x.code not in CRITICAL_XIDS:
            other.setdefault(x.code)
            continue
        key = (_bus(x.pci), x.code)
        counts[key] = counts.get(key, 0) + 1
        last[key] = x
    found = [_critical(node, last[k], counts[k], names) for k in sorted(last, key=lambda k: (k[1], k[0]))]
    if other:
        codes = ", ".join(str(c) for c in sorted(other))
        found.append(Finding(
            CHECK, "info", node, None, None, None, codes,
            f"{node}: application Xids in the kernel log ({codes}): NVIDIA's Xid catalog attributes them to the "
            "application that ran, not to the node", "nothing to do on the node; the job's owner may look at them",
        ))
    return found


def node_result(node: str, done: Completed) -> CheckResult:
    """The ``xid`` result of one GPU node from the GPUDirect node probe (:data:`PROBE_SECTIONS` after lsmod)."""
    if done.unreachable:
        return CheckResult.could_not_run(CHECK, node, done.stderr.strip() or "unreachable")
    if done.timed_out:
        return CheckResult.could_not_run(CHECK, node, "reading the kernel log timed out")
    _, sections = split_probe(done.stdout)
    if "kernel log" not in sections:
        return CheckResult.could_not_run(CHECK, node, "the probe printed no kernel log section")
    log = sections["kernel log"]
    refused = next((ln.strip() for ln in log.splitlines() if ln.startswith("dmesg: ")), None)
    if refused is not None:
        return CheckResult.could_not_run(CHECK, node, f"the kernel log could not be read: {refused[:200]!r} "
                                                      "(verify reads it as the spec's ssh user; root can)")
    found = findings(node, log, sections.get("gpus", ""))
    return CheckResult.from_findings(CHECK, node, found, {"xid_lines": len(parse_xids(log))})
