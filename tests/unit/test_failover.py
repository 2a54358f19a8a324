"""Failover and watch: drain the failed node, verify a spare, swap it into the partition, record and persist;
the watch fails over a node only when its health checks fail twice in a row.

Slurm, the verification and the converge are fakes recording what was asked; the health probe's readings are
the lab's simulated tools and real captures (test_health.py builds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import UsageError
from provisioner.failover import Failover, Timeline, Watch, history, summary_lines
from provisioner.health import NodeHealth
from provisioner.report import VerifyReport
from provisioner.slurm.membership import current, load_swaps
from provisioner.spec.cluster import Cluster
from tests.unit.test_plan import LAB, _cluster
from tests.unit.test_rolling import FakeCtl, FakeRunJournal, _finding, _report


@dataclass
class Probe:
    """Stands in for the health probe (``provisioner.health.check_nodes``, tested on the lab's simulated tools and
    real captures in test_health.py): per node a list of problems, and every call in order."""

    bad: dict[str, list[str]] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, cluster: Cluster, remote: Any, nodes: Sequence[str], timeout: float = 20.0
                 ) -> dict[str, NodeHealth]:
        self.calls.append(sorted(nodes))
        return {n: NodeHealth(n, list(self.bad.get(n, []))) for n in nodes}


class SlurmFake(FakeCtl):
    def set_partition(self, partition: str, nodes: Sequence[str]) -> None:
        self.log.append(("partition", partition, ",".join(nodes)))


@pytest.fixture
def cluster() -> Cluster:
    return _cluster(LAB)


@dataclass
class World:
    cluster: Cluster
    tmp: Path
    log: list[tuple[str, ...]] = field(default_factory=list)
    verify_fails: dict[str, str] = field(default_factory=dict)

    def verifier(self, cluster: Cluster, nodes: Sequence[str], peers: Sequence[str], directory: Path,
                 progress: Any, remote: Any = None) -> VerifyReport:
        self.log.append(("verify", ",".join(nodes), ",".join(peers)))
        return _report(cluster.name, [_finding(n, self.verify_fails[n]) for n in nodes if n in self.verify_fails])

    def converge(self, spec: Path, opts: Any, **kw: Any) -> FakeRunJournal:
        self.log.append(("converge", ",".join(opts.only), str(opts.limit)))
        return FakeRunJournal("r1", "passed")

    def failover(self) -> Failover:
        return Failover(Path("c.yaml"), self.cluster, self.tmp, SlurmFake(self.log), None,  # type: ignore[arg-type]
                        verifier=self.verifier, converge=self.converge)


@pytest.fixture(autouse=True)
def _probe(monkeypatch: pytest.MonkeyPatch) -> Probe:
    probe = Probe()
    monkeypatch.setattr("provisioner.failover.check_nodes", probe)
    return probe


def test_failover_drains_verifies_swaps_records_and_persists(cluster: Cluster, tmp_path: Path) -> None:
    w = World(cluster, tmp_path)
    r = w.failover().run("gpu01", "gpu_count: 1 of 2 GPUs")
    assert r.spare == "gpu03" and r.partitions == ["gpu"] and r.exit_code == 0
    assert [e[0] for e in w.log] == ["drain", "verify", "partition", "converge"]
    assert w.log[0][1:] == ("gpu01", "provision failover: gpu_count: 1 of 2 GPUs")
    assert w.log[1] == ("verify", "gpu03", "gpu02")          # against the healthy partition node, not gpu01
    assert w.log[2] == ("partition", "gpu", "gpu03,gpu02")   # gpu01's place, the order Slurm keeps
    assert w.log[3] == ("converge", "slurm", "None")          # slurm.conf on every Slurm node
    assert [e for e, _, _ in r.timeline.events] == ["fault seen", "drained", "spare verified",
                                                     "spare in partition", "persisted"]
    assert r.within_budget and r.in_partition_s is not None and r.in_partition_s < 5
    assert current(cluster, tmp_path).partitions == {"gpu": ["gpu02", "gpu03"]}
    assert [s.spare for s in load_swaps(tmp_path)] == ["gpu03"]
    assert history(tmp_path)[0]["spare"] == "gpu03" and history(tmp_path)[0]["within_budget"] is True
    text = "\n".join(summary_lines(r))
    assert "gpu03 replaces gpu01 in gpu" in text and "within the budget of 600 s" in text


def test_a_spare_that_fails_verification_is_drained_and_none_left_means_no_failover(
        cluster: Cluster, tmp_path: Path) -> None:
    w = World(cluster, tmp_path, verify_fails={"gpu03": "mlx5_1 port 1 down"})
    r = w.failover().run("gpu01", "xid 79")
    assert r.spare is None and r.exit_code == 1
    assert r.rejected == {"gpu03": "verify: gpu03 mlx5_0/1: mlx5_1 port 1 down"}
    assert ("partition",) not in [e[:1] for e in w.log]
    assert w.log[-1][:2] == ("drain", "gpu03")
    assert load_swaps(tmp_path) == [] and "no spare passed" in "\n".join(summary_lines(r))


def test_an_unhealthy_spare_is_not_even_verified(cluster: Cluster, tmp_path: Path, _probe: Probe) -> None:
    w = World(cluster, tmp_path)
    _probe.bad = {"gpu03": ["gpu_count: 1 of 2 GPUs"]}
    r = w.failover().run("gpu01", "x")
    assert r.rejected == {"gpu03": "health: gpu_count: 1 of 2 GPUs"} and not any(e[0] == "verify" for e in w.log)


def test_only_partition_nodes_fail_over(cluster: Cluster, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="gpu03 is in no Slurm partition"):
        World(cluster, tmp_path).failover().run("gpu03", "x")


def test_the_watch_confirms_a_failure_before_failing_over(cluster: Cluster, tmp_path: Path, _probe: Probe) -> None:
    w = World(cluster, tmp_path)
    _probe.bad = {"gpu02": ["gpu_count: 1 of 2 GPUs"]}
    lines: list[str] = []
    watch = Watch(w.failover(), 5, progress=lines.append, sleep=lambda _s: None)
    watch.loop(rounds=2)
    # round 1: all partition nodes, then gpu02 again to confirm; failover of gpu02 (spare gpu03 probed); round 2:
    # the partition is gpu01+gpu03 now and both are healthy
    assert _probe.calls == [["gpu01", "gpu02"], ["gpu02"], ["gpu03"], ["gpu01", "gpu03"]]
    assert [r.node for r in watch.results] == ["gpu02"] and watch.results[0].spare == "gpu03"
    assert any(ln.startswith("gpu02 failed its health checks: gpu_count: 1 of 2 GPUs") for ln in lines)


def test_a_failure_seen_once_is_not_acted_on(cluster: Cluster, tmp_path: Path, _probe: Probe) -> None:
    w = World(cluster, tmp_path)
    original = Probe.__call__

    def flaky(self: Probe, *a: Any, **kw: Any) -> dict[str, NodeHealth]:
        self.bad = {"gpu01": ["xid: Xid 79 (GPU has fallen off the bus) on PCI 0000:18:00"]} if not self.calls else {}
        return original(self, *a, **kw)

    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Probe, "__call__", flaky)
        assert Watch(w.failover(), 5, progress=lines.append).round() == []
    assert lines == ["gpu01: xid: Xid 79 (GPU has fallen off the bus) on PCI 0000:18:00 once, healthy on the "
                     "second look: no failover"]
    assert not any(e[0] == "drain" for e in w.log)


def test_timeline_measures_from_the_fault(tmp_path: Path) -> None:
    tl = Timeline(t0=0.0)
    tl.events.append(("fault seen", "t", 0.0))
    assert tl.at("spare in partition") is None and tl.at("fault seen") == 0.0


def test_a_node_drained_by_someone_else_is_not_checked_nor_failed_over(cluster: Cluster, tmp_path: Path,
                                                                      _probe: Probe) -> None:
    from provisioner.slurm.ctl import NodeState

    w = World(cluster, tmp_path)
    fo = w.failover()
    fo.ctl.states["gpu02"] = NodeState("gpu02", "IDLE+DRAIN", "BIOS update [ops@2026-01-01T00:00:00]")  # type: ignore[attr-defined]
    _probe.bad = {"gpu02": ["gpu_count: 0 of 2 GPUs"]}
    lines: list[str] = []
    watch = Watch(fo, 5, progress=lines.append)
    assert watch.round() == [] and watch.round() == []
    assert _probe.calls == [["gpu01"], ["gpu01"]]
    assert lines == ["gpu02 is drained (BIOS update [ops@2026-01-01T00:00:00]): not checked while it is"]


# --- issue #26 item 5: an interrupted failover or watch records what it did and exits as its help says -------
class NoHandler(Exception):
    """What the old code met: no handler of ours, so the test's stand-in for the default action ran."""


@pytest.fixture
def term_guard() -> Any:
    """SIGTERM and SIGINT raise NoHandler unless the code under test installed its own handler (the default
    action would kill the test process)."""
    import signal

    def fallback(signum: int, frame: Any) -> None:
        raise NoHandler(signum)

    before = {s: signal.signal(s, fallback) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in before.items():
        signal.signal(s, h)


def _kill_self(sig: str) -> None:
    import os
    import signal

    os.kill(os.getpid(), getattr(signal, sig))


def test_an_interrupted_failover_is_recorded(cluster: Cluster, tmp_path: Path, term_guard: Any) -> None:
    from provisioner.interrupt import Interrupted

    w = World(cluster, tmp_path)
    fo = w.failover()

    def verifier(*args: Any, **kw: Any) -> VerifyReport:
        _kill_self("SIGTERM")  # `systemctl stop` while the spare is measured
        raise AssertionError("not reached")

    fo.verifier = verifier
    with pytest.raises(Interrupted) as info:
        fo.run("gpu01", "xid 79")
    assert info.value.exit_code == 143
    [rec] = history(tmp_path)  # old: nothing recorded
    assert rec["interrupted"] == "SIGTERM" and rec["spare"] is None
    assert [t["event"] for t in rec["timeline"]] == ["fault seen", "drained", "interrupted by SIGTERM"]
    assert load_swaps(tmp_path) == []


def _cli_world(monkeypatch: pytest.MonkeyPatch, w: World) -> Failover:
    fo = w.failover()
    monkeypatch.setattr("provisioner.failover.make_failover", lambda *a, **kw: fo)
    return fo


def test_failover_command_exits_as_its_help_says(cluster: Cluster, tmp_path: Path, term_guard: Any,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from provisioner.cli import app, main

    fo = _cli_world(monkeypatch, World(cluster, tmp_path))
    fo.verifier = lambda *a, **kw: _kill_self("SIGINT")  # type: ignore[assignment,func-returns-value]
    rc = main(["failover", str(LAB), "gpu01"])
    err = capsys.readouterr().err
    assert rc == 130, err  # old: 3 (an internal error), or killed
    assert "interrupted by SIGINT" in err and "Traceback" not in err
    assert history(tmp_path)[0]["interrupted"] == "SIGINT"
    helptext = next(c for c in app.registered_commands if c.name == "failover").callback.__doc__ or ""
    assert "130/143/129" in " ".join(helptext.split())


def test_watch_stopped_between_failovers_exits_0(cluster: Cluster, tmp_path: Path, term_guard: Any,
                                                 monkeypatch: pytest.MonkeyPatch, _probe: Probe,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from provisioner.cli import main

    _cli_world(monkeypatch, World(cluster, tmp_path))

    def probe(*a: Any, **kw: Any) -> Any:
        _kill_self("SIGTERM")  # stopped while it checks the nodes' health

    monkeypatch.setattr("provisioner.failover.check_nodes", probe)
    rc = main(["watch", str(LAB)])
    err = capsys.readouterr().err
    assert rc == 0, err  # old: 3 (or killed by SIGTERM: systemd's stop)
    assert "stopped by SIGTERM" in err and history(tmp_path) == []


def test_watch_interrupted_in_a_failover_records_it_and_exits_143(
        cluster: Cluster, tmp_path: Path, term_guard: Any, monkeypatch: pytest.MonkeyPatch, _probe: Probe,
        capsys: pytest.CaptureFixture[str]) -> None:
    from provisioner.cli import app, main

    fo = _cli_world(monkeypatch, World(cluster, tmp_path))
    _probe.bad = {"gpu01": ["gpu_count: 1 of 2 GPUs"]}
    fo.verifier = lambda *a, **kw: _kill_self("SIGTERM")  # type: ignore[assignment,func-returns-value]
    rc = main(["watch", str(LAB)])
    err = capsys.readouterr().err
    assert rc == 143, err
    [rec] = history(tmp_path)
    assert rec["node"] == "gpu01" and rec["interrupted"] == "SIGTERM"
    assert "failover of gpu01 was interrupted" in err
    helptext = " ".join((next(c for c in app.registered_commands if c.name == "watch").callback.__doc__ or "").split())
    assert "130/143/129 when the signal interrupted a failover" in helptext
