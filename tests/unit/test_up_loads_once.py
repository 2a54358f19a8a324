"""`provision up` reads and validates the spec once and passes the model down (issue #28).

The spec used to be loaded by the run engine, again by the verify step after a converge of minutes, by the drift
hook and by the drift summary: four loads, and a spec edited during the converge verified something else than
what was converged. Here the whole run goes through ``cli.main`` with a scripted runner, verify and drift check
(no node is touched) and every read of the spec file is counted."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import provisioner.drift
import provisioner.phases
import provisioner.spec.load
import provisioner.verify
from provisioner.cli import main
from provisioner.drift import DriftReport
from provisioner.report.model import VerifyReport
from provisioner.runner import FakeRun, PlaybookResult, fake_result
from provisioner.spec.cluster import Cluster
from provisioner.verify import VerifyRun

LAB = Path(__file__).resolve().parents[2] / "examples" / "lab" / "cluster.yaml"


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every read of the spec file, every playbook run, every cluster verify and the drift hook were given."""
    seen: dict[str, list[Any]] = {"reads": [], "playbooks": [], "verified": [], "drift": []}
    read = provisioner.spec.load.read_spec_text

    def counting_read(path: Any, what: str = "a spec file") -> str:
        if Path(path).resolve() == LAB:
            seen["reads"].append(what)
        return read(path, what)

    def runner(playbook: Path, inventory_dir: Path, *, limit: Iterable[str], **kw: Any) -> PlaybookResult:
        seen["playbooks"].append(playbook.name)
        return fake_result(playbook.name, list(limit), FakeRun())

    real_run = provisioner.phases.provision_run

    def provision_run(*args: Any, **kw: Any) -> Any:
        return real_run(*args, **kw, runner=runner)

    def verify(cluster: Cluster, **kw: Any) -> VerifyRun:
        seen["verified"].append(cluster)
        now = datetime.now(UTC)
        return VerifyRun(VerifyReport(cluster=cluster.name, started=now, finished=now, checks=()), None)

    def check_cluster(cluster: Cluster, state_dir: Path, **kw: Any) -> DriftReport:
        seen["drift"].append(cluster)
        return DriftReport(checked_at="now", nodes=[])

    monkeypatch.setattr(provisioner.spec.load, "read_spec_text", counting_read)
    monkeypatch.setattr(provisioner.phases, "provision_run", provision_run)
    monkeypatch.setattr(provisioner.verify, "verify", verify)
    monkeypatch.setattr(provisioner.drift, "check_cluster", check_cluster)
    return seen


@pytest.mark.parametrize("view", [["--json"], []], ids=["json", "live"])
def test_up_reads_the_spec_once(counted: dict[str, list[Any]], tmp_path: Path, view: list[str]) -> None:
    rc = main(["up", str(LAB), "--out", str(tmp_path), *view])
    assert rc == 0
    assert "storage.yml" in counted["playbooks"], "the run converged nothing: the count would prove nothing"
    assert counted["verified"] and counted["drift"], "verify and the drift hook must have run"
    assert counted["verified"][0].name == counted["drift"][0].name == "lab"
    assert counted["reads"] == ["a spec file"], f"the spec was read {len(counted['reads'])} times"
