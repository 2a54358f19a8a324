"""``provision watch``: rounds of health checks (:mod:`provisioner.health`) on the partition nodes every
``spares.watch_interval_s``; a node that fails them twice in a row (a confirmation probe right after the first
failure: one lost SSH packet does not cost a node) is failed over to a spare (:mod:`provisioner.day2.failover`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from provisioner import interrupt
from provisioner.day2.failover import Failover, FailoverResult, Timeline, summary_lines
from provisioner.day2.peers import DEFAULT_PEERS, Progress
from provisioner.errors import ProvisionerError
from provisioner.health import NodeHealth, check_nodes
from provisioner.interrupt import Interrupted
from provisioner.slurm.membership import current


@dataclass
class Watch:
    """Rounds of health checks over the partition nodes; a node failing twice in a row is failed over."""

    failover: Failover
    interval_s: float
    progress: Progress = lambda _m: None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    results: list[FailoverResult] = field(default_factory=list)
    skipped: set[str] = field(default_factory=set)
    failing_over: str | None = None   # the node a failover is under way for (a signal then interrupts it)

    def round(self) -> list[FailoverResult]:
        f = self.failover
        membership = current(f.cluster, f.state_dir)
        t_round = time.monotonic()
        # a node someone drained (maintenance, a rolling batch) is out of service already: not ours to fail over
        states = f.ctl.nodes(membership.in_partitions) if membership.in_partitions else {}
        nodes = [n for n in membership.in_partitions if not (n in states and states[n].drain)]
        for n in sorted(set(membership.in_partitions) - set(nodes)):
            if n not in self.skipped:
                self.progress(f"{n} is drained ({states[n].reason or 'no reason'}): not checked while it is")
        self.skipped = set(membership.in_partitions) - set(nodes)
        if not nodes:
            return []
        health = check_nodes(f.cluster, f.remote, nodes)
        bad = {n: h for n, h in health.items() if not h.ok}
        if not bad:
            return []
        confirmed = check_nodes(f.cluster, f.remote, list(bad))
        done: list[FailoverResult] = []
        for n, h in confirmed.items():
            if h.ok:
                self.progress(f"{n}: {bad[n].summary()} once, healthy on the second look: no failover")
                continue
            self.progress(f"{n} failed its health checks: {h.summary()}")
            tl = Timeline(t0=t_round)
            tl.mark("fault seen")
            self.failing_over = n  # stays set when a signal interrupts it: the watch then exits as interrupted
            try:
                res = f.run(n, _reason(h), timeline=tl, unhealthy=set(bad))
            except ProvisionerError as exc:
                self.failing_over = None
                self.progress(f"failover of {n} could not run: {exc}")
                continue
            self.failing_over = None
            for line in summary_lines(res):
                self.progress(line)
            done.append(res)
        self.results += done
        return done

    def loop(self, rounds: int | None = None, until: Callable[[list[FailoverResult]], bool] | None = None) -> None:
        """Run rounds every ``interval_s`` (``rounds`` of them, or until ``until`` says so, or forever)."""
        n = 0
        while rounds is None or n < rounds:
            start = self.clock()
            done = self.round()
            n += 1
            if until is not None and until(done):
                return
            if rounds is not None and n >= rounds:
                return
            self.sleep(max(0.0, self.interval_s - (self.clock() - start)))


def _reason(h: NodeHealth) -> str:
    return h.summary()[:150]


def watch_spec(spec: Path, *, overlay: Path | None = None, state_dir: Path | None = None,
               interval: float | None = None, once: bool = False, peers: int = DEFAULT_PEERS,
               progress: Progress = lambda _m: None) -> int:
    """`provision watch`: rounds every ``interval`` (default the spec's spares.watch_interval_s) until a signal,
    or one round with ``once``; the exit code its help gives (a signal between failovers is a clean stop, 0;
    one that interrupted a failover is its own code, the failover recorded as interrupted)."""
    from provisioner.day2.failover import make_failover  # looked up per call: tests stand in for it

    watch: Watch | None = None
    try:
        with interrupt.interruptible():
            fo = make_failover(spec, overlay=overlay, state_dir=state_dir, peers=peers, progress=progress,
                               command="provision watch: failover")
            spares = fo.cluster.spec.spares
            every = interval if interval is not None else float(spares.watch_interval_s if spares else 60)
            watch = Watch(fo, every, progress=progress)
            progress(f"watching {fo.cluster.name} every {every:g} s (failover budget "
                     f"{spares.failover_budget_s if spares else 600} s)")
            watch.loop(rounds=1 if once else None)
    except Interrupted as exc:
        if watch is not None and watch.failing_over is not None:
            progress(f"the failover of {watch.failing_over} was interrupted by {exc.signame}: recorded under "
                     f"{watch.failover.state_dir / 'failover'}")
            return exc.exit_code
        progress(f"stopped by {exc.signame}")
        return 0
    return 1 if once and watch.results else 0
