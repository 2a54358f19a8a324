"""The simulated fabric between the HCAs: switches, their links, routes and how flows share them (stdlib only).

What the simulated ``ib_write_bw`` and the MAD tools (``iblinkinfo``, ``ibnetdiscover``, ``ibqueryerrors``) agree
on, from ``fabric.json``:

* **Live topology.** A switch is up unless a ``switch_down`` fault marked it ``"down": true``; a switch-to-switch
  link (``switch_links``) carries traffic unless it is ``"state": "down"`` or one of its switches is down; its
  rate is its width x lane speed (a degraded link has a narrower width or a slower speed). A node port reaches
  the switch its cable lands on (``cables``).
* **Routes** (docs/lab-hardware-model.md "Fabric routes and shared links"). With a static routing engine
  (minhop, updn, ftree, ...: whatever ``sm/sm.json`` names that is not ``ar_*``, or no SM at all) every switch
  sends each destination LID out of one port: among its ports on a shortest path to the destination's leaf,
  the one that carries the fewest destinations so far, destinations taken in LID order (opensm
  doc/current-routing.txt: "Each port has a counter counting the number of target LIDs going through it. When
  there are multiple alternative ports with same MinHop to a LID, the one with less previously assigned ports is
  selected"). The tables are computed from scratch on the live topology, as a heavy sweep would; opensm keeps
  the routes that need not change after a link loss, so the lab's per-uplink load after a failure can differ
  from a real fabric's (the total capacity left cannot). With an adaptive engine (``ar_*``) a flow is spread
  evenly over every shortest path (a fluid stand-in for per-packet adaptive routing, which also avoids hot
  links as it goes; the lab does not model that feedback).
* **Sharing.** Flows that run at the same time share every directed link on their routes max-min fairly
  (progressive filling: all flows grow together, a flow stops growing when a link it uses is full). A port's
  own rate (x ``bw_factor``) is the capacity of its send and its receive direction. Credit-based flow control,
  head-of-line blocking and congestion control are not modelled; max-min is what an ideal lossless fabric
  gives, so a real fabric is at best this good.
* **Which flows run at the same time** is learnt from ``<lab root>/flows/``: each simulated ``ib_write_bw``
  client registers its flow there; one whose route crosses a switch-to-switch link waits until no new flow has
  appeared for ``PROVISIONER_LAB_FLOW_SETTLE_S`` (default 1 s, at most ``PROVISIONER_LAB_FLOW_WAIT_S``), takes
  its share of the flows it sees, and stays registered until every flow it saw has taken its own, so flows that
  start together see each other. A flow that stays on one leaf takes its share at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

try:
    from provisioner.lab.simtools import fabsim_common as common
    from provisioner.lab.simtools import labstate
except ImportError:  # inside a node
    import fabsim_common as common  # type: ignore[import-not-found,no-redef]
    import labstate  # type: ignore[import-not-found,no-redef]

FLOWS_DIR = "flows"
STALE_S = 120.0
"""A registration older than this is a leftover of a killed run, not a flow."""

PortKey = tuple[str, str, int]
"""(host, device, port) of an HCA port."""
Resource = tuple[Any, ...]
"""("tx"|"rx", host, device, port) for a port's two directions; ("isl", switch, port) for a link's direction out
of ``switch`` through ``port``."""


# ---------------------------------------------------------------- live topology (pure)


def switch_up(fabric: Mapping[str, Any], name: str) -> bool:
    return any(str(s.get("name")) == name and not s.get("down") for s in fabric.get("switches", []))


def link_rate(link: Mapping[str, Any]) -> float:
    try:
        return float(labstate.rate_gbps(str(link.get("speed", "NDR")), str(link.get("width", "4X"))))
    except ValueError:
        return 0.0


def live_switch_links(fabric: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The switch-to-switch links that carry traffic: not down, both switches up."""
    up = {str(s.get("name")) for s in fabric.get("switches", []) if not s.get("down")}
    return [lk for lk in fabric.get("switch_links", []) or []
            if lk.get("state") != "down" and str(lk.get("switch")) in up and str(lk.get("peer")) in up]


class Topology:
    """Switches, live links and where each HCA port is attached, with hop distances to each switch."""

    def __init__(self, fabric: Mapping[str, Any]) -> None:
        self.up = {str(s.get("name")) for s in fabric.get("switches", []) if not s.get("down")}
        self.adj: dict[str, list[tuple[int, str, int, float]]] = defaultdict(list)
        for lk in live_switch_links(fabric):
            a, pa, b, pb = str(lk["switch"]), int(lk["port"]), str(lk["peer"]), int(lk["peer_port"])
            rate = link_rate(lk)
            self.adj[a].append((pa, b, pb, rate))
            self.adj[b].append((pb, a, pa, rate))
        for ports in self.adj.values():
            ports.sort()
        self.attached: dict[PortKey, tuple[str, int]] = {}
        for cable in fabric.get("cables", []) or []:
            if cable.get("node") and str(cable.get("switch")) in self.up:
                key = (str(cable["node"]), str(cable.get("device")), int(cable.get("port", 1)))
                self.attached[key] = (str(cable["switch"]), int(cable.get("switch_port", 0)))
        self.cabled = bool(fabric.get("cables"))
        self._dist: dict[str, dict[str, int]] = {}

    def dist(self, target: str) -> dict[str, int]:
        """Hops from every switch to ``target`` over live links (absent = unreachable)."""
        if target not in self._dist:
            seen = {target: 0}
            queue = deque([target])
            while queue:
                u = queue.popleft()
                for _, v, _, _ in self.adj.get(u, []):
                    if v not in seen:
                        seen[v] = seen[u] + 1
                        queue.append(v)
            self._dist[target] = seen
        return self._dist[target]

    def toward(self, here: str, target: str) -> list[tuple[int, str, int, float]]:
        """``here``'s links (port, next switch, its port, rate) one hop closer to ``target``, by port."""
        d = self.dist(target)
        if here not in d:
            return []
        return [e for e in self.adj.get(here, []) if d.get(e[1], -1) == d[here] - 1]


# ---------------------------------------------------------------- routes (pure)


def static_tables(topo: Topology, dests: Sequence[tuple[PortKey, int]]) -> dict[str, dict[PortKey, int]]:
    """Every switch's forwarding table: destination -> output port (least-loaded shortest-path port, LID order)."""
    tables: dict[str, dict[PortKey, int]] = {}
    for sw in sorted(topo.up):
        load: dict[int, int] = defaultdict(int)
        table: dict[PortKey, int] = {}
        for dest, _lid in sorted(dests, key=lambda d: (d[1], d[0])):
            leaf = topo.attached.get(dest)
            if leaf is None:
                continue
            if leaf[0] == sw:
                table[dest] = leaf[1]
                continue
            ports = sorted({e[0] for e in topo.toward(sw, leaf[0])})
            if not ports:
                continue
            port = min(ports, key=lambda p: (load[p], p))
            load[port] += 1
            table[dest] = port
        tables[sw] = table
    return tables


def route(topo: Topology, src: PortKey, dst: PortKey, adaptive: bool,
          tables: Mapping[str, Mapping[PortKey, int]] | None) -> dict[Resource, float] | None:
    """The fraction of the flow src -> dst on each resource; None when no live path joins them.

    Without cables in fabric.json (a lab with no switches) the flow only uses the two ports.
    """
    ends: dict[Resource, float] = {("tx", *src): 1.0, ("rx", *dst): 1.0}
    if not topo.cabled:
        return ends
    a, b = topo.attached.get(src), topo.attached.get(dst)
    if a is None or b is None:
        return None
    if a[0] == b[0]:
        return ends
    if a[0] not in topo.dist(b[0]):
        return None
    if not adaptive:
        here, hops = a[0], 0
        while here != b[0] and hops < 16:
            port = (tables or {}).get(here, {}).get(dst)
            nxt = next((e for e in topo.adj.get(here, []) if e[0] == port), None)
            if nxt is None:
                return None
            ends[("isl", here, port)] = 1.0
            here, hops = nxt[1], hops + 1
        return ends if here == b[0] else None
    # adaptive: an even spread over all shortest paths (path counts forward from a, backward from b)
    d = topo.dist(b[0])
    order = sorted((s for s in d if d[s] <= d[a[0]]), key=lambda s: -d[s])
    back: dict[str, float] = {b[0]: 1.0}
    for s in sorted(order, key=lambda s: d[s]):
        if s != b[0]:
            back[s] = sum(back.get(v, 0.0) for _, v, _, _ in topo.toward(s, b[0]))
    fwd: dict[str, float] = defaultdict(float)
    fwd[a[0]] = 1.0
    total = back[a[0]]
    for s in order:
        if fwd[s] == 0:
            continue
        for port, v, _, _ in topo.toward(s, b[0]):
            share = fwd[s] * back.get(v, 0.0) / total
            ends[("isl", s, port)] = ends.get(("isl", s, port), 0.0) + share
            fwd[v] += fwd[s]
    return ends


def max_min(flows: Mapping[str, Mapping[Resource, float]], capacity: Mapping[Resource, float]) -> dict[str, float]:
    """Max-min fair rates of flows that use resources in the given fractions (progressive filling)."""
    rate = dict.fromkeys(flows, 0.0)
    left = {r: float(capacity.get(r, 0.0)) for f in flows.values() for r in f}
    active = set(flows)
    while active:
        demand: dict[Resource, float] = defaultdict(float)
        for f in active:
            for r, share in flows[f].items():
                demand[r] += share
        step = min((left[r] / w for r, w in demand.items() if w > 0), default=0.0)
        for f in active:
            rate[f] += step
        for r, w in demand.items():
            left[r] -= step * w
        full = {r for r, w in demand.items() if w > 0 and left[r] <= 1e-9 * max(1.0, capacity.get(r, 1.0))}
        frozen = {f for f in active if full & set(flows[f])}
        if not frozen:  # numerical safety: nothing saturated means nothing limits the rest
            break
        active -= frozen
    return rate


# ---------------------------------------------------------------- the lab's state (I/O)


def adaptive_routing(root: str) -> bool:
    """Whether the master SM routes with an adaptive (``ar_*``) engine."""
    try:
        with open(os.path.join(root, "sm", "sm.json"), encoding="utf-8") as handle:
            return str(json.load(handle).get("routing_engine", "")).startswith("ar_")
    except (OSError, ValueError, AttributeError):
        return False


def port_capacity(root: str) -> tuple[dict[Resource, float], list[tuple[PortKey, int]]]:
    """Each HCA port's send/receive capacity (rate x bw_factor) and every CA port with its LID."""
    lids: dict[str, int] = {}
    try:
        with open(os.path.join(root, "sm", "lids.json"), encoding="utf-8") as handle:
            lids = {str(k): int(v) for k, v in json.load(handle).items()}
    except (OSError, ValueError, AttributeError):
        pass
    cap: dict[Resource, float] = {}
    dests: list[tuple[PortKey, int]] = []
    for host in common.lab_hosts(root):
        for hca in labstate.load_node(root, host).get("hcas", []):
            key = (host, str(hca.get("device")), int(hca.get("port", 1)))
            rate = float(hca.get("rate_gbps", 0)) * float(hca.get("bw_factor", 1.0))
            cap[("tx", *key)] = cap[("rx", *key)] = rate
            dests.append((key, lids.get(str(hca.get("port_guid")), 0xFFFF)))
    return cap, dests


def shares(root: str, flows: Mapping[str, tuple[PortKey, PortKey]]) -> dict[str, float | None]:
    """Each flow's max-min rate in Gb/s over the live fabric; None for a flow with no path."""
    fabric = common.load_fabric_or_empty(root)
    topo = Topology(fabric)
    cap, dests = port_capacity(root)
    adaptive = adaptive_routing(root)
    tables = None if adaptive else static_tables(topo, dests)
    for lk in live_switch_links(fabric):
        rate = link_rate(lk)
        cap[("isl", str(lk["switch"]), int(lk["port"]))] = rate
        cap[("isl", str(lk["peer"]), int(lk["peer_port"]))] = rate
    routed: dict[str, dict[Resource, float]] = {}
    out: dict[str, float | None] = {}
    for fid, (src, dst) in flows.items():
        path = route(topo, src, dst, adaptive, tables)
        if path is None:
            out[fid] = None
        else:
            routed[fid] = path
    out.update(max_min(routed, cap))
    return out


def crosses_switches(root: str, src: PortKey, dst: PortKey) -> bool:
    """Whether traffic src -> dst leaves its leaf (only then can other flows on other leaves slow it)."""
    topo = Topology(common.load_fabric_or_empty(root))
    a, b = topo.attached.get(src), topo.attached.get(dst)
    return a is not None and b is not None and a[0] != b[0]


# ---------------------------------------------------------------- the flows that run now (I/O)


def _flows_dir(root: str) -> str:
    path = os.path.join(root, FLOWS_DIR)
    os.makedirs(path, exist_ok=True)
    return path


def register(root: str, fid: str, pairs: Iterable[tuple[PortKey, PortKey]], snapped: bool = False) -> None:
    """Record (or update) a running flow: its directions and whether it has taken its share yet."""
    record = {"id": fid, "pairs": [[list(s), list(d)] for s, d in pairs], "t": time.time(), "snap": snapped}
    labstate.atomic_write(os.path.join(_flows_dir(root), f"{fid}.json"), json.dumps(record) + "\n")


def unregister(root: str, fid: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(_flows_dir(root), f"{fid}.json"))


def running(root: str) -> dict[str, dict[str, Any]]:
    """The flows registered now (stale leftovers skipped)."""
    out: dict[str, dict[str, Any]] = {}
    now = time.time()
    base = _flows_dir(root)
    for name in sorted(os.listdir(base)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(base, name), encoding="utf-8") as handle:
                rec = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and now - float(rec.get("t", 0)) < STALE_S:
            out[str(rec.get("id"))] = rec
    return out


def _env_s(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


def fair_share(root: str, fid: str, pairs: Sequence[tuple[PortKey, PortKey]]) -> list[float | None]:
    """Register this run's flow(s), wait for the flows that start with it, return each direction's rate.

    See the module docstring for the waiting rules; the flow stays registered until :func:`unregister`.
    """
    register(root, fid, pairs)
    wait = any(crosses_switches(root, s, d) for s, d in pairs)
    settle = _env_s("PROVISIONER_LAB_FLOW_SETTLE_S", 1.0)
    limit = time.monotonic() + _env_s("PROVISIONER_LAB_FLOW_WAIT_S", 10.0)
    seen = set(running(root))
    if wait:
        quiet_since = time.monotonic()
        while time.monotonic() < limit and time.monotonic() - quiet_since < settle:
            time.sleep(0.05)
            now = set(running(root))
            if now != seen:
                seen, quiet_since = now, time.monotonic()
    snapshot = running(root)
    flows: dict[str, tuple[PortKey, PortKey]] = {}
    for other in snapshot.values():
        for i, (s, d) in enumerate(other.get("pairs", [])):
            flows[f"{other['id']}#{i}"] = ((str(s[0]), str(s[1]), int(s[2])), (str(d[0]), str(d[1]), int(d[2])))
    for i, pair in enumerate(pairs):
        flows[f"{fid}#{i}"] = pair
    rates = shares(root, flows)
    register(root, fid, pairs, snapped=True)
    if wait:
        while time.monotonic() < limit:
            current = running(root)
            if all(current.get(o, {}).get("snap", True) for o in snapshot):
                break
            time.sleep(0.05)
    return [rates.get(f"{fid}#{i}") for i in range(len(pairs))]
