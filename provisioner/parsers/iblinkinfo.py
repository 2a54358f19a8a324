"""Parser for ``iblinkinfo`` (default block form and ``-l`` one-line form).

Each printed port becomes one link record: the node it belongs to (switch or CA name) and
its kind (``node_type``: ``switch`` or ``ca`` from the block header; ``None`` in the ``-l``
form, which has no header), port state and physical state, width, the lane signalling speed as printed
(``25.78125 Gbps``) and the nominal data rate derived from it (4X x 25 = 100 Gb/s, the
figure ibstat would print). ``(Could be ...)`` hints from iblinkinfo — the link trained
below what both ends support — become warnings. A Down port has no link and so no ``rate_gbps``; older
iblinkinfo still printed a width and speed for it (``==( 4X 2.5 Gbps   Down/Disabled)==>``), kept as
printed. Piped through grep (``iblinkinfo | grep Up``) the block headers are gone: those ports come out
with ``switch``/``node_type`` null and a warning, never under a guessed node.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import norm_phys_state, norm_state, require_text, to_float

#: Lane signalling rate as printed -> nominal per-lane data rate used in "Rate" figures.
_LANE_NOMINAL = {
    2.5: 2.5,
    5.0: 5.0,
    10.0: 10.0,
    10.3125: 10.0,
    14.0625: 14.0,
    25.78125: 25.0,
    53.125: 50.0,
    106.25: 100.0,
    212.5: 200.0,
}

#: ``Switch: 0x<guid> <name>:`` / ``CA: <name>:``; iblinkinfo of 2010 (infiniband-diags 1.5) printed the switch
#: header without the colon after the word: ``Switch 0x0008f10500380136 IBM HSSM:``.
_NODE_RE = re.compile(
    r"^(?P<kind>Switch|CA)(?::\s+|\s+(?=0x))(?:(?P<guid>0x[0-9a-fA-F]+)\s+)?(?P<name>.*?):?\s*$"
)
_LINK_RE = re.compile(
    r"^\s*(?:0x[0-9a-fA-F]+\s+)?(?:\"(?P<lname>[^\"]*)\"\s+)?(?:\d+\s+)?(?P<port>\d+)\[[^\]]*\]\s*"
    r"==\(\s*(?:(?P<width>\d+)X\s+(?P<speed>[\d.]+)\s*Gbps\s*(?:\([^)]*\)\s*)?)?"
    r"(?P<state>[A-Za-z]+)/\s*(?P<phys>[A-Za-z]+)\s*\)==>\s*"
    r"(?:0x[0-9a-fA-F]+\s+)?(?:\d+\s+(?P<pport>\d+))?\s*\[[^\]]*\]\s*\"(?P<peer>[^\"]*)\"\s*(?:\((?P<hint>[^)]*)\))?"
)


def _nominal(speed: float | None) -> float | None:
    if speed is None:
        return None
    return _LANE_NOMINAL.get(speed, speed)


def parse_iblinkinfo(text: str) -> dict[str, Any]:
    """Parse ``iblinkinfo`` into one record per printed port."""
    require_text("iblinkinfo", text)
    links: list[dict[str, Any]] = []
    warnings: list[str] = []
    node: str | None = None
    kind: str | None = None
    headerless = False
    for line in text.splitlines():
        n = _NODE_RE.match(line.strip())
        if n and "==(" not in line:
            node = n.group("name").strip()
            kind = "switch" if n.group("kind") == "Switch" else "ca"
            continue
        m = _LINK_RE.match(line)
        if not m:
            continue
        owner = m.group("lname").strip() if m.group("lname") is not None else node
        headerless = headerless or owner is None
        width = int(m.group("width")) if m.group("width") else None
        speed = to_float(m.group("speed")) if m.group("speed") else None
        nominal = _nominal(speed)
        peer = m.group("peer").strip() or None
        rec = {
            "switch": owner,
            "node_type": kind if m.group("lname") is None else None,
            "port": int(m.group("port")),
            "state": norm_state(m.group("state")),
            "physical_state": norm_phys_state(m.group("phys")),
            "width": f"{width}X" if width else None,
            "lane_speed_gbps": speed,
            "rate_gbps": width * nominal if width and nominal and norm_state(m.group("state")) != "down" else None,
            "peer": peer,
            "peer_port": int(m.group("pport")) if m.group("pport") else None,
        }
        links.append(rec)
        hint = (m.group("hint") or "").strip()
        if hint:
            warnings.append(f"{owner} port {rec['port']}: {hint}")
    if not links:
        raise ParseError("iblinkinfo: no '<port>[ ] ==( ... )==> ...' link line found")
    if headerless:
        warnings.insert(0, "link lines before any 'CA:'/'Switch:' header (filtered output?): "
                           "the node those ports belong to is unknown (switch: null)")
    return {"tool": "iblinkinfo", "links": links, "warnings": warnings}
