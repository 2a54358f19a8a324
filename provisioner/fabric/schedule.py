"""Which node pairs run ``ib_write_bw`` when, and which port or link is to blame when a pair is slow.

Pure logic, no I/O. A *rail* is one HCA index: HCA ``i`` of node A is only ever tested against HCA ``i`` of
node B. Every HCA can take part in one test at a time (one server or one client), so a *round* is a set of
disjoint node pairs; a round planned for "every rail" runs on all rails at once, because the rails are
independent HCAs and switches.

Two modes:

* **full** (:func:`plan_full`): every unordered pair exactly once, by the circle (round-robin) method:
  n−1 rounds for even n, n rounds for odd n (one node idle per round). Quadratic in fabric time, exhaustive.
* **quick**: :func:`plan_quick_round1` tests every node once (n/2 pairs; for odd n the leftover node runs
  in one extra slot against the first node). :func:`plan_localisation` then re-pairs every suspect of a
  failing pair with a node that passed, and :func:`localise` names the bad port or link from both rounds.
  With a single fault on a rail (one bad port, or one bad pair/link among the pairs tested), the culprit is
  always named for n ≥ 3 nodes. With n = 2 nothing can tell the two ends apart and the verdict says so.

Inference rules, per rail (stated so that an operator can check a verdict by hand):

1. a port that passed at least one test is **good** (a bad port fails every peer);
2. a port that passed nothing and failed against at least two *good* peers is **bad**;
3. two good ports whose test failed point at the **link** between them (their cables/route, or that pair);
4. anything else is **unknown**, with the reason (too few good peers, rail-wide failure, not tested).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from provisioner.errors import UsageError
from provisioner.fabric.findings import Finding

Status = Literal["good", "bad", "link", "unknown"]
CHECK_NAME = "pairwise_bandwidth"


@dataclass(frozen=True, slots=True, order=True)
class Pair:
    """One ``ib_write_bw`` run: ``server`` listens, ``client`` connects (same HCA index on both)."""

    server: str
    client: str

    def __post_init__(self) -> None:
        if self.server == self.client:
            raise ValueError(f"a node cannot be paired with itself: {self.server!r}")

    @property
    def key(self) -> tuple[str, str]:
        """The unordered identity of the pair (sorted names), used for coverage and lookups."""
        return (self.server, self.client) if self.server < self.client else (self.client, self.server)

    @property
    def nodes(self) -> tuple[str, str]:
        return (self.server, self.client)


@dataclass(frozen=True, slots=True)
class Round:
    """Disjoint pairs that run at the same time.

    ``rails=None`` means the same pairs on every rail at once; a localisation round names the rails it is
    for, because suspects differ per rail (rounds with the same ``index`` run concurrently on their rails).
    """

    index: int
    pairs: tuple[Pair, ...]
    rails: tuple[int, ...] | None = None
    idle: tuple[str, ...] = ()
    purpose: str = ""

    def busy(self) -> set[str]:
        return {n for p in self.pairs for n in p.nodes}


@dataclass(frozen=True, slots=True)
class PairResult:
    """The measured outcome of one pair on one rail. ``gbps`` is None when the test did not complete."""

    pair: Pair
    rail: int
    passed: bool
    gbps: float | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """What the tests say about one node's port on one rail, and why (``reason`` is for people)."""

    node: str
    rail: int
    status: Status
    reason: str
    peers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Localisation:
    """Verdicts per (node, rail), the links blamed, and notes on anything ambiguous."""

    verdicts: Mapping[tuple[str, int], NodeVerdict]
    links: tuple[tuple[str, str, int], ...]
    notes: tuple[str, ...]

    def with_status(self, status: Status) -> list[NodeVerdict]:
        return [v for _, v in sorted(self.verdicts.items()) if v.status == status]

    @property
    def all_good(self) -> bool:
        return all(v.status == "good" for v in self.verdicts.values())


def judge(pair: Pair, rail: int, gbps: float | None, expected_gbps: float, min_fraction: float = 0.9) -> PairResult:
    """Turn a bandwidth figure into pass/fail: pass at or above ``min_fraction`` of the expected rate."""
    if expected_gbps <= 0 or not 0 < min_fraction <= 1:
        raise UsageError(
            f"cannot judge bandwidth against {expected_gbps} Gb/s at fraction {min_fraction}",
            hint="expected rate must be positive and the fraction within (0, 1]",
        )
    if gbps is None:
        return PairResult(pair, rail, passed=False, gbps=None, detail="test did not complete")
    floor = expected_gbps * min_fraction
    passed = gbps >= floor
    detail = "" if passed else f"{gbps:.1f} Gb/s < {floor:.1f} Gb/s ({min_fraction:.0%} of {expected_gbps:g})"
    return PairResult(pair, rail, passed=passed, gbps=gbps, detail=detail)


def _checked_nodes(nodes: Iterable[str]) -> list[str]:
    """Sorted, duplicate-free node list; a duplicate would put one HCA in two pairs of a round."""
    ordered = sorted(nodes)
    dupes = sorted({n for i, n in enumerate(ordered) if i and ordered[i - 1] == n})
    if dupes:
        raise UsageError(f"duplicate node names in the pairing: {', '.join(dupes)}")
    return ordered


def _oriented(a: str, b: str, position: Mapping[str, int]) -> Pair:
    """Who serves: the node "before" the other on a circle of n, so every node serves ⌊n/2⌋ or fewer times.

    Orienting i → j when (j − i) mod n is in the first half of the circle (ties at n/2 go to the lower
    index) gives every node the server role (n−1)/2 times for odd n and n/2 or n/2 − 1 times for even n.
    """
    n = len(position)
    i, j = position[a], position[b]
    d = (j - i) % n
    first = d < n - d or (d == n - d and i < j)
    return Pair(a, b) if first else Pair(b, a)


def plan_full(nodes: Iterable[str]) -> list[Round]:
    """Every unordered pair exactly once in n−1 (even n) or n (odd n) rounds of disjoint pairs.

    Circle method: node 0 stays put, the others rotate one place per round; the pair at position i is
    (circle[i], circle[-1-i]). For odd n a phantom seat makes its partner idle for that round. The server
    role is spread evenly (see :func:`_oriented`) so that no node runs most of the servers.
    """
    ordered = _checked_nodes(nodes)
    if len(ordered) < 2:
        return []
    circle: list[str | None] = list(ordered)
    if len(circle) % 2:
        circle.append(None)
    m = len(circle)
    position = {name: i for i, name in enumerate(ordered)}
    rounds: list[Round] = []
    for r in range(m - 1):
        pairs: list[Pair] = []
        idle: list[str] = []
        for i in range(m // 2):
            a, b = circle[i], circle[m - 1 - i]
            if a is None or b is None:
                idle.append(a if a is not None else str(b))
                continue
            pairs.append(_oriented(a, b, position))
        rounds.append(Round(index=r + 1, pairs=tuple(pairs), idle=tuple(idle), purpose="full"))
        circle = [circle[0], circle[-1], *circle[1:-1]]
    return rounds


def plan_quick_round1(nodes: Iterable[str]) -> list[Round]:
    """Round 1 of quick mode: every node in exactly one pair of the first slot, neighbours paired in order.

    For odd n the last node cannot be paired in the same slot; it runs in a second slot (``index=2``) against
    the first node, so every node is tested before localisation. That node is then tested twice, which
    :func:`localise` accounts for. Returns one round (even n), two (odd n) or none (n < 2).
    """
    ordered = _checked_nodes(nodes)
    if len(ordered) < 2:
        return []
    pairs = tuple(Pair(ordered[i], ordered[i + 1]) for i in range(0, len(ordered) - 1, 2))
    rounds = [Round(index=1, pairs=pairs, purpose="quick")]
    if len(ordered) % 2:
        leftover = ordered[-1]
        rounds.append(
            Round(
                index=2,
                pairs=(Pair(ordered[0], leftover),),
                idle=tuple(ordered[1:-1]),
                purpose="quick (odd node out)",
            )
        )
    return rounds


class _RailView:
    """Pass/fail adjacency of one rail, from any number of results (later rounds add evidence)."""

    def __init__(self, results: Iterable[PairResult]) -> None:
        self.passed_with: dict[str, set[str]] = defaultdict(set)
        self.failed_with: dict[str, set[str]] = defaultdict(set)
        self.tested: set[tuple[str, str]] = set()
        for res in results:
            a, b = res.pair.key
            self.tested.add((a, b))
            table = self.passed_with if res.passed else self.failed_with
            table[a].add(b)
            table[b].add(a)

    def good(self, node: str) -> bool:
        return bool(self.passed_with.get(node))

    def suspects(self) -> list[str]:
        return sorted(n for n, peers in self.failed_with.items() if peers and not self.good(n))


def _by_rail(results: Iterable[PairResult]) -> dict[int, list[PairResult]]:
    grouped: dict[int, list[PairResult]] = defaultdict(list)
    for res in results:
        grouped[res.rail].append(res)
    return grouped


def _localisation_pairs(nodes: Sequence[str], view: _RailView) -> tuple[Pair, ...]:
    """Pairs for one rail that separate every suspect from its failing peers.

    Suspects that failed against fewer peers go first: clearing them is also what convicts a node that failed
    against several (e.g. the node that the odd-n leftover was paired with). Each suspect gets a distinct
    known-good partner it has not been tested with; if good partners run out, remaining suspects are paired
    with each other where that pair is new (if it passes, both are cleared).
    """
    good = [n for n in nodes if view.good(n)]
    suspects = sorted(view.suspects(), key=lambda n: (len(view.failed_with[n]), n))
    busy: set[str] = set()
    pairs: list[Pair] = []
    waiting: list[str] = []
    for s in suspects:
        partner = next(
            (g for g in good if g not in busy and (min(s, g), max(s, g)) not in view.tested),
            None,
        )
        if partner is None:
            waiting.append(s)
            continue
        busy.update((s, partner))
        pairs.append(Pair(partner, s))
    for i, s in enumerate(waiting):
        if s in busy:
            continue
        partner = next(
            (t for t in waiting[i + 1 :] if t not in busy and (min(s, t), max(s, t)) not in view.tested),
            None,
        )
        if partner is not None:
            busy.update((s, partner))
            pairs.append(Pair(s, partner))
    return tuple(sorted(pairs))


def plan_localisation(
    nodes: Iterable[str], rails: Iterable[int], results: Iterable[PairResult], *, index: int = 2
) -> list[Round]:
    """The localisation round after quick round 1: one round per group of rails that need the same pairs.

    Rails where every pair passed need nothing; an empty list means the fabric passed quick mode. Pass
    ``index`` = number of round-1 slots + 1 (3 for odd n) so round numbers stay consecutive.
    """
    ordered = _checked_nodes(nodes)
    grouped = _by_rail(results)
    by_pairs: dict[tuple[Pair, ...], list[int]] = defaultdict(list)
    for rail in sorted(set(rails)):
        pairs = _localisation_pairs(ordered, _RailView(grouped.get(rail, [])))
        if pairs:
            by_pairs[pairs].append(rail)
    rounds = []
    for pairs, rail_list in sorted(by_pairs.items(), key=lambda kv: kv[1]):
        busy = {n for p in pairs for n in p.nodes}
        rounds.append(
            Round(
                index=index,
                pairs=pairs,
                rails=tuple(rail_list),
                idle=tuple(n for n in ordered if n not in busy),
                purpose="localisation",
            )
        )
    return rounds


def _verdict(node: str, rail: int, view: _RailView) -> NodeVerdict:
    passed = view.passed_with.get(node, set())
    failed = view.failed_with.get(node, set())
    if passed:
        links = tuple(sorted(p for p in failed if view.good(p)))
        if links:
            return NodeVerdict(
                node,
                rail,
                "link",
                f"port passed with {', '.join(sorted(passed))} but failed with {', '.join(links)}, "
                "which also passed elsewhere: the link between them (cable, switch route) or that pair",
                links,
            )
        return NodeVerdict(node, rail, "good", f"passed with {', '.join(sorted(passed))}")
    if not failed:
        return NodeVerdict(node, rail, "unknown", "not tested on this rail")
    good_peers = tuple(sorted(p for p in failed if view.good(p)))
    if len(good_peers) >= 2:
        return NodeVerdict(
            node,
            rail,
            "bad",
            f"failed with {', '.join(good_peers)}, which passed with other nodes, and passed with nobody",
            tuple(sorted(failed)),
        )
    others = sorted(failed - set(good_peers))
    if good_peers:
        why = (
            f"failed only with {good_peers[0]} (good elsewhere)"
            + (f" and with unproven {', '.join(others)}" if others else "")
            + ": this port or that link; no second known-good partner was tested"
        )
    elif len(failed) == 1:
        why = (
            f"failed with {others[0]}, and neither passed a test: the fault is on this port, on "
            f"{others[0]}'s, or on the link between them (a third node is needed to tell)"
        )
    else:
        why = f"failed with {', '.join(others)}, none of which passed a test either: no known-good reference"
    return NodeVerdict(node, rail, "unknown", why, tuple(sorted(failed)))


def localise(
    results_round1: Iterable[PairResult],
    results_round2: Iterable[PairResult] = (),
    *,
    nodes: Iterable[str] | None = None,
    rails: Iterable[int] | None = None,
) -> Localisation:
    """Name bad ports and links from all results so far (any rounds; full-mode results work too).

    ``nodes``/``rails`` default to those seen in the results; pass them to get an explicit ``unknown`` for a
    node or rail that was never tested.
    """
    everything = [*results_round1, *results_round2]
    grouped = _by_rail(everything)
    seen = {n for r in everything for n in r.pair.nodes}
    node_list = _checked_nodes(nodes) if nodes is not None else sorted(seen)
    rail_list = sorted(set(rails)) if rails is not None else sorted(grouped)
    verdicts: dict[tuple[str, int], NodeVerdict] = {}
    links: set[tuple[str, str, int]] = set()
    notes: list[str] = []
    for rail in rail_list:
        view = _RailView(grouped.get(rail, []))
        for node in node_list:
            v = _verdict(node, rail, view)
            verdicts[(node, rail)] = v
            for peer in v.peers if v.status == "link" else ():
                a, b = sorted((node, peer))
                links.add((a, b, rail))
        rail_nodes = [n for n in node_list if view.passed_with.get(n) or view.failed_with.get(n)]
        if len(rail_nodes) >= 3 and not any(view.good(n) for n in rail_nodes):
            notes.append(
                f"rail {rail}: no test passed on any node; a rail-wide cause (switch, subnet manager, "
                "rail cabling, wrong expected rate) is more likely than every port being bad"
            )
    if len(node_list) == 2 and any(v.status == "unknown" for v in verdicts.values()):
        notes.append(
            "only two nodes: a failing pair cannot be split between its two ends and the link; "
            "add a node or check each port's counters (perfquery) and link state"
        )
    for node in node_list:
        node_rails = [verdicts[(node, r)].status for r in rail_list]
        if len(rail_list) > 1 and all(s == "bad" for s in node_rails):
            notes.append(
                f"{node}: bad on all {len(rail_list)} rails, which points at the host (PCIe, driver, "
                "firmware, peer memory) rather than a cable"
            )
    return Localisation(verdicts=verdicts, links=tuple(sorted(links)), notes=tuple(notes))


Measure = Callable[[Round, Sequence[int]], list[PairResult]]


def run_quick(nodes: Sequence[str], rails: Sequence[int], measure: Measure) -> tuple[list[Round], Localisation]:
    """Drive quick mode end to end with an injected ``measure`` (runs one round on the given rails).

    Keeps the orchestration testable without SSH: the real measure starts ib_write_bw pairs; tests and the
    benchmark simulate them.
    """
    ordered = _checked_nodes(nodes)
    rail_list = sorted(set(rails))
    rounds = plan_quick_round1(ordered)
    first: list[PairResult] = []
    for rnd in rounds:
        first.extend(measure(rnd, rail_list))
    loc_rounds = plan_localisation(ordered, rail_list, first, index=len(rounds) + 1)
    second: list[PairResult] = []
    for rnd in loc_rounds:
        second.extend(measure(rnd, list(rnd.rails or rail_list)))
    return [*rounds, *loc_rounds], localise(first, second, nodes=ordered, rails=rail_list)


def verdict_findings(loc: Localisation, *, device_by_rail: Mapping[int, str] | None = None) -> list[Finding]:
    """Findings for everything not good: bad ports and links are errors, unknowns are warnings."""
    devices = device_by_rail or {}
    findings: list[Finding] = []
    for (node, rail), v in sorted(loc.verdicts.items()):
        if v.status == "bad":
            findings.append(
                Finding(
                    check=CHECK_NAME,
                    severity="error",
                    node=node,
                    device=devices.get(rail),
                    port=None,
                    expected="line rate with every peer",
                    observed="failed with " + ", ".join(v.peers),
                    message=f"{node} rail {rail}: port is bad ({v.reason})",
                    hint="check the port (ibstat state/rate, perfquery error counters), then reseat or swap "
                    "the cable and transceiver; if every rail is bad, check the host side",
                    rail=rail,
                )
            )
        elif v.status == "unknown" and v.peers:
            findings.append(
                Finding(
                    check=CHECK_NAME,
                    severity="warning",
                    node=node,
                    device=devices.get(rail),
                    port=None,
                    expected="a verdict",
                    observed="ambiguous",
                    message=f"{node} rail {rail}: {v.reason}",
                    hint="run full mode (--mode full) or test this node against a known-good node",
                    rail=rail,
                    peer=v.peers[0] if len(v.peers) == 1 else None,
                )
            )
    for a, b, rail in loc.links:
        findings.append(
            Finding(
                check=CHECK_NAME,
                severity="error",
                node=a,
                device=devices.get(rail),
                port=None,
                expected="line rate",
                observed="failed, while both ends pass with other nodes",
                message=f"{a} ↔ {b} rail {rail}: the link or route between them is bad",
                hint="check both cables to the leaf switch and the switch route between them "
                "(ibtracert, port counters on the switch)",
                rail=rail,
                peer=b,
            )
        )
    return findings
