"""A verification run as plain text lines, the way `provision verify` and the run's report phase print it; every
piece of node or tool text goes through safetext."""

from __future__ import annotations

from pathlib import Path

from provisioner.fabric.findings import Finding
from provisioner.report.model import VerifyReport, nccl_lines
from provisioner.safetext import printable
from provisioner.spec import hostlist


def finding_line(f: Finding) -> str:
    """``ERROR   gpu01/mlx5_0/1: message``."""
    return f"{f.severity.upper():7s} {printable(f.location())}: {printable(f.message)}"


def not_run_lines(report: VerifyReport) -> list[str]:
    """One ``NOT RUN`` line per check and cause, the nodes that share it folded into a hostlist."""
    not_run: dict[tuple[str, str], list[str]] = {}
    for c in report.checks:
        if not c.ran:
            not_run.setdefault((c.name, c.error or ""), []).append(c.node or "cluster")
    return [f"NOT RUN {name} {hostlist.compress(nodes)}: {printable(why)}" for (name, why), nodes in not_run.items()]


def report_lines(report: VerifyReport) -> list[str]:
    """What the run's report phase prints: the findings and the NCCL results."""
    return [*(finding_line(f) for f in report.findings()), *nccl_lines(report)]


def verify_lines(report: VerifyReport, directory: Path | None) -> list[str]:
    """What `provision verify` prints: the findings, what did not run and why, the NCCL results, the verdict."""
    return [*(finding_line(f) for f in report.findings()), *not_run_lines(report), *nccl_lines(report),
            f"{report.verdict.label}: {directory}"]
