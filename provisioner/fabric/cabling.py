"""Cabling: where each node port lands on the switches (live ``iblinkinfo`` or ``ibnetdiscover``) against the spec.

The spec's side is ``fabric.topology.cabling``. Either tool's parsed output is accepted (``tool`` says which).

Findings are written as technician actions ("gpu017 mlx5_3: expected leaf04 port 17, found leaf04 port 18")
because the person who fixes them stands in front of a rack with a cable in hand.

Matching rules (documented so a verdict can be checked by hand):

* a node port is found by its node description: ``"<node> <device>"`` (what rdma-ndd and the lab set), or
  ``"<node> HCA-<n>"`` (the kernel default, n = the device's position in the node's profile, from 1);
* a spec switch ``leaf04`` matches a live switch whose description is ``leaf04`` or contains it as a
  ``;``/``:``/``/``-separated token (``MF0;leaf04:MQM9700/U1``), in any case (the spec's switch names are
  lowercase host names; sites often name switches ``MF0;A09-P1-IBLEAF-04-04:MQM9701/U1``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from provisioner.fabric.findings import Finding
from provisioner.spec.cluster import CableX, Cluster

CHECK = "cabling"


def switch_matches(spec_name: str, description: str | None) -> bool:
    """Whether a live switch description names the spec's switch (see the module docstring)."""
    if not description:
        return False
    name, desc = spec_name.casefold(), description.casefold()
    return desc == name or name in re.split(r"[;:/\s]+", desc)


def _descriptions(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """Node description → (node, device), both forms."""
    out: dict[str, tuple[str, str]] = {}
    for node in cluster.nodes:
        for i, p in enumerate(node.ports):
            out[f"{node.name} {p.device}"] = (node.name, p.device)
            out.setdefault(f"{node.name} HCA-{i + 1}", (node.name, p.device))
    return out


def live_map(cluster: Cluster, iblinkinfo: Mapping[str, Any]) -> dict[tuple[str, str], tuple[str, int] | None]:
    """``{(node, device): (switch description, switch port) or None when the port has no live link}``."""
    names = _descriptions(cluster)
    if iblinkinfo.get("tool") == "ibnetdiscover":
        return _live_map_ibnetdiscover(names, iblinkinfo)
    found: dict[tuple[str, str], tuple[str, int] | None] = {}
    for link in iblinkinfo.get("links", []):
        ca = names.get(str(link.get("switch")))
        if ca is not None:
            if link.get("peer") and link.get("peer_port") is not None:
                found[ca] = (str(link["peer"]), int(link["peer_port"]))
            else:
                found.setdefault(ca, None)
    for link in iblinkinfo.get("links", []):  # the switch side, when the CA block is absent
        ca = names.get(str(link.get("peer")))
        if ca is not None and found.get(ca) is None and link.get("switch") is not None:  # grep'd: owner unknown
            found[ca] = (str(link.get("switch")), int(link.get("port", 0)))
    return found


def _live_map_ibnetdiscover(
    names: Mapping[str, tuple[str, str]], topo: Mapping[str, Any]
) -> dict[tuple[str, str], tuple[str, int] | None]:
    """The same map from ``ibnetdiscover``: a CA it found with no link maps to None; one it did not find is absent.

    ibnetdiscover prints no line for a port without a link, and cannot reach a CA whose only port is
    down at all, so "not in the fabric" is the usual verdict for an unplugged single-port HCA.
    """
    switches = {str(s.get("guid")): str(s.get("name")) for s in topo.get("switches", [])}
    found: dict[tuple[str, str], tuple[str, int] | None] = {}
    for ca in topo.get("cas", []):
        key = names.get(str(ca.get("name")))
        if key is not None:
            found.setdefault(key, None)
    for link in topo.get("links", []):
        for mine, other in (("from", "to"), ("to", "from")):
            key = names.get(str(link.get(f"{mine}_name")))
            switch = switches.get(str(link.get(f"{other}_guid")))
            if key is not None and switch is not None and link.get(f"{other}_port") is not None:
                found[key] = (switch, int(link[f"{other}_port"]))
    return found


def _spec_switch(description: str, switches: Sequence[str]) -> str:
    return next((s for s in switches if switch_matches(s, description)), description)


def cabling_findings(cluster: Cluster, iblinkinfo: Mapping[str, Any]) -> list[Finding]:
    """One error per spec cable that is missing or lands elsewhere, phrased as what to do at the rack.

    ``iblinkinfo`` is the parsed output of ``iblinkinfo`` or of ``ibnetdiscover`` (see :func:`live_map`).
    """
    live = live_map(cluster, iblinkinfo)
    switches = [s.name for s in cluster.switches]
    ports = {(n.name, p.device): p for n in cluster.nodes for p in n.ports}
    found: list[Finding] = []
    for cable in sorted(cluster.cables, key=lambda c: (c.node, c.device)):
        got = live.get((cable.node, cable.device))
        want = f"{cable.switch} port {cable.switch_port}"
        port = ports.get((cable.node, cable.device))
        if got is not None and switch_matches(cable.switch, got[0]) and got[1] == cable.switch_port:
            continue
        if got is None:
            observed = "no link" if (cable.node, cable.device) in live else "not in the fabric"
            action = f"{cable.node} {cable.device}: expected {want}, found {observed}"
            hint = "check that the cable is plugged in at both ends and the port is up (ibstat, switch LEDs)"
        else:
            observed = f"{_spec_switch(got[0], switches)} port {got[1]}"
            action = f"{cable.node} {cable.device}: expected {want}, found {observed}"
            hint = f"move the cable from {observed} to {want}" + _who_is_there(cable, live, switches)
        found.append(Finding(CHECK, "error", cable.node, cable.device, port.port if port else None, want,
                             observed, action, hint, rail=port.rail if port else None))
    return found


def _who_is_there(cable: CableX, live: Mapping[tuple[str, str], tuple[str, int] | None], switches: list[str]) -> str:
    for (node, dev), where in sorted(live.items(), key=lambda kv: kv[0]):
        if where and where[1] == cable.switch_port and switch_matches(cable.switch, where[0]):
            return f" ({node} {dev} is plugged into {cable.switch} port {cable.switch_port} now)"
    return ""
