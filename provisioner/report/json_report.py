"""Machine-readable report (``--json``): stable key order so two runs can be diffed line by line."""

from __future__ import annotations

import json

from provisioner.report.model import VerifyReport, fraction, version_mismatches
from provisioner.safetext import printable_json


def report_dict(report: VerifyReport) -> dict[str, object]:
    """The report as plain JSON types; tuple keys of the bandwidth matrix become records."""
    bandwidth: dict[str, object] = {}
    for rail in sorted(report.bandwidth):
        rate = report.line_rate.get(rail)
        pairs = [
            {"server": a, "client": b, "gbps": gbps, "fraction_of_line_rate": fraction(gbps, rate)}
            for (a, b), gbps in sorted(report.bandwidth[rail].items())
        ]
        bandwidth[str(rail)] = {"line_rate_gbps": rate, "pairs": pairs}
    return {
        "cluster": report.cluster,
        "started": report.started.isoformat(),
        "finished": report.finished.isoformat(),
        "duration_s": report.duration_s,
        "verdict": report.verdict.to_dict(),
        "checks": [c.to_dict() for c in sorted(report.checks, key=lambda c: (c.name, c.node or ""))],
        "findings": [f.to_dict() for f in report.findings()],
        "bandwidth": bandwidth,
        "versions": {n: dict(sorted(report.versions[n].items())) for n in sorted(report.versions)},
        "version_mismatches": [
            {"node": n, "component": c, "observed": got, "expected": want}
            for n, c, got, want in version_mismatches(report.versions, report.peers)
        ],
        "nccl": report.nccl_runs(),
        "nccl_single_node": report.nccl_node_runs(),
        "notes": list(report.notes),
        "peer_groups": {g: sorted(n for n, p in report.peers.items() if p == g)
                        for g in sorted(set(report.peers.values()))},
    }


def to_json(report: VerifyReport) -> str:
    """JSON text with sorted keys and a trailing newline; what nodes reported is in it, so characters that are not
    printable are escaped (safetext.printable_json): ``provision verify --json`` prints it."""
    return printable_json(json.dumps(report_dict(report), sort_keys=True, indent=2, ensure_ascii=False)) + "\n"
