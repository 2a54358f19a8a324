"""Parser for ``nvidia-smi --query-gpu=<QUERY> --format=csv,noheader,nounits`` (QUERY below).

One line per GPU, the fields in the order asked for, separated by ``", "``; with ``nounits`` the memory is a bare
number of MiB (with units it reads ``81559 MiB``, which is accepted too). A field the driver cannot read prints
``[N/A]`` or ``[Not Supported]``. The GPU name may itself contain commas in principle, so the name is everything
between the index and the last three fields.
"""

from __future__ import annotations

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
