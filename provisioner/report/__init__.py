"""Reports of a verification run: JSON for machines, JUnit XML for CI, HTML for people."""

from provisioner.report.html_report import to_html
from provisioner.report.json_report import report_dict, to_json
from provisioner.report.junit import to_junit
from provisioner.report.model import VerifyReport, expected_versions, version_mismatches

__all__ = [
    "VerifyReport",
    "expected_versions",
    "report_dict",
    "to_html",
    "to_json",
    "to_junit",
    "version_mismatches",
]
