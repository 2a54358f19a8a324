"""Link check: every port the spec names is present, Active/LinkUp, at its rate, with an SM LID, on the right layer,
and has not been flapping or collecting bit errors.

Input per node is one SSH round trip (:data:`PROBE_SCRIPT`): ``ibstat`` (state, rate, LIDs, GUIDs), ``ibstatus``
(the sysfs ``rate`` line with width and speed: ``200 Gb/sec (2X NDR)``) and every
``/sys/class/infiniband/<dev>/ports/<p>/counters/*`` file; :func:`split_probe` cuts it apart. The expected state
comes from the spec's ports only, never from what a node shows today. ``ibstat`` prints no width, so a port that
trained at fewer lanes shows up Active/LinkUp at a lower rate; ibstatus says which of width or speed is off, and
:func:`explain_rate` guesses from the numbers where ibstatus is missing.

Counters are read at the start of ``verify`` and again at its end (:func:`counter_findings`): counts from before
the run are history (a warning: the port flapped at some point since the counters were cleared), counts that grow
while verify runs are an error (the link is bouncing now, under the traffic verify itself sent).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from provisioner.fabric import schedule
from provisioner.fabric.findings import CheckResult, Finding, Severity
from provisioner.spec.catalog import IB_SPEEDS, WIDTHS
from provisioner.spec.cluster import Cluster, Node, Port

CHECK = "links"

IBSTATUS_MARK = "--- provisioner links: ibstatus ---"
COUNTERS_MARK = "--- provisioner links: counters ---"
COUNTERS_SCRIPT = "grep -Hs . /sys/class/infiniband/*/ports/*/counters/* 2>/dev/null; true"
"""Every port counter as ``<path>:<value>`` lines (grep -H), unreadable files skipped (-s): one command for
any number of HCAs, and a missing ``counters`` directory yields no line rather than an error."""
PROBE_SCRIPT = (f"ibstat; rc=$?; echo '{IBSTATUS_MARK}'; ibstatus 2>&1; echo '{COUNTERS_MARK}'; "
                f"{COUNTERS_SCRIPT}; exit $rc")
"""The links probe, run with ``sh -c``: ibstat, ibstatus and the counters in one round trip. The exit status
is ibstat's, so an unreachable or broken node reads as before."""

FLAP_COUNTERS = ("link_downed", "link_error_recovery")
#: ``expected`` of the error a port gets when its flap counters grew while verify ran
FLAPPED_DURING_RUN = "no link drops during verify"
ERROR_THRESHOLDS: dict[str, int] = {
    "symbol_error": 10,
    "port_rcv_errors": 10,
    "local_link_integrity_errors": 0,
    "excessive_buffer_overrun_errors": 0,
    "port_rcv_remote_physical_errors": 100,
    "port_xmit_discards": 100,
}
"""Warn when a counter is above this. ibqueryerrors reports anything above 0; here a handful of symbol/receive
errors is allowed (a link that retrained once logs some), while the 4-bit integrity/overrun counters are
reported at once. Remote physical errors and transmit discards are mostly caused elsewhere (a bad link
upstream, congestion, a port that was down with packets queued), hence the higher bar."""
_COUNTER_RE = re.compile(r"^\S*/infiniband/([^/\s]+)/ports/(\d+)/counters/([A-Za-z0-9_]+):\s*(\d+)\s*$")

#: Data rate per lane and lanes per width: the catalog's tables (FDR 14, EDR 25, HDR 50, NDR 100, XDR 200).
LANE_GBPS: dict[str, float] = {k: v for k, v in IB_SPEEDS.items() if k != "FDR10"}
WIDTH_LANES = WIDTHS


def _speed_name(lane: float) -> str | None:
    return next((name for name, g in LANE_GBPS.items() if abs(g - lane) < 0.01), None)


def explain_rate(expected_gbps: float, observed_gbps: float, width: str) -> str:
    """Why a port is slower than the spec, from the rates alone: degraded width or a slower lane speed.

    ``expected_gbps`` is width × lane rate of the spec; a rate that equals k × the same lane rate (k below
    the spec width) is a width problem (a lane down: cable, transceiver), otherwise a lower speed generation
    (wrong cable/transceiver type, auto-negotiation, a port forced to a speed).
    """
    lanes = WIDTH_LANES.get(width, 4)
    lane = expected_gbps / lanes
    narrow = ""
    for k in sorted((w for w in set(WIDTH_LANES.values()) if w < lanes), reverse=True):
        if abs(observed_gbps - lane * k) < 0.01:
            speed = _speed_name(lane)
            narrow = f"width degraded to {k}X (lanes at {speed or f'{lane:g} Gb/s'} as expected)"
            break
    slow_speed = _speed_name(observed_gbps / lanes)
    slow = f"speed degraded to {slow_speed} ({width} at {observed_gbps / lanes:g} Gb/s per lane)" if slow_speed else ""
    if narrow and slow:
        # e.g. NDR 2X and HDR 4X are both 200 Gb/s: the rate alone cannot tell them apart, so say both.
        return f"{narrow} or {slow}; ibstat cannot tell which (ibstatus or mlxlink shows width and speed)"
    return narrow or slow or "rate below the spec"


def _ports_by_key(ibstat: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for dev in ibstat.get("devices", []):
        for port in dev.get("ports", []):
            out[(str(dev.get("name")), int(port.get("port", 1)))] = port
    return out


def _f(node: str, port: Port, severity: Severity, expected: Any, observed: Any, message: str, hint: str) -> Finding:
    return Finding(
        check=CHECK,
        severity=severity,
        node=node,
        device=port.device,
        port=port.port,
        expected=expected,
        observed=observed,
        message=message,
        hint=hint,
        rail=port.rail,
    )


def split_probe(stdout: str) -> tuple[str, str, str]:
    """The :data:`PROBE_SCRIPT` output cut into (ibstat, ibstatus, counters) text; a missing part is ""."""
    head, _, rest = stdout.partition(IBSTATUS_MARK + "\n")
    if not rest and IBSTATUS_MARK not in stdout:
        return stdout, "", ""
    status, _, counters = rest.partition(COUNTERS_MARK + "\n")
    return head, status, counters


def parse_counters(text: str) -> dict[tuple[str, int], dict[str, int]]:
    """``grep -H`` lines of ``counters/*`` files -> {(device, port): {counter: value}}.

    Lines that are not ``<sysfs path>:<number>`` are skipped: the kernel prints ``N/A (no PMA)`` for a counter
    it cannot read, and a port without a PMA has no usable counters at all.
    """
    out: dict[tuple[str, int], dict[str, int]] = {}
    for line in text.splitlines():
        m = _COUNTER_RE.match(line.strip())
        if m:
            out.setdefault((m.group(1), int(m.group(2))), {})[m.group(3)] = int(m.group(4))
    return out


def status_by_port(ibstatus: Mapping[str, Any] | None) -> dict[tuple[str, int], dict[str, Any]]:
    """Parsed ``ibstatus`` records keyed by (device, port)."""
    ports = (ibstatus or {}).get("ports", [])
    return {(str(r.get("device")), int(r.get("port", 1))): r for r in ports}


def rate_cause(port: Port, status: Mapping[str, Any] | None) -> str:
    """Which of width and speed is below the spec, from ibstatus' ``rate: 200 Gb/sec (2X NDR)``; "" if unknown.

    Exactly what to look for: a narrower width is a lane down (cable, transceiver, connector), a slower speed
    a cable/transceiver of an older generation or a port forced to a lower speed.
    """
    if not status or not status.get("width") or not status.get("speed"):
        return ""
    expected_speed = _speed_name(port.rate_gbps / WIDTH_LANES.get(port.width, 4))
    parts = []
    if status["width"] != port.width:
        parts.append(f"width {status['width']}, expected {port.width}")
    if expected_speed and status["speed"] != expected_speed:
        parts.append(f"speed {status['speed']}, expected {expected_speed}")
    return "; ".join(parts)


def port_findings(node: Node, ibstat: Mapping[str, Any], ibstatus: Mapping[str, Any] | None = None) -> list[Finding]:
    """Findings for one node's ports (empty when every spec port is as the spec says).

    ``ibstatus`` (parsed) names the cause of a low rate exactly (width or speed); without it the cause is
    inferred from the rate.
    """
    found: list[Finding] = []
    status = status_by_port(ibstatus)
    for err in ibstat.get("errors", []):
        found.append(
            Finding(CHECK, "error", node.name, None, None, "ibstat output", "ibstat error", f"ibstat: {err}",
                    "check the RDMA driver (lsmod | grep mlx5) and ibstat -l")
        )
    seen = _ports_by_key(ibstat)
    devices = sorted({d for d, _ in seen})
    for p in node.ports:
        obs = seen.get((p.device, p.port))
        if obs is None:
            dev_known = p.device in devices
            found.append(_f(
                node.name, p, "error", "present", "missing",
                f"{p.device} port {p.port} {'has no such port' if dev_known else 'not found'}"
                + (f" (ibstat lists {', '.join(devices)})" if devices else " (ibstat lists no device)"),
                "check that the HCA is seated and its driver loaded (lspci | grep -i mellanox; ibstat -l); "
                "device names follow PCI order and can shift when a card is missing",
            ))
            continue
        state, phys = obs.get("state"), obs.get("physical_state")
        if state != "active" or phys != "linkup":
            if phys == "linkup" and state in ("init", "armed"):
                hint = "the link trained but no subnet manager configured it: check that opensm runs (sminfo)"
            elif phys == "disabled":
                hint = "the port is administratively disabled: ibportstate <lid> <port> enable, or the switch side"
            elif phys == "polling":
                hint = "no light from the far end: check the cable, the transceiver and the switch port"
            else:
                hint = "check the cable, the switch port and dmesg for mlx5 errors"
            found.append(_f(node.name, p, "error", "Active/LinkUp", f"{state}/{phys}",
                            f"{p.device}/{p.port} is {state}/{phys}", hint))
            continue
        rate = obs.get("rate_gbps")
        if isinstance(rate, int | float) and rate < p.rate_gbps - 0.01:
            why = rate_cause(p, status.get((p.device, p.port))) or explain_rate(p.rate_gbps, float(rate), p.width)
            found.append(_f(
                node.name, p, "error", p.rate_gbps, rate,
                f"{p.device}/{p.port} runs at {rate:g} Gb/s, spec {p.rate_gbps:g} Gb/s {p.width}: {why}",
                "reseat or replace the cable/transceiver; check the switch port's speed and width settings "
                "(mlxlink -d <dev> shows the lanes)",
            ))
        elif isinstance(rate, int | float) and rate > p.rate_gbps + 0.01:
            found.append(_f(node.name, p, "warning", p.rate_gbps, rate,
                            f"{p.device}/{p.port} runs at {rate:g} Gb/s, faster than the spec's {p.rate_gbps:g}",
                            "update the spec's rate if the hardware was upgraded"))
        layer = obs.get("link_layer")
        if layer is not None and layer != p.link_layer:
            found.append(_f(node.name, p, "error", p.link_layer, layer,
                            f"{p.device}/{p.port} link layer is {layer}, spec says {p.link_layer}",
                            "set the port type with mlxconfig (LINK_TYPE_P1) and reboot, or fix the spec"))
        if p.link_layer == "infiniband" and not obs.get("sm_lid"):
            found.append(_f(node.name, p, "error", "SM LID set", obs.get("sm_lid"),
                            f"{p.device}/{p.port} has no SM LID: no subnet manager has swept this port",
                            "check the subnet manager (sminfo; systemctl status opensm)"))
    return found


def _flaps(counts: Mapping[str, int]) -> int:
    return sum(counts.get(name, 0) for name in FLAP_COUNTERS)


def _flap_finding(node: str, p: Port, before: Mapping[str, int], after: Mapping[str, int] | None) -> Finding | None:
    """Error when link_downed/link_error_recovery grew during the run, warning when they were already > 0."""
    if after is not None and _flaps(after) > _flaps(before):
        moved = ", ".join(f"{n} {before.get(n, 0)} -> {after.get(n, 0)}" for n in FLAP_COUNTERS
                          if after.get(n, 0) != before.get(n, 0))
        return _f(node, p, "error", FLAPPED_DURING_RUN, moved,
                  f"{p.device}/{p.port} flapped during this verify run ({moved})",
                  "the link is unstable right now: reseat or replace the cable and transceiver, check the switch "
                  "port (mlxlink -d <dev> shows lanes and errors). Counts that grow while verify runs are an error; "
                  "counts from before the run alone are only a warning, since they may be an old, fixed event")
    latest = after if after is not None else before
    flaps = _flaps(latest)
    if not flaps:
        return None
    detail = ", ".join(f"{n} {latest.get(n, 0)}" for n in FLAP_COUNTERS)
    return _f(node, p, "warning", 0, flaps,
              f"{p.device}/{p.port} flapped {flaps} times since the counters were last cleared ({detail})",
              "the port is up now but went down or retrained before: if the counts grow, reseat or replace the "
              "cable/transceiver; after a fix clear them (perfquery -R on the node) so the next verify starts at "
              "zero. verify re-reads them at the end of the run and fails the port if they grow")


def _error_finding(node: str, p: Port, counts: Mapping[str, int]) -> Finding | None:
    """Warning naming every error counter above :data:`ERROR_THRESHOLDS`."""
    over = {n: counts[n] for n, limit in ERROR_THRESHOLDS.items() if counts.get(n, 0) > limit}
    if not over:
        return None
    text = ", ".join(f"{n} {v} (> {ERROR_THRESHOLDS[n]})" for n, v in over.items())
    return _f(node, p, "warning", "error counters within thresholds", text,
              f"{p.device}/{p.port} error counters above threshold: {text}",
              "bit errors on a port that is up point at a marginal cable, transceiver or connector: check the BER "
              "(mlxlink -d <dev> -c), reseat or replace, then clear the counters (perfquery -R)")


def counter_findings(node: Node, before: Mapping[tuple[str, int], Mapping[str, int]],
                     after: Mapping[tuple[str, int], Mapping[str, int]] | None = None) -> list[Finding]:
    """Flap and error-counter findings for one node's spec ports.

    ``before`` is read at the start of verify, ``after`` (None when not re-read) at its end. A port with no
    counters (no PMA, an older kernel, a RoCE port without them) gets no finding.
    """
    found: list[Finding] = []
    for p in node.ports:
        start = before.get((p.device, p.port))
        if start is None:
            continue
        end = after.get((p.device, p.port)) if after is not None else None
        for finding in (_flap_finding(node.name, p, start, end), _error_finding(node.name, p, end or start)):
            if finding is not None:
                found.append(finding)
    return found


def sm_lid_findings(nodes: Iterable[Node], observed: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
    """One SM for the whole fabric: every active InfiniBand port must report the same SM LID.

    The majority value is taken as the fabric's; each port that differs gets an error (two SMs both
    master, a split subnet, or a port that has not seen the current master yet).
    """
    by_lid: dict[int, list[tuple[str, Port]]] = defaultdict(list)
    for node in sorted(nodes, key=lambda n: n.name):
        name = node.name
        ports = _ports_by_key(observed.get(name, {}))
        for p in node.ports:
            obs = ports.get((p.device, p.port))
            if p.link_layer != "infiniband" or not obs or obs.get("state") != "active" or not obs.get("sm_lid"):
                continue
            by_lid[int(obs["sm_lid"])].append((name, p))
    if len(by_lid) < 2:
        return []
    majority = max(by_lid, key=lambda lid: (len(by_lid[lid]), -lid))
    found = []
    for lid, odd in sorted(by_lid.items()):
        if lid == majority:
            continue
        for name, q in odd:
            found.append(_f(name, q, "error", majority, lid,
                            f"{q.device}/{q.port} reports SM LID {lid}, the rest of the fabric {majority}",
                            "two subnet managers may both be master, or the fabric is split: check sminfo on "
                            "both sides and the SM priorities"))
    return found


def port_guids(ibstat: Mapping[str, Any]) -> dict[str, str]:
    """``{"mlx5_0/1": port GUID}`` for the hardware inventory (state journal, hardware-swap detection)."""
    return {f"{d}/{p}": str(port["port_guid"]) for (d, p), port in sorted(_ports_by_key(ibstat).items())
            if port.get("port_guid")}


def firmware(ibstat: Mapping[str, Any]) -> dict[str, str]:
    """``{device: firmware version}`` as ibstat reports it."""
    return {str(d.get("name")): str(d["firmware"]) for d in ibstat.get("devices", []) if d.get("firmware")}


def blame_flapping_ends(checks: Iterable[CheckResult], cluster: Cluster) -> list[CheckResult]:
    """Name the flapping end of a failed pair instead of "the link or route between them".

    A port that drops the link now and then fails only some ``ib_write_bw`` runs over it, so the pairwise
    schedule can see one failed pair whose two ends both pass with other nodes and can only blame the route
    between them. When the end-of-run counters show that exactly one end's port on that rail flapped during
    this run, that port is the cause: the pair's finding is given to it (``node`` that end, ``peer`` the other).
    With both ends or neither flapping the finding stays as it was.
    """
    results = list(checks)
    flapped = {(f.node, f.device) for c in results if c.name == CHECK for f in c.findings
               if f.severity == "error" and f.expected == FLAPPED_DURING_RUN and f.node and f.device}
    if not flapped:
        return results

    def device_on_rail(node: str, rail: int) -> str | None:
        try:
            ports = cluster.node(node).ports
        except KeyError:
            return None
        return next((p.device for p in ports if p.rail == rail), None)

    def reattributed(f: Finding) -> Finding:
        if (f.check != schedule.CHECK_NAME or f.severity != "error" or f.peer is None or f.node is None
                or f.rail is None):
            return f
        ends = [(n, device_on_rail(n, f.rail)) for n in (f.node, f.peer)]
        guilty = [(n, d) for n, d in ends if d is not None and (n, d) in flapped]
        if len(guilty) != 1:
            return f
        node, device = guilty[0]
        other = f.peer if node == f.node else f.node
        return Finding(
            check=f.check, severity="error", node=node, device=device, port=None, expected=f.expected,
            observed=f"failed with {other}; {node} {device} flapped during the run",
            message=f"{node} rail {f.rail}: the run with {other} failed while {node}'s {device} flapped "
                    "(its link counters grew during this verify run)",
            hint="the link is unstable: reseat or replace this port's cable and transceiver and check the switch "
                 "port (mlxlink -d <dev>); the other end passed with other nodes",
            rail=f.rail, peer=other,
        )

    out: list[CheckResult] = []
    for c in results:
        # the pair findings (check "pairwise_bandwidth") come inside the bandwidth check's result ("bandwidth"):
        # match the findings, never the result's name
        if not c.findings:
            out.append(c)
            continue
        found = tuple(reattributed(f) for f in c.findings)
        out.append(c if found == c.findings else CheckResult(
            name=c.name, node=c.node, passed=c.passed, findings=found, measurements=c.measurements,
            error=c.error, skipped=c.skipped))
    return out
