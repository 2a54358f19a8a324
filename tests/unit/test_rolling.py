"""The rolling engine (``provision cluster.yaml --rolling``): per batch drain, wait, converge, verify, resume; the
first failing batch stops the run and stays drained; ``--resume`` continues there.

Slurm, the converge and the verification are fakes that record what the engine asked of them (the real commands
and their output are tested in test_slurm_ctl.py on real captures, and end to end in tests/lab/test_slurm_lab.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from provisioner.day2.peers import batch_failures, busy_peers, pick
from provisioner.day2.plan import make_plan
from provisioner.day2.rolling import (
    Rolling,
    load_last,
    new_journal,
    resume_command,
    summary_lines,
)
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.phases import RunOptions
from provisioner.report import VerifyReport
from provisioner.slurm.ctl import NodeState, SlurmError
from provisioner.slurm.membership import spec_membership
from provisioner.spec.cluster import Cluster
from tests.unit.test_plan import LAB, _cluster, fleet


@dataclass
class FakeCtl:
    """Slurm as the engine sees it: node states, jobs per node, and every call in order."""

    log: list[tuple[str, ...]]
    states: dict[str, NodeState] = field(default_factory=dict)
    jobs: dict[str, list[str]] = field(default_factory=dict)
    on_wait: Callable[[Sequence[str]], None] = lambda _n: None

    def drain(self, nodes: Sequence[str], reason: str) -> None:
        self.log.append(("drain", ",".join(nodes), reason))
        for n in nodes:
            self.states[n] = NodeState(n, "IDLE+DRAIN", reason)

    def resume(self, nodes: Sequence[str]) -> None:
        self.log.append(("resume", ",".join(nodes)))
        for n in nodes:
            self.states[n] = NodeState(n, "IDLE")

    def nodes(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        return {n: self.states.get(n, NodeState(n, "IDLE")) for n in nodes}

    def busy_nodes(self, nodes: Sequence[str]) -> dict[str, list[str]]:
        return {n: self.jobs[n] for n in nodes if self.jobs.get(n)}

    def wait_idle(self, nodes: Sequence[str], max_wait_s: float, poll_s: float = 2.0,
                  progress: Callable[[str], None] = lambda _m: None) -> dict[str, list[str]]:
        self.log.append(("wait", ",".join(nodes)))
        self.on_wait(nodes)
        return {n: self.jobs[n] for n in nodes if self.jobs.get(n)}


@dataclass
class FakeRunJournal:
    run_id: str
    status: str
    stop_reason: str | None = None
    set_aside: dict[str, dict[str, str]] = field(default_factory=dict)


def _report(cluster: str, findings: Sequence[Finding] = ()) -> VerifyReport:
    now = datetime.now(UTC)
    return VerifyReport(cluster, now, now, (CheckResult.from_findings("links", None, findings),))


def _finding(node: str, message: str, severity: str = "error") -> Finding:
    return Finding("links", severity, node, "mlx5_0", 1, "4X", "2X", message, "reseat the cable")  # type: ignore[arg-type]


@dataclass
class Harness:
    cluster: Cluster
    tmp: Path
    log: list[tuple[str, ...]] = field(default_factory=list)
    converge_fails: set[str] = field(default_factory=set)
    verify_fails: dict[str, str] = field(default_factory=dict)
    options: list[RunOptions] = field(default_factory=list)

    def converge(self, spec: Path, opts: RunOptions, **kw: Any) -> FakeRunJournal:
        self.options.append(opts)
        self.log.append(("converge", str(opts.limit), ",".join(opts.only)))
        bad = {n: {"phase": "gpu_stack", "state": "failed", "reason": "apt failed"}
               for n in (opts.limit or "").split(",") if n in self.converge_fails}
        return FakeRunJournal(f"run{len(self.options)}", "partial" if bad else "passed", set_aside=bad)

    def verifier(self, cluster: Cluster, nodes: Sequence[str], peers: Sequence[str], directory: Path,
                 progress: Any, remote: Any = None) -> VerifyReport:
        self.log.append(("verify", ",".join(nodes), ",".join(peers)))
        return _report(cluster.name, [_finding(n, self.verify_fails[n]) for n in nodes if n in self.verify_fails])

    def engine(self, journal: Any, ctl: FakeCtl) -> Rolling:
        return Rolling(Path("cluster.yaml"), self.cluster, self.tmp, journal, ctl, converge=self.converge,
                       verifier=self.verifier, max_wait_s=60)


@pytest.fixture
def driver_change(tmp_path: Path) -> Harness:
    c = _cluster(LAB.replace('version: "550.90.07"', 'version: "550.127.05"'))
    return Harness(c, tmp_path)


def _journal(h: Harness, batch: str = "1") -> Any:
    plan = make_plan(h.cluster, fleet(h.cluster), {}, spec_membership(h.cluster), batch=batch)
    return new_journal(plan, "cluster.yaml", {"overlay": "ov.yaml", "max_wait": 60.0})


def test_every_batch_is_drained_waited_converged_verified_and_resumed_in_order(driver_change: Harness) -> None:
    h = driver_change
    ctl = FakeCtl(h.log)
    journal = h.engine(_journal(h), ctl).run()
    assert journal.status == "passed" and [b.status for b in journal.batches] == ["done"] * 3
    steps = [entry[:2] for entry in h.log]
    assert steps == [("drain", "gpu03"), ("wait", "gpu03"), ("converge", "gpu03"), ("verify", "gpu03"),
                     ("resume", "gpu03"),
                     ("drain", "gpu01"), ("wait", "gpu01"), ("converge", "gpu01"), ("verify", "gpu01"),
                     ("resume", "gpu01"),
                     ("drain", "gpu02"), ("wait", "gpu02"), ("converge", "gpu02"), ("verify", "gpu02"),
                     ("resume", "gpu02")]
    reason = h.log[0][2]
    assert reason.startswith(f"provision rolling {journal.rolling_id} batch 1/3 gpu03")
    assert "=" not in reason and "'" not in reason
    assert h.options[0].only == ["gpu_stack"] and h.options[0].limit == "gpu03"
    # the batch is drained: the driver role may reboot it when the spec allows reboots (the lab spec does not)
    assert h.options[0].extravars == {"nvidia_driver_allow_reboot": False, "provisioner_reboot_serial": 1}
    # peers: finished batches first (gpu03 is done when gpu01 is verified)
    assert [e for e in h.log if e[0] == "verify"][1] == ("verify", "gpu01", "gpu03,gpu02")
    assert load_last(h.tmp) == journal


def test_the_first_failing_batch_stops_the_run_stays_drained_and_resume_continues_there(
        driver_change: Harness) -> None:
    h = driver_change
    h.verify_fails = {"gpu01": "mlx5_0 port 1 width 2X, expected 4X"}
    ctl = FakeCtl(h.log)
    journal = h.engine(_journal(h), ctl).run()
    assert journal.status == "stopped" and [b.status for b in journal.batches] == ["done", "failed", "pending"]
    assert "batch 2/3 gpu01" in (journal.stop_reason or "") and "width 2X" in (journal.stop_reason or "")
    assert ctl.states["gpu01"].drain and "failed: verify: gpu01 mlx5_0/1: mlx5_0 port 1 width 2X" in \
        ctl.states["gpu01"].reason
    assert not any(e[1] == "gpu02" for e in h.log)  # nothing after the failed batch was touched
    assert not any(e == ("resume", "gpu01") for e in h.log)
    text = "\n".join(summary_lines(journal))
    assert "gpu01 stay(s) drained in Slurm" in text
    assert "resume: provision cluster.yaml --rolling --resume --overlay ov.yaml --max-wait 60" in text

    # the fault is fixed; --resume picks the stopped journal up at batch 2
    h.verify_fails = {}
    h.log.clear()
    again = load_last(h.tmp)
    assert again is not None and again.rolling_id == journal.rolling_id
    done = h.engine(again, ctl).run()
    assert done.status == "passed" and [b.status for b in done.batches] == ["done"] * 3
    assert [e[:2] for e in h.log][:5] == [("drain", "gpu01"), ("wait", "gpu01"), ("converge", "gpu01"),
                                          ("verify", "gpu01"), ("resume", "gpu01")]
    assert not any(e[1] == "gpu03" for e in h.log)
    assert ctl.states["gpu01"].state == "IDLE" and ctl.states["gpu02"].state == "IDLE"


def test_jobs_that_outlive_max_wait_stop_the_batch_before_any_converge(driver_change: Harness) -> None:
    h = driver_change
    ctl = FakeCtl(h.log, jobs={"gpu03": ["4711"]})
    journal = h.engine(_journal(h), ctl).run()
    assert journal.status == "stopped" and journal.batches[0].status == "failed"
    assert journal.batches[0].reason == "jobs still running after --max-wait 60 s on gpu03 (4711)"
    assert not any(e[0] == "converge" for e in h.log)
    assert ctl.states["gpu03"].drain


def test_a_node_drained_before_the_run_is_left_drained(driver_change: Harness) -> None:
    h = driver_change
    ctl = FakeCtl(h.log, states={"gpu02": NodeState("gpu02", "IDLE+DRAIN", "bad DIMM [ops@2026-01-01T00:00:00]")})
    journal = h.engine(_journal(h), ctl).run()
    assert journal.status == "passed"
    assert journal.batches[2].already_drained == {"gpu02": "bad DIMM [ops@2026-01-01T00:00:00]"}
    assert ("resume", "gpu02") not in [e[:2] for e in h.log] and ctl.states["gpu02"].drain


def test_a_converge_that_sets_the_node_aside_fails_the_batch_without_verifying(driver_change: Harness) -> None:
    h = driver_change
    h.converge_fails = {"gpu03"}
    journal = h.engine(_journal(h), FakeCtl(h.log)).run()
    assert journal.batches[0].status == "failed"
    assert journal.batches[0].reason == "converge: gpu03: failed in gpu_stack: apt failed"
    assert not any(e[0] == "verify" for e in h.log)


def test_only_findings_on_the_batch_or_cluster_wide_fail_it() -> None:
    peer_old_version = _finding("gpu02", "driver 550.90.07, the spec pins 550.127.05")
    report = _report("c", [peer_old_version, _finding("gpu01", "flapping", "warning")])
    assert batch_failures(report, ["gpu01"]) == []
    report = _report("c", [_finding("gpu01", "port down")])
    assert batch_failures(report, ["gpu01"]) == ["gpu01 mlx5_0/1: port down"]
    now = datetime.now(UTC)
    nccl = VerifyReport("c", now, now, (CheckResult.could_not_run("nccl", None, "mpirun failed"),))
    assert batch_failures(nccl, ["gpu01"]) == ["nccl on the batch could not run: mpirun failed"]


def test_peers_share_a_rail_prefer_finished_batches_and_skip_unhealthy(driver_change: Harness) -> None:
    c = driver_change.cluster
    assert pick(c, ["gpu01"], set()) == ["gpu02", "gpu03"]
    assert pick(c, ["gpu01"], set(), 1, done=["gpu03"]) == ["gpu03"]
    assert pick(c, ["gpu01"], {"gpu02"}) == ["gpu03"]
    assert pick(c, ["sm1"], set()) == []
    # a peer running a Slurm job comes last: its job would slow the measurement and the measurement the job
    assert pick(c, ["gpu01"], set(), 1, done=["gpu03"], busy={"gpu03"}) == ["gpu02"]
    assert pick(c, ["gpu01"], set(), 1, busy={"gpu02", "gpu03"}) == ["gpu02"]  # all busy: still one


def test_busy_peers_asks_slurm_about_the_other_gpu_nodes_and_says_when_it_cannot(driver_change: Harness) -> None:
    c = driver_change.cluster
    said: list[str] = []
    ctl = FakeCtl(log=[], jobs={"gpu03": ["7"], "gpu01": ["8"]})
    assert busy_peers(ctl, c, ["gpu01"], said.append) == {"gpu03"}  # type: ignore[arg-type]
    assert busy_peers(None, c, ["gpu01"], said.append) == set() and said == []

    class Down(FakeCtl):
        def busy_nodes(self, nodes: Sequence[str]) -> dict[str, list[str]]:
            raise SlurmError("squeue on sm1 failed: Unable to contact slurm controller (connect failure)")

    assert busy_peers(Down(log=[]), c, ["gpu01"], said.append) == set()  # type: ignore[arg-type]
    assert said and "could not ask Slurm which peers run jobs" in said[0] and "connect failure" in said[0]


def test_resume_command_carries_the_state_dir_and_the_overlay(driver_change: Harness) -> None:
    journal = _journal(driver_change)
    journal.options = {"overlay": "/tmp/x y/overlay.yaml", "out": "st", "max_wait": 600.0, "peers": 3}
    assert resume_command(journal) == ("provision cluster.yaml --rolling --resume --overlay '/tmp/x y/overlay.yaml' "
                                       "--out st --max-wait 600 --peers 3")


def test_a_batch_node_someone_else_drains_meanwhile_is_not_resumed(driver_change: Harness) -> None:
    """A failover drained gpu01 while its batch converged: the batch's resume leaves it drained (it resumes only
    what the run itself drained, read again under the day-2 lock), and says so."""
    h = driver_change
    ctl = FakeCtl(h.log)
    said: list[str] = []
    converge = h.converge

    def failover_meanwhile(spec: Path, opts: RunOptions, **kw: Any) -> FakeRunJournal:
        if opts.limit == "gpu01":
            ctl.drain(["gpu01"], "provision failover: xid 79")
        return converge(spec, opts, **kw)

    engine = h.engine(_journal(h), ctl)
    engine.converge, engine.progress = failover_meanwhile, said.append
    assert engine.run().status == "passed"
    assert ("resume", "gpu01") not in h.log and ("resume", "gpu02") in h.log
    assert ctl.states["gpu01"].reason == "provision failover: xid 79"
    assert any("gpu01 stays drained: drained meanwhile by someone else (provision failover: xid 79)" in ln
               for ln in said), said


def test_a_batch_waits_for_the_day2_lock_and_stops_naming_its_holder(driver_change: Harness) -> None:
    from provisioner.state import day2_lock

    h = driver_change
    ctl = FakeCtl(h.log)
    engine = h.engine(_journal(h), ctl)
    engine.day2_wait_s = 0.1
    done: list[Any] = []
    hold = threading.Thread(target=lambda: done.append(engine.run()))
    with day2_lock(h.tmp, command="provision failover gpu02"):
        hold.start()
        hold.join(30)
    journal = done[0]
    assert journal.status == "stopped" and [e[0] for e in h.log] == ["drain"], h.log   # only _fail's reason
    assert "could not run: the day-2 lock" in (journal.stop_reason or "")
    assert "held by provision failover gpu02" in (journal.stop_reason or "")
