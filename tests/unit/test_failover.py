"""Failover and watch: drain the failed node, verify a spare, swap it into the partition, record and persist;
the watch fails over a node only when its health checks fail twice in a row.

Slurm, the verification and the converge are fakes recording what was asked; the health probe's readings are
the lab's simulated tools and real captures (test_health.py builds them).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from provisioner.day2.failover import Failover, Timeline, history, summary_lines
from provisioner.day2.watch import Watch
from provisioner.errors import UsageError
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


@dataclass
class SlurmFake(FakeCtl):
    """FakeCtl with slurmctld's live partition lists (``scontrol show partition`` / ``update PartitionName``)."""

    parts: dict[str, list[str]] = field(default_factory=lambda: {"gpu": ["gpu01", "gpu02"]})

    def set_partition(self, partition: str, nodes: Sequence[str]) -> None:
        self.log.append(("partition", partition, ",".join(nodes)))
        self.parts[partition] = list(nodes)

    def partition_nodes(self, partition: str) -> list[str]:
        return list(self.parts.get(partition, []))


@pytest.fixture
def cluster() -> Cluster:
    return _cluster(LAB)


@dataclass
class World:
    cluster: Cluster
    tmp: Path
    log: list[tuple[str, ...]] = field(default_factory=list)
    verify_fails: dict[str, str] = field(default_factory=dict)
    ctl: SlurmFake = field(init=False)             # one slurmctld, whichever Failover talks to it
    in_verify: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.ctl = SlurmFake(self.log)

    def verifier(self, cluster: Cluster, nodes: Sequence[str], peers: Sequence[str], directory: Path,
                 progress: Any, remote: Any = None) -> VerifyReport:
        if threading.current_thread().name == "first":  # race(): the first command waits here
            self.in_verify.set()
            assert self.release.wait(30), "the second command never finished"
        self.log.append(("verify", ",".join(nodes), ",".join(peers)))
        return _report(cluster.name, [_finding(n, self.verify_fails[n]) for n in nodes if n in self.verify_fails])

    def converge(self, spec: Path, opts: Any, **kw: Any) -> FakeRunJournal:
        self.log.append(("converge", ",".join(opts.only), str(opts.limit)))
        return FakeRunJournal("r1", "passed")

    def failover(self) -> Failover:
        return Failover(Path("c.yaml"), self.cluster, self.tmp, self.ctl, None,  # type: ignore[arg-type]
                        verifier=self.verifier, converge=self.converge)

    def race(self, first: Callable[[], Any], second: Callable[[], Any]) -> list[Any]:
        """``first`` in a thread, stopped inside its spare's verification until ``second`` (here) has finished:
        two commands at once, in the one order that loses a swap without a lock. What each returned or raised."""
        outcome: list[Any] = [None, None]

        def run_first() -> None:
            try:
                outcome[0] = first()
            except Exception as exc:  # the outcome under test
                outcome[0] = exc
            finally:
                self.in_verify.set()

        thread = threading.Thread(target=run_first, name="first")
        thread.start()
        assert self.in_verify.wait(30)
        try:
            outcome[1] = second()
        except Exception as exc:  # the outcome under test
            outcome[1] = exc
        finally:
            self.release.set()
            thread.join(30)
        return outcome


@pytest.fixture(autouse=True)
def _probe(monkeypatch: pytest.MonkeyPatch) -> Probe:
    probe = Probe()
    monkeypatch.setattr("provisioner.day2.failover.check_nodes", probe)  # the spare's health before it is verified
    monkeypatch.setattr("provisioner.day2.watch.check_nodes", probe)  # the watch's rounds
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
    monkeypatch.setattr("provisioner.day2.failover.make_failover", lambda *a, **kw: fo)
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

    monkeypatch.setattr("provisioner.day2.watch.check_nodes", probe)
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


def test_two_failovers_of_one_node_at_once_record_one_swap_and_the_second_names_the_first(
        cluster: Cluster, tmp_path: Path) -> None:
    w = World(cluster, tmp_path)
    first, second = w.race(lambda: w.failover().run("gpu01", "xid 79"), lambda: w.failover().run("gpu01", "xid 79"))
    assert first.spare == "gpu03", first
    assert isinstance(second, UsageError), second
    msg = str(second)
    assert "provision failover gpu01" in msg and f"pid {os.getpid()}" in msg and "started 20" in msg, msg
    assert [(s.failed, s.spare) for s in load_swaps(tmp_path)] == [("gpu01", "gpu03")]
    assert current(cluster, tmp_path).partitions == {"gpu": ["gpu02", "gpu03"]}   # readable: no exit 2 afterwards


def test_failovers_of_two_nodes_at_once_never_share_a_spare_nor_put_a_drained_node_back(
        cluster: Cluster, tmp_path: Path) -> None:
    w = World(cluster, tmp_path)
    outcome = w.race(lambda: w.failover().run("gpu01", "xid 79"), lambda: w.failover().run("gpu02", "xid 48"))
    done = [r for r in outcome if not isinstance(r, Exception)]
    spares = [r.spare for r in done if r.spare]
    assert spares and len(spares) == len(set(spares)), outcome                 # distinct spares ...
    assert len(done) == 2 or "held by provision failover gpu01" in str(outcome[1]), outcome   # ... or refused
    swaps = load_swaps(tmp_path)
    assert len({s.spare for s in swaps}) == len(swaps) == len(spares)
    drained = {n for n, st in w.ctl.states.items() if st.drain}
    assert not drained & set(w.ctl.parts["gpu"]), (w.ctl.parts, drained)
    assert current(cluster, tmp_path).partitions["gpu"] == sorted(w.ctl.parts["gpu"])


def test_overlapping_watch_rounds_fail_a_node_over_once(cluster: Cluster, tmp_path: Path, _probe: Probe) -> None:
    """A systemd timer overrun: round A has seen gpu02 fail (before anything was drained) when round B starts;
    B gets as far as verifying the spare, then A fails gpu02 over, then B finishes. Without the day-2 lock both
    recorded gpu02 -> gpu03."""
    w = World(cluster, tmp_path)
    _probe.bad = {"gpu02": ["gpu_count: 1 of 2 GPUs"]}
    a_confirmed, b_verifying, go_a, go_b = (threading.Event() for _ in range(4))
    original = Probe.__call__

    def probe(self: Probe, *a: Any, **kw: Any) -> dict[str, NodeHealth]:
        if threading.current_thread().name == "A" and len(self.calls) == 1:   # A's confirmation probe
            a_confirmed.set()
            assert go_a.wait(30)
        return original(self, *a, **kw)

    def verifier(*a: Any, **kw: Any) -> VerifyReport:
        if threading.current_thread().name == "B":
            b_verifying.set()
            assert go_b.wait(30)
        return w.verifier(*a, **kw)

    said: dict[str, list[str]] = {"A": [], "B": []}
    found: dict[str, Any] = {}

    def round_of(name: str) -> None:
        fo = w.failover()
        fo.verifier = verifier
        try:
            found[name] = Watch(fo, 60, progress=said[name].append).round()
        finally:
            (b_verifying if name == "B" else a_confirmed).set()

    threads = {n: threading.Thread(target=round_of, args=(n,), name=n) for n in "AB"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Probe, "__call__", probe)
        threads["A"].start()
        assert a_confirmed.wait(30)
        threads["B"].start()
        assert b_verifying.wait(30)
        go_a.set()
        threads["A"].join(30)
        go_b.set()
        threads["B"].join(30)
    assert [(s.failed, s.spare) for s in load_swaps(tmp_path)] == [("gpu02", "gpu03")]
    assert [r.spare for r in found["B"]] == ["gpu03"] and found["A"] == [], found
    assert any("failover of gpu02 could not run" in ln and "held by provision failover gpu02" in ln
               for ln in said["A"]), said


@pytest.mark.parametrize("reason", ["fan replaced [ops@2026-12-01T10:00:00]",
                                    "provision rolling 20261201T100000.000000Z-abcdef batch 1/3 gpu03: gpu_stack"])
def test_a_spare_someone_else_drained_is_skipped_never_resumed(cluster: Cluster, tmp_path: Path,
                                                               reason: str) -> None:
    from provisioner.slurm.ctl import NodeState

    w = World(cluster, tmp_path)
    w.ctl.states["gpu03"] = NodeState("gpu03", "IDLE+DRAIN", reason)
    r = w.failover().run("gpu01", "xid 79")
    assert r.spare is None and r.exit_code == 1
    assert r.rejected == {"gpu03": f"drained by someone else ({reason}): left drained"}
    assert not [e for e in w.log if e[0] in ("verify", "resume", "partition")], w.log
    assert w.ctl.states["gpu03"].reason == reason and load_swaps(tmp_path) == []


def test_the_partition_is_changed_from_slurms_live_list(cluster: Cluster, tmp_path: Path) -> None:
    w = World(cluster, tmp_path)
    w.ctl.parts["gpu"] = ["gpu01"]          # an operator took gpu02 out by hand: the spec and swaps do not know
    assert w.failover().run("gpu01", "xid 79").spare == "gpu03"
    assert w.ctl.parts["gpu"] == ["gpu03"] and ("partition", "gpu", "gpu03") in w.log


def test_a_node_failed_over_already_is_refused_naming_its_swap(cluster: Cluster, tmp_path: Path) -> None:
    w = World(cluster, tmp_path)
    w.failover().run("gpu01", "xid 79")
    with pytest.raises(UsageError, match=r"gpu01 was failed over already: gpu03 took its place in gpu at 20"):
        w.failover().run("gpu01", "xid 79")


def test_a_duplicate_swap_record_loads_with_a_warning_naming_it(cluster: Cluster, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    import json

    record = {"failed": "gpu01", "spare": "gpu03", "partitions": ["gpu"], "at": "2026-12-01T10:00:00Z",
              "reason": "xid 79", "returned": None}
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "swaps.json").write_text(json.dumps({"schema": 1, "swaps": [record, dict(record)]}))
    with caplog.at_level("WARNING"):
        assert current(cluster, tmp_path).partitions == {"gpu": ["gpu02", "gpu03"]}
    assert [(s.failed, s.spare) for s in load_swaps(tmp_path)] == [("gpu01", "gpu03")]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("record 2 (gpu01 -> gpu03 in gpu at 2026-12-01T10:00:00Z) repeats record 1" in m
               and "swaps.json" in m for m in warned), warned


def test_the_cli_refuses_a_failover_while_another_holds_the_lock_in_one_line(tmp_path: Path) -> None:
    """`provision failover` in its own process while this one holds the day-2 lock: exit 2, one line naming the
    holder, nothing touched (no SSH: the lock comes before the first Slurm command)."""
    import subprocess
    import sys

    from provisioner.state import day2_lock

    spec = Path(__file__).resolve().parents[1] / "lab" / "slurm_cluster.yaml"
    with day2_lock(tmp_path / "st", command="provision failover gpu02"):
        done = subprocess.run([sys.executable, "-m", "provisioner.cli", "failover", str(spec), "gpu01", "--out",
                               str(tmp_path / "st")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout, done.stderr)
    [line] = done.stderr.splitlines()
    assert line.startswith(f"provision: error: the day-2 lock {tmp_path / 'st' / 'day2.lock'} is held by provision "
                           f"failover gpu02, pid {os.getpid()} on "), line
    assert not (tmp_path / "st" / "failover").exists() and not (tmp_path / "st" / "slurm").exists()
