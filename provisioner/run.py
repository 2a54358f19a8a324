"""`provision up` as one library call: the spec loaded once, the run engine (`phases.py`) with its verify and report
phases and the after-converge drift check on that model, the live view or the JSON event stream, the summary.

The verify phase verifies the hosts the phase runs on (plus the SM/NFS server nodes the fabric and storage checks
need) and records their hardware; the report phase prints the findings of that verification. Both are Python
steps of the engine (`StepContext` in, `StepOutcome` out); the drift hook fetches every converged node's manifest
once after the last converge phase.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from provisioner import phases
from provisioner.interrupt import Interrupted
from provisioner.phases import CRITICAL_ROLES, PythonStep, RunOptions, StepContext, StepOutcome
from provisioner.spec import Cluster
from provisioner.state import state_dir_for

Say = Callable[[str], None]


def verify_steps(loaded: Cluster, out_dir: Path | None, *, say: Say, progress: Say) -> dict[str, PythonStep]:
    """The verify and report phases of a run on the run's loaded spec: `say` prints a report line, `progress` a
    verification progress message."""
    from provisioner.report.text import report_lines
    from provisioner.state import record_hardware
    from provisioner.verify import verify

    last: dict[str, Any] = {}

    def verify_step(ctx: StepContext) -> StepOutcome:
        # only the hosts this phase runs on (set-aside ones would cost an SSH timeout per probe and their
        # findings are dropped anyway), plus the SM/NFS server nodes the fabric and storage checks need
        keep = set(ctx.hosts) | {n.name for n in loaded.nodes if set(n.roles) & set(CRITICAL_ROLES)}
        cluster = loaded.subset([n.name for n in loaded.nodes if n.name in keep])
        run = verify(cluster, state_dir=out_dir, progress=progress)
        last["run"] = run
        for node, guids in run.inventory.items():
            if node in ctx.hosts:
                record_hardware(ctx.state_dir, node, guids=dict(guids))
        failed: dict[str, str] = {}
        for f in run.report.findings():
            if f.severity == "error" and f.node in ctx.hosts and f.node not in failed:
                failed[f.node] = f.message
        if run.exit_code == 1 and not failed:
            return StepOutcome(status="error", note="fabric findings not tied to one node; see the report")
        if run.exit_code == 2 and not failed:
            return StepOutcome(status="error", note="verification could not run; see the report")
        return StepOutcome(failed=failed, note=f"{run.report.verdict.label}: {run.directory}")

    def report_step(ctx: StepContext) -> StepOutcome:
        run = last.get("run")
        if run is None:
            return StepOutcome(status="not_built", note="no verification in this run to report on")
        for line in report_lines(run.report):
            say(line)
        return StepOutcome(note=f"reports: {run.directory}")

    return {"verify": verify_step, "report": report_step}


def drift_hook(cluster: Cluster) -> phases.AfterConverge:
    """The run engine's after-converge hook: fetch every converged node's manifest, compare, store."""
    from provisioner.drift import check_cluster

    def hook(ctx: StepContext) -> str:
        return "drift: " + check_cluster(cluster, ctx.state_dir, nodes=ctx.hosts, run_id=ctx.run_dir.name).note()

    return hook


def run_drift_lines(cluster: Cluster, out_dir: Path | None, run_id: str) -> list[str]:
    """The drift findings of this run (written by the hook), for below the run summary."""
    from provisioner.drift import DriftReport, summary_lines

    path = state_dir_for(cluster.name, out_dir) / "runs" / run_id / "drift.json"
    if not path.is_file():
        return []
    return summary_lines(DriftReport.from_json(json.loads(path.read_text(encoding="utf-8"))))


def check_run_files(opts: RunOptions) -> None:
    """The secrets and vault password files, refused before a journal opens (a pipe would hang ansible)."""
    from provisioner.runner import read_secret_file
    from provisioner.userfile import read_user_bytes

    for secrets_file in opts.secret_files:  # a pipe, a huge or broken file is refused before a journal opens
        read_secret_file(secrets_file)
    if opts.vault_password_file is not None:  # ansible-playbook would wait on a pipe for ever
        read_user_bytes(opts.vault_password_file, "a vault password file")


def up(spec: Path, opts: RunOptions, out_dir: Path | None, *, as_json: bool, err: Console, progress: Say) -> int:
    """`provision up` after its options: the run with the live view on `err` or the JSON stream on standard
    output, the summary and this run's drift; the exit code (an interrupted run's own, its summary printed)."""
    from provisioner.progress import JsonReporter, LiveReporter

    def say(line: str) -> None:
        err.print(line, markup=False)

    check_run_files(opts)
    live = LiveReporter(err)  # drawn only without --json; what it printed is left out of the summary
    try:
        loaded = phases.load_run_spec(spec, opts)  # once: the engine, verify and the drift check share the model
        steps = verify_steps(loaded[0], out_dir, say=say, progress=progress)
        hook = drift_hook(loaded[0])
        if as_json:
            journal = phases.provision_run(spec, opts, state_dir=out_dir, steps=steps,
                                           reporter=JsonReporter(sys.stdout), after_converge=hook, loaded=loaded)
        else:
            with live as rep:
                journal = phases.provision_run(spec, opts, state_dir=out_dir, steps=steps, reporter=rep,
                                               after_converge=hook, loaded=loaded)
    except Interrupted as exc:
        if exc.journal is not None and not as_json:
            for line in phases.summary_lines(exc.journal, printed=live.printed):
                say(line)
        say(f"provision: {exc}; the journal is closed: `--resume` continues")
        return exc.exit_code
    if not as_json:
        for line in phases.summary_lines(journal, printed=live.printed):  # each phase line once: live, or here
            say(line)
        for line in run_drift_lines(loaded[0], out_dir, journal.run_id):
            say(line)
    return {"passed": 0, "partial": 1, "stopped": 1}.get(journal.status, 2)
