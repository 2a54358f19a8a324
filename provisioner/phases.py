"""The phases of `provision cluster.yaml`, in order, and the engine that runs them with failure isolation.

    validate -> render -> preflight -> repos -> ofed -> gpu_stack -> fabric -> storage -> slurm -> verify -> report

Each phase is a playbook of the collection provisioner.cluster (`provisioner.collection`) or a Python step. The
engine keeps going when single nodes break: a host that fails or cannot be reached in a phase is *set aside* with
its reason and the others carry on, because one dead node must not hold 127 healthy ones hostage. It stops the
whole run when that would be wrong: a critical host (the subnet manager, the NFS server) is down, or more than
`max_fail` percent of the run's hosts have been set aside (then something systematic is broken and carrying on only
adds damage).

A run whose phases need a playbook that is missing does not start: one line names the file and how to get it
back (exit 2), never a phase quietly recorded as not built. A Python step the caller did not supply (the library
without verify/report) is recorded as `not_built`, never as passed, and no host counts it as completed.

The journal (`provisioner.state`) is written after every phase; `--resume` continues each host from the
first phase it has not completed. One run works on a cluster's state at a time (`provisioner.state.run_lock`).

`--check` changes nothing anywhere: the playbooks run in Ansible's check mode against an inventory rendered
into the run's own directory (the live one is left alone), with the fact cache there too; the Python steps
that measure or record (verify, report) do not run; and no later `--resume` continues from a check run.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from provisioner import collection as content
from provisioner import interrupt
from provisioner.collection import ContentMissing, require_playbook
from provisioner.errors import ProvisionerError, UsageError
from provisioner.hostpattern import select_hosts
from provisioner.runner import PlaybookResult, RunnerError, ansible_state_dir, run_playbook
from provisioner.safetext import printable
from provisioner.spec.hostlist import compress
from provisioner.state import (
    HostProgress,
    PhaseRecord,
    RunJournal,
    close_dead_runs,
    new_run_id,
    private_dir,
    resumable_run,
    run_lock,
    runs_dir,
    save_journal,
    state_dir_for,
    utcnow,
)

if TYPE_CHECKING:
    from provisioner.spec.cluster import Cluster
    from provisioner.spec.diagnostics import Diagnostic


@dataclass(frozen=True)
class Phase:
    name: str
    title: str
    playbook: str | None = None   # file in the collection's playbooks/; None: a Python step
    always: bool = False          # re-run on every run and resume (cheap prerequisites)


PHASES: tuple[Phase, ...] = (
    Phase("validate", "validate the spec", always=True),
    Phase("render", "render the inventory", always=True),
    Phase("preflight", "preflight checks", "preflight.yml"),
    Phase("repos", "vendor repositories, host baseline", "repos.yml"),
    # OFED before the driver: the driver's DKMS build of nvidia_peermem needs the OFED peer-memory symbols
    Phase("ofed", "DOCA-OFED/MOFED, RoCE QoS", "ofed.yml"),
    Phase("gpu_stack", "driver, CUDA, NCCL, GPUDirect RDMA", "gpu_stack.yml"),
    Phase("fabric", "subnet manager, switches", "fabric.yml"),
    Phase("storage", "NFS/Lustre", "storage.yml"),
    Phase("slurm", "Slurm: MUNGE, slurmctld, slurmd", "slurm.yml"),
    Phase("verify", "verify the fabric against the spec"),
    Phase("report", "write the reports"),
)
PHASE_NAMES: tuple[str, ...] = tuple(p.name for p in PHASES)
CHECK_MODE_STEPS: tuple[str, ...] = ("validate", "render")
"""The Python steps a --check run runs; the others (verify, report) measure or record, so they are skipped."""
CRITICAL_ROLES: tuple[str, ...] = ("subnet_manager", "nfs_server")
DEFAULT_MAX_FAIL = 10.0


def phase(name: str) -> Phase:
    for p in PHASES:
        if p.name == name:
            return p
    raise UsageError(f"unknown phase '{name}'", hint="one of " + ", ".join(PHASE_NAMES))


@dataclass
class RunOptions:
    """Everything the command line can say about a run (the CLI builds this; docs/architecture.md, "The run engine")."""

    only: list[str] = field(default_factory=list)
    from_phase: str | None = None
    limit: str | None = None
    check: bool = False
    diff: bool = False
    tags: list[str] = field(default_factory=list)
    forks: int | None = None
    max_fail: float = DEFAULT_MAX_FAIL
    resume: bool = False
    overlay: str | None = None
    secret_files: list[Path] = field(default_factory=list)   # -e @file; every value is scrubbed from artifacts
    vault_password_file: Path | None = None
    extravars: dict[str, Any] = field(default_factory=dict)  # non-secret only (they reach the command line)
    out: str | None = None  # the state dir given with --out (the retry command must name it to find the journal)

    def to_json(self) -> dict[str, Any]:
        return {"only": self.only, "from": self.from_phase, "limit": self.limit, "check": self.check,
                "diff": self.diff, "tags": self.tags, "forks": self.forks, "max_fail": self.max_fail,
                "resume": self.resume, "overlay": self.overlay, "out": self.out,
                "secret_files": [str(v) for v in self.secret_files],
                "vault_password_file": str(self.vault_password_file) if self.vault_password_file else None,
                "extravars": self.extravars}


# ---------------------------------------------------------------------------------------------------------
# planning (pure)

def select_phases(only: Sequence[str] = (), from_phase: str | None = None) -> list[str]:
    """The phases to run, in order. validate and render always run: every later phase needs the inventory."""
    if only and from_phase:
        raise UsageError("--only and --from cannot be used together")
    for name in [*only, *([from_phase] if from_phase else [])]:
        phase(name)
    if only:
        wanted = set(only)
        return [p.name for p in PHASES if p.always or p.name in wanted]
    if from_phase:
        start = PHASE_NAMES.index(from_phase)
        return [p.name for i, p in enumerate(PHASES) if p.always or i >= start]
    return list(PHASE_NAMES)


def expand_limit(limit: str | None, known: Sequence[str], groups: Mapping[str, Sequence[str]] | None = None,
                 *, what: str = "--limit") -> list[str]:
    """The hosts `--limit` selects, in spec order: every host when it is not given (None); otherwise an Ansible
    pattern over the hosts and `groups` or a hostlist (provisioner.hostpattern). An empty one is an error."""
    if limit is None:
        return list(known)
    return select_hosts(limit, known, groups, what=what)


def critical_hosts(roles: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """host -> the critical role it plays (subnet_manager, nfs_server): its failure stops the run."""
    out: dict[str, str] = {}
    for host, host_roles in roles.items():
        crit = [r for r in host_roles if r in CRITICAL_ROLES]
        if crit:
            out[host] = ",".join(crit)
    return out


@dataclass
class RunPlan:
    phases: list[str]
    hosts: list[str]                       # the hosts this run works on, spec order
    progress: dict[str, HostProgress]      # every host known to the journal (carried over on resume)
    resumed_from: str | None = None


def plan_run(all_hosts: Sequence[str], options: RunOptions, previous: RunJournal | None = None,
             groups: Mapping[str, Sequence[str]] | None = None) -> RunPlan:
    """Which phases and hosts this run covers. On resume: the previous run's phases, and its hosts that have
    not completed them (narrowed by --limit), each continuing from the first phase it has not completed."""
    limited = expand_limit(options.limit, all_hosts, groups)
    if not options.resume:
        return RunPlan(select_phases(options.only, options.from_phase), limited,
                       {h: HostProgress() for h in limited})
    if previous is None:
        raise UsageError("--resume: no previous run of this cluster (--check runs do not count)",
                         hint="run without --resume first")
    if previous.check_run:
        raise UsageError(f"--resume: run {previous.run_id} was a --check run; it changed nothing to continue from")
    if options.only or options.from_phase:
        raise UsageError("--resume continues the previous run's phases; drop --only/--from")
    progress = {h: HostProgress(list(hp.completed), dict(hp.set_aside) if hp.set_aside else None)
                for h, hp in previous.hosts.items() if h in all_hosts}
    wanted = set(limited)
    hosts = [h for h in all_hosts if h in wanted and h in progress
             and any(p not in progress[h].completed for p in previous.phases_planned if not phase(p).always)]
    if not hosts:
        raise UsageError("--resume: nothing left to do for these hosts in run " + previous.run_id)
    for h in hosts:
        progress[h].set_aside = None
    return RunPlan(list(previous.phases_planned), hosts, progress, previous.run_id)


@dataclass(frozen=True)
class Decision:
    stop: bool
    reason: str | None = None


def decide(set_aside: Mapping[str, Mapping[str, str]], run_hosts: int, critical: Mapping[str, str],
           max_fail: float) -> Decision:
    """Carry on or stop, given every host set aside so far in this run."""
    crit = [h for h in set_aside if h in critical]
    if crit:
        h = crit[0]
        return Decision(True, f"critical host {h} ({critical[h]}) was set aside in phase "
                              f"{set_aside[h].get('phase')}: {set_aside[h].get('reason')}")
    if run_hosts and len(set_aside) * 100.0 > max_fail * run_hosts:
        pct = 100.0 * len(set_aside) / run_hosts
        return Decision(True, f"{len(set_aside)} of {run_hosts} hosts set aside ({pct:.0f} %), "
                              f"more than --max-fail {max_fail:g} %")
    return Decision(False)


# ---------------------------------------------------------------------------------------------------------
# steps

@dataclass
class StepOutcome:
    """What a Python step reports: per-host failures (absent hosts passed), or not_built/error."""

    status: str = "ok"   # ok, not_built, error, skipped
    failed: dict[str, str] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)
    note: str | None = None


@dataclass
class StepContext:
    phase: str
    hosts: list[str]
    run_dir: Path
    state_dir: Path
    options: RunOptions


PythonStep = Callable[[StepContext], StepOutcome]
AfterConverge = Callable[[StepContext], str | None]


class Reporter(Protocol):
    """What the engine tells the progress view (provisioner.progress implements it)."""

    def phase_started(self, name: str, hosts: Sequence[str]) -> None: ...
    def event(self, phase: str, event: Mapping[str, Any]) -> None: ...
    def phase_finished(self, record: PhaseRecord) -> None: ...
    def run_finished(self, journal: RunJournal) -> None: ...


class NullReporter:
    def phase_started(self, name: str, hosts: Sequence[str]) -> None:
        return None

    def event(self, phase: str, event: Mapping[str, Any]) -> None:
        return None

    def phase_finished(self, record: PhaseRecord) -> None:
        return None

    def run_finished(self, journal: RunJournal) -> None:
        return None


PlaybookRunner = Callable[..., PlaybookResult]


def outcome_from_result(result: PlaybookResult) -> StepOutcome:
    """Per-host failures from a playbook result; a run with no per-host result at all is an error."""
    if result.error is not None:
        return StepOutcome("error", note=f"{result.playbook}: {result.error}")
    return StepOutcome(
        "ok",
        failed={h: s.reason for h, s in result.hosts.items() if s.state == "failed"},
        unreachable={h: s.reason for h, s in result.hosts.items() if s.state == "unreachable"},
    )


@dataclass
class Engine:
    """Runs a plan phase by phase, isolating failed hosts, journaling after each phase."""

    cluster: str
    spec: str
    state_dir: Path
    inventory_dir: Path
    critical: Mapping[str, str]
    options: RunOptions
    playbooks_dir: Path = field(default_factory=content.playbooks_dir)
    runner: PlaybookRunner = run_playbook
    steps: Mapping[str, PythonStep] = field(default_factory=dict)
    reporter: Reporter = field(default_factory=NullReporter)
    run_id: str = field(default_factory=new_run_id)
    after_converge: AfterConverge | None = None   # e.g. fetch the nodes' manifests and report drift
    play_vars: Mapping[str, Any] = field(default_factory=dict)  # from the spec, for play keywords (serial); -e wins

    def execute(self, plan: RunPlan) -> RunJournal:
        """Run the plan. Raises :class:`ContentMissing` before anything runs when a planned playbook is missing."""
        for name in plan.phases:
            book = phase(name).playbook
            if book is not None:
                require_playbook(self.playbooks_dir / book, name)
        journal = RunJournal(self.run_id, self.cluster, self.spec, list(plan.phases), plan.progress,
                             self.options.to_json(), resumed_from=plan.resumed_from, pid=os.getpid(),
                             host=socket.gethostname())
        run_dir = runs_dir(self.state_dir) / self.run_id
        with interrupt.interruptible(), interrupt.on_abort(lambda signum: self._close_interrupted(journal, signum)):
            try:
                private_dir(run_dir)  # artifacts and facts of a check run: node data, the operator's only
                save_journal(self.state_dir, journal)
                self._phases(plan, journal, run_dir)
            except interrupt.Interrupted as exc:
                self._close_interrupted(journal, exc.signum)
                self.reporter.run_finished(journal)
                exc.journal = journal
                raise
            except Exception as exc:  # a secrets file broken mid-run, a step's bug: the journal is not left running
                self._close_failed(journal, exc)
                self.reporter.run_finished(journal)
                raise
        return journal

    def _close_failed(self, journal: RunJournal, exc: Exception) -> None:
        """The phase under way ended on an error (its hosts complete nothing); the journal is closed as failed."""
        what = str(exc) if isinstance(exc, ProvisionerError) else f"{type(exc).__name__}: {exc}"
        why = f"the run ended on an error: {what}"
        if journal.phases and journal.phases[-1].status == "pending":
            rec = journal.phases[-1]
            rec.status, rec.ended, rec.note = "error", utcnow(), why
        journal.status, journal.stop_reason, journal.ended = "failed", why, utcnow()
        with contextlib.suppress(OSError):  # the state dir itself may be what failed: the first error is the one
            save_journal(self.state_dir, journal)

    def _close_interrupted(self, journal: RunJournal, signum: int) -> None:
        """The phase under way is interrupted (its hosts complete nothing); the journal is closed, not running."""
        why = f"interrupted by {interrupt.Interrupted(signum).signame}"
        if journal.phases and journal.phases[-1].status == "pending":
            rec = journal.phases[-1]
            rec.status, rec.ended, rec.note = "interrupted", utcnow(), why
        journal.status, journal.stop_reason, journal.ended = "interrupted", why, utcnow()
        save_journal(self.state_dir, journal)

    def _phases(self, plan: RunPlan, journal: RunJournal, run_dir: Path) -> None:
        active = list(plan.hosts)
        set_aside: dict[str, dict[str, str]] = {}
        last_converge = next((n for n in reversed(plan.phases) if phase(n).playbook), None)
        for name in plan.phases:
            ph = phase(name)
            targets = [h for h in active if ph.always or name not in journal.hosts[h].completed]
            rec = PhaseRecord(name, started=utcnow(), hosts=targets)
            journal.phases.append(rec)
            if not targets:
                rec.status, rec.ended, rec.note = "skipped", utcnow(), "every host has completed it"
                continue
            self.reporter.phase_started(name, targets)
            save_journal(self.state_dir, journal)  # a run killed now shows the phase it was in
            outcome = self._run_phase(ph, targets, run_dir, rec)
            rec.ended = utcnow()
            if outcome.status == "skipped":
                rec.status, rec.note = "skipped", outcome.note
                self.reporter.phase_finished(rec)
                save_journal(self.state_dir, journal)
                continue
            if outcome.status in ("not_built", "error"):
                rec.status, rec.note = outcome.status, outcome.note
                self.reporter.phase_finished(rec)
                save_journal(self.state_dir, journal)
                if outcome.status == "error":
                    journal.stop_reason = f"phase {name} could not run: {outcome.note}"
                    break
                continue
            self._apply(name, targets, outcome, rec, journal, set_aside)
            active = [h for h in active if h not in set_aside]
            if name == last_converge:
                self._after_converge(rec, active, run_dir)
            self.reporter.phase_finished(rec)
            save_journal(self.state_dir, journal)
            decision = decide(set_aside, len(plan.hosts), self.critical, self.options.max_fail)
            if decision.stop:
                journal.stop_reason = decision.reason
                break
            if not active:
                journal.stop_reason = "no host left to continue with"
                break
        journal.ended = utcnow()
        journal.status = final_status(journal)
        save_journal(self.state_dir, journal)
        self.reporter.run_finished(journal)

    def _apply(self, name: str, targets: list[str], outcome: StepOutcome, rec: PhaseRecord, journal: RunJournal,
               set_aside: dict[str, dict[str, str]]) -> None:
        rec.unreachable = {h: r for h, r in outcome.unreachable.items() if h in targets}
        rec.failed = {h: r for h, r in outcome.failed.items() if h in targets and h not in rec.unreachable}
        rec.ok = [h for h in targets if h not in rec.failed and h not in rec.unreachable]
        rec.status = "partial" if (rec.failed or rec.unreachable) else "ok"
        rec.note = outcome.note or rec.note  # a step's verdict (verify: PASS/FAIL and the report dir) is journaled
        for state, bad in (("failed", rec.failed), ("unreachable", rec.unreachable)):
            for h, reason in bad.items():
                entry = {"phase": name, "state": state, "reason": reason}
                set_aside[h] = entry
                journal.hosts[h].set_aside = entry
        if not self.options.check:  # a dry run completes nothing
            for h in rec.ok:
                if name not in journal.hosts[h].completed:
                    journal.hosts[h].completed.append(name)

    def _after_converge(self, rec: PhaseRecord, hosts: list[str], run_dir: Path) -> None:
        """After the last converge phase: the hook (manifest fetch + drift) notes its result on that phase.

        Skipped in check mode (no manifest is written then); its failure never fails the run."""
        if self.after_converge is None or self.options.check or not hosts:
            return
        try:
            note = self.after_converge(StepContext(rec.name, list(hosts), run_dir, self.state_dir, self.options))
        except ProvisionerError as exc:
            note = f"drift check could not run: {exc}"
        if note:
            rec.note = f"{rec.note}; {note}" if rec.note else note

    def _run_phase(self, ph: Phase, targets: list[str], run_dir: Path, rec: PhaseRecord) -> StepOutcome:
        if ph.playbook is None:
            if self.options.check and ph.name not in CHECK_MODE_STEPS:
                return StepOutcome("skipped", note="--check: nothing is measured or recorded")
            step = self.steps.get(ph.name)
            if step is None:
                return StepOutcome("not_built", note=f"the {ph.name} step is not built yet")
            return step(StepContext(ph.name, targets, run_dir, self.state_dir, self.options))
        playbook = self.playbooks_dir / ph.playbook
        try:
            require_playbook(playbook, ph.name)  # checked before the run; gone since: the run stops here
        except ContentMissing as exc:
            return StepOutcome("error", note=str(exc))
        try:
            result = self.runner(
                playbook, self.inventory_dir, private_data_dir=run_dir / ph.name, limit=targets,
                tags=self.options.tags or None, check=self.options.check, diff=self.options.diff,
                forks=self.options.forks, event_handler=lambda ev: self.reporter.event(ph.name, ev),
                extravars={**self.play_vars, **self.options.extravars} or None,
                secret_files=self.options.secret_files,
                vault_password_file=self.options.vault_password_file,
                # a check run keeps even the fact cache in its own directory
                state_dir=run_dir if self.options.check else self.state_dir, ident=ph.name)
        except RunnerError as exc:
            return StepOutcome("error", note=str(exc))
        rec.artifact_dir = str(result.artifact_dir) if result.artifact_dir else None
        return outcome_from_result(result)


def final_status(journal: RunJournal) -> str:
    """passed only when every planned phase ran and every host came through; never with a phase not built."""
    statuses = {p.status for p in journal.phases}
    if journal.stop_reason:
        return "stopped"
    if journal.set_aside:
        return "partial"
    if "not_built" in statuses:
        return "incomplete"
    return "passed"


def retry_command(journal: RunJournal, spec: str | None = None) -> str | None:
    """The exact command that picks up the set-aside hosts, or None when none were set aside.

    It must paste into a shell as is: every word is quoted where needed (a hostlist's brackets are a glob to
    bash and an error to zsh), and the options the resumed run needs to find the journal and behave like
    this run are carried over (state dir, overlay, max-fail, forks, tags, secrets files)."""
    hosts = [h for h in journal.hosts if journal.hosts[h].set_aside]
    if not hosts:
        return None
    opts = journal.options
    parts = ["provision", spec or journal.spec, "--resume", "--limit", compress(hosts)]
    for flag, key in (("--overlay", "overlay"), ("--out", "out"), ("--forks", "forks"),
                      ("--vault-password-file", "vault_password_file")):
        if opts.get(key) is not None:
            parts += [flag, str(opts[key])]
    if opts.get("max_fail") is not None and float(opts["max_fail"]) != DEFAULT_MAX_FAIL:
        parts += ["--max-fail", f"{float(opts['max_fail']):g}"]
    if opts.get("tags"):
        parts += ["--tags", ",".join(opts["tags"])]
    for secret_file in opts.get("secret_files") or []:
        parts += ["--secrets", str(secret_file)]
    return " ".join(shlex.quote(p) for p in parts)


def one_line(text: object) -> str:
    """``text`` (a task's or a node's words) as one line safe to print: :func:`provisioner.safetext.printable`."""
    return printable(text)


def phase_line(rec: PhaseRecord) -> str:
    """One phase's status as a person reads it, live and in the summary alike: ``fabric: partial (3 ok, 1 failed,
    0 unreachable; <note>)``."""
    parts = []
    if rec.failed or rec.unreachable:
        parts.append(f"{len(rec.ok)} ok, {len(rec.failed)} failed, {len(rec.unreachable)} unreachable")
    if rec.note:
        parts.append(one_line(rec.note))
    return f"{rec.name}: {rec.status.replace('_', ' ')}" + (f" ({'; '.join(parts)})" if parts else "")


def summary_lines(journal: RunJournal, *, printed: Collection[str] = ()) -> list[str]:
    """The end-of-run summary for a person: per phase (those not in ``printed``, the phase lines the live view
    already printed), set-aside hosts with reasons, how to retry."""
    lines = [f"run {journal.run_id}: {journal.status}"]
    lines += [f"  {phase_line(rec)}" for rec in journal.phases if rec.name not in printed]
    aside = journal.set_aside
    if aside:
        lines.append(f"set aside ({len(aside)}):")
        # one line per host: ssh and module messages carry \r\n, which would split a host's reason over lines
        lines.extend(f"  {h}: {sa['state']} in {sa['phase']}: {one_line(sa['reason'])}" for h, sa in aside.items())
    if journal.stop_reason:
        lines.append(f"stopped: {journal.stop_reason}")
    cmd = retry_command(journal)
    if cmd:
        lines.append(f"retry them: {cmd}")
    return lines


# ---------------------------------------------------------------------------------------------------------
# the whole run from a spec

def load_run_spec(spec: Path, options: RunOptions) -> tuple[Cluster, list[Diagnostic]]:
    """The spec of a run (and its overlay), loaded once for the whole run: raises SpecInvalid. A signal while
    loading is a clean exit too, not a kill."""
    from provisioner.spec import load_cluster

    with interrupt.interruptible():
        return load_cluster(spec, Path(options.overlay) if options.overlay else None)


def provision_run(spec: Path, options: RunOptions, *, state_dir: Path | None = None,
                  runner: PlaybookRunner = run_playbook, steps: Mapping[str, PythonStep] | None = None,
                  reporter: Reporter | None = None, playbooks_dir: Path | None = None,
                  after_converge: AfterConverge | None = None,
                  loaded: tuple[Cluster, list[Diagnostic]] | None = None) -> RunJournal:
    """`provision cluster.yaml`: load the spec (raises SpecInvalid), plan (fresh or --resume), run the phases.

    `steps` supplies the Python phases beyond validate/render (verify, report); missing ones are not built.
    `after_converge` runs once after the last converge phase (the CLI passes the manifest/drift check).
    `loaded` is the spec already loaded by :func:`load_run_spec` (the CLI's steps use that same model).
    A signal ends it with :class:`provisioner.interrupt.Interrupted` (its `journal` closed as interrupted).
    """
    with interrupt.interruptible():  # SIGTERM while loading or waiting is a clean exit too, not a kill
        cluster, warnings = loaded if loaded is not None else load_run_spec(spec, options)
        return _provision_run(spec, cluster, warnings, options, state_dir, runner, steps, reporter, playbooks_dir,
                              after_converge)


def _provision_run(spec: Path, cluster: Cluster, warnings: list[Diagnostic], options: RunOptions,
                   state_dir: Path | None, runner: PlaybookRunner, steps: Mapping[str, PythonStep] | None,
                   reporter: Reporter | None, playbooks_dir: Path | None,
                   after_converge: AfterConverge | None) -> RunJournal:
    from provisioner.render import render_inventory
    from provisioner.render.model import build_inventory, play_vars
    from provisioner.slurm.membership import run_vars as slurm_run_vars

    if state_dir is not None and options.out is None:
        options = replace(options, out=str(state_dir))
    sdir = state_dir_for(cluster.name, state_dir)
    ansible_state_dir(sdir)  # refused before anything is locked, recorded or rendered there
    run_id = new_run_id()
    groups = build_inventory(cluster).groups
    with run_lock(sdir, run_id=run_id, command="provision up" + (" --check" if options.check else "")):
        if not options.check:  # a check run changes nothing, not even an old journal
            for dead in close_dead_runs(sdir, found_by=run_id):
                interrupt.kill_run_processes(runs_dir(sdir) / dead)  # its ansible-playbook outlived it
        previous = resumable_run(sdir) if options.resume else None
        plan = plan_run([n.name for n in cluster.nodes], options, previous, groups)
        # a check run renders into its own directory: the live inventory stays what the last real run used
        inventory_base = runs_dir(sdir) / run_id if options.check else sdir

        def validate_step(ctx: StepContext) -> StepOutcome:
            return StepOutcome(note=f"{len(cluster.nodes)} nodes, {len(warnings)} warning(s)")

        def render_step(ctx: StepContext) -> StepOutcome:
            res = render_inventory(cluster, inventory_base)
            return StepOutcome(note=f"{res.out_dir}: {len(res.written) + len(res.removed)} file(s) changed")

        all_steps: dict[str, PythonStep] = {"validate": validate_step, "render": render_step, **(steps or {})}
        engine = Engine(cluster.name, str(spec), sdir, inventory_base / "inventory",
                        critical_hosts({n.name: n.roles for n in cluster.nodes}), options,
                        playbooks_dir=playbooks_dir or content.playbooks_dir(), runner=runner, steps=all_steps,
                        reporter=reporter or NullReporter(), run_id=run_id, after_converge=after_converge,
                        play_vars={**play_vars(cluster), **slurm_run_vars(cluster, sdir)})
        return engine.execute(plan)
