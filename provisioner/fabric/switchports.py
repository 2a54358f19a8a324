"""Error counters of every switch port, fabric-wide, judged by the thresholds node ports are judged by.

One command from one node that answers: ``ibqueryerrors --switch`` (infiniband-diags) asks every switch's PMA
and prints each port whose error counters are above 0 (its default thresholds), by libibmad's field names
(``SymbolErrorCounter``, ``LinkDownedCounter``, ...). They are mapped to the kernel's sysfs counter names so the
judgement is :mod:`provisioner.fabric.links`' own, word for word:

* counts above :data:`provisioner.fabric.links.ERROR_THRESHOLDS` are a warning (a marginal cable or transceiver);
* ``link_downed``/``link_error_recovery`` above 0 are a warning (the link went down or retrained since the
  counters were cleared), and an **error** when they grow between the read at the start of ``verify`` and the
  one at its end (the link bounces now, under verify's own traffic).

A switch's ``port ALL`` line (the sum over its ports) and port 0 (its management port) are not judged. The
switch is named as the spec names it where its description matches (``MF0;leaf04:MQM9700/U1`` is ``leaf04``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from provisioner.fabric.cabling import switch_matches
from provisioner.fabric.findings import Finding
from provisioner.fabric.links import ERROR_THRESHOLDS, FLAP_COUNTERS
from provisioner.spec.cluster import Cluster

CHECK = "switch_ports"
COMMAND = ["ibqueryerrors", "--switch"]
"""Every switch port with an error counter above 0 (rc 1 when any is printed, which is not a failure)."""

MAD_TO_SYSFS: dict[str, str] = {
    "SymbolErrorCounter": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped",
    "PortXmitWait": "port_xmit_wait",
}
"""libibmad's PortCounters field names (``fields.c``) -> the kernel's sysfs counter files (``counters/<name>``)."""

PortKey = tuple[str, int]
Counts = dict[PortKey, dict[str, int]]


def read_counters(cluster: Cluster, parsed: Mapping[str, Any]) -> Counts:
    """``{(switch, port): {sysfs counter name: value}}`` for every switch port ibqueryerrors printed."""
    names = [s.name for s in cluster.switches]
    out: Counts = {}
    for node in parsed.get("nodes", []):
        if node.get("type") != "switch":
            continue
        desc = str(node.get("name"))
        switch = next((n for n in names if switch_matches(n, desc)), desc)
        for port in node.get("ports", []):
            number = port.get("port")
            if not isinstance(number, int) or number == 0:
                continue  # "port ALL" (a sum) and the management port
            counts = {MAD_TO_SYSFS[k]: int(v) for k, v in port.get("counters", {}).items() if k in MAD_TO_SYSFS}
            out[(switch, number)] = counts
    return out


def _flaps(counts: Mapping[str, int]) -> int:
    return sum(counts.get(n, 0) for n in FLAP_COUNTERS)


def port_findings(before: Counts, after: Counts | None = None,
                  peers: Mapping[PortKey, str] | None = None) -> list[Finding]:
    """Flap and error-counter findings per switch port (``after`` None when the counters were read once)."""
    found: list[Finding] = []
    for key in sorted(set(before) | set(after or {})):
        switch, port = key
        where = f"{switch} port {port}" + (f" (↔ {peers[key]})" if peers and key in peers else "")
        start = before.get(key, {})
        end = after.get(key, {}) if after is not None else None
        latest = end if end is not None else start
        if end is not None and _flaps(end) > _flaps(start):
            moved = ", ".join(f"{n} {start.get(n, 0)} -> {end.get(n, 0)}" for n in FLAP_COUNTERS
                              if end.get(n, 0) != start.get(n, 0))
            found.append(Finding(CHECK, "error", None, None, port, "no link drops during verify", moved,
                                 f"{where} flapped during this verify run ({moved})",
                                 "the link is unstable now: reseat or replace the cable and both transceivers",
                                 switch=switch))
        elif _flaps(latest):
            detail = ", ".join(f"{n} {latest.get(n, 0)}" for n in FLAP_COUNTERS)
            found.append(Finding(CHECK, "warning", None, None, port, 0, _flaps(latest),
                                 f"{where} flapped {_flaps(latest)} times since the counters were last cleared "
                                 f"({detail})",
                                 "if the counts grow, reseat or replace the cable; after a fix clear them "
                                 "(ibqueryerrors -k, or perfquery -R <lid> <port>)", switch=switch))
        over = {n: latest[n] for n, limit in ERROR_THRESHOLDS.items() if latest.get(n, 0) > limit}
        if over:
            text = ", ".join(f"{n} {v} (> {ERROR_THRESHOLDS[n]})" for n, v in over.items())
            found.append(Finding(CHECK, "warning", None, None, port, "error counters within thresholds", text,
                                 f"{where} error counters above threshold: {text}",
                                 "bit errors on a link that is up point at a marginal cable, transceiver or "
                                 "connector: check the BER (mlxlink on the switch), reseat or replace, then clear "
                                 "the counters", switch=switch))
    return found


def sweep_gaps(parsed: Mapping[str, Any]) -> list[Finding]:
    """An error when the sweep did not reach the whole fabric: discovery paths that timed out or PMA queries
    that failed leave switches (and every port behind them) unread, which must not read as clean counters."""
    errors = [str(e) for e in parsed.get("errors", [])]
    pma = int((parsed.get("summary") or {}).get("pma_query_failures") or 0)
    if not errors and not pma:
        return []
    parts = ([f"{len(errors)} discovery/query error(s), first: {errors[0]}"] if errors else []) + (
        [f"{pma} PMA query failure(s)"] if pma else [])
    return [Finding(CHECK, "error", None, None, None, "every switch answers", "; ".join(parts),
                    "ibqueryerrors did not reach the whole fabric: " + "; ".join(parts)
                    + " (the ports behind those paths were not read)",
                    "a switch or link that does not answer SMPs/PMA queries: check the path with ibtracert and "
                    "iblinkinfo, the switch's management state and its firmware; then run verify again")]
