"""What every verification check produces: findings, per-check results and the overall verdict.

The model is deliberately plain (frozen dataclasses of strings and numbers) so that any check, from a port
state parser to the pairwise bandwidth scheduler, can emit it without importing anything else, and so that
every report format (JSON, JUnit XML, HTML) renders the same facts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, get_args

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)

#: What a check measured, by name (``{"rate_gbps": 400.0, "state": "Active"}``).
Value = str | int | float | bool | None

EXIT_PASS = 0
EXIT_FINDINGS = 1
EXIT_COULD_NOT_RUN = 2


@dataclass(frozen=True, slots=True)
class Finding:
    """One difference between the spec (expected) and the cluster (observed), with what to do about it.

    ``device``/``port`` name the HCA and port (``mlx5_0``, 1) when the finding is about a port; ``rail`` and
    ``peer`` are set for pairwise bandwidth findings, where the fault may lie between two nodes. ``switch``
    names the switch a finding is about (an inter-switch link, a switch port's counters, a leaf's uplinks);
    such a finding has no ``node``, and ``port`` is then the switch's port.
    """

    check: str
    severity: Severity
    node: str | None
    device: str | None
    port: int | None
    expected: Value
    observed: Value
    message: str
    hint: str
    rail: int | None = None
    peer: str | None = None
    switch: str | None = None

    def __post_init__(self) -> None:
        # A wrong severity is a programming error in a check, not a user error: fail loudly at construction.
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")
        if not self.check:
            raise ValueError("a finding needs the name of the check that produced it")

    def to_dict(self) -> dict[str, Value]:
        """JSON-ready mapping with a fixed key order (the field order)."""
        return {
            "check": self.check,
            "severity": self.severity,
            "node": self.node,
            "device": self.device,
            "port": self.port,
            "rail": self.rail,
            "peer": self.peer,
            "switch": self.switch,
            "expected": self.expected,
            "observed": self.observed,
            "message": self.message,
            "hint": self.hint,
        }

    def to_json(self) -> str:
        """One finding as a JSON object (for ``--json`` line output and logs)."""
        return json.dumps(self.to_dict(), sort_keys=False, ensure_ascii=False)

    def location(self) -> str:
        """Short human label of where the finding is: ``node1 mlx5_0/1 rail 0 ↔ node2``."""
        parts = [self.node or self.switch or "cluster"]
        if self.device:
            parts.append(self.device if self.port is None else f"{self.device}/{self.port}")
        elif self.port is not None:
            parts.append(f"port {self.port}")
        if self.rail is not None:
            parts.append(f"rail {self.rail}")
        if self.peer:
            parts.append(f"↔ {self.peer}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check on one node (``node=None`` for cluster-wide checks such as NCCL).

    ``error`` is set when the check could not run at all (node unreachable, tool missing); such a result
    has ``passed=False`` and says nothing about the hardware, which is why the verdict counts it apart.
    ``skipped`` (the reason) marks what was looked at and found impossible on this node by the site's own
    declaration (e.g. a storage mount on a node whose kernel has no NFS client and whose site says it need
    not have one): not passed, not failed, and it does not change the exit code.
    """

    name: str
    node: str | None
    passed: bool
    findings: tuple[Finding, ...] = ()
    measurements: Mapping[str, Value] = field(default_factory=dict)
    error: str | None = None
    skipped: str | None = None

    def __post_init__(self) -> None:
        if self.error is not None and self.passed:
            raise ValueError(f"check {self.name!r} could not run ({self.error}) and cannot have passed")
        if self.skipped is not None and (self.passed or self.error is not None
                                         or any(f.severity == "error" for f in self.findings)):
            raise ValueError(f"check {self.name!r} was skipped ({self.skipped}): it cannot have passed, "
                             "failed or not run")
        if self.passed and any(f.severity == "error" for f in self.findings):
            raise ValueError(f"check {self.name!r} has error findings and cannot have passed")

    @classmethod
    def from_findings(
        cls,
        name: str,
        node: str | None,
        findings: Iterable[Finding],
        measurements: Mapping[str, Value] | None = None,
    ) -> CheckResult:
        """Build a result whose pass/fail follows from its findings: any error fails it, warnings do not."""
        found = tuple(findings)
        return cls(
            name=name,
            node=node,
            passed=not any(f.severity == "error" for f in found),
            findings=found,
            measurements=dict(measurements or {}),
        )

    @classmethod
    def could_not_run(cls, name: str, node: str | None, reason: str) -> CheckResult:
        """A check that never produced a measurement (the hardware state stays unknown)."""
        return cls(name=name, node=node, passed=False, error=reason)

    @classmethod
    def skip(cls, name: str, node: str | None, reason: str, findings: Iterable[Finding] = (),
             measurements: Mapping[str, Value] | None = None) -> CheckResult:
        """A check that cannot apply here (``reason`` says why); findings may only inform or warn."""
        return cls(name=name, node=node, passed=False, findings=tuple(findings),
                   measurements=dict(measurements or {}), skipped=reason)

    @property
    def ran(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "node": self.node,
            "passed": self.passed,
            "error": self.error,
            "skipped": self.skipped,
            "measurements": {k: self.measurements[k] for k in sorted(self.measurements)},
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """The one-line summary of a verification run and the exit code it maps to.

    Exit codes: 0 every check ran and no error finding; 1 at least one error finding (the fabric is known to
    be wrong, which is the more useful news even if some other check could not run); 2 no error finding but
    at least one check could not run (the fabric is not proven either way). Skipped checks are counted
    apart and leave the exit code alone (what the site declared impossible is neither proven nor failed).
    """

    passed: int
    failed: int
    could_not_run: int
    errors: int
    warnings: int
    infos: int
    skipped: int = 0

    @classmethod
    def of(cls, results: Iterable[CheckResult]) -> Verdict:
        res = list(results)
        findings = [f for r in res for f in r.findings]
        return cls(
            passed=sum(1 for r in res if r.passed),
            failed=sum(1 for r in res if not r.passed and r.ran and r.skipped is None),
            could_not_run=sum(1 for r in res if not r.ran),
            errors=sum(1 for f in findings if f.severity == "error"),
            warnings=sum(1 for f in findings if f.severity == "warning"),
            infos=sum(1 for f in findings if f.severity == "info"),
            skipped=sum(1 for r in res if r.skipped is not None),
        )

    @property
    def exit_code(self) -> int:
        if self.errors or self.failed:
            return EXIT_FINDINGS
        if self.could_not_run:
            return EXIT_COULD_NOT_RUN
        return EXIT_PASS

    @property
    def label(self) -> str:
        return {EXIT_PASS: "PASS", EXIT_FINDINGS: "FAIL", EXIT_COULD_NOT_RUN: "INCOMPLETE"}[self.exit_code]

    def to_dict(self) -> dict[str, object]:
        return {
            "label": self.label,
            "exit_code": self.exit_code,
            "passed": self.passed,
            "failed": self.failed,
            "could_not_run": self.could_not_run,
            "errors": self.errors,
            "warnings": self.warnings,
            "infos": self.infos,
            "skipped": self.skipped,
        }
