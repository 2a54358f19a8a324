"""Baselines: the first passing run's figures, and warnings when a later run drops more than 10 %.

A fabric that passes the floor (90 % of line rate) can still lose 8 % after a firmware update or a re-cable;
only a comparison with its own past, and with the fleet's median today, shows that. The baseline records
per rail/pair bandwidth with the message size and the software versions it was measured with, so a
comparison across different sizes or versions is flagged rather than silently made.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from provisioner.fabric.findings import Finding

CHECK = "baseline"
DROP = 0.10


def pair_key(rail: int, a: str, b: str) -> str:
    x, y = sorted((a, b))
    return f"rail{rail}:{x}:{y}"


def make_baseline(
    matrix: Mapping[int, Mapping[tuple[str, str], float]],
    message_size: int,
    versions: Mapping[str, Mapping[str, str]],
    nccl_busbw: float | None,
    created: str,
) -> dict[str, Any]:
    """The JSON document stored as the baseline."""
    return {
        "created": created,
        "message_size": message_size,
        "bandwidth": {pair_key(r, a, b): g for r, cells in sorted(matrix.items()) for (a, b), g in cells.items()},
        "nccl_busbw_gbps": nccl_busbw,
        "versions": {n: dict(v) for n, v in sorted(versions.items())},
    }


def load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def store_if_first(path: Path, baseline: Mapping[str, Any], passed: bool) -> bool:
    """Write the baseline when none exists and the run passed; True when written."""
    if path.exists() or not passed:
        return False
    from provisioner.state import write_text_atomic

    write_text_atomic(path, json.dumps(baseline, indent=2, sort_keys=True) + "\n")
    return True


def compare(
    baseline: Mapping[str, Any] | None,
    matrix: Mapping[int, Mapping[tuple[str, str], float]],
    message_size: int,
    nccl_busbw: float | None,
) -> list[Finding]:
    """Warnings for drops > 10 % against the baseline and against today's per-rail median."""
    found: list[Finding] = []
    for rail, cells in sorted(matrix.items()):
        values = list(cells.values())
        median = statistics.median(values) if len(values) >= 3 else None
        for (a, b), gbps in sorted(cells.items()):
            if median and gbps < median * (1 - DROP):
                found.append(Finding(CHECK, "warning", a, None, None, f"~{median:.1f} Gb/s (fleet median)", gbps,
                                     f"{a} → {b} rail {rail}: {gbps:.1f} Gb/s is {1 - gbps / median:.0%} below the "
                                     f"rail's median {median:.1f} Gb/s", "compare the port counters of both ends "
                                     "(perfquery) and their firmware", rail=rail, peer=b))
    if baseline is None:
        return found
    if baseline.get("message_size") != message_size:
        found.append(Finding(CHECK, "info", None, None, None, baseline.get("message_size"), message_size,
                             "the baseline was measured with another message size; bandwidth not compared",
                             "delete the baseline to record a new one"))
        return found
    base_bw: Mapping[str, float] = baseline.get("bandwidth", {})
    for rail, cells in sorted(matrix.items()):
        for (a, b), gbps in sorted(cells.items()):
            old = base_bw.get(pair_key(rail, a, b))
            if old and gbps < old * (1 - DROP):
                found.append(Finding(CHECK, "warning", a, None, None, old, gbps,
                                     f"{a} ↔ {b} rail {rail}: {gbps:.1f} Gb/s, {1 - gbps / old:.0%} below the "
                                     f"baseline {old:.1f} Gb/s ({baseline.get('created', '?')})",
                                     "what changed since the baseline: firmware, cables, versions?",
                                     rail=rail, peer=b))
    old_nccl = baseline.get("nccl_busbw_gbps")
    if old_nccl and nccl_busbw is not None and nccl_busbw < old_nccl * (1 - DROP):
        found.append(Finding(CHECK, "warning", None, None, None, old_nccl, nccl_busbw,
                             f"NCCL all-reduce bus bandwidth {nccl_busbw:.1f} GB/s is "
                             f"{1 - nccl_busbw / old_nccl:.0%} below the baseline {old_nccl:.1f} GB/s",
                             "compare NCCL/driver versions with the baseline's"))
    return found
