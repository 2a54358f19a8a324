"""Load across leaves: every port sends at once to a partner on another leaf, judged against the planned uplinks.

The pairwise rounds (:mod:`provisioner.fabric.bandwidth`) prove each port; they rarely fill a leaf's uplinks,
so a leaf that lost uplinks, or a spine that died, passes them. This round does what a training job does:

* **Who sends to whom.** Per rail whose ports sit on several leaves, the rail's ports; the rails that each sit
  on one leaf (rail-optimised fabrics) together, across rails. Within a group the ports are ordered by their
  position on their leaf, then by leaf (``leaf1#1, leaf2#1, leaf1#2, leaf2#2, ...``) and each port sends to the
  port ``s`` places further on, for the smallest ``s`` that puts every partner on another leaf and another
  node: a *shift* pattern, the one a fat tree is built to carry without contention (opensm's ftree engine
  optimises its routes for it, doc/current-routing.txt). Every port is a client once and a server once, all at
  the same time (``ib_write_bw``, the bandwidth check's settings). Where no shift fits (leaves of unequal
  size), partners are picked greedily and a port left without one is named in a note.
* **What each flow should get.** The slower of its two ports' spec rates, and no more than its share of the
  *planned* uplinks of the leaves it leaves and enters (a 2:1 leaf sending every port off the leaf gives each
  flow half a port): the spec's oversubscription, not the live fabric's. A flow passes at
  ``verify.bandwidth.min_fraction`` of that.
* **Who is to blame for a slow flow.** A flow touching a port the pairwise rounds or the link check already
  named (an error or a warning on it) is explained by it (info). Slow flows through a switch whose uplinks are
  short (:mod:`provisioner.fabric.switchlinks`) are blamed on that switch, with its effective
  oversubscription — not on the nodes behind it. If the slow flows left all share one port (and some flows
  ran at rate), that port is named: it fails under load only. What is left is blamed on the one leaf the slow
  flows all share, or on the pair of leaves between which they ran.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.perftest import BASE_TCP_PORT, PairRun
from provisioner.fabric.switchlinks import PlannedLink, Uplinks
from provisioner.spec.cluster import Cluster, Node

CHECK = "fabric_load"
TCP_BASE = BASE_TCP_PORT + 100
"""The round's servers listen on 18615 + the server port's rail (one server per port, so per node and rail)."""
MAX_PARALLEL = 512
"""Flows started at once; a bigger round runs in waves of this size (and is no longer all at once)."""


@dataclass(frozen=True, slots=True, order=True)
class Flow:
    """One ``ib_write_bw`` of the round: ``src`` (the client) writes to ``dst`` (the server)."""

    src: str
    src_dev: str
    dst: str
    dst_dev: str
    src_leaf: str
    dst_leaf: str
    src_rail: int
    dst_rail: int

    def name(self) -> str:
        return f"{self.src} {self.src_dev} ({self.src_leaf}) → {self.dst} {self.dst_dev} ({self.dst_leaf})"

    @property
    def leaves(self) -> frozenset[str]:
        return frozenset({self.src_leaf, self.dst_leaf})


@dataclass(frozen=True, slots=True)
class _Port:
    node: str
    device: str
    rail: int
    leaf: str
    switch_port: int


def _permute(ports: Sequence[_Port], leaf_order: Mapping[str, int]) -> tuple[list[Flow], list[_Port]]:
    """Each port's partner on another leaf and node: a shift of the interleaved order, else greedy."""
    rank: dict[_Port, int] = {}
    for leaf in {p.leaf for p in ports}:
        for i, p in enumerate(sorted((p for p in ports if p.leaf == leaf), key=lambda q: (q.switch_port, q.node))):
            rank[p] = i
    order = sorted(ports, key=lambda p: (rank[p], leaf_order.get(p.leaf, 0), p.leaf))
    n = len(order)

    def ok(a: _Port, b: _Port) -> bool:
        return a.leaf != b.leaf and a.node != b.node

    def flow(a: _Port, b: _Port) -> Flow:
        return Flow(a.node, a.device, b.node, b.device, a.leaf, b.leaf, a.rail, b.rail)

    for s in range(1, n):
        if all(ok(order[i], order[(i + s) % n]) for i in range(n)):
            return [flow(order[i], order[(i + s) % n]) for i in range(n)], []
    flows: list[Flow] = []
    taken: set[_Port] = set()
    idle: list[_Port] = []
    for i, a in enumerate(order):
        b = next((order[(i + k) % n] for k in range(1, n) if order[(i + k) % n] not in taken
                  and ok(a, order[(i + k) % n])), None)
        if b is None:
            idle.append(a)
            continue
        taken.add(b)
        flows.append(flow(a, b))
    return flows, idle


def plan_flows(cluster: Cluster, nodes: Sequence[Node], planned: Sequence[PlannedLink]) -> tuple[list[Flow], list[str]]:
    """The round's flows over ``nodes`` (compute nodes with rails), and notes on what could not be loaded."""
    if not planned:
        return [], []
    where = {(c.node, c.device): (c.switch, c.switch_port) for c in cluster.cables}
    leaf_order = {s.name: i for i, s in enumerate(cluster.switches)}
    by_rail: dict[int, list[_Port]] = defaultdict(list)
    uncabled: list[str] = []
    for node in nodes:
        for p in node.rail_ports:
            if p.rail is None:
                continue
            if (node.name, p.device) not in where:
                uncabled.append(f"{node.name} {p.device}")
                continue
            leaf, port = where[(node.name, p.device)]
            by_rail[p.rail].append(_Port(node.name, p.device, p.rail, leaf, port))
    groups = [ports for _, ports in sorted(by_rail.items()) if len({p.leaf for p in ports}) > 1]
    single = [p for _, ports in sorted(by_rail.items()) if len({q.leaf for q in ports}) == 1 for p in ports]
    if len({p.leaf for p in single}) > 1:
        groups.append(single)
    notes = [f"{CHECK}: not in the spec's cabling, not loaded: {', '.join(uncabled)}"] if uncabled else []
    flows: list[Flow] = []
    for ports in groups:
        got, idle = _permute(ports, leaf_order)
        flows += got
        if idle:
            notes.append(f"{CHECK}: no partner on another leaf for " + ", ".join(f"{p.node} {p.device}" for p in idle))
    return sorted(flows), notes


def expected_gbps(cluster: Cluster, flows: Sequence[Flow], planned: Sequence[PlannedLink]) -> dict[Flow, float]:
    """Each flow's planned rate: its ports' spec rates, capped by its share of its leaves' planned uplinks."""
    rate = {(n.name, p.device): p.rate_gbps for n in cluster.nodes for p in n.ports}
    up: dict[str, float] = defaultdict(float)
    for lk in planned:
        up[lk.switch] += lk.rate_gbps
    out_n: dict[str, int] = defaultdict(int)
    in_n: dict[str, int] = defaultdict(int)
    for f in flows:
        out_n[f.src_leaf] += 1
        in_n[f.dst_leaf] += 1
    return {f: min(rate.get((f.src, f.src_dev), cluster.fabric_rate_gbps),
                   rate.get((f.dst, f.dst_dev), cluster.fabric_rate_gbps),
                   up[f.src_leaf] / out_n[f.src_leaf] if up[f.src_leaf] else float("inf"),
                   up[f.dst_leaf] / in_n[f.dst_leaf] if up[f.dst_leaf] else float("inf"))
            for f in flows}


FlowRunner = Callable[[Flow], PairRun]


def measure(flows: Sequence[Flow], runner: FlowRunner) -> dict[Flow, PairRun]:
    """Every flow at once (up to :data:`MAX_PARALLEL`)."""
    if not flows:
        return {}
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(flows))) as pool:
        return dict(zip(flows, pool.map(runner, flows), strict=True))


def _flow_info(f: Flow, run: PairRun, floor: float) -> Finding:
    got = f"{run.gbps:.1f} Gb/s" if run.gbps is not None else f"no result ({run.detail})"
    return Finding(CHECK, "info", f.src, f.src_dev, None, f"≥ {floor:.1f} Gb/s", got,
                   f"{f.name()}: {got}, floor {floor:.1f} Gb/s", "see the leaf or port findings above",
                   rail=f.src_rail, peer=f.dst)


def _leaf_findings(flows: Sequence[Flow], rest: Sequence[Flow], floors: Mapping[Flow, float]) -> list[Finding]:
    """Slow flows no port and no short switch explains: the one leaf they all share, else each leaf pair."""
    common = frozenset.intersection(*(f.leaves for f in rest))
    pairs: dict[frozenset[str], list[Flow]] = defaultdict(list)
    for f in rest:
        pairs[f.leaves].append(f)
    if len(common) == 1 and len(pairs) > 1:
        leaf = next(iter(common))
        through = [f for f in flows if leaf in f.leaves]
        return [Finding(
            CHECK, "error", None, None, None, "every flow at its floor", f"{len(rest)} of {len(through)} slow",
            f"{leaf}: {len(rest)} of {len(through)} flows through it below their floor, its uplinks all up: "
            "the leaf's uplinks or the routes through it",
            "check the leaf's uplink counters (switch_ports), its routes (ibtracert between two slow pairs) "
            "and the spines it reaches", switch=leaf)]
    out = []
    for leaves, group in sorted(pairs.items(), key=lambda kv: sorted(kv[0])):
        a, b = sorted(leaves)
        between = [f for f in flows if f.leaves == leaves]
        out.append(Finding(
            CHECK, "error", None, None, None, "every flow at its floor", f"{len(group)} of {len(between)} slow",
            f"{a} ↔ {b}: {len(group)} of {len(between)} flows between these leaves below their floor, the ports "
            "at both ends good in the pairwise rounds: the links or spines between them",
            "check the uplinks of both leaves and the spines between them (switch_links, switch_ports)",
            switch=a))
    return out


def judge(flows: Sequence[Flow], runs: Mapping[Flow, PairRun], expected: Mapping[Flow, float], min_fraction: float,
          suspects: set[tuple[str, str]], uplinks: Mapping[str, Uplinks] | None = None) -> CheckResult:
    """The round's result: slow flows blamed on a port the port checks named (``suspects``: (node, device)), a
    switch short of uplinks, the one port all the others share, or the leaf (pair) they ran through."""
    floors = {f: expected[f] * min_fraction for f in flows}
    slow = [f for f in flows if runs[f].gbps is None or float(runs[f].gbps or 0) < floors[f]]
    findings: list[Finding] = []
    explained = [f for f in slow if (f.src, f.src_dev) in suspects or (f.dst, f.dst_dev) in suspects]
    for f in explained:
        bad = f"{f.src} {f.src_dev}" if (f.src, f.src_dev) in suspects else f"{f.dst} {f.dst_dev}"
        findings.append(Finding(CHECK, "info", f.src, f.src_dev, None, "explained", bad,
                                f"{f.name()}: slow, explained by {bad} (already named by the port checks)", "",
                                rail=f.src_rail, peer=f.dst))
    rest = [f for f in slow if f not in explained]
    short = {sw: u for sw, u in (uplinks or {}).items() if u.short}
    for sw, u in sorted(short.items()):
        through = [f for f in flows if sw in f.leaves]
        hit = [f for f in rest if sw in f.leaves]
        if not hit:
            continue
        worst = min((runs[f].gbps or 0.0) for f in hit)
        findings.append(Finding(
            CHECK, "error", None, None, None, f"≥ {min(floors[f] for f in hit):.0f} Gb/s per flow",
            f"{len(hit)} of {len(through)} flows slow",
            f"{sw}: {len(hit)} of {len(through)} flows through it below their floor (slowest {worst:.0f} Gb/s); "
            f"{u.up} of {u.planned} uplinks up → {u.ratio(u.live_gbps)} (planned {u.ratio(u.planned_gbps)}): "
            "the switch's uplinks, not the nodes behind it",
            f"restore {sw}'s uplinks (see the switch_links findings); the nodes on it are not at fault",
            switch=sw))
        rest = [f for f in rest if f not in hit]
    ports = {p for f in rest for p in ((f.src, f.src_dev), (f.dst, f.dst_dev))}
    shared = [p for p in sorted(ports) if all(p in ((f.src, f.src_dev), (f.dst, f.dst_dev)) for f in rest)]
    if rest and len(shared) == 1 and len(rest) < len(flows):
        node, device = shared[0]
        mine = [f for f in flows if shared[0] in ((f.src, f.src_dev), (f.dst, f.dst_dev))]
        speeds = ", ".join(f"{runs[f].gbps:.0f}" if runs[f].gbps is not None else "none" for f in rest)
        findings.append(Finding(
            CHECK, "error", node, device, None, "its flows at their floor", f"{len(rest)} of {len(mine)} slow",
            f"{node} {device}: {len(rest)} of its {len(mine)} flows in this round below their floor ({speeds} "
            "Gb/s), every other flow at rate: this port under load (its cable, transceiver or switch port)",
            "check its counters (links, switch_ports) and reseat or swap the cable; the pairwise rounds did not "
            "catch it, so it fails under load only",
            rail=rest[0].src_rail if (rest[0].src, rest[0].src_dev) == shared[0] else rest[0].dst_rail))
        rest = []
    if rest:
        findings += _leaf_findings(flows, rest, floors)
    findings += [_flow_info(f, runs[f], floors[f]) for f in slow]
    measured = {"flows": len(flows), "flows_slow": len(slow),
                "floor_gbps_min": round(min(floors.values()), 1) if floors else None,
                "min_fraction": min_fraction}
    if flows and all(runs[f].gbps is None and "exit 127" in runs[f].detail for f in flows):
        return CheckResult.could_not_run(CHECK, None, "ib_write_bw is not installed (exit 127 everywhere); "
                                         "install perftest on the nodes")
    return CheckResult.from_findings(CHECK, None, findings, measured)
