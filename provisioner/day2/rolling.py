"""``provision cluster.yaml --rolling``: converge a running cluster a batch at a time, the way ops do on Slurm.

Per batch of :mod:`provisioner.day2.plan`:

1. **drain** the batch's Slurm nodes (``scontrol update State=DRAIN Reason="provision rolling <id> ..."``): no
   new job starts there; running jobs go on. A node that was drained before the run is noted and left drained
   at the end (its reason is someone else's).
2. **wait** until no job holds them (``squeue --nodelist``, the node state), at most ``--max-wait`` seconds;
   past that the batch stops with the jobs named and the nodes drained.
3. **converge** the batch alone: the plan's phases with ``--limit`` (a driver change reboots a node that needs it
   when the spec allows reboots: the node is drained, nothing runs on it).
4. **verify** the batch against healthy peers (as replace-node does: links and versions on the batch, bandwidth
   and NCCL with the peers, GPUDirect with a peer; subnet managers: links, versions and the SM check). Peers from
   batches already done come first (they run what the batch now runs).
5. **resume** the nodes (``State=RESUME``): only those this run drained, read again then (a node a failover
   drained meanwhile stays drained).

The drain and the resume run under the day-2 lock (:func:`provisioner.state.day2_lock`), waiting for a failover
or watch round that holds it.

The first batch that fails (converge set a node aside, verification found an error on a batch node, jobs did not
end in time) stops the run: its nodes stay drained with the reason, and the summary says how to resume. The
rolling journal (``<state>/rolling/<id>/rolling.json``, rewritten at every step) lets ``--rolling --resume``
continue from that batch. Subnet managers and storage servers come last, one per batch, standby first.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provisioner.day2 import peers as peers_mod
from provisioner.day2.peers import DEFAULT_PEERS, Progress
from provisioner.day2.plan import Batch, Plan
from provisioner.errors import ProvisionerError, UsageError
from provisioner.phases import NullReporter, Reporter, RunOptions, provision_run
from provisioner.remote import Remote
from provisioner.report import VerifyReport
from provisioner.slurm.ctl import SlurmCtl, reason_text
from provisioner.spec import hostlist
from provisioner.spec.cluster import Cluster
from provisioner.spec.diagnostics import Diagnostic
from provisioner.state import DAY2_WAIT_S, day2_lock, new_run_id, state_dir_for, utcnow, write_json_atomic

ROLLING_DIR = "rolling"
JOURNAL = "rolling.json"
DEFAULT_MAX_WAIT_S = 3600.0



@dataclass
class BatchRecord:
    """One batch as it went; ``status``: pending, draining, waiting, converging, verifying, done, failed."""

    index: int
    nodes: list[str]
    kind: str
    drain: list[str]
    phases: list[str]
    effects: list[str]
    note: str = ""
    status: str = "pending"
    started: str | None = None
    ended: str | None = None
    drained_at: str | None = None
    idle_at: str | None = None
    already_drained: dict[str, str] = field(default_factory=dict)   # node -> its reason before this run
    runs: list[str] = field(default_factory=list)                   # run-engine journals of its converge
    peers: list[str] = field(default_factory=list)
    verify_dir: str | None = None
    reason: str | None = None                                       # why it failed

    @classmethod
    def from_batch(cls, b: Batch) -> BatchRecord:
        return cls(b.index, list(b.nodes), b.kind, list(b.drain), list(b.phases), list(b.effects), b.note)


@dataclass
class RollingJournal:
    rolling_id: str
    cluster: str
    spec: str
    options: dict[str, Any]
    batches: list[BatchRecord]
    status: str = "running"        # running, passed, stopped
    stop_reason: str | None = None
    started: str = field(default_factory=utcnow)
    ended: str | None = None
    resumed: list[str] = field(default_factory=list)                # when --resume picked it up again

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RollingJournal:
        d = dict(data)
        d["batches"] = [BatchRecord(**b) for b in d.get("batches") or []]
        return cls(**d)

    @property
    def failed_batch(self) -> BatchRecord | None:
        return next((b for b in self.batches if b.status not in ("pending", "done")), None)


def journal_path(state_dir: Path, rolling_id: str) -> Path:
    return state_dir / ROLLING_DIR / rolling_id / JOURNAL


def save(state_dir: Path, journal: RollingJournal) -> None:
    write_json_atomic(journal_path(state_dir, journal.rolling_id), journal.to_json())


def load_last(state_dir: Path) -> RollingJournal | None:
    base = state_dir / ROLLING_DIR
    if not base.is_dir():
        return None
    for d in sorted(base.iterdir(), reverse=True):
        path = d / JOURNAL
        if path.is_file():
            try:
                return RollingJournal.from_json(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise UsageError(f"{path}: not a readable rolling journal ({exc})") from None
    return None


def resume_command(journal: RollingJournal) -> str:
    opts = journal.options
    parts = ["provision", journal.spec, "--rolling", "--resume"]
    for flag, key in (("--overlay", "overlay"), ("--out", "out"), ("--max-wait", "max_wait"),
                      ("--peers", "peers")):
        if opts.get(key) is not None:
            parts += [flag, f"{opts[key]:g}" if isinstance(opts[key], float) else str(opts[key])]
    return " ".join(shlex.quote(p) for p in parts)


# ---------------------------------------------------------------------------------------------------------
# judging a batch (pure)

# ---------------------------------------------------------------------------------------------------------
# the engine

Converge = Callable[..., Any]
Verifier = Callable[..., VerifyReport]


@dataclass
class Rolling:
    """Runs the batches of one rolling journal; every collaborator is injectable for tests."""

    spec: Path
    cluster: Cluster
    state_dir: Path
    journal: RollingJournal
    ctl: SlurmCtl | None
    overlay: str | None = None
    max_wait_s: float = DEFAULT_MAX_WAIT_S
    peers: int = DEFAULT_PEERS
    progress: Progress = lambda _m: None
    reporter: Reporter = field(default_factory=NullReporter)
    converge: Converge = provision_run
    verifier: Verifier = peers_mod.verify
    remote: Remote | None = None
    unhealthy: set[str] = field(default_factory=set)
    day2_wait_s: float = DAY2_WAIT_S
    warnings: list[Diagnostic] = field(default_factory=list)  # the spec's, loaded once with `cluster`

    def _save(self) -> None:
        save(self.state_dir, self.journal)

    def run(self) -> RollingJournal:
        j = self.journal
        total = len(j.batches)
        for b in j.batches:
            if b.status == "done":
                continue
            label = f"batch {b.index}/{total} {hostlist.compress(b.nodes)}"
            try:
                ok = self._batch(b, label, total)
            except ProvisionerError as exc:
                ok = False
                self._fail(b, label, f"could not run: {exc}")
            if not ok:
                j.status, j.stop_reason = "stopped", f"{label}: {b.reason}"
                break
        else:
            j.status = "passed"
        j.ended = utcnow()
        self._save()
        return j

    def _day2(self, label: str) -> contextlib.AbstractContextManager[object]:
        """The day-2 lock around a drain or resume decision: waits for a failover or watch round to finish."""
        return day2_lock(self.state_dir, command=f"provision rolling {self.journal.rolling_id} {label}",
                         wait_s=self.day2_wait_s)

    def _foreign_drains(self, nodes: Sequence[str]) -> dict[str, str]:
        """The nodes of ``nodes`` drained with a reason not this run's (node -> that reason): they stay drained."""
        ours = f"provision rolling {self.journal.rolling_id}"
        assert self.ctl is not None
        return {n: st.reason for n, st in self.ctl.nodes(nodes).items() if st.drain and not st.reason.startswith(ours)}

    def _resume(self, b: BatchRecord, label: str) -> None:
        assert self.ctl is not None
        with self._day2(label):
            mine = [n for n in b.drain if n not in b.already_drained]
            since = self._foreign_drains(mine) if mine else {}
            back = [n for n in mine if n not in since]
            if back:
                self.progress(f"{label}: resume {hostlist.compress(back)}")
                self.ctl.resume(back)
        for n, why in sorted(since.items()):
            self.progress(f"{label}: {n} stays drained: drained meanwhile by someone else ({why})")

    def _fail(self, b: BatchRecord, label: str, why: str) -> None:
        b.status, b.reason, b.ended = "failed", why, utcnow()
        self._save()
        if b.drain and self.ctl is not None:
            try:
                self.ctl.drain(b.drain, f"provision rolling {self.journal.rolling_id} {label} failed: {why}")
            except ProvisionerError as exc:
                self.progress(f"{label}: could not set the drain reason: {exc}")
        self.progress(f"{label}: FAILED: {why}")

    def _drain_and_wait(self, b: BatchRecord, label: str) -> bool:
        """Drain the batch (deciding under the day-2 lock which nodes were drained by someone else), then wait
        until no job holds it; False when jobs outlast --max-wait (the batch failed)."""
        assert self.ctl is not None
        rid = self.journal.rolling_id
        b.status = "draining"
        self._save()
        with self._day2(label):
            if b.drained_at is None:
                b.already_drained = self._foreign_drains(b.drain)
            reason = f"provision rolling {rid} {label}: {', '.join(b.phases) or 'converge'}"
            self.progress(f"{label}: drain {hostlist.compress(b.drain)} (Reason={reason_text(reason)})")
            self.ctl.drain(b.drain, reason)
        b.drained_at = b.drained_at or utcnow()
        b.status = "waiting"
        self._save()
        busy = self.ctl.wait_idle(b.drain, self.max_wait_s,
                                  progress=lambda m: self.progress(f"{label}: {m}"))
        if busy:
            jobs = ", ".join(f"{n} ({','.join(ids) or 'completing'})" for n, ids in sorted(busy.items()))
            self._fail(b, label, f"jobs still running after --max-wait {self.max_wait_s:g} s on {jobs}")
            return False
        b.idle_at = utcnow()
        self.progress(f"{label}: no job left on {hostlist.compress(b.drain)}")
        return True

    def _batch(self, b: BatchRecord, label: str, total: int) -> bool:
        rid = self.journal.rolling_id
        b.started, b.reason = b.started or utcnow(), None
        # 1. drain (and note the nodes someone else drained before this run: they stay drained), wait for jobs
        if b.drain and self.ctl is not None and not self._drain_and_wait(b, label):
            return False
        # 2. converge the batch alone
        b.status = "converging"
        self._save()
        self.progress(f"{label}: converge {','.join(b.phases)}")
        extravars = {"nvidia_driver_allow_reboot": self.cluster.spec.reboot.allowed,
                     "provisioner_reboot_serial": max(1, len(b.nodes))}
        opts = RunOptions(only=list(b.phases), limit=hostlist.compress(b.nodes), overlay=self.overlay,
                          extravars=extravars)
        run = self.converge(self.spec, opts, state_dir=self.state_dir, reporter=self.reporter,
                            loaded=(self.cluster, self.warnings))  # the planned model, not a re-read spec
        b.runs.append(run.run_id)
        if run.status != "passed":
            why = run.stop_reason or "; ".join(f"{h}: {sa.get('state')} in {sa.get('phase')}: {sa.get('reason')}"
                                               for h, sa in run.set_aside.items()) or f"converge ended {run.status}"
            self._fail(b, label, f"converge: {' '.join(why.split())}")
            return False
        # 3. verify against healthy peers
        b.status = "verifying"
        done = [n for x in self.journal.batches if x.status == "done" for n in x.nodes]
        b.peers = peers_mod.pick(self.cluster, b.nodes, self.unhealthy, self.peers, done=done,
                             busy=peers_mod.busy_peers(self.ctl, self.cluster, b.nodes, self.progress))
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        directory = self.state_dir / ROLLING_DIR / rid / f"batch{b.index}-{stamp}"
        b.verify_dir = str(directory)
        self._save()
        self.progress(f"{label}: verify against {', '.join(b.peers) or 'no peer (links, versions)'}")
        report = self.verifier(self.cluster, b.nodes, b.peers, directory, self.progress, remote=self.remote)
        failures = peers_mod.batch_failures(report, b.nodes)
        if failures:
            more = f" (+{len(failures) - 1} more, see {directory})" if len(failures) > 1 else ""
            self._fail(b, label, f"verify: {failures[0]}{more}")
            return False
        # 4. resume what this run drained, read again under the day-2 lock (a failover may have drained one since)
        if b.drain and self.ctl is not None:
            self._resume(b, label)
        for n, why in sorted(b.already_drained.items()):
            self.progress(f"{label}: {n} stays drained: it was drained before this run ({why})")
        b.status, b.ended = "done", utcnow()
        self._save()
        return True


def new_journal(plan: Plan, spec: str, options: Mapping[str, Any]) -> RollingJournal:
    return RollingJournal(new_run_id(), plan.cluster, spec, dict(options),
                          [BatchRecord.from_batch(b) for b in plan.batches])


def summary_lines(journal: RollingJournal) -> list[str]:
    """Per batch what happened, then how to resume a stopped run."""
    lines = [f"rolling {journal.rolling_id}: {journal.status}"]
    for b in journal.batches:
        extra = f" ({b.note})" if b.note else ""
        lines.append(f"  batch {b.index} {hostlist.compress(b.nodes)}{extra}: {b.status}"
                     + (f": {b.reason}" if b.reason else "")
                     + (f"; verified against {', '.join(b.peers)}" if b.status == "done" and b.peers else ""))
    failed = journal.failed_batch
    if journal.status != "passed" and failed is not None:
        if failed.drain:
            lines.append(f"{hostlist.compress(failed.drain)} stay(s) drained in Slurm with the reason above "
                         "(scontrol show node); nothing after this batch was touched")
        lines.append(f"fix it, then resume: {resume_command(journal)}")
    return lines


def rolling_run(spec: Path, *, overlay: Path | None = None, state_dir: Path | None = None,
                batch: str | None = None, max_wait_s: float = DEFAULT_MAX_WAIT_S, peers: int = DEFAULT_PEERS,
                resume: bool = False, progress: Progress = lambda _m: None, reporter: Reporter | None = None,
                remote_factory: Callable[[Mapping[str, Any]], Any] | None = None,
                converge: Converge = provision_run, verifier: Verifier = peers_mod.verify) -> RollingJournal:
    """A rolling run from the spec: plan it (or pick up the last stopped one with ``resume``), then run it."""
    from provisioner.day2.plan import make_plan
    from provisioner.drift import fetch_manifests
    from provisioner.remote import SshRemote, targets_from_cluster
    from provisioner.slurm.membership import current
    from provisioner.spec import load_cluster

    cluster, warnings = load_cluster(spec, overlay)
    sdir = state_dir_for(cluster.name, state_dir)
    sdir.mkdir(parents=True, exist_ok=True)
    remote = (remote_factory or SshRemote)(targets_from_cluster(cluster))
    try:
        ctl = SlurmCtl(remote, cluster.spec.slurm.controller) if cluster.spec.slurm else None
        if resume:
            journal = load_last(sdir)
            if journal is None or journal.status == "passed":
                raise UsageError("--rolling --resume: no stopped rolling run of this cluster",
                                 hint="run with --rolling (without --resume) to plan a new one")
            journal.status, journal.stop_reason, journal.ended = "running", None, None
            journal.resumed.append(utcnow())
            progress(f"resuming rolling {journal.rolling_id} at batch "
                     f"{next(b.index for b in journal.batches if b.status != 'done')}")
        else:
            names = [n.name for n in cluster.nodes]
            manifests, missing = fetch_manifests(remote, names)
            membership = current(cluster, sdir)
            plan = make_plan(cluster, manifests, missing, membership, batch=batch)
            options = {"overlay": str(overlay) if overlay else None, "out": str(state_dir) if state_dir else None,
                       "batch": plan.batch_size, "max_wait": max_wait_s, "peers": peers}
            journal = new_journal(plan, str(spec), options)
            progress(f"rolling {journal.rolling_id}: {len(journal.batches)} batch(es) of --batch {plan.batch_size}")
        save(sdir, journal)
        unhealthy = peers_mod.unhealthy_nodes(sdir) | set(current(cluster, sdir).failed)
        engine = Rolling(spec, cluster, sdir, journal, ctl, overlay=str(overlay) if overlay else None,
                         max_wait_s=max_wait_s, peers=peers, progress=progress,
                         reporter=reporter or NullReporter(), converge=converge, verifier=verifier,
                         remote=remote if remote_factory else None, unhealthy=unhealthy, warnings=warnings)
        return engine.run()
    finally:
        close = getattr(remote, "close", None)
        if callable(close):
            close()
