"""Partition reachability in the simulated fabric (stdlib only).

IBA partitioning: two end ports can talk in a partition when both hold its P_Key and at
least one of them is a full member (two limited members cannot).  The simulated SM records
the partitions it enforces in ``<lab root>/sm/partitions.json`` (parsed partitions.conf
entries: name, pkey, members [{member, membership}]); ``ALL`` and ``SELF`` are the
partitions.conf keywords for every port and the SM's own port.
"""

from __future__ import annotations

import json
import os
from typing import Any


def _guid(value: object) -> int:
    try:
        return int(str(value), 16)
    except ValueError:
        return -1


def membership(partition: dict[str, Any], port_guid: str, sm_guid: str = "") -> str | None:
    """``full``, ``limited`` or None for one port in one partition (the last matching entry wins)."""
    found: str | None = None
    for entry in partition.get("members", []):
        who = str(entry.get("member", ""))
        matches = (
            who == "ALL"
            or (who == "SELF" and sm_guid and _guid(sm_guid) == _guid(port_guid))
            or (who.lower().startswith("0x") and _guid(who) == _guid(port_guid))
        )
        if matches:
            found = "full" if str(entry.get("membership", "limited")) == "full" else "limited"
    return found


def can_reach(partitions: list[dict[str, Any]], pkey: str, src_guid: str, dst_guid: str, sm_guid: str = "") -> bool:
    """True when ``src`` and ``dst`` share partition ``pkey`` and one of them is a full member."""
    for part in partitions:
        if _guid(part.get("pkey")) & 0x7FFF != _guid(pkey) & 0x7FFF:
            continue
        a, b = membership(part, src_guid, sm_guid), membership(part, dst_guid, sm_guid)
        return a is not None and b is not None and "full" in (a, b)
    return False


def load_partitions(root: str) -> list[dict[str, Any]]:
    """What the master SM enforces now (empty when no SM has swept)."""
    try:
        with open(os.path.join(root, "sm", "partitions.json"), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []
