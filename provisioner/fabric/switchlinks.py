"""Inter-switch links: what the spec plans between tiers, what one node's fabric-wide view shows, and the gap.

**The plan.** The spec says how many uplinks each switch has (``uplinks:``), not where each one lands, so the
plan follows the usual fat-tree cabling (:func:`plan`): a switch's uplinks are its *highest* ports; uplink ``j``
goes to upper switch ``j mod n`` of the next tier that has switches (32 uplinks over 16 spines = 2 cables per
spine); the upper switch takes them on its lowest free ports below its own uplinks. The lab cables exactly this
plan (``provisioner.lab.fromspec.lab_switch_links``).

**The live view** is ``iblinkinfo`` (both ends of every link, port state, width and speed) or ``ibnetdiscover``
(live links only, with width and speed) from one node: a switch-to-switch link is a port line whose owner and
peer are both switches (the spec's switch names, matched as :func:`provisioner.fabric.cabling.switch_matches`
does, or an iblinkinfo ``Switch:`` block).

**Matching rules** (so a verdict can be checked by hand), per planned link ``A port a ↔ B port b``:

1. a live link between the same two ports matches it;
2. else a live link between the same two switches on other ports matches it (the ports differ from the usual
   layout, the bandwidth does not: no finding);
3. else a live link that starts at one of its ports and ends elsewhere is **miscabled** (error, named with the
   planned far end);
4. what is left of the plan is **missing** (error; a switch of which no port is seen at all is reported once,
   with every planned link it takes down), and what is left of the live links is **extra**: a warning between
   adjacent tiers, an error when it links two switches of one tier or skips a tier;
5. a matched link that is not Active/LinkUp, or narrower or slower than planned, is **degraded** (error).

Every switch with planned uplinks whose live uplinks carry less than planned gets its **effective
oversubscription**: the node ports cabled to it (and the planned links from the tier below) over the rate of
its uplinks that are up: ``leaf3: 30 of 32 uplinks up → 1.07:1 (planned 1.00:1)``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from provisioner.fabric.cabling import switch_matches
from provisioner.fabric.findings import Finding, Severity
from provisioner.spec.catalog import IB_SPEEDS, WIDTHS
from provisioner.spec.cluster import Cluster

CHECK = "switch_links"
TIERS = ("leaf", "spine", "core")
"""Fat-tree tiers from the bottom up; a switch's uplinks go to the next tier above it that has switches."""
SPEED_PREFERENCE = ("NDR", "HDR", "EDR", "FDR", "QDR", "DDR", "SDR", "XDR")
"""Which speed name a 4X uplink rate means when two would fit (QDR rather than FDR10 for 40 Gb/s)."""


@dataclass(frozen=True, slots=True)
class PlannedLink:
    """A cable between two switches: ``switch`` port ``port`` (the lower tier) up to ``peer`` port ``peer_port``."""

    switch: str
    port: int
    peer: str
    peer_port: int
    width: str = "4X"
    speed: str | None = "NDR"
    rate_gbps: float = 400.0

    def name(self) -> str:
        return f"{self.switch} port {self.port} ↔ {self.peer} port {self.peer_port}"


def uplink_speed(rate_gbps: float, width: str = "4X") -> str | None:
    """IB speed name of a link of this rate and width (400, 4X -> NDR); None when no speed gives that rate."""
    lanes = WIDTHS.get(width, 4)
    return next((s for s in SPEED_PREFERENCE if abs(IB_SPEEDS[s] * lanes - rate_gbps) < 0.01), None)


class PlannedSwitch(Protocol):
    """What the plan needs of a switch (the spec's ``SwitchX``, the lab's ``LabSwitch``)."""

    @property
    def name(self) -> str: ...
    @property
    def tier(self) -> str: ...
    @property
    def ports(self) -> int: ...
    @property
    def uplinks(self) -> int: ...
    @property
    def uplink_rate_gbps(self) -> float: ...


def plan(cluster: Cluster) -> list[PlannedLink]:
    """Leaf-to-spine and spine-to-core cables as the spec plans them (see :func:`plan_links`)."""
    return plan_links(cluster.switches)


def plan_links(switches: Sequence[PlannedSwitch]) -> list[PlannedLink]:
    """The cables between tiers for these switches (see the module docstring).

    An uplink that finds no free port on any upper switch is left out (the spec's port budget does not close;
    ``provision validate`` says so: TIER-PORTS-EXCEEDED).
    """
    by_tier = {t: [s for s in switches if s.tier == t] for t in TIERS}
    links: list[PlannedLink] = []
    for level, tier in enumerate(TIERS):
        upper = next((by_tier[t] for t in TIERS[level + 1:] if by_tier[t]), [])
        if not upper:
            continue
        next_free = {u.name: 1 for u in upper}
        for sw in by_tier[tier]:
            speed = uplink_speed(sw.uplink_rate_gbps)
            for j in range(sw.uplinks):
                for k in range(len(upper)):
                    up = upper[(j + k) % len(upper)]
                    if next_free[up.name] <= up.ports - up.uplinks:
                        links.append(PlannedLink(sw.name, sw.ports - sw.uplinks + 1 + j, up.name,
                                                 next_free[up.name], "4X", speed, sw.uplink_rate_gbps))
                        next_free[up.name] += 1
                        break
    return links


# ---------------------------------------------------------------- the live view


@dataclass(frozen=True, slots=True)
class LiveLink:
    """A switch-to-switch link as the fabric shows it (names are the spec's where a live switch matches one)."""

    a: str
    a_port: int
    b: str
    b_port: int
    state: str | None
    phys: str | None
    width: str | None
    rate_gbps: float | None

    @property
    def speed(self) -> str | None:
        if not self.width or not self.rate_gbps:
            return None
        lanes = WIDTHS.get(self.width, 4)
        return next((s for s in SPEED_PREFERENCE if abs(IB_SPEEDS[s] * lanes - self.rate_gbps) < 0.01), None)

    @property
    def up(self) -> bool:
        """Carries traffic: Active/LinkUp (ibnetdiscover shows no state: a link it prints is LinkUp)."""
        return self.phys == "linkup" and self.state in ("active", None)

    def ends(self) -> frozenset[tuple[str, int]]:
        return frozenset({(self.a, self.a_port), (self.b, self.b_port)})

    def name(self) -> str:
        return f"{self.a} port {self.a_port} ↔ {self.b} port {self.b_port}"

    def shown(self) -> str:
        """``Active/LinkUp 4X NDR`` as the tool showed it."""
        state = "/".join(_title(x) for x in (self.state, self.phys) if x) or "LinkUp"
        return " ".join(x for x in (state, self.width, self.speed) if x)


def _title(word: str) -> str:
    return {"linkup": "LinkUp", "init": "Init"}.get(word, word.capitalize())


@dataclass
class LiveView:
    """What one fabric-wide query showed: switch-to-switch links, the switches seen, and their down ports."""

    links: list[LiveLink] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    down_ports: dict[tuple[str, int], str] = field(default_factory=dict)
    tool: str = "iblinkinfo"


def _namer(cluster: Cluster) -> Callable[[str], str]:
    """Live switch description -> the spec's switch name (the description itself when none matches)."""
    names = [s.name for s in cluster.switches]
    cache: dict[str, str] = {}

    def spec_name(desc: str) -> str:
        if desc not in cache:
            cache[desc] = next((n for n in names if switch_matches(n, desc)), desc)
        return cache[desc]

    return spec_name


def live_view(cluster: Cluster, parsed: Mapping[str, object]) -> LiveView:
    """Switch-to-switch links from parsed ``iblinkinfo`` or ``ibnetdiscover`` output."""
    spec_name = _namer(cluster)
    tiers = {s.name: s.tier for s in cluster.switches}
    view = LiveView(tool=str(parsed.get("tool", "iblinkinfo")))
    seen: dict[frozenset[tuple[str, int]], LiveLink] = {}
    if view.tool == "ibnetdiscover":
        switches = {str(s.get("guid")): spec_name(str(s.get("name"))) for s in _dicts(parsed.get("switches"))}
        view.seen = set(switches.values())

        def switch_at(guid: object, name: object) -> str | None:
            """A switch block's name, or the spec's switch a port line's description names (excerpts)."""
            found = switches.get(str(guid))
            return found if found is not None else (spec_name(str(name)) if spec_name(str(name)) in tiers else None)

        for lk in _dicts(parsed.get("links")):
            a, b = switch_at(lk.get("from_guid"), lk.get("from_name")), switch_at(lk.get("to_guid"), lk.get("to_name"))
            if a is None or b is None:
                continue
            view.seen.update((a, b))
            link = LiveLink(a, int(str(lk.get("from_port"))), b, int(str(lk.get("to_port"))), None, "linkup",
                            _str(lk.get("width")), _num(lk.get("rate_gbps")))
            seen.setdefault(link.ends(), link)
        view.links = list(seen.values())
        return view
    records = _dicts(parsed.get("links"))
    blocks = {str(r.get("switch")) for r in records if r.get("node_type") == "switch"}
    for r in records:
        owner = str(r.get("switch"))
        is_switch = r.get("node_type") == "switch" or spec_name(owner) in tiers
        if not is_switch:
            continue
        a = spec_name(owner)
        view.seen.add(a)
        peer = r.get("peer")
        if not peer:
            view.down_ports[(a, int(str(r.get("port"))))] = "/".join(
                _title(str(x)) for x in (r.get("state"), r.get("physical_state")) if x)
            continue
        if str(peer) not in blocks and spec_name(str(peer)) not in tiers:
            continue  # a CA
        link = LiveLink(a, int(str(r.get("port"))), spec_name(str(peer)), int(str(r.get("peer_port"))),
                        _str(r.get("state")), _str(r.get("physical_state")), _str(r.get("width")),
                        _num(r.get("rate_gbps")))
        seen.setdefault(link.ends(), link)
    view.links = list(seen.values())
    return view


def port_peers(cluster: Cluster, parsed: Mapping[str, object]) -> dict[tuple[str, int], str]:
    """``{(switch, port): far end}`` from iblinkinfo (``spine1 port 3``, ``gpu01 mlx5_0``), for naming switch ports."""
    spec_name = _namer(cluster)
    tiers = {s.name for s in cluster.switches}
    out: dict[tuple[str, int], str] = {}
    for r in _dicts(parsed.get("links")) if parsed.get("tool") == "iblinkinfo" else []:
        owner, peer = spec_name(str(r.get("switch"))), r.get("peer")
        if peer and (r.get("node_type") == "switch" or owner in tiers) and r.get("port") is not None:
            far = spec_name(str(peer))
            out[(owner, int(str(r.get("port"))))] = f"{far} port {r.get('peer_port')}" if far in tiers else far
    return out


def _dicts(value: object) -> list[Mapping[str, object]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _str(value: object) -> str | None:
    return str(value) if value is not None else None


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# ---------------------------------------------------------------- comparison


@dataclass(frozen=True, slots=True)
class Uplinks:
    """One switch's uplinks as planned and as found: what the load round and the oversubscription use."""

    switch: str
    planned: int
    up: int
    degraded: int
    planned_gbps: float
    live_gbps: float
    down_gbps: float

    @property
    def short(self) -> bool:
        return self.live_gbps < self.planned_gbps - 0.01

    def ratio(self, up_gbps: float) -> str:
        return f"{self.down_gbps / up_gbps:.2f}:1" if up_gbps > 0 else "no way up"


@dataclass
class Comparison:
    """The findings of one comparison and each planned switch's uplinks."""

    findings: list[Finding] = field(default_factory=list)
    uplinks: dict[str, Uplinks] = field(default_factory=dict)
    matched: list[tuple[PlannedLink, LiveLink]] = field(default_factory=list)
    extra: list[LiveLink] = field(default_factory=list)
    missing: list[PlannedLink] = field(default_factory=list)


HINT_MISSING = ("check the cable and both transceivers (switch port LEDs, mlxlink on the switch); a port that "
                "shows Down/Polling has no light from the far end")
HINT_DEGRADED = ("a link that trained narrower or slower than planned: reseat or replace the cable/transceiver, "
                 "check the port's speed settings on both switches")


def _finding(severity: Severity, switch: str, port: int | None, expected: str, observed: str, message: str,
             hint: str) -> Finding:
    return Finding(CHECK, severity, None, None, port, expected, observed, message, hint, switch=switch)


def _ports(ports: Iterable[int]) -> str:
    """57, 58, 59, 61 -> ``57-59,61``."""
    runs: list[list[int]] = []
    for p in sorted(set(ports)):
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def compare(cluster: Cluster, planned: Sequence[PlannedLink], view: LiveView) -> Comparison:
    """Findings for every planned link that is missing, miscabled or degraded and every unplanned link."""
    tiers = {s.name: s.tier for s in cluster.switches}
    out = Comparison()
    left = list(view.links)
    todo: list[PlannedLink] = []
    for p in planned:  # rule 1: the same two ports
        want = frozenset({(p.switch, p.port), (p.peer, p.peer_port)})
        hit = next((lk for lk in left if lk.ends() == want), None)
        if hit is None:
            todo.append(p)
            continue
        left.remove(hit)
        out.matched.append((p, hit))
    rest: list[PlannedLink] = []
    for p in todo:  # rule 2: the same two switches, other ports
        hit = next((lk for lk in left if {lk.a, lk.b} == {p.switch, p.peer}), None)
        if hit is None:
            rest.append(p)
            continue
        left.remove(hit)
        out.matched.append((p, hit))
    for p in rest:  # rule 3: one end where planned, the other elsewhere
        hit = next((lk for lk in left if (p.switch, p.port) in lk.ends() or (p.peer, p.peer_port) in lk.ends()), None)
        if hit is None:
            out.missing.append(p)
            continue
        left.remove(hit)
        here = (p.switch, p.port) if (p.switch, p.port) in hit.ends() else (p.peer, p.peer_port)
        far = next(e for e in hit.ends() if e != here) if len(hit.ends()) == 2 else here
        want_far = (p.peer, p.peer_port) if here == (p.switch, p.port) else (p.switch, p.port)
        out.findings.append(_finding(
            "error", here[0], here[1], p.name(), hit.name(),
            f"{here[0]} port {here[1]} ↔ {far[0]} port {far[1]}: miscabled, planned {p.name()}",
            f"move the cable at {far[0]} port {far[1]} to {want_far[0]} port {want_far[1]}"))
        if hit.up and tiers.get(far[0]) == tiers.get(want_far[0]):
            out.matched.append((p, hit))  # it still carries traffic up a tier
    out.findings += _missing_findings(out.missing, view, tiers, out.matched)
    for lk in left:
        out.extra.append(lk)
        out.findings.append(_extra_finding(lk, tiers, planned))
    for p, lk in out.matched:
        out.findings += _health(p, lk)
    out.uplinks = _uplinks(cluster, planned, out.matched)
    out.findings += [_oversub_finding(u) for u in out.uplinks.values() if u.short]
    return out


def _missing_findings(missing: Sequence[PlannedLink], view: LiveView, tiers: Mapping[str, str],
                      matched: Sequence[tuple[PlannedLink, LiveLink]]) -> list[Finding]:
    """One error per missing link; one per switch not in the fabric at all, listing the links it takes down.

    Where the two switches are joined on other ports than the plan's (a site's own port layout), the missing
    link is named by the switch pair and the ports that do carry links, not by a planned port nobody used.
    """
    dead = sorted({s for p in missing for s in (p.switch, p.peer) if s not in view.seen and s in tiers})
    found: list[Finding] = []
    for sw in dead:
        lost = [p for p in missing if sw in (p.switch, p.peer)]
        by_peer: dict[str, list[int]] = defaultdict(list)
        for p in lost:
            other, port = (p.peer, p.peer_port) if p.switch == sw else (p.switch, p.port)
            by_peer[other].append(port)
        where = "; ".join(f"{other} port {_ports(ports)}" for other, ports in sorted(by_peer.items()))
        found.append(_finding(
            "error", sw, None, "in the fabric", "not seen",
            f"{sw}: not in the fabric (no port of it answers); its {len(lost)} planned links are down: {where}",
            "the switch is off, rebooting or cut off: check its power and management port; until it is back its "
            "peers route around it, at the capacity the uplink findings show"))
    for p in missing:
        if p.switch in dead or p.peer in dead:
            continue
        same_pair = [(q, lk) for q, lk in matched if (q.switch, q.peer) == (p.switch, p.peer)]
        if same_pair and any((q.switch, q.port) not in lk.ends() for q, lk in same_pair):
            used = _ports(lk.a_port if lk.a == p.switch else lk.b_port for _, lk in same_pair)
            planned_n = len(same_pair) + sum(1 for m in missing if (m.switch, m.peer) == (p.switch, p.peer))
            found.append(_finding(
                "error", p.switch, None, f"{planned_n} links {p.switch} ↔ {p.peer}", f"{len(same_pair)} up",
                f"{p.switch} ↔ {p.peer}: a planned link is missing ({len(same_pair)} of {planned_n} up, on "
                f"{p.switch} port {used}; in the plan's layout the missing one is {p.name()})", HINT_MISSING))
            continue
        why = [f"{sw} port {port} is {view.down_ports[(sw, port)]}" for sw, port in
               ((p.switch, p.port), (p.peer, p.peer_port)) if (sw, port) in view.down_ports]
        found.append(_finding(
            "error", p.switch, p.port, f"{p.width} {p.speed or ''} Active/LinkUp".replace("  ", " "), "no link",
            f"{p.name()}: missing" + (f" ({'; '.join(why)})" if why else ""), HINT_MISSING))
    return found


def _extra_finding(lk: LiveLink, tiers: Mapping[str, str], planned: Sequence[PlannedLink]) -> Finding:
    ta, tb = tiers.get(lk.a), tiers.get(lk.b)
    if ta is None or tb is None:
        unknown = lk.a if ta is None else lk.b
        return _finding("warning", lk.a if ta else lk.b, lk.a_port if ta else lk.b_port, "a switch of the spec",
                        unknown, f"{lk.name()}: {unknown} is no switch of the spec",
                        "add the switch to the spec (switches:) or remove the cable")
    low, high = sorted(((lk.a, lk.a_port, ta), (lk.b, lk.b_port, tb)), key=lambda e: TIERS.index(e[2]))
    present = [t for t in TIERS if t in tiers.values()]
    adjacent = present.index(high[2]) == present.index(low[2]) + 1
    if not adjacent:
        what = f"links two {low[2]} switches" if low[2] == high[2] else f"skips a tier ({low[2]} to {high[2]})"
        return _finding("error", low[0], low[1], "links only from one tier to the next", f"{low[2]}–{high[2]}",
                        f"{lk.name()}: lands on the wrong tier: it {what}",
                        "move the cable to a port of the next tier up, as the spec plans")
    count = sum(1 for p in planned if {p.switch, p.peer} == {low[0], high[0]})
    return _finding("warning", low[0], low[1], f"{count} link(s) {low[0]} ↔ {high[0]}", "one more",
                    f"{lk.name()}: not planned (the spec plans {count} link(s) between {low[0]} and {high[0]})",
                    "raise uplinks: in the spec if the cable is meant to be there, or remove it")


def _health(p: PlannedLink, lk: LiveLink) -> list[Finding]:
    want = f"Active/LinkUp {p.width} {p.speed or f'{p.rate_gbps:g} Gb/s'}"
    if not lk.up:
        return [_finding("error", p.switch, p.port, want, lk.shown(),
                         f"{lk.name()}: {lk.shown()}, not Active: no subnet manager has brought it up",
                         "check that the subnet manager runs and sweeps (sminfo; the SM log)")]
    if lk.rate_gbps is not None and lk.rate_gbps < p.rate_gbps - 0.01:
        parts = []
        if lk.width and lk.width != p.width:
            parts.append(f"width {lk.width}, planned {p.width}")
        if lk.speed and p.speed and lk.speed != p.speed:
            parts.append(f"speed {lk.speed}, planned {p.speed}")
        return [_finding("error", p.switch, p.port, want, lk.shown(),
                         f"{lk.name()}: degraded to {lk.rate_gbps:g} Gb/s ({'; '.join(parts) or lk.shown()}), "
                         f"planned {p.rate_gbps:g} Gb/s", HINT_DEGRADED)]
    return []


def _uplinks(cluster: Cluster, planned: Sequence[PlannedLink],
             matched: Sequence[tuple[PlannedLink, LiveLink]]) -> dict[str, Uplinks]:
    rate_of = {(n.name, p.device): p.rate_gbps for n in cluster.nodes for p in n.ports}
    down: dict[str, float] = defaultdict(float)
    for cab in cluster.cables:
        down[cab.switch] += rate_of.get((cab.node, cab.device), cluster.fabric_rate_gbps)
    for p in planned:
        down[p.peer] += p.rate_gbps
    live: dict[PlannedLink, LiveLink] = dict(matched)
    out: dict[str, Uplinks] = {}
    for sw in cluster.switches:
        mine = [p for p in planned if p.switch == sw.name]
        if not mine:
            continue
        ups = [live[p] for p in mine if p in live and live[p].up]
        degraded = sum(1 for lk in ups if lk.rate_gbps is not None and lk.rate_gbps < sw.uplink_rate_gbps - 0.01)
        out[sw.name] = Uplinks(sw.name, len(mine), len(ups), degraded, sum(p.rate_gbps for p in mine),
                               sum(lk.rate_gbps if lk.rate_gbps is not None else sw.uplink_rate_gbps for lk in ups),
                               down[sw.name])
    return out


def _oversub_finding(u: Uplinks) -> Finding:
    state = f"{u.up} of {u.planned} uplinks up" + (f", {u.degraded} degraded" if u.degraded else "")
    message = (f"{u.switch}: {state} → {u.ratio(u.live_gbps)} (planned {u.ratio(u.planned_gbps)}; "
               f"{u.down_gbps:g} Gb/s down, {u.live_gbps:g} of {u.planned_gbps:g} Gb/s up)")
    return _finding("warning", u.switch, None, f"{u.planned_gbps:g} Gb/s up", f"{u.live_gbps:g} Gb/s up", message,
                    "traffic that leaves this switch shares the uplinks that are left: jobs spanning switches "
                    "run slower until the links above are fixed")
