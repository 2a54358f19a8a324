"""Parser for ``ibstatus`` (the sysfs-reading script from infiniband-diags).

Each port is a block headed ``Infiniband device 'mlx5_0' port 1 status:`` followed by
``key: value`` lines. States carry their numeric code (``4: ACTIVE``); the rate line carries
width and generation (``200 Gb/sec (2X NDR)``), which is where a degraded width shows even
though the port is Active/LinkUp.

Pasted through grep (``ibstatus | grep -e state -e rate``) the headers are gone: key lines that come
before any header are still read, into ports with no device name (``device``/``port`` null), a new
one starting whenever a key repeats; grep's ``--`` separators are skipped. Such a text is accepted
only when it holds a state, physical state or rate that reads as one.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import norm_link_layer, norm_phys_state, norm_state, require_text, to_float

_HEAD_RE = re.compile(r"^\s*Infiniband device '([^']+)' port (\d+) status:\s*$")
_KV_RE = re.compile(r"^\s*([a-z_ ]+?):\s*(.*?)\s*$")
_KEYS = ("default gid", "base lid", "sm lid", "state", "phys state", "rate", "link_layer")
_RATE_RE = re.compile(r"^([\d.]+)\s*Gb/sec(?:\s*\((\d+X)\s*([A-Za-z0-9]*)\))?")


def parse_rate(value: str) -> tuple[float | None, str | None, str | None]:
    """Split ``"200 Gb/sec (4X HDR)"`` into (200.0, "4X", "HDR"); missing parts are None."""
    m = _RATE_RE.match(value.strip())
    if not m:
        return None, None, None
    return to_float(m.group(1)), m.group(2), (m.group(3) or None)


def _new_port(device: str | None, port: int | None) -> dict[str, Any]:
    return {
        "device": device,
        "port": port,
        "state": None,
        "physical_state": None,
        "rate_gbps": None,
        "width": None,
        "speed": None,
        "link_layer": None,
    }


def _set(cur: dict[str, Any], key: str, value: str) -> None:
    if key == "state":
        cur["state"] = norm_state(value)
    elif key == "phys state":
        cur["physical_state"] = norm_phys_state(value)
    elif key == "rate":
        cur["rate_gbps"], cur["width"], cur["speed"] = parse_rate(value)
    elif key == "link_layer":
        cur["link_layer"] = norm_link_layer(value)


def parse_ibstatus(text: str) -> dict[str, Any]:
    """Parse ``ibstatus`` output into one record per port (whole blocks or grep's leftovers)."""
    require_text("ibstatus", text)
    ports: list[dict[str, Any]] = []
    warnings: list[str] = []
    cur: dict[str, Any] | None = None
    seen: set[str] = set()
    headerless = False
    for line in text.splitlines():
        m = _HEAD_RE.match(line)
        if m:
            cur = _new_port(m.group(1), int(m.group(2)))
            ports.append(cur)
            seen = set()
            continue
        if line.strip().startswith("Fatal error"):
            warnings.append(line.strip())
            continue
        kv = _KV_RE.match(line)
        if not kv or kv.group(1).strip() not in _KEYS:
            continue
        key, value = kv.group(1).strip(), kv.group(2)
        if cur is None or (cur["device"] is None and key in seen):
            cur = _new_port(None, None)
            ports.append(cur)
            seen = set()
            headerless = True
        seen.add(key)
        _set(cur, key, value)
    named = [p for p in ports if p["device"] is not None]
    readable = any(p["state"] or p["physical_state"] or p["rate_gbps"] is not None for p in ports)
    if not named and not readable:
        raise ParseError("ibstatus: no \"Infiniband device '<name>' port N status:\" block or port state line found")
    if headerless:
        warnings.append("key lines without an 'Infiniband device' header (filtered output?): those ports are unnamed")
    for p in ports:
        where = f"{p['device']} port {p['port']}" if p["device"] is not None else "unnamed port"
        if p["state"] == "down" and p["rate_gbps"] is not None:
            warnings.append(f"{where}: port is Down, rate {p['rate_gbps']:g} is a placeholder")
        elif p["link_layer"] == "ethernet" and p["speed"]:
            warnings.append(f"{where}: Ethernet (RoCE) port: '{p['width']} {p['speed']}' is the kernel's InfiniBand "
                            f"wording for {p['rate_gbps']:g} Gb/s, not an InfiniBand link")
    return {"tool": "ibstatus", "ports": ports, "warnings": warnings}
