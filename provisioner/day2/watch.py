"""``provision watch``: rounds of health checks (:mod:`provisioner.health`) on the partition nodes every
``spares.watch_interval_s``; a node that fails them twice in a row (a confirmation probe right after the first
failure: one lost SSH packet does not cost a node) is failed over to a spare (:mod:`provisioner.day2.failover`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from provisioner.day2.failover import Failover, FailoverResult, Timeline, summary_lines
from provisioner.day2.peers import Progress
from provisioner.errors import ProvisionerError
from provisioner.health import NodeHealth, check_nodes
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
