"""Filters of the roce_qos role: read what mlnx_qos and ibdev2netdev print.

Why a filter and not regexes in YAML: the role must change a port only when it differs from
the spec, so it has to read the current state exactly, and the same reading is unit-tested
on real captured outputs (tests/fixtures/mlnx_qos, tests/fixtures/ibdev2netdev).  Both
tools' layouts come from their sources in github.com/Mellanox/mlnx-tools (pretty_print() of
python/mlnx_qos; ofed_scripts/ibdev2netdev); tabs and runs of spaces are treated alike
because captures found in the wild have their tabs expanded.
"""

from __future__ import annotations

import re
from typing import Any

_TRUST_RE = re.compile(r"^\s*Priority trust state:\s*(\w+)\s*$", re.MULTILINE)
_DCBX_RE = re.compile(r"^\s*DCBX mode:\s*(.+?)\s*$", re.MULTILINE)
_PRIO_RE = re.compile(r"^\s*priority((?:\s+\d){8})\s*$", re.MULTILINE)
_ENABLED_RE = re.compile(r"^\s*enabled((?:\s+[01]){8})\s*$", re.MULTILINE)
_NETDEV_RE = re.compile(r"^(\S+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((Up|Down)\)")


class RoceQosParseError(ValueError):
    """The text is not what the tool prints; the message says what is missing."""


def mlnx_qos_state(text: str) -> dict[str, Any]:
    """``mlnx_qos -i <if>`` output -> {trust, pfc: [8 x 0/1], pfc_priorities, dcbx}."""
    trust = _TRUST_RE.search(text or "")
    prios = _PRIO_RE.search(text or "")
    enabled = _ENABLED_RE.search(text or "")
    if trust is None or prios is None or enabled is None:
        raise RoceQosParseError(
            "not mlnx_qos output: expected 'Priority trust state:' and the PFC 'priority'/'enabled' rows")
    order = [int(p) for p in prios.group(1).split()]
    if sorted(order) != list(range(8)):
        raise RoceQosParseError(f"mlnx_qos PFC header lists priorities {order}, expected 0..7")
    flags = [int(v) for v in enabled.group(1).split()]
    pfc = [0] * 8
    for prio, flag in zip(order, flags, strict=True):
        pfc[prio] = flag
    dcbx = _DCBX_RE.search(text)
    return {
        "trust": trust.group(1),
        "pfc": pfc,
        "pfc_priorities": [p for p in range(8) if pfc[p]],
        "dcbx": dcbx.group(1) if dcbx else None,
    }


def ibdev2netdev_map(text: str) -> dict[str, str]:
    """``ibdev2netdev`` output -> {"mlx5_0/1": "enp23s0np0", ...} (trailing notes ignored)."""
    found: dict[str, str] = {}
    for line in (text or "").splitlines():
        match = _NETDEV_RE.match(line.strip())
        if match:
            found[f"{match.group(1)}/{match.group(2)}"] = match.group(3)
    return found


def pfc_vector(priority: int, enabled: bool = True) -> list[int]:
    """The 8-item PFC vector with only ``priority`` on (all off when ``enabled`` is false)."""
    prio = int(priority)
    if not 0 <= prio <= 7:
        raise RoceQosParseError(f"PFC priority {prio} is outside 0..7")
    return [1 if (enabled and p == prio) else 0 for p in range(8)]


def resolve_ports(ports: list[dict[str, Any]], found: dict[str, str]) -> list[dict[str, Any]]:
    """Each spec port with its netdev: the spec's, else the one ibdev2netdev reports ('' if none).

    ``discovered`` is kept beside it so the role can tell "spec says X, the node says Y" apart
    from "the node has no netdev for this port".
    """
    out = []
    for port in ports:
        number = int(port.get("port") or 1)
        discovered = found.get(f"{port['device']}/{number}", "")
        out.append({"device": port["device"], "port": number, "netdev": port.get("netdev") or discovered,
                    "discovered": discovered})
    return out


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "roce_qos_mlnx_qos_state": mlnx_qos_state,
            "roce_qos_ibdev2netdev": ibdev2netdev_map,
            "roce_qos_pfc_vector": pfc_vector,
            "roce_qos_resolve_ports": resolve_ports,
        }
