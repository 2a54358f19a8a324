"""The findings model: construction rules, JSON shape and the verdict's exit codes."""

from __future__ import annotations

import json

import pytest

from provisioner.fabric.findings import CheckResult, Finding, Verdict


def finding(severity: str = "error", **kw: object) -> Finding:
    base: dict[str, object] = {
        "check": "port_state",
        "severity": severity,
        "node": "gpu001",
        "device": "mlx5_0",
        "port": 1,
        "expected": "Active",
        "observed": "Polling",
        "message": "port is not Active",
        "hint": "check the cable",
    }
    base.update(kw)
    return Finding(**base)  # type: ignore[arg-type]


def test_finding_json_has_fixed_keys_and_order() -> None:
    f = finding(rail=0, peer="gpu002")
    data = json.loads(f.to_json())
    assert list(data) == [
        "check",
        "severity",
        "node",
        "device",
        "port",
        "rail",
        "peer",
        "switch",
        "expected",
        "observed",
        "message",
        "hint",
    ]
    assert data["observed"] == "Polling" and data["rail"] == 0 and data["peer"] == "gpu002"


def test_finding_rejects_unknown_severity_and_empty_check() -> None:
    with pytest.raises(ValueError, match="severity"):
        finding("fatal")
    with pytest.raises(ValueError, match="name of the check"):
        finding(check="")


def test_finding_is_frozen() -> None:
    f = finding()
    with pytest.raises(AttributeError):
        f.node = "other"  # type: ignore[misc]


def test_location_label() -> None:
    assert finding(rail=2, peer="gpu009").location() == "gpu001 mlx5_0/1 rail 2 ↔ gpu009"
    assert finding(node=None, device=None, port=None).location() == "cluster"


def test_check_result_from_findings_warnings_do_not_fail() -> None:
    ok = CheckResult.from_findings("port_state", "gpu001", [finding("warning")], {"rate_gbps": 400.0})
    assert ok.passed and ok.ran
    bad = CheckResult.from_findings("port_state", "gpu001", [finding("warning"), finding("error")])
    assert not bad.passed
    assert bad.to_dict()["findings"][1]["severity"] == "error"  # type: ignore[index]


def test_check_result_invariants() -> None:
    with pytest.raises(ValueError, match="could not run"):
        CheckResult("x", "n", passed=True, error="ssh timeout")
    with pytest.raises(ValueError, match="error findings"):
        CheckResult("x", "n", passed=True, findings=(finding("error"),))


def test_verdict_exit_codes() -> None:
    ok = CheckResult.from_findings("a", "n1", [])
    warn = CheckResult.from_findings("b", "n1", [finding("warning")])
    fail = CheckResult.from_findings("c", "n1", [finding("error")])
    norun = CheckResult.could_not_run("d", "n2", "ssh: connection refused")
    assert Verdict.of([ok, warn]).exit_code == 0
    assert Verdict.of([ok, warn]).label == "PASS"
    assert Verdict.of([ok, norun]).exit_code == 2
    assert Verdict.of([ok, norun]).label == "INCOMPLETE"
    both = Verdict.of([ok, warn, fail, norun])
    assert both.exit_code == 1  # a known fault outranks an incomplete run
    assert (both.passed, both.failed, both.could_not_run) == (2, 1, 1)
    assert (both.errors, both.warnings, both.infos) == (1, 1, 0)
    assert Verdict.of([]).exit_code == 0


def test_failed_check_without_findings_still_fails_the_run() -> None:
    assert Verdict.of([CheckResult("nccl", None, passed=False)]).exit_code == 1
