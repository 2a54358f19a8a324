"""The storage check wired into ``provision verify``: selection, the *skipped* state and how every report shows it.

The remote is the storage fake of :mod:`tests.unit._storage_fakes`: nodes whose kernel has no NFS client (what
the lab overlay declares optional) and an NFS server reached from user space. No tool output is invented here:
the storage check reads ``/proc/mounts`` and the exit status of libnfs's tools, both simulated as such.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from provisioner.fabric.findings import CheckResult, Finding, Verdict
from provisioner.report import to_html, to_junit
from provisioner.spec import load_text
from provisioner.verify import select_tests, verify
from tests.unit._storage_fakes import NoKernelNfsRemote, lab_cluster

NO_STORAGE = """
cluster: {name: rc, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: mlnx_ofed, version: "23.07"}}
profiles:
  g: {gpu: {model: H100-SXM5-80GB, count: 2}, hcas: [{device: "mlx5_[0-1]", rate: 200, numa: 0}]}
nodes: [{name: "n[1-4]", address: "10.0.0.[1-4]", profile: g}]
fabric: {type: roce, rate: 200, roce: {pfc_priority: 3, ecn: true}}
"""


def _clock() -> object:
    ticks = iter([datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC), datetime(2025, 1, 2, 3, 4, 9, tzinfo=UTC)])
    return lambda: next(ticks)


def test_storage_is_selected_when_the_spec_has_mounts() -> None:
    assert "storage" in select_tests(lab_cluster(), None)
    assert select_tests(lab_cluster(), ["storage"]) == ["storage"]
    res = load_text(NO_STORAGE, "cluster.yaml")
    assert res.cluster is not None
    assert "storage" not in select_tests(res.cluster, None)  # in verify.tests by default, but nothing to check


def test_only_storage_on_a_spec_without_mounts_says_so(tmp_path: Path) -> None:
    res = load_text(NO_STORAGE, "cluster.yaml")
    assert res.cluster is not None
    run = verify(res.cluster, tests=["storage"], remote=NoKernelNfsRemote(), state_dir=tmp_path, write=False)
    (check,) = run.report.checks
    assert (check.name, check.error) == ("storage", "the spec lists no NFS or Lustre mounts")
    assert run.exit_code == 2


def test_lab_verify_skips_the_mounts_checks_the_export_and_passes(tmp_path: Path) -> None:
    run = verify(lab_cluster(), tests=["storage"], remote=NoKernelNfsRemote(), state_dir=tmp_path,
                 now=_clock())  # type: ignore[arg-type]
    verdict = run.report.verdict
    assert (verdict.passed, verdict.failed, verdict.could_not_run, verdict.skipped) == (1, 0, 0, 3)
    assert run.exit_code == 0 and verdict.label == "PASS"
    assert run.directory is not None
    data = json.loads((run.directory / "report.json").read_text(encoding="utf-8"))
    assert data["verdict"]["skipped"] == 3
    checks = {(c["name"], c["node"]): c for c in data["checks"]}
    assert checks[("storage", "gpu01")]["passed"] is False
    assert checks[("storage", "gpu01")]["skipped"] == "no kernel NFS client (declared optional): /shared not mounted"
    assert checks[("storage_export", "sm1")]["passed"] is True
    assert [f["severity"] for f in data["findings"]] == ["info", "info", "info"]
    suite = ET.fromstring((run.directory / "junit.xml").read_text(encoding="utf-8"))
    assert suite.get("skipped") == "3" and suite.get("failures") == "0" and suite.get("errors") == "0"
    skipped = {c.get("name"): c.find("skipped") for c in suite.iter("testcase")}
    assert skipped["storage on gpu02"] is not None
    assert skipped["storage on gpu02"].get("message") == checks[("storage", "gpu02")]["skipped"]  # type: ignore[union-attr]
    assert skipped["storage_export on sm1"] is None
    page = (run.directory / "report.html").read_text(encoding="utf-8")
    assert "3 skipped" in page and page.count('<li class="result" data-severity="skipped">') == 3  # one per node
    assert "no kernel NFS client (declared optional): /shared not mounted" in page


def test_lab_verify_fails_when_the_export_is_not_served(tmp_path: Path) -> None:
    run = verify(lab_cluster(), tests=["storage"], remote=NoKernelNfsRemote(served=False), state_dir=tmp_path,
                 write=False)
    assert run.exit_code == 1
    errors = [f for f in run.report.findings() if f.severity == "error"]
    assert [(f.check, f.node) for f in errors] == [("storage_export", "sm1")]
    assert 'type="error"' in to_junit(run.report) and '<td class="fail">sm1</td>' in to_html(run.report)


def test_without_the_site_switch_a_missing_mount_fails_the_run(tmp_path: Path) -> None:
    run = verify(lab_cluster({}), tests=["storage"], remote=NoKernelNfsRemote(), state_dir=tmp_path, write=False)
    assert run.exit_code == 1 and run.report.verdict.skipped == 0
    assert {f.node for f in run.report.findings() if f.severity == "error"} == {"gpu01", "gpu02", "gpu03"}


def test_skipped_results_keep_their_invariants() -> None:
    info = Finding("storage", "info", "n1", None, None, "x", None, "skipped", "")
    error = Finding("storage", "error", "n1", None, None, "x", None, "missing", "")
    skipped = CheckResult.skip("storage", "n1", "no kernel NFS client", [info])
    assert not skipped.passed and skipped.ran and skipped.to_dict()["skipped"] == "no kernel NFS client"
    with pytest.raises(ValueError, match="skipped"):
        CheckResult.skip("storage", "n1", "why", [error])
    with pytest.raises(ValueError, match="skipped"):
        CheckResult("storage", "n1", passed=True, skipped="why")
    with pytest.raises(ValueError, match="skipped"):
        CheckResult("storage", "n1", passed=False, error="unreachable", skipped="why")
    failing = CheckResult.from_findings("links", "n2", [error.__class__("links", "error", "n2", None, None, 1, 0,
                                                                        "down", "")])
    verdict = Verdict.of([skipped, failing])
    assert (verdict.skipped, verdict.failed, verdict.exit_code) == (1, 1, 1)
    assert Verdict.of([skipped]).exit_code == 0 and Verdict.of([skipped]).to_dict()["skipped"] == 1
