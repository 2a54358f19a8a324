"""Parser for ``nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits`` (QUERY below).

One line per GPU, the fields in the order asked for, separated by ``", "``; with ``nounits`` the memory is a bare
number of MiB (with units it reads ``81559 MiB``, which is accepted too). A field the driver cannot read prints
``[N/A]`` or ``[Not Supported]``. The GPU name may itself contain commas in principle, so the name is everything
between the index and the last three fields.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import require_text

QUERY = "index,name,pci.bus_id,driver_version,memory.total"
"""The --query-gpu fields this parser reads, in order."""


def _value(text: str) -> str | None:
    text = text.strip()
    return None if text.startswith("[") and text.endswith("]") else text


def parse_nvidia_smi_query(text: str) -> dict[str, Any]:
    """Parse the CSV rows into ``gpus: [{index, name, pci_bus_id, driver_version, memory_mib}]``."""
    require_text("nvidia-smi-query", text)
    gpus: list[dict[str, Any]] = []
    warnings: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("index,"):
            continue
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) < 5 or not cells[0].isdigit():
            warnings.append(f"not a GPU row: {line.strip()[:80]!r}")
            continue
        memory = _value(cells[-1])
        mib = memory.split()[0] if memory else None
        gpus.append({
            "index": int(cells[0]),
            "name": ", ".join(cells[1:-3]),
            "pci_bus_id": _value(cells[-3]),
            "driver_version": _value(cells[-2]),
            "memory_mib": int(mib) if mib and mib.isdigit() else None,
        })
    if not gpus:
        raise ParseError(f"nvidia-smi-query: no '<index>, <name>, <bus id>, <driver>, <memory>' row ({QUERY})")
    return {"tool": "nvidia-smi-query", "gpus": gpus, "warnings": warnings}


# --- nvidia-smi -q: the Fabric section ------------------------------------------------------------------------

_GPU_HEADER_RE = re.compile(r"^GPU\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_KEY_RE = re.compile(r"^(?P<key>[A-Za-z][A-Za-z ]*?)\s*:\s*(?P<value>.*)$")
FABRIC_DONE = ("Completed", "Success")
"""(State, Status) of a GPU whose NVSwitch fabric fabric manager has trained (the Fabric Manager user guide)."""


def parse_nvidia_smi_fabric(text: str) -> dict[str, Any]:
    """The ``Fabric`` section of each GPU in ``nvidia-smi -q``: ``gpus: [{bus_id, state, status}]``.

    The section reads (driver 470 and newer; 550+ adds ``CliqueId``, ``ClusterUUID`` and a ``Health`` block)::

        GPU 00000000:19:00.0
            ...
            Fabric
                State                             : Completed
                Status                            : Success

    ``In Progress`` / ``N/A`` while fabric manager has not trained the fabric; ``N/A`` / ``N/A`` on a GPU without
    NVSwitch. ``nvidia-smi -q | grep -A 2 Fabric`` (no GPU header) parses too, with ``bus_id`` null. A GPU without
    a Fabric section (an older driver) has ``state`` null.
    """
    require_text("nvidia-smi-q", text)
    gpus: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    in_fabric = False
    for raw in text.splitlines():
        line = raw.strip()
        header = _GPU_HEADER_RE.match(line)
        if header:
            current = {"bus_id": header.group("bus").lower(), "state": None, "status": None}
            gpus.append(current)
            in_fabric = False
        elif line == "Fabric":
            if current is None or current["state"] is not None:
                current = {"bus_id": None, "state": None, "status": None}
                gpus.append(current)
            in_fabric = True
        elif in_fabric and current is not None and (m := _KEY_RE.match(line)):
            key = m.group("key").lower()
            if key in ("state", "status"):
                current[key] = m.group("value").strip()
            in_fabric = key != "status"
    if not gpus:
        raise ParseError("nvidia-smi-q: no 'GPU <bus id>' block and no 'Fabric' section")
    return {"tool": "nvidia-smi-q", "gpus": gpus, "warnings": []}
