"""Parser for ``nvidia-smi topo -m``: the GPU/NIC link matrix, the NIC legend, GPU-NIC affinity.

The header row mixes device columns (``GPU0``, ``NIC0`` or, on older drivers, ``mlx5_0``)
with multi-word trailing columns (``CPU Affinity``, ``NUMA Affinity``, ``GPU NUMA ID``).
Pasted output may use tabs or runs of spaces, so device columns are taken from the header
tokens until the first affinity word, and each row's first N cells after its name are the
links. ``gpu_nic_affinity`` lists, per GPU, the NICs at the closest PCIe class
(PIX < PXB < PHB < NODE < SYS) — the pairing GPUDirect RDMA and NCCL rails rely on.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import require_text

_LINK_RANK = {"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4, "SOC": 4}
_DEVICE_RE = re.compile(r"^(?:GPU\d+|NIC\d+|mlx\d+_\w+|mlx5_bond_\d+|hfi\d+_\d+|bnxt_re\d+|irdma\d+|efa\d+)$")
_LEGEND_RE = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")
_LINK_RE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def _header_devices(line: str) -> list[str]:
    devs: list[str] = []
    for tok in line.split():
        if _DEVICE_RE.match(tok):
            devs.append(tok)
        else:
            break
    return devs


def _is_header(tokens: list[str]) -> bool:
    """The header starts with GPU0 like the first row does; the row's second cell is ``X``."""
    return len(tokens) >= 2 and tokens[0] == "GPU0" and tokens[1] != "X"


def parse_nvidia_smi_topo(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi topo -m`` into gpus, nics, the link matrix and GPU->closest NICs."""
    require_text("nvidia-smi-topo", text)
    lines = [_ANSI_RE.sub("", ln) for ln in text.splitlines()]
    header_idx = next((i for i, ln in enumerate(lines) if _is_header(ln.split())), None)
    if header_idx is None:
        raise ParseError("nvidia-smi-topo: no header row starting with GPU0 found")
    columns = _header_devices(lines[header_idx])
    if not columns or not any(c.startswith("GPU") for c in columns):
        raise ParseError("nvidia-smi-topo: header row names no GPU column")
    matrix: dict[str, dict[str, str]] = {}
    warnings: list[str] = []
    for ln in lines[header_idx + 1 :]:
        cells = ln.split()
        if not cells or cells[0] not in columns:
            if cells and cells[0] == "Legend:":
                break
            continue
        links = cells[1 : 1 + len(columns)]
        if len(links) < len(columns) or not all(_LINK_RE.match(c) for c in links):
            warnings.append(f"row {cells[0]}: could not read {len(columns)} link cells")
            continue
        matrix[cells[0]] = dict(zip(columns, links, strict=True))
    if not matrix:
        raise ParseError("nvidia-smi-topo: header found but no matrix rows")
    nic_names: dict[str, str] = {}
    for ln in lines:
        m = _LEGEND_RE.match(ln)
        if m:
            nic_names[m.group(1)] = m.group(2)
    gpus = [c for c in columns if c.startswith("GPU")]
    nics = [c for c in columns if not c.startswith("GPU")]
    for n in nics:
        if n.startswith("NIC") and n not in nic_names:
            warnings.append(f"{n} has no entry in the NIC Legend")
    affinity: dict[str, list[str]] = {}
    for g in gpus:
        row = matrix.get(g, {})
        ranked = [(_LINK_RANK[row[n]], n) for n in nics if row.get(n) in _LINK_RANK]
        if not ranked:
            affinity[g] = []
            continue
        best = min(r for r, _ in ranked)
        affinity[g] = [nic_names.get(n, n) for r, n in ranked if r == best]
    return {
        "tool": "nvidia-smi-topo",
        "gpus": gpus,
        "nics": nics,
        "nic_names": nic_names,
        "matrix": matrix,
        "gpu_nic_affinity": affinity,
        "warnings": warnings,
    }
