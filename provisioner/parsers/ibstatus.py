"""Parser for ``ibstatus`` (the sysfs-reading script from infiniband-diags).

Each port is a block headed ``Infiniband device 'mlx5_0' port 1 status:`` followed by
``key: value`` lines. States carry their numeric code (``4: ACTIVE``); the rate line carries
width and generation (``200 Gb/sec (2X NDR)``), which is where a degraded width shows even
though the port is Active/LinkUp.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import norm_link_layer, norm_phys_state, norm_state, require_text, to_float

_HEAD_RE = re.compile(r"^\s*Infiniband device '([^']+)' port (\d+) status:\s*$")
_KV_RE = re.compile(r"^\s*([a-z_ ]+?):\s*(.*?)\s*$")
_RATE_RE = re.compile(r"^([\d.]+)\s*Gb/sec(?:\s*\((\d+X)\s*([A-Za-z0-9]*)\))?")


def parse_rate(value: str) -> tuple[float | None, str | None, str | None]:
    """Split ``"200 Gb/sec (4X HDR)"`` into (200.0, "4X", "HDR"); missing parts are None."""
    m = _RATE_RE.match(value.strip())
    if not m:
        return None, None, None
    return to_float(m.group(1)), m.group(2), (m.group(3) or None)


def parse_ibstatus(text: str) -> dict[str, Any]:
    """Parse ``ibstatus`` output into one record per port."""
    require_text("ibstatus", text)
    ports: list[dict[str, Any]] = []
    warnings: list[str] = []
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        m = _HEAD_RE.match(line)
        if m:
            cur = {
                "device": m.group(1),
                "port": int(m.group(2)),
                "state": None,
                "physical_state": None,
                "rate_gbps": None,
                "width": None,
                "speed": None,
                "link_layer": None,
            }
            ports.append(cur)
            continue
        if cur is None:
            if line.strip().startswith("Fatal error"):
                warnings.append(line.strip())
            continue
        kv = _KV_RE.match(line)
        if not kv:
            continue
        key, value = kv.group(1).strip(), kv.group(2)
        if key == "state":
            cur["state"] = norm_state(value)
        elif key == "phys state":
            cur["physical_state"] = norm_phys_state(value)
        elif key == "rate":
            cur["rate_gbps"], cur["width"], cur["speed"] = parse_rate(value)
        elif key == "link_layer":
            cur["link_layer"] = norm_link_layer(value)
    if not ports:
        raise ParseError("ibstatus: no \"Infiniband device '<name>' port N status:\" block found")
    for p in ports:
        where = f"{p['device']} port {p['port']}"
        if p["state"] == "down" and p["rate_gbps"] is not None:
            warnings.append(f"{where}: port is Down, rate {p['rate_gbps']:g} is a placeholder")
    return {"tool": "ibstatus", "ports": ports, "warnings": warnings}
