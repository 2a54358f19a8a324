"""Parser for ``ibnetdiscover`` (the default topology-file form from infiniband-diags).

The output is one block per node: ``vendid=``/``devid=``/``*guid=`` lines, a node line
(``Switch  36 "S-<guid>"  # "<description>" base port 0 lid 48 lmc 0`` or
``Ca  2 "H-<guid>"  # "<description>"``) and one line per connected port. Switch port lines
read ``[port]  "H-<peer guid>"[peer port](peer port guid)  # "<peer description>" lid N 4xEDR``;
CA port lines put their own port GUID after the port and the local LID/LMC in the comment.
Each node record lists ``ports``: the port numbers printed under it, i.e. the ports with a live
link (ibnetdiscover prints no line for a port that is down), next to ``num_ports`` (all ports).

Every physical link is printed twice (once from each end), so links are reported once,
keyed on the unordered pair of (node GUID, port). The trailing ``4xEDR`` is the *active*
width and speed, which is where a link that trained narrow (``1xSDR``) shows up.

A run that failed before printing any node (``ibnetdiscover: iberror: failed: discover failed`` after the
library's ``ibwarn:``/``ibnetdisc.c:802; can't open MAD port`` lines) is ibnetdiscover's output too: ``ok``
false, ``error`` the iberror message, every error line in ``errors``.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import diag_error_line, iberror_text, norm_guid, require_text
from provisioner.spec.catalog import IB_SPEEDS

#: Per-lane data rate (Gb/s) of each speed name, for the nominal link rate.
_LANE_GBPS = IB_SPEEDS

_NODE_RE = re.compile(
    r'^\s*(?P<kind>Switch|Ca|Rt)\s+(?P<nports>\d+)\s+"(?P<type>[SHR])-(?:0x)?(?P<guid>[0-9a-fA-F]+)"'
    r'\s*#\s*"(?P<desc>[^"]*)"(?P<rest>.*)$'
)
_PORT_RE = re.compile(
    r"^\s*\[(?P<port>\d+)\](?:\[ext \d+\])?(?:\((?:0x)?(?P<pguid>[0-9a-fA-F]+)\))?\s+"
    r'"(?P<ptype>[SHR])-(?:0x)?(?P<peer>[0-9a-fA-F]+)"\[(?P<pport>\d+)\](?:\[ext \d+\])?'
    r"(?:\((?:0x)?(?P<ppguid>[0-9a-fA-F]+)\))?\s*#\s*(?P<comment>.*?)\s*$"
)
_LINK_TAIL_RE = re.compile(r"(?P<width>\d+)x(?P<speed>[A-Za-z0-9]+)$")
_LID_RE = re.compile(r"\blid (\d+)")
_QUOTED_RE = re.compile(r'"([^"]*)"')


def _link_rate(width: str | None, speed: str | None) -> float | None:
    """Nominal data rate of a link (4X EDR -> 100.0), or None when either part is unknown."""
    if width is None or speed is None or speed not in _LANE_GBPS:
        return None
    return int(width.rstrip("X")) * _LANE_GBPS[speed]


def _node_record(m: re.Match[str]) -> dict[str, Any]:
    lid = _LID_RE.search(m.group("rest"))
    return {
        "guid": norm_guid(m.group("guid")),
        "name": m.group("desc"),
        "num_ports": int(m.group("nports")),
        "ports": [],
        "lid": int(lid.group(1)) if lid else None,
    }


def _lanes(width: str | None) -> int:
    return int(width.rstrip("X")) if width else 0


def _merge_far_end(
    link: dict[str, Any], name: str, port: int, width: str | None, speed: str | None, warnings: list[str]
) -> None:
    """Fold the second sighting of a link into the first; keep the narrower width if they differ.

    Both ends of a real link report the same active width and speed, so a disagreement means
    the two sightings were taken at different moments (a link retraining) and is worth a warning.
    """
    if (width, speed) == (link["width"], link["speed"]) or width is None:
        return
    warnings.append(
        f"{link['from_name']} port {link['from_port']} reports {link['width']} {link['speed']} but the "
        f"far end ({name} port {port}) reports {width} {speed}: link may be retraining"
    )
    if _lanes(width) < _lanes(link["width"]):
        link["width"], link["speed"], link["rate_gbps"] = width, speed, _link_rate(width, speed)


def parse_ibnetdiscover(text: str) -> dict[str, Any]:
    """Parse ``ibnetdiscover`` into switches, CAs and de-duplicated links."""
    require_text("ibnetdiscover", text)
    switches: list[dict[str, Any]] = []
    cas: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    links: list[dict[str, Any]] = []
    seen: dict[frozenset[tuple[str, int]], dict[str, Any]] = {}
    warnings: list[str] = []
    errors: list[str] = []
    node: dict[str, Any] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if diag_error_line(stripped, "ibnetdiscover"):
            errors.append(stripped)
            continue
        n = _NODE_RE.match(line)
        if n:
            node = _node_record(n)
            names[node["guid"]] = node["name"]
            if n.group("kind") == "Switch":
                switches.append(node)
            elif n.group("kind") == "Ca":
                node.pop("lid")
                cas.append(node)
            continue
        p = _PORT_RE.match(line)
        if not p or node is None:
            continue
        comment = p.group("comment")
        tail = _LINK_TAIL_RE.search(comment)
        width = f"{tail.group('width')}X" if tail else None
        speed = tail.group("speed").upper() if tail else None
        quoted = _QUOTED_RE.findall(comment)
        from_port, to_port = int(p.group("port")), int(p.group("pport"))
        to_guid = norm_guid(p.group("peer"))
        if to_guid is not None and quoted:
            names.setdefault(to_guid, quoted[-1])
        node["ports"].append(from_port)
        key = frozenset({(node["guid"], from_port), (str(to_guid), to_port)})
        if key in seen:
            _merge_far_end(seen[key], node["name"], from_port, width, speed, warnings)
            continue
        seen[key] = {
            "from_guid": node["guid"],
            "from_name": node["name"],
            "from_port": from_port,
            "to_guid": to_guid,
            "to_name": quoted[-1] if quoted else None,
            "to_port": to_port,
            "width": width,
            "speed": speed,
            "rate_gbps": _link_rate(width, speed),
        }
        links.append(seen[key])
    if not switches and not cas:
        failure = next((msg for e in errors if (msg := iberror_text(e, "ibnetdiscover")) is not None), None)
        if failure is None:
            raise ParseError('ibnetdiscover: no "Switch N "S-<guid>"" or "Ca N "H-<guid>"" node line found')
        return {"tool": "ibnetdiscover", "ok": False, "error": failure, "switches": [], "cas": [], "links": [],
                "errors": errors, "warnings": []}
    widest = max((_lanes(lk["width"]) for lk in links), default=0)
    for lk in links:
        if lk["width"] and _lanes(lk["width"]) < widest:
            warnings.append(
                f"{lk['from_name']} port {lk['from_port']} -> {lk['to_name']} port {lk['to_port']}: "
                f"trained at {lk['width']} {lk['speed']}, narrower than the fabric's {widest}X links"
            )
    return {
        "tool": "ibnetdiscover",
        "ok": True,
        "error": None,
        "switches": switches,
        "cas": cas,
        "links": links,
        "errors": errors,
        "warnings": warnings,
    }
