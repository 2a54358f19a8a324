"""The cheap health checks ``provision watch`` runs on every partition node and spare, one SSH round trip each.

What each check reads and why it is enough to take a node out of service:

* **GPU count**: ``nvidia-smi --query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total
  --format=csv,noheader``: fewer GPUs than the profile says (a GPU that fell off the bus is no longer listed), or
  nvidia-smi failing (no driver, "No devices were found").
* **ECC**: the same query's ``ecc.errors.uncorrected.volatile.total``: an uncorrectable error since the driver
  loaded means the GPU returned wrong data (``[N/A]``: ECC off or not supported, not an error).
* **Xid**: ``NVRM: Xid (PCI:<bus>): <code>, ...`` lines in the kernel log (``dmesg``) whose code NVIDIA lists as a
  hardware or GPU-reset condition (:data:`provisioner.fabric.xid.CRITICAL_XIDS`, which verify judges too);
  application Xids (13, 31, 43, ...) are ignored.
* **Ports**: ``ibstat``: every port the spec expects is Active/LinkUp at its rate and width
  (:func:`provisioner.fabric.links.port_findings`, the verify check's own rules).
* **peermem**: ``lsmod`` lists nvidia_peermem on GPU nodes with rail HCAs
  (:func:`provisioner.fabric.gpudirect.peermem_findings`), where verify requires it too: not with
  ``gpudirect.mode: dmabuf`` (DMA-BUF registers GPU memory without the module) nor with
  ``verify.gpudirect.required: false``.

A node that does not answer SSH is unhealthy too ("unreachable"): its jobs are lost either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from provisioner.errors import ParseError
from provisioner.fabric import gpudirect, links
from provisioner.fabric.xid import CRITICAL_XIDS, Xid, parse_xids
from provisioner.parsers import parse
from provisioner.remote import Completed, Remote, split_sections
from provisioner.spec.cluster import Cluster, Node

TIMEOUT_S = 20.0
GPU_QUERY = "index,pci.bus_id,ecc.errors.uncorrected.volatile.total"
_MARK = "### provisioner health:"
PROBE = (
    f"echo '{_MARK} gpus'; nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader 2>&1; echo \"rc=$?\"; "
    f"echo '{_MARK} xid'; dmesg 2>/dev/null | grep -F 'NVRM: Xid' | tail -n 50; "
    f"echo '{_MARK} ibstat'; ibstat 2>&1; "
    f"echo '{_MARK} lsmod'; lsmod 2>&1; true"
)
"""A constant script (no spec value in it): the four readings, each after its marker line."""
__all__ = ["CRITICAL_XIDS", "PROBE", "NodeHealth", "Xid", "check_nodes", "judge", "parse_gpu_query", "parse_xids",
           "split_probe"]


@dataclass
class NodeHealth:
    node: str
    problems: list[str] = field(default_factory=list)
    unreachable: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems and self.unreachable is None

    def summary(self) -> str:
        if self.unreachable is not None:
            return f"unreachable: {self.unreachable}"
        return "; ".join(self.problems) or "healthy"


def split_probe(stdout: str) -> dict[str, str]:
    """The probe's output by section (gpus, xid, ibstat, lsmod)."""
    return split_sections(stdout, _MARK)[1]


def parse_gpu_query(text: str) -> tuple[int | None, list[tuple[str, int | None]], str | None]:
    """(exit code, [(bus id, uncorrected volatile ECC or None for [N/A])], nvidia-smi's message when it failed)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    rc: int | None = None
    if lines and lines[-1].startswith("rc="):
        rc = int(lines.pop()[3:]) if lines[-1][3:].isdigit() else None
    if rc not in (None, 0):
        return rc, [], " ".join(lines)[:200] or f"nvidia-smi exit {rc}"
    gpus: list[tuple[str, int | None]] = []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 3 or not cells[0].isdigit():
            return rc, gpus, f"unexpected nvidia-smi line: {line[:120]}"
        ecc = int(cells[2]) if cells[2].isdigit() else None
        gpus.append((cells[1], ecc))
    return rc, gpus, None


def judge(cluster: Cluster, node: Node, sections: Mapping[str, str]) -> list[str]:
    """The problems of one node from its probe sections (pure)."""
    problems: list[str] = []
    if node.gpu_count:
        _rc, gpus, error = parse_gpu_query(sections.get("gpus", ""))
        if error is not None:
            problems.append(f"gpu_count: nvidia-smi failed: {error}")
        elif len(gpus) < node.gpu_count:
            problems.append(f"gpu_count: {len(gpus)} of {node.gpu_count} GPUs")
        bad = [(bus, n) for bus, n in gpus if n]
        if bad:
            problems.append("ecc: uncorrectable ECC errors on " + ", ".join(f"{bus} ({n})" for bus, n in bad))
        for xid in parse_xids(sections.get("xid", "")):
            if xid.code in CRITICAL_XIDS:
                problems.append(f"xid: Xid {xid.code} ({CRITICAL_XIDS[xid.code]}) on PCI {xid.pci}")
    if node.ports:
        try:
            ibstat = parse("ibstat", sections.get("ibstat", ""))
        except ParseError as exc:
            problems.append(f"ports: ibstat unreadable: {exc.message}")
        else:
            for f in links.port_findings(node, ibstat):
                if f.severity == "error":
                    problems.append(f"ports: {f.location()}: {f.message}")
    # as verify judges it: DMA-BUF needs no nvidia_peermem, and with GPUDirect optional its absence fails nothing
    if node.gpu_count and node.rail_ports and cluster.spec.verify.gpudirect.required \
            and not gpudirect.dmabuf_mode(cluster):
        try:
            lsmod = parse("lsmod", sections.get("lsmod", ""))
        except ParseError as exc:
            problems.append(f"peermem: lsmod unreadable: {exc.message}")
        else:
            if gpudirect.peermem_findings(node.name, lsmod, True):
                problems.append("peermem: nvidia_peermem is not loaded")
    # one line per kind of problem is enough to decide; keep them in a stable order
    seen: dict[str, None] = {}
    for p in problems:
        seen.setdefault(p)
    return list(seen)


def check_nodes(cluster: Cluster, remote: Remote, nodes: Iterable[str], timeout: float = TIMEOUT_S
                ) -> dict[str, NodeHealth]:
    """Probe ``nodes`` in parallel and judge each."""
    names = list(nodes)
    results: Mapping[str, Completed] = remote.run_many({n: ["sh", "-c", PROBE] for n in names}, timeout)
    out: dict[str, NodeHealth] = {}
    for n in names:
        done = results[n]
        if done.unreachable or done.timed_out:
            why = (done.stderr.strip().splitlines() or ["no answer"])[-1]
            out[n] = NodeHealth(n, unreachable=why[:200])
            continue
        out[n] = NodeHealth(n, judge(cluster, cluster.node(n), split_probe(done.stdout)))
    return out
