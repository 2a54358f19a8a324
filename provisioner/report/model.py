"""The one object every report format renders: what a verification run found and measured.

Renderers are pure functions of a :class:`VerifyReport`, so the JSON, the JUnit XML and the HTML page can
never disagree about a number.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from provisioner.fabric.findings import CheckResult, Finding, Verdict
from provisioner.report.fabric_picture import FabricPicture

#: Bandwidth per rail: ``{rail: {(server, client): gbps}}``.
BandwidthMatrix = Mapping[int, Mapping[tuple[str, str], float]]

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
NCCL = "nccl"
NCCL_NODE = "nccl_node"
NCCL_CONTAINER = "nccl_container"
MAX_NODE_LINES = 8
"""Up to this many GPU nodes, the terminal prints one single-node NCCL line per node; above, one line (lowest node,
how many below their floor): every node stays in the JSON and HTML reports."""
NCCL_FIGURES = ("busbw_gbps", "expected_busbw_gbps", "expected_from", "efficiency", "floor_gbps", "floor_from")
"""The NCCL check's measurements a report shows (provisioner/fabric/nccl.py :func:`efficiency`)."""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Everything one ``provision verify`` run produced.

    ``line_rate`` is the expected per-port rate per rail (Gb/s) from the spec; bandwidth figures are shown as
    a fraction of it. ``versions`` is ``{node: {component: version}}`` as observed on each node. ``peers`` names
    each node's peer group (one profile and the same roles): versions are compared within a group only.
    ``fabric`` is the picture of the switch tiers, their links and the node ports (None without switches).
    """

    cluster: str
    started: datetime
    finished: datetime
    checks: tuple[CheckResult, ...]
    bandwidth: BandwidthMatrix = field(default_factory=dict)
    line_rate: Mapping[int, float] = field(default_factory=dict)
    versions: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    peers: Mapping[str, str] = field(default_factory=dict)
    fabric: FabricPicture | None = None

    @property
    def verdict(self) -> Verdict:
        return Verdict.of(self.checks)

    @property
    def duration_s(self) -> float:
        return (self.finished - self.started).total_seconds()

    def findings(self) -> list[Finding]:
        """All findings, most severe first, then by node, rail and check (the order people read them in)."""
        every = [f for c in self.checks for f in c.findings]
        return sorted(
            every,
            key=lambda f: (
                SEVERITY_ORDER[f.severity],
                f.node or "",
                -1 if f.rail is None else f.rail,
                f.check,
                f.device or "",
                -1 if f.port is None else f.port,
                f.peer or "",
                f.message,
            ),
        )

    def nccl_runs(self) -> list[dict[str, float | str | None]]:
        """Each NCCL all-reduce that gave a figure: its group (None for a single run), the measured bus bandwidth,
        the figure the spec's links allow, their ratio and the floor it was judged against, with sources."""
        out: list[dict[str, float | str | None]] = []
        for check in self.checks:
            if check.name not in (NCCL, NCCL_CONTAINER) or check.node is not None:
                continue
            m = check.measurements
            groups: list[str | None] = [k.removeprefix("busbw_gbps ") for k in m if k.startswith("busbw_gbps ")]
            for group in groups or [None]:
                suffix = f" {group}" if group else ""
                if m.get(f"busbw_gbps{suffix}") is None and m.get(f"expected_busbw_gbps{suffix}") is None:
                    continue
                out.append({"group": group, **{k: m.get(f"{k}{suffix}") for k in NCCL_FIGURES}})
        return out

    def nccl_node_runs(self) -> list[dict[str, float | str | None]]:
        """Each single-node all-reduce that gave a figure (its node's GPUs alone, the network disabled), by node:
        the same figures as :meth:`nccl_runs`, with ``node`` instead of ``group``."""
        return [{"node": c.node, **{k: c.measurements.get(k) for k in NCCL_FIGURES}}
                for c in sorted(self.checks, key=lambda c: str(c.node))
                if c.name == NCCL_NODE and c.node is not None and c.measurements.get("busbw_gbps") is not None]

    def rail_nodes(self, rail: int) -> list[str]:
        """Nodes that appear in the bandwidth matrix of one rail, sorted."""
        return sorted({n for pair in self.bandwidth.get(rail, {}) for n in pair})


def _figure(run: Mapping[str, float | str | None]) -> str:
    """``94.0 GB/s, 94% of the expected 100 GB/s (...)`` of one run."""
    busbw, want, eff = (run.get(k) for k in ("busbw_gbps", "expected_busbw_gbps", "efficiency"))
    text = f"{busbw:.1f} GB/s" if isinstance(busbw, float) else "no figure"
    if isinstance(want, float):
        text += f", {eff:.0%} of" if isinstance(eff, float) else ", expected"
        text += f" the expected {want:g} GB/s ({run.get('expected_from')})"
    return text


def nccl_line(run: Mapping[str, float | str | None]) -> str:
    """One NCCL run for a terminal: ``NCCL all-reduce: 94.0 GB/s, 94% of the expected 100 GB/s (...); floor ...``;
    a single-node run (``node``) says it ran on that node's GPUs alone."""
    group, node, floor = run.get("group"), run.get("node"), run.get("floor_gbps")
    text = (f"NCCL all-reduce in {node} alone (network disabled): " if node
            else f"NCCL all-reduce ({group}): " if group else "NCCL all-reduce: ")
    text += _figure(run)
    return text + (f"; floor {floor:g} GB/s ({run.get('floor_from')})" if isinstance(floor, float) else "")


def nccl_lines(report: VerifyReport) -> list[str]:
    """The terminal's NCCL summary: each inter-node run, then the single-node runs (one line each up to
    :data:`MAX_NODE_LINES` nodes, else one line naming the lowest node and how many fell below their floor)."""
    lines = [nccl_line(r) for r in report.nccl_runs()]
    nodes = report.nccl_node_runs()
    if len(nodes) <= MAX_NODE_LINES:
        return lines + [nccl_line(r) for r in nodes]
    lowest = min(nodes, key=lambda r: float(r["efficiency"] if isinstance(r["efficiency"], float)
                                            else r["busbw_gbps"] or 0.0))
    below = sum(1 for r in nodes if isinstance(r["floor_gbps"], float) and isinstance(r["busbw_gbps"], float)
                and r["busbw_gbps"] < r["floor_gbps"])
    return [*lines, f"NCCL all-reduce in each of {len(nodes)} GPU nodes alone (network disabled): lowest "
                    f"{lowest['node']} {_figure(lowest)}; {below} below its floor; every node in the reports"]


def fraction(gbps: float, line_rate: float | None) -> float | None:
    """Measured bandwidth as a fraction of line rate; None when no line rate is known."""
    if not line_rate or line_rate <= 0:
        return None
    return gbps / line_rate


def peer_versions(versions: Mapping[str, Mapping[str, str]],
                  peers: Mapping[str, str] | None = None) -> dict[str, dict[str, Mapping[str, str]]]:
    """``versions`` split by peer group (``peers``: node → group); without ``peers`` one group of every node."""
    out: dict[str, dict[str, Mapping[str, str]]] = {}
    for node in sorted(versions):
        group = (peers or {}).get(node, "all nodes")
        out.setdefault(group, {})[node] = versions[node]
    return dict(sorted(out.items()))


def expected_versions(versions: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The most common version of each component across nodes (ties: the lexically greatest version).

    The spec pins versions too, but this table is about drift between nodes: the odd one out is what an
    operator looks for after a node swap. Pass the nodes of one peer group (:func:`peer_versions`).
    """
    counts: dict[str, Counter[str]] = {}
    for comps in versions.values():
        for comp, ver in comps.items():
            counts.setdefault(comp, Counter())[ver] += 1
    return {comp: max(c.items(), key=lambda kv: (kv[1], kv[0]))[0] for comp, c in sorted(counts.items())}


def version_mismatches(versions: Mapping[str, Mapping[str, str]], peers: Mapping[str, str] | None = None,
                       ) -> list[tuple[str, str, str | None, str]]:
    """``(node, component, observed or None if missing, expected)`` for every cell that differs from its peers."""
    out: list[tuple[str, str, str | None, str]] = []
    for group in peer_versions(versions, peers).values():
        expected = expected_versions(group)
        for node in sorted(group):
            for comp, want in expected.items():
                got = group[node].get(comp)
                if got != want:
                    out.append((node, comp, got, want))
    return sorted(out, key=lambda m: (m[0], m[1]))
