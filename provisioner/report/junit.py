"""JUnit XML for CI systems: one testcase per check and node, findings as the failure text.

Built with ElementTree so escaping is never hand-rolled; characters that XML 1.0 forbids (control
characters that can appear in captured tool output) are replaced, since one of them makes the whole file
unreadable to a CI server.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from provisioner.fabric.findings import CheckResult, Finding
from provisioner.report.model import VerifyReport

_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _clean(text: str) -> str:
    return _XML_ILLEGAL.sub("\ufffd", text)


def _finding_line(f: Finding) -> str:
    line = f"[{f.severity}] {f.location()}: {f.message} (expected {f.expected}, observed {f.observed})"
    return f"{line}\n    hint: {f.hint}" if f.hint else line


def _testcase(cluster: str, check: CheckResult) -> ET.Element:
    name = check.name if check.node is None else f"{check.name} on {check.node}"
    case = ET.Element("testcase", {"classname": _clean(f"{cluster}.{check.name}"), "name": _clean(name)})
    errors = [f for f in check.findings if f.severity == "error"]
    others = [f for f in check.findings if f.severity != "error"]
    if check.error is not None:
        err = ET.SubElement(case, "error", {"message": _clean(check.error), "type": "could_not_run"})
        err.text = _clean(check.error)
    elif check.skipped is not None:
        skip = ET.SubElement(case, "skipped", {"message": _clean(check.skipped)})
        skip.text = _clean(check.skipped)
    elif not check.passed:
        fail = ET.SubElement(
            case,
            "failure",
            {
                "message": _clean(f"{len(errors)} error finding(s)" if errors else "check failed"),
                "type": "error",
            },
        )
        fail.text = _clean("\n".join(_finding_line(f) for f in errors) or "check failed without findings")
    if others:
        out = ET.SubElement(case, "system-out")
        out.text = _clean("\n".join(_finding_line(f) for f in others))
    return case


def to_junit(report: VerifyReport) -> str:
    """A ``<testsuites>`` document with one suite for the cluster."""
    checks = sorted(report.checks, key=lambda c: (c.name, c.node or ""))
    verdict = report.verdict
    counts = {
        "tests": str(len(checks)),
        "failures": str(verdict.failed),
        "errors": str(verdict.could_not_run),
        "skipped": str(verdict.skipped),
        "time": f"{report.duration_s:.3f}",
    }
    suites = ET.Element("testsuites", {"name": _clean(f"provisioner verify {report.cluster}"), **counts})
    suite = ET.SubElement(
        suites,
        "testsuite",
        {"name": _clean(report.cluster), "timestamp": report.started.isoformat(), **counts},
    )
    if report.notes:
        props = ET.SubElement(suite, "properties")
        for i, note in enumerate(report.notes):
            ET.SubElement(props, "property", {"name": f"note.{i}", "value": _clean(note)})
    for check in checks:
        suite.append(_testcase(report.cluster, check))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
