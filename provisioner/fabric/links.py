"""Link check: every port the spec names is present, Active/LinkUp, at its rate, with an SM LID, on the right layer.

Input is the parsed ``ibstat`` of each node (``provisioner.parsers.parse("ibstat", text)``); the expected state
comes from the spec's ports only, never from what a node shows today. ``ibstat`` prints no width, so a port
that trained at fewer lanes shows up Active/LinkUp at a lower rate; :func:`explain_rate` names that case
(width or speed) from the numbers, because "rate 200, expected 400" alone sends people to the wrong place.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from provisioner.fabric.findings import Finding, Severity
from provisioner.spec.catalog import IB_SPEEDS, WIDTHS
from provisioner.spec.cluster import Node, Port

CHECK = "links"

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
    for k in sorted((w for w in set(WIDTH_LANES.values()) if w < lanes), reverse=True):
        if abs(observed_gbps - lane * k) < 0.01:
            speed = _speed_name(lane)
            return f"width degraded to {k}X (lanes at {speed or f'{lane:g} Gb/s'} as expected)"
    speed = _speed_name(observed_gbps / lanes)
    if speed:
        return f"speed degraded to {speed} ({width} at {observed_gbps / lanes:g} Gb/s per lane)"
    return "rate below the spec"


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


def port_findings(node: Node, ibstat: Mapping[str, Any]) -> list[Finding]:
    """Findings for one node's ports (empty when every spec port is as the spec says)."""
    found: list[Finding] = []
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
            why = explain_rate(p.rate_gbps, float(rate), p.width)
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
