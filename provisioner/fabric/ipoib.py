"""IPoIB against the spec: every planned interface present and up, with its address, MTU and mode, and a peer on
the same network answering over it.

Why each part: NFS/RDMA and Lustre o2ib resolve their peers through IPoIB (RDMA-CM), so an interface that is down,
carries another address or a smaller MTU than planned breaks storage in ways that show only as hangs or slow
mounts. The kernel's own view is read (``ip addr show``, the iproute2 text every distribution prints, and
``/sys/class/net/<if>/mode``, Documentation/infiniband/ipoib.rst); a peer is pinged over the interface only when
its own interface was seen healthy, so a dead peer is blamed on the peer, not on the node that cannot reach it.

A site whose nodes carry simulated IPoIB links (the lab: veth pairs named like the spec's netdevs) says so with the
ipoib role's own switch ``ipoib_require_infiniband: false`` in ``site_vars``; the link type and the mode are then
reported as not checked (info), never as passed, while address, MTU, state and reachability are checked for real.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from provisioner.errors import ParseError
from provisioner.fabric.findings import CheckResult, Finding, Severity, Value
from provisioner.remote import Completed, Remote
from provisioner.spec.cluster import Cluster, IpoibIf

CHECK = "ipoib"
PROBE_TIMEOUT_S = 30.0
PING_TIMEOUT_S = 60.0
PEERS_TRIED = 3
MODE_MARKER = "provisioner-ipoib-mode"
SITE_SWITCH = "ipoib_require_infiniband"

_HEADER = re.compile(r"^(?P<index>\d+):\s+(?P<name>[^:@\s]+)(?:@\S+)?:\s+<(?P<flags>[^>]*)>(?P<rest>.*)$")
_INET = re.compile(r"^\s+inet\s+(?P<cidr>\d{1,3}(?:\.\d{1,3}){3}/\d{1,2})\b")
_LINK = re.compile(r"^\s+link/(?P<type>\S+)")


@dataclass(frozen=True, slots=True)
class Link:
    """One interface as ``ip addr show`` prints it."""

    name: str
    flags: tuple[str, ...]
    mtu: int | None
    state: str | None
    link_type: str | None
    addresses: tuple[str, ...]  # IPv4 address/prefix, in the order printed

    @property
    def up(self) -> bool:
        """Administratively up with carrier (``UP`` and ``LOWER_UP`` in the flags)."""
        return "UP" in self.flags and "LOWER_UP" in self.flags and "NO-CARRIER" not in self.flags


@dataclass
class _Building:
    name: str
    flags: tuple[str, ...]
    mtu: int | None
    state: str | None
    link_type: str | None = None
    addresses: list[str] | None = None

    def done(self) -> Link:
        return Link(self.name, self.flags, self.mtu, self.state, self.link_type, tuple(self.addresses or ()))


def parse_ip_addr(text: str) -> dict[str, Link]:
    """Interfaces of ``ip addr show`` (iproute2's default text) by name; ParseError when there is none."""
    links: dict[str, Link] = {}
    current: _Building | None = None
    for line in text.splitlines():
        head = _HEADER.match(line)
        if head:
            if current is not None:
                links[current.name] = current.done()
            rest = head.group("rest")
            mtu = re.search(r"\bmtu (\d+)", rest)
            state = re.search(r"\bstate (\S+)", rest)
            current = _Building(head.group("name"), tuple(f for f in head.group("flags").split(",") if f),
                                int(mtu.group(1)) if mtu else None, state.group(1) if state else None, None, [])
            continue
        if current is None:
            continue
        link = _LINK.match(line)
        if link and current.link_type is None:
            current.link_type = link.group("type")
            continue
        inet = _INET.match(line)
        if inet and current.addresses is not None:
            current.addresses.append(inet.group("cidr"))
    if current is not None:
        links[current.name] = current.done()
    if not links:
        raise ParseError("no interface in `ip addr show` output")
    return links


def parse_modes(text: str) -> dict[str, str | None]:
    """``{interface: datagram|connected|None}`` from the probe's mode lines (None: no sysfs mode file)."""
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == MODE_MARKER:
            out[parts[1]] = parts[2] if parts[2] in ("datagram", "connected") else None
    return out


def probe_argv(planned: Sequence[IpoibIf]) -> list[str]:
    """``ip addr show`` and the sysfs mode of each planned interface, in one round trip."""
    names = " ".join(shlex.quote(i.netdev) for i in planned)
    return ["sh", "-c", f"ip addr show && for d in {names}; do m=$(cat /sys/class/net/$d/mode 2>/dev/null) "
                        f"|| m=-; echo {MODE_MARKER} $d ${{m:--}}; done"]


def ping_argv(tries: Mapping[str, Sequence[str]]) -> list[str]:
    """For each interface, ping its candidate peers in turn until one answers: ``ping <if> <addr> ok|fail``."""
    parts = []
    for iface, addrs in tries.items():
        q = shlex.quote(iface)
        targets = " ".join(shlex.quote(a) for a in addrs)
        parts.append(f"for a in {targets}; do if ping -n -q -c 1 -W 2 -I {q} $a >/dev/null 2>&1; then "
                     f"echo ping {q} $a ok; break; else echo ping {q} $a fail; fi; done")
    guard = 'command -v ping >/dev/null || { echo "ping: not installed (iputils-ping)" >&2; exit 127; }; '
    return ["sh", "-c", guard + "; ".join(parts)]


def parse_pings(text: str) -> dict[str, list[tuple[str, bool]]]:
    """``{interface: [(peer address, answered), ...]}`` from :func:`ping_argv` output."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ping" and parts[3] in ("ok", "fail"):
            out.setdefault(parts[1], []).append((parts[2], parts[3] == "ok"))
    return out


# ---------------------------------------------------------------- judging (pure)
def _finding(node: str, iface: IpoibIf, severity: Severity, expected: Value, observed: Value, message: str,
             hint: str, peer: str | None = None) -> Finding:
    return Finding(CHECK, severity, node, iface.device, iface.port, expected, observed,
                   f"{iface.netdev}: {message}", hint, peer=peer)


def interface_findings(iface: IpoibIf, link: Link | None, mode: str | None, simulated: bool) -> list[Finding]:
    """What is wrong with one planned interface, from the node's own view (no reachability)."""
    node = iface.node
    where = (f"child of {iface.parent} for partition {iface.partition} (P_Key {iface.pkey:#06x})"
             if iface.parent and iface.pkey is not None else f"{iface.device} port {iface.port}")
    if link is None:
        hint = ("the ipoib role creates it (networkd .netdev Kind=ipoib); check `networkctl status` and that the "
                "partition's P_Key is in the port's table (ibstat)" if iface.parent else
                "ibdev2netdev shows the port's netdev; is ib_ipoib loaded and the name the spec's?")
        return [_finding(node, iface, "error", iface.cidr, None, f"missing (planned on {where})", hint)]
    out: list[Finding] = []
    if link.link_type != "infiniband":
        if simulated:
            out.append(_finding(node, iface, "info", "infiniband", link.link_type, f"link/{link.link_type}, not "
                                f"checked as IPoIB: the site says its IPoIB links are simulated ({SITE_SWITCH}: "
                                "false)", "address, MTU, state and a peer are checked; the mode and P_Key are not"))
        else:
            out.append(_finding(node, iface, "error", "infiniband", link.link_type, f"is link/{link.link_type}, not "
                                "an IPoIB interface", "the spec names another port's netdev: compare ibdev2netdev"))
    if not link.up:
        flags = ",".join(link.flags)
        out.append(_finding(node, iface, "error", "UP,LOWER_UP", flags, f"is down (<{flags}>, state "
                            f"{link.state or 'unknown'})", "no carrier: the IB port is not Active (ibstat); admin "
                            "down: `networkctl up` / `ip link set up`, then find who set it down"))
    if iface.cidr not in link.addresses:
        seen = ", ".join(link.addresses) or "no IPv4 address"
        out.append(_finding(node, iface, "error", iface.cidr, seen, f"has {seen}, planned {iface.cidr}",
                            "the ipoib role writes the address (networkd/netplan); a wrong one is usually a hand "
                            "edit or another tool managing the interface"))
    if link.mtu != iface.mtu:
        out.append(_finding(node, iface, "error", iface.mtu, link.mtu, f"MTU {link.mtu}, planned {iface.mtu}",
                            "datagram mode is capped by the SM's IPoIB group (opensm mtu=5 for 4096 bytes -> 4092); "
                            "connected mode allows up to 65520"))
    if not simulated and link.link_type == "infiniband":
        if mode is None:
            out.append(_finding(node, iface, "warning", iface.mode, None, "mode unreadable (/sys/class/net/"
                                f"{iface.netdev}/mode)", "an IPoIB interface has that file; is ib_ipoib in use?"))
        elif mode != iface.mode:
            out.append(_finding(node, iface, "error", iface.mode, mode, f"runs in {mode} mode, planned {iface.mode}",
                                "mlx5 (ConnectX-4 and later) run enhanced IPoIB, datagram only"))
    return out


def healthy(findings: Sequence[Finding]) -> bool:
    return not any(f.severity == "error" for f in findings)


def ping_findings(iface: IpoibIf, tried: Sequence[tuple[str, bool]], names: Mapping[str, str]) -> list[Finding]:
    """An error when no peer answered over the interface (only healthy peers are tried)."""
    if any(ok for _, ok in tried):
        return []
    peers = ", ".join(f"{names.get(a, a)} {a}" for a, _ in tried)
    return [_finding(iface.node, iface, "error", "a peer answers", "no answer", f"no peer on {iface.network} "
                     f"answers (tried {peers})", "the peers' own interfaces look healthy: check this port's "
                     "partition membership (P_Key table), ARP (`ip neigh`) and the SM's IPoIB group",
                     peer=names.get(tried[0][0]) if tried else None)]


# ---------------------------------------------------------------- orchestration
def simulated(cluster: Cluster) -> bool:
    return cluster.spec.site_vars.get(SITE_SWITCH) is False


def check_ipoib(cluster: Cluster, remote: Remote, nodes: Sequence[str] | None = None) -> list[CheckResult]:
    """One result per node with planned IPoIB interfaces: state first, then pings to peers seen healthy."""
    planned: dict[str, list[IpoibIf]] = {}
    for i in cluster.ipoib:
        if nodes is None or i.node in nodes:
            planned.setdefault(i.node, []).append(i)
    if not planned:
        return []
    sim = simulated(cluster)
    done = remote.run_many({n: probe_argv(p) for n, p in planned.items()}, timeout=PROBE_TIMEOUT_S)
    results: dict[str, CheckResult] = {}
    found: dict[str, list[Finding]] = {}
    ok: set[tuple[str, str]] = set()  # (node, netdev) seen healthy
    for node in sorted(planned):
        d = done.get(node)
        if d is None or d.unreachable or d.timed_out or d.rc != 0:
            results[node] = CheckResult.could_not_run(CHECK, node, _why(d))
            continue
        try:
            links = parse_ip_addr(d.stdout)
        except ParseError as exc:
            results[node] = CheckResult.could_not_run(CHECK, node, exc.message)
            continue
        modes = parse_modes(d.stdout)
        found[node] = []
        for iface in planned[node]:
            mine = interface_findings(iface, links.get(iface.netdev), modes.get(iface.netdev), sim)
            found[node] += mine
            if healthy(mine):
                ok.add((node, iface.netdev))
    by_net: dict[str, list[IpoibIf]] = {}
    for i in cluster.ipoib:
        by_net.setdefault(i.network, []).append(i)
    names = {i.address: i.node for i in cluster.ipoib}
    tries: dict[str, dict[str, list[str]]] = {}
    for node in found:
        for iface in planned[node]:
            if (node, iface.netdev) not in ok:
                continue
            members = by_net[iface.network]
            k = next(j for j, m in enumerate(members) if m.node == node)
            ring = [members[(k + j) % len(members)] for j in range(1, len(members))]
            peers = [m.address for m in ring if (m.node, m.netdev) in ok][:PEERS_TRIED]
            if peers:
                tries.setdefault(node, {})[iface.netdev] = peers
            else:
                found[node].append(_finding(node, iface, "info", "a healthy peer", None, f"no healthy peer on "
                                            f"{iface.network} to ping", "reachability not checked from here"))
    pinged = remote.run_many({n: ping_argv(t) for n, t in tries.items()}, timeout=PING_TIMEOUT_S) if tries else {}
    for node, per_if in tries.items():
        d = pinged.get(node)
        if d is None or d.unreachable or d.timed_out or d.rc == 127:
            results[node] = CheckResult.could_not_run(CHECK, node, _why(d))
            continue
        answers = parse_pings(d.stdout)
        for iface in planned[node]:
            if iface.netdev in per_if:
                found[node] += ping_findings(iface, answers.get(iface.netdev, []), names)
    for node, fs in found.items():
        if node in results:
            continue
        measured: dict[str, Value] = {"interfaces": len(planned[node]),
                                      "healthy": sum(1 for i in planned[node] if (node, i.netdev) in ok)}
        results[node] = CheckResult.from_findings(CHECK, node, fs, measured)
    return [results[n] for n in sorted(results)]


def _why(done: Completed | None) -> str:
    if done is None:
        return "not probed"
    if done.unreachable:
        return done.stderr.strip() or "unreachable"
    if done.timed_out:
        return "timed out"
    tail = (done.stderr.strip().splitlines() or [""])[-1]
    return f"exit {done.rc}" + (f": {tail}" if tail else "")
