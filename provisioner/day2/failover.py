"""``provision failover``: a spare node into a failed node's place, the way ops do on Slurm.

Failover of NODE (a node of some Slurm partition):

1. **drain** NODE with the reason (``scontrol update State=DRAIN Reason="provision failover: ..."``): its running
   job is lost with the hardware, nothing new starts there;
2. **pick a spare** of NODE's profile (the spec's spares, minus those used by earlier failovers, plus failed
   nodes that came back through ``replace-node``) and **verify it against healthy peers** (the cheap health
   checks first, then links, versions, bandwidth and a short NCCL run with the peers, GPUDirect with one: the
   rolling batch verification). A spare that fails is drained and the next one is tried; a spare someone else
   drained (an operator, a rolling batch: a reason not ours) is skipped and left drained;
3. **put the spare in NODE's partitions** (``scontrol update PartitionName=... Nodes=...``, live, starting from
   the list slurmctld has now) and record the swap (``<state>/slurm/swaps.json``; the timeline under
   ``<state>/failover/``);
4. **persist** it: the slurm phase renders slurm.conf with the swap on every Slurm node, so a restart of
   slurmctld keeps the spare in and NODE out.

All of it runs under the day-2 lock (``<state>/day2.lock``, :func:`provisioner.state.day2_lock`): a second
failover, a watch round or a rolling step meanwhile is refused (or waits) naming the holder, so two commands never
pick the same spare or record a swap twice.

The timeline (fault seen, drained, spare verified, spare in partition, persisted) is kept with the swap; the
budget (``spares.failover_budget_s``, 10 minutes by default) is checked against fault-seen → spare-in-partition.

``provision watch`` (:mod:`provisioner.day2.watch`) runs the health checks on the partition nodes and fails over a
node that fails them twice in a row.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provisioner import interrupt
from provisioner.day2 import peers as peers_mod
from provisioner.day2.peers import DEFAULT_PEERS, Progress
from provisioner.errors import ProvisionerError, UsageError
from provisioner.health import check_nodes
from provisioner.interrupt import Interrupted
from provisioner.phases import NullReporter, Reporter, RunOptions, provision_run
from provisioner.remote import Remote
from provisioner.report import VerifyReport
from provisioner.slurm.ctl import SlurmCtl
from provisioner.slurm.membership import Membership, current, load_swaps, record_swap
from provisioner.spec.cluster import Cluster
from provisioner.spec.diagnostics import Diagnostic
from provisioner.state import day2_lock, state_dir_for, utcnow, write_json_atomic

FAILOVER_DIR = "failover"
OUR_DRAIN = "provision failover"
"""How a failover's drain reasons start: a drain with another reason is someone else's and never resumed here."""


class NoSpare(ProvisionerError):
    """No spare of the failed node's profile passed verification."""

    exit_code = 1


@dataclass
class Timeline:
    """Named moments of one failover, as UTC times and seconds since the fault was seen (monotonic)."""

    t0: float = field(default_factory=time.monotonic)
    events: list[tuple[str, str, float]] = field(default_factory=list)

    def mark(self, event: str) -> float:
        elapsed = time.monotonic() - self.t0
        self.events.append((event, utcnow(), round(elapsed, 3)))
        return elapsed

    def at(self, event: str) -> float | None:
        return next((s for e, _, s in self.events if e == event), None)


@dataclass
class FailoverResult:
    node: str
    reason: str
    spare: str | None = None
    partitions: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)    # spare -> why it was not taken
    peers: list[str] = field(default_factory=list)
    report_dir: str | None = None
    persisted: str | None = None                              # the slurm phase's run status
    budget_s: float = 600.0
    interrupted: str | None = None                            # the signal that stopped it part way (SIGTERM)
    timeline: Timeline = field(default_factory=Timeline)

    @property
    def in_partition_s(self) -> float | None:
        return self.timeline.at("spare in partition")

    @property
    def within_budget(self) -> bool:
        s = self.in_partition_s
        return s is not None and s <= self.budget_s

    @property
    def exit_code(self) -> int:
        if self.spare is None:
            return 1
        return 0 if self.persisted in (None, "passed") else 1

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "timeline"}
        d["timeline"] = [{"event": e, "at": at, "s": s} for e, at, s in self.timeline.events]
        d["in_partition_s"] = self.in_partition_s
        d["within_budget"] = self.within_budget
        return d


def spare_candidates(cluster: Cluster, membership: Membership, node: str, unhealthy: set[str]) -> list[str]:
    """Spares of ``node``'s profile, in spec order, not known unhealthy."""
    profile = cluster.node(node).profile
    return [s for s in membership.spares if cluster.node(s).profile == profile and s not in unhealthy]


def summary_lines(r: FailoverResult) -> list[str]:
    lines = [f"failover {r.node}: {r.reason}"]
    for event, at, s in r.timeline.events:
        lines.append(f"  {s:8.1f} s  {event} ({at})")
    for spare, why in r.rejected.items():
        lines.append(f"  spare {spare} rejected: {why}")
    if r.interrupted is not None:
        if r.in_partition_s is None:
            lines.append(f"  interrupted by {r.interrupted}: {r.node} stays drained, no spare took its place (the "
                         f"timeline is what was done); run `provision failover <spec> {r.node}` again")
        else:
            lines.append(f"  interrupted by {r.interrupted}: {r.spare} replaces {r.node} live and recorded, slurm.conf "
                         "not persisted: rerun `provision cluster.yaml --only slurm` before slurmctld restarts")
        return lines
    if r.spare is None:
        lines.append(f"  no spare passed: {r.node} stays drained and out of service; add or repair a spare")
        return lines
    lines.append(f"  {r.spare} replaces {r.node} in {', '.join(r.partitions)} (verified against "
                 f"{', '.join(r.peers) or 'no peer'}; report {r.report_dir})")
    took = r.in_partition_s or 0.0
    verdict = "within" if r.within_budget else "OVER"
    lines.append(f"  fault to spare in partition: {took:.1f} s, {verdict} the budget of {r.budget_s:g} s")
    if r.persisted not in (None, "passed"):
        lines.append(f"  slurm.conf not persisted (slurm phase {r.persisted}): the swap is live and recorded; "
                     "rerun `provision cluster.yaml --only slurm` before slurmctld restarts")
    lines.append(f"  {r.node} stays drained; after repair: provision replace-node <spec> {r.node} (it returns as "
                 "a spare)")
    return lines


@dataclass
class Failover:
    """One failover; the collaborators are injectable for tests."""

    spec: Path
    cluster: Cluster
    state_dir: Path
    ctl: SlurmCtl
    remote: Remote
    overlay: str | None = None
    peers: int = DEFAULT_PEERS
    progress: Progress = lambda _m: None
    reporter: Reporter = field(default_factory=NullReporter)
    verifier: Callable[..., VerifyReport] = peers_mod.verify
    converge: Callable[..., Any] = provision_run
    persist: bool = True
    verify_remote: Remote | None = None
    command: str = "provision failover"          # names the day-2 lock's holder (with the node)
    warnings: list[Diagnostic] = field(default_factory=list)  # the spec's, loaded once with `cluster`

    def run(self, node: str, reason: str, timeline: Timeline | None = None,
            unhealthy: set[str] | None = None) -> FailoverResult:
        """Fail ``node`` over, holding the day-2 lock from reading the membership to recording the swap (and its
        persist run): a second failover, a watch round or a rolling step meanwhile is refused or waits."""
        with day2_lock(self.state_dir, command=f"{self.command} {node}"):
            return self._run(node, reason, timeline, unhealthy)

    def _run(self, node: str, reason: str, timeline: Timeline | None, unhealthy: set[str] | None) -> FailoverResult:
        c = self.cluster
        membership = current(c, self.state_dir)
        parts = self._partitions_of(node, membership)
        budget = float(c.spec.spares.failover_budget_s) if c.spec.spares else 600.0
        result = FailoverResult(node, reason, partitions=parts, budget_s=budget, timeline=timeline or Timeline())
        if not result.timeline.events:
            result.timeline.mark("fault seen")
        bad = set(unhealthy or set()) | {node} | set(membership.failed)
        # a signal ends it where it is (the first cleanly, a second at once): either way what it did is recorded
        with interrupt.interruptible(), interrupt.on_abort(lambda signum: self._interrupted(result, signum)):
            try:
                return self._steps(result, membership, bad)
            except interrupt.Interrupted as exc:
                self._interrupted(result, exc.signum)
                raise

    def _interrupted(self, result: FailoverResult, signum: int) -> None:
        result.interrupted = interrupt.Interrupted(signum).signame
        result.timeline.mark(f"interrupted by {result.interrupted}")
        self._save(result)

    def _steps(self, result: FailoverResult, membership: Membership, bad: set[str]) -> FailoverResult:
        """Drain, verify spares, swap, record, persist: the timeline marks each step as it is done."""
        node, reason, parts, tl = result.node, result.reason, result.partitions, result.timeline
        self.progress(f"drain {node}: {reason}")
        self.ctl.drain([node], f"{OUR_DRAIN}: {reason}")
        tl.mark("drained")
        result.spare = self._pick_spare(node, membership, bad, result)
        if result.spare is None:
            tl.mark("no spare")
            self._save(result)
            return result
        tl.mark("spare verified")
        self._swap_in(node, result.spare, parts)
        elapsed = tl.mark("spare in partition")
        self.progress(f"{result.spare} in {', '.join(parts)} {elapsed:.1f} s after the fault was seen")
        record_swap(self.state_dir, node, result.spare, parts, reason)
        self._save(result)
        if self.persist:
            self.progress("persist: slurm.conf with the swap on every Slurm node")
            run = self.converge(self.spec, RunOptions(only=["slurm"], overlay=self.overlay),
                                state_dir=self.state_dir, reporter=self.reporter,
                                loaded=(self.cluster, self.warnings))  # this model, not a re-read spec
            result.persisted = str(run.status)
            tl.mark("persisted" if run.status == "passed" else f"persist {run.status}")
        self._save(result)
        return result

    def _partitions_of(self, node: str, membership: Membership) -> list[str]:
        """``node``'s partitions now; a node failed over already is refused naming the swap that took it out."""
        parts = membership.partitions_of(node)
        if parts:
            return parts
        swap = next((s for s in reversed(load_swaps(self.state_dir)) if s.failed == node and not s.returned), None)
        if swap is not None:
            raise UsageError(f"{node} was failed over already: {swap.spare} took its place in "
                             f"{', '.join(swap.partitions)} at {swap.at}",
                             hint=f"after repair: provision replace-node <spec> {node} (it returns as a spare)")
        raise UsageError(f"{node} is in no Slurm partition (partitions: "
                         + ", ".join(f"{p}={','.join(n)}" for p, n in membership.partitions.items()) + ")",
                         hint="failover replaces a partition node; spares and failed nodes are in none")

    def _pick_spare(self, node: str, membership: Membership, bad: set[str], result: FailoverResult) -> str | None:
        """The first spare that passes verification; a spare someone else drained (an operator, a rolling batch)
        is skipped and left drained, one that fails is drained with the reason."""
        candidates = spare_candidates(self.cluster, membership, node, bad)
        states = self.ctl.nodes(candidates) if candidates else {}
        for spare in candidates:
            st = states.get(spare)
            why: str | None
            if st is not None and st.drain and not st.reason.startswith(OUR_DRAIN):
                why = f"drained by someone else ({st.reason}): left drained"
            else:
                why = self._verify_spare(spare, bad, result)
                if why is None:
                    return spare
                bad.add(spare)
                try:
                    self.ctl.drain([spare], f"{OUR_DRAIN}: spare failed verification: {why}")
                except ProvisionerError as exc:
                    self.progress(f"could not drain {spare}: {exc}")
            result.rejected[spare] = why
            self.progress(f"spare {spare} rejected: {why}")
        return None

    def _swap_in(self, node: str, spare: str, parts: Sequence[str]) -> None:
        """Resume the spare (only from a drain of ours) and put it in ``node``'s place in each partition's list
        as slurmctld has it now (not the spec's: an operator's or another command's change stays)."""
        states = self.ctl.nodes([spare])
        if spare in states and states[spare].drain and states[spare].reason.startswith(OUR_DRAIN):
            self.ctl.resume([spare])
        for part in parts:
            live = self.ctl.partition_nodes(part)
            members = [spare if n == node else n for n in live] if node in live else [*live, spare]
            self.progress(f"partition {part}: {node} -> {spare}")
            self.ctl.set_partition(part, list(dict.fromkeys(members)))

    def _verify_spare(self, spare: str, unhealthy: set[str], result: FailoverResult) -> str | None:
        health = check_nodes(self.cluster, self.remote, [spare])[spare]
        if not health.ok:
            return f"health: {health.summary()}"
        peers = peers_mod.pick(self.cluster, [spare], unhealthy, self.peers,
                               busy=peers_mod.busy_peers(self.ctl, self.cluster, [spare], self.progress))
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        directory = self.state_dir / FAILOVER_DIR / f"{stamp}-{result.node}" / f"verify-{spare}"
        self.progress(f"verify spare {spare} against {', '.join(peers) or 'no peer'}")
        report = self.verifier(self.cluster, [spare], peers, directory, self.progress, remote=self.verify_remote)
        result.peers, result.report_dir = peers, str(directory)
        failures = peers_mod.batch_failures(report, [spare])
        return f"verify: {failures[0]}" if failures else None

    def _save(self, result: FailoverResult) -> None:
        first = result.timeline.events[0][1] if result.timeline.events else utcnow()
        stamp = first.replace("-", "").replace(":", "")
        write_json_atomic(self.state_dir / FAILOVER_DIR / f"{stamp}-{result.node}.json", result.to_json())


def history(state_dir: Path) -> list[dict[str, Any]]:
    """Every recorded failover, oldest first."""
    base = state_dir / FAILOVER_DIR
    out: list[dict[str, Any]] = []
    for path in sorted(base.glob("*.json")) if base.is_dir() else []:
        try:
            out.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return out


def make_failover(spec: Path, *, overlay: Path | None = None, state_dir: Path | None = None, peers: int = DEFAULT_PEERS,
                  progress: Progress = lambda _m: None, reporter: Reporter | None = None,
                  remote_factory: Callable[[Mapping[str, Any]], Any] | None = None,
                  persist: bool = True, command: str = "provision failover") -> Failover:
    """A Failover for the spec (SSH to the nodes, Slurm on the spec's controller)."""
    from provisioner.remote import SshRemote, targets_from_cluster
    from provisioner.spec import load_cluster

    cluster, warnings = load_cluster(spec, overlay)
    if cluster.spec.slurm is None:
        raise UsageError("the spec has no slurm section: failover puts a spare into a Slurm partition")
    sdir = state_dir_for(cluster.name, state_dir)
    sdir.mkdir(parents=True, exist_ok=True)
    remote = (remote_factory or SshRemote)(targets_from_cluster(cluster))
    return Failover(spec, cluster, sdir, SlurmCtl(remote, cluster.spec.slurm.controller), remote,
                    overlay=str(overlay) if overlay else None, peers=peers, progress=progress,
                    reporter=reporter or NullReporter(), persist=persist,
                    verify_remote=remote if remote_factory else None, command=command, warnings=warnings)


def names_of(nodes: Sequence[str]) -> str:
    return ", ".join(nodes)


def failover_spec(spec: Path, node: str, reason: str, *, overlay: Path | None = None, state_dir: Path | None = None,
                  peers: int = DEFAULT_PEERS, persist: bool = True, reporter: Reporter | None = None,
                  progress: Progress = lambda _m: None) -> FailoverResult:
    """`provision failover`: ``node`` failed over for ``reason`` on the spec's cluster. A signal ends it with
    :class:`Interrupted`, ``progress`` told where what was done is recorded."""
    with interrupt.interruptible():
        fo = make_failover(spec, overlay=overlay, state_dir=state_dir, peers=peers, reporter=reporter,
                           persist=persist, progress=progress)
        try:
            return fo.run(node, reason)
        except Interrupted as exc:
            progress(f"interrupted by {exc.signame}: what was done is recorded under {fo.state_dir / 'failover'}")
            raise
