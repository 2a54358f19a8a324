"""The `provision` command line (typer). Thin: parses arguments, calls the library, maps errors to exit codes.

Exit codes: 0 success, 1 the spec or the fabric has problems (findings), 2 could not run (usage, I/O, unreachable);
128 + the signal when a run is interrupted (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
`provision cluster.yaml` is the whole bring-up: the same as `provision up cluster.yaml`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from provisioner import __version__
from provisioner.errors import ProvisionerError, SpecInvalid
from provisioner.interrupt import Interrupted
from provisioner.spec import Diagnostic, load_cluster, load_spec

EPILOG = """\b
Examples:
  provision cluster.yaml                  bring the whole cluster up and verify it
  provision validate cluster.yaml         check the spec, print every problem with file:line:col
  provision render cluster.yaml --diff    write the Ansible inventory, show what changed
  provision lab up examples/lab/cluster.yaml   start the simulated lab cluster
"""

app = typer.Typer(
    name="provision", help="Racked GPU servers to a verified InfiniBand fabric from one file.",
    epilog=EPILOG, no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# Plain text only: diagnostics carry `file:100:3:`, which rich's emoji codes would turn into a symbol, and
# spec values or host output could carry [markup]. Nothing printed here is ever interpreted.
out = Console(highlight=False, soft_wrap=True, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)

SpecArg = Annotated[Path, typer.Argument(help="The cluster spec (cluster.yaml).", show_default=False)]
OverlayOpt = Annotated[Path | None, typer.Option("--overlay", help="A YAML overlay merged onto the spec "
                                                 "(e.g. the lab's .lab/<cluster>/overlay.yaml).")]


def _state_dir_option(value: Path | None) -> Path | None:
    """--out names a directory (made if missing); a file there is a usage error before anything runs."""
    if value is not None and value.exists() and not value.is_dir():
        raise typer.BadParameter(f"{value}: not a directory")
    return value


LimitOpt = Annotated[str | None, typer.Option("--limit", help="Only these hosts: Ansible patterns over the spec's "
                                              "hosts and groups (compute,!gpu03  rail_0:&leaf_rail0  gpu0*  "
                                              "compute[0:3]) or a hostlist (gpu[01-04],sm1).")]
StateDirOpt = Annotated[Path | None, typer.Option("--out", help="State directory (default .provision/<cluster>).",
                                                  callback=_state_dir_option)]


def _version(value: bool) -> None:
    if value:
        out.print(f"provision {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Racked GPU servers to a verified InfiniBand fabric from one file."""


def _print_diagnostics(diags: list[Diagnostic]) -> None:
    for d in diags:
        (out if d.severity == "error" else err).print(d.format(), markup=False)


@app.command()
def validate(
    spec: SpecArg,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the diagnostics as JSON.")] = False,
    overlay: OverlayOpt = None,
) -> None:
    """Check the spec: schema, references, hostlists and the design rules. Exit 1 on errors."""
    res = load_spec(spec, overlay)
    failed = bool(res.errors) or (strict and bool(res.warnings))
    if as_json:
        out.print_json(json.dumps({"ok": not failed, "diagnostics": [d.to_json() for d in res.diagnostics]}))
    else:
        _print_diagnostics(res.diagnostics)
        n_nodes = len(res.cluster.nodes) if res.cluster else 0
        summary = f"{spec}: {len(res.errors)} error(s), {len(res.warnings)} warning(s)"
        if res.cluster is not None and not res.errors:
            summary += f"; {n_nodes} nodes, {len(res.cluster.switches)} switches"
        err.print(summary, markup=False)
    raise typer.Exit(1 if failed else 0)


@app.command()
def render(
    spec: SpecArg,
    out_dir: StateDirOpt = None,
    diff: Annotated[bool, typer.Option("--diff", help="Show the diff against the previous render.")] = False,
    overlay: OverlayOpt = None,
) -> None:
    """Write the Ansible inventory rendered from the spec (deterministic; re-render is byte-identical)."""
    from provisioner.render import render_inventory

    cluster, warnings = load_cluster(spec, overlay)
    _print_diagnostics(warnings)
    res = render_inventory(cluster, out_dir)
    if diff and res.diff:
        out.print(res.diff, markup=False, end="")
    changed = len(res.written) + len(res.removed)
    err.print(f"inventory: {res.out_dir} ({changed} file(s) changed)" if changed else
              f"inventory: {res.out_dir} (unchanged)", markup=False)


@app.command()
def rules() -> None:
    """List the design rules `validate` applies, with their severity and why."""
    from provisioner.spec.rules import RULES

    for r in RULES:
        out.print(f"{r.id} [{r.severity}]: {r.why}", markup=False)


@app.command("parse")
def parse_cmd(
    tool: Annotated[str, typer.Argument(help="ibstat, ibstatus, perftest, ibdev2netdev, nvidia-smi-topo, nccl-tests, "
                                        "iblinkinfo, ofed_info, lsmod, opensm-conf, sminfo.", show_default=False)],
    file: Annotated[str, typer.Argument(help="The captured output, or - for standard input.")] = "-",
) -> None:
    """Parse a captured tool output and print it as one JSON object (exit 2 if it is not that tool's output)."""
    from provisioner.errors import UsageError
    from provisioner.parsers import PARSERS, parse

    if tool not in PARSERS:
        raise UsageError(f"unknown tool '{tool}'", hint="one of " + ", ".join(sorted(PARSERS)))
    if file == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(file).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(f"{file}: {exc.strerror or exc}") from None
    out.print_json(json.dumps(parse(tool, text), sort_keys=True))


def _verify_steps(spec: Path, overlay: Path | None, out_dir: Path | None) -> dict[str, Any]:
    """The verify and report phases of a run, as Python steps of the run engine."""
    from provisioner.phases import CRITICAL_ROLES, StepContext, StepOutcome
    from provisioner.replace import subset
    from provisioner.state import record_hardware
    from provisioner.verify import verify

    last: dict[str, Any] = {}

    def verify_step(ctx: StepContext) -> StepOutcome:
        cluster, _ = load_cluster(spec, overlay)
        # only the hosts this phase runs on (set-aside ones would cost an SSH timeout per probe and their
        # findings are dropped anyway), plus the SM/NFS server nodes the fabric and storage checks need
        keep = set(ctx.hosts) | {n.name for n in cluster.nodes if set(n.roles) & set(CRITICAL_ROLES)}
        cluster = subset(cluster, [n.name for n in cluster.nodes if n.name in keep])
        run = verify(cluster, state_dir=out_dir, progress=lambda m: err.print(f"[verify] {m}", markup=False))
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
        for f in run.report.findings():
            err.print(f"{f.severity.upper():7s} {f.location()}: {f.message}", markup=False)
        return StepOutcome(note=f"reports: {run.directory}")

    return {"verify": verify_step, "report": report_step}


@app.command("up")
def up(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    out_dir: StateDirOpt = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only these phases (repeat or comma-separate): "
                                                   "preflight, repos, gpu_stack, ofed, fabric, storage, verify, "
                                                   "report.")] = None,
    from_phase: Annotated[str | None, typer.Option("--from", help="Start at this phase and run the rest.")] = None,
    limit: LimitOpt = None,
    check: Annotated[bool, typer.Option("--check", help="Ansible check mode: report what would change.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file changes (with --check: what would change).")]
    = False,
    tags: Annotated[list[str] | None, typer.Option("--tags", help="Only tasks with these Ansible tags.")] = None,
    forks: Annotated[int | None, typer.Option("--forks", min=1, help="Hosts worked on at once (default 25).")]
    = None,
    max_fail: Annotated[float, typer.Option("--max-fail", min=0, max=100, help="Stop when more than this percent "
                                            "of the hosts have been set aside.")] = 10.0,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the last run: each unfinished host from the "
                                         "first phase it has not completed.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Stream one JSON object per event on stdout.")] = False,
    secrets: Annotated[list[Path] | None, typer.Option("--secrets", help="A YAML vars file of secrets (passed as "
                                                       "-e @file; scrubbed from every artifact). Repeatable.")]
    = None,
    vault_password_file: Annotated[Path | None, typer.Option("--vault-password-file",
                                                             help="For ansible-vault encrypted secrets files.")]
    = None,
) -> None:
    """The whole bring-up (what `provision cluster.yaml` runs): validate, render, converge, verify, report.

    Exit 0 passed, 1 hosts set aside or the run stopped, 2 incomplete or could not run; 130/143/129 when
    interrupted by Ctrl-C/SIGTERM/SIGHUP (the phase is recorded as interrupted; a second Ctrl-C exits at once).
    """
    from provisioner.phases import RunOptions, provision_run, summary_lines
    from provisioner.progress import JsonReporter, LiveReporter

    opts = RunOptions(only=[p for item in only or [] for p in item.split(",") if p], from_phase=from_phase,
                      limit=limit, check=check, diff=diff,
                      tags=[t for item in tags or [] for t in item.split(",") if t],
                      forks=forks, max_fail=max_fail, resume=resume, overlay=str(overlay) if overlay else None,
                      secret_files=list(secrets or []), vault_password_file=vault_password_file)
    steps = _verify_steps(spec, overlay, out_dir)
    hook = _drift_hook(spec, overlay)
    try:
        if as_json:
            journal = provision_run(spec, opts, state_dir=out_dir, steps=steps, reporter=JsonReporter(sys.stdout),
                                    after_converge=hook)
        else:
            with LiveReporter(err) as rep:
                journal = provision_run(spec, opts, state_dir=out_dir, steps=steps, reporter=rep,
                                        after_converge=hook)
    except Interrupted as exc:
        if exc.journal is not None and not as_json:
            for line in summary_lines(exc.journal):
                err.print(line, markup=False)
        err.print(f"provision: {exc}; the journal is closed: `--resume` continues", markup=False)
        raise typer.Exit(exc.exit_code) from None
    if not as_json:
        for line in summary_lines(journal):
            err.print(line, markup=False)
        _print_run_drift(spec, overlay, out_dir, journal.run_id)
    raise typer.Exit({"passed": 0, "partial": 1, "stopped": 1}.get(journal.status, 2))


def _drift_hook(spec: Path, overlay: Path | None) -> Any:
    """The run engine's after-converge hook: fetch every converged node's manifest, compare, store."""
    from provisioner.drift import check_cluster
    from provisioner.phases import StepContext

    def hook(ctx: StepContext) -> str:
        cluster, _ = load_cluster(spec, overlay)
        return "drift: " + check_cluster(cluster, ctx.state_dir, nodes=ctx.hosts, run_id=ctx.run_dir.name).note()

    return hook


def _print_run_drift(spec: Path, overlay: Path | None, out_dir: Path | None, run_id: str) -> None:
    """The drift findings of this run (written by the hook), below the run summary."""
    from provisioner.drift import DriftReport, summary_lines

    cluster, _ = load_cluster(spec, overlay)
    path = (out_dir or Path(".provision") / cluster.name) / "runs" / run_id / "drift.json"
    if path.is_file():
        for line in summary_lines(DriftReport.from_json(json.loads(path.read_text(encoding="utf-8")))):
            err.print(line, markup=False)


def _print_latest_drift(state_dir: Path) -> None:
    from provisioner.drift import load_latest, summary_lines

    report = load_latest(state_dir)
    if report is not None:
        for line in summary_lines(report):
            out.print(line, markup=False)


@app.command("drift")
def drift_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    limit: LimitOpt = None,
    out_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the drift report as JSON.")] = False,
) -> None:
    """Read every node's manifest (/var/lib/provisioner/manifest.json) over SSH and report drift: versions off
    the spec's pins (errors) and nodes that differ from their peers (warnings, the majority value named).

    Exit 0 no drift, 1 drift or nodes without a manifest, 2 could not run.
    """
    from provisioner.drift import check_cluster, summary_lines
    from provisioner.phases import expand_limit
    from provisioner.render.model import build_inventory

    cluster, _ = load_cluster(spec, overlay)
    nodes = expand_limit(limit, [n.name for n in cluster.nodes], build_inventory(cluster).groups)
    report = check_cluster(cluster, out_dir or Path(".provision") / cluster.name, nodes=nodes)
    if as_json:
        out.print_json(json.dumps(report.to_json()))
    else:
        for line in summary_lines(report):
            out.print(line, markup=False)
    raise typer.Exit(1 if report.findings or report.missing else 0)


@app.command("status")
def status_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    out_dir: StateDirOpt = None,
    last: Annotated[int, typer.Option("--last", min=1, help="How many runs to show.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """The last runs of this cluster: status, phases, set-aside hosts and why."""
    from dataclasses import asdict

    from rich.table import Table

    from provisioner.state import status_rows

    cluster, _ = load_cluster(spec, overlay)
    rows = status_rows(out_dir or Path(".provision") / cluster.name, last=last)
    if as_json:
        out.print_json(json.dumps([asdict(r) for r in rows]))
        return
    table = Table("run", "started", "status", "phases", "hosts", "set aside")
    for r in rows:
        table.add_row(r.run_id, r.started, r.status + (f" ({r.stop_reason})" if r.stop_reason else ""), r.phases,
                      str(r.hosts), r.set_aside or "-")
    out.print(table)
    _print_latest_drift(out_dir or Path(".provision") / cluster.name)


@app.command("verify")
def verify_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    only: Annotated[str | None, typer.Option("--only", help="Comma list of checks: links, versions, bandwidth, "
                                             "gpudirect, nccl, cabling, storage (default: the spec's "
                                             "verify.tests).")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="Bandwidth mode quick|full (default: the spec's).")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print report.json to standard output.")] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write JUnit XML here.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Also write the HTML report here.")] = None,
    out_dir: StateDirOpt = None,
) -> None:
    """Prove the fabric against the spec: links, versions, bandwidth per rail, GPUDirect, NCCL, cabling.

    Exit 0 pass, 1 findings, 2 could not run. Reports go to <state>/verify/<time>/ (JSON, JUnit XML, HTML).
    """
    from provisioner.errors import UsageError
    from provisioner.report import to_html, to_json, to_junit
    from provisioner.verify import verify

    if mode not in (None, "quick", "full"):
        raise UsageError(f"--mode {mode}: use quick or full")
    from provisioner.state import run_lock

    cluster, warnings = load_cluster(spec, overlay)
    _print_diagnostics(warnings)
    tests = [t.strip() for t in only.split(",") if t.strip()] if only else None
    with run_lock(out_dir or Path(".provision") / cluster.name, command="provision verify"):  # not during a run
        run = verify(cluster, tests=tests, mode=mode, state_dir=out_dir,
                     progress=(lambda m: None) if as_json else (lambda m: err.print(f"[verify] {m}", markup=False)))
    if junit:
        junit.write_text(to_junit(run.report), encoding="utf-8")
    if html:
        html.write_text(to_html(run.report), encoding="utf-8")
    if as_json:
        out.print(to_json(run.report), markup=False, end="", highlight=False)
    else:
        for f in run.report.findings():
            out.print(f"{f.severity.upper():7s} {f.location()}: {f.message}", markup=False)
        out.print(f"{run.report.verdict.label}: {run.directory}", markup=False)
    raise typer.Exit(run.exit_code)


@app.command("replace-node")
def replace_node_cmd(
    spec: SpecArg,
    node: Annotated[str, typer.Argument(help="The node whose board, HCA or disk was swapped and reinstalled.",
                                        show_default=False)],
    overlay: OverlayOpt = None,
    accept_new_host_key: Annotated[bool, typer.Option("--accept-new-host-key", help="Trust the new SSH host key "
                                                      "the node offers (its fingerprint is printed first).")]
    = False,
    host_key_fingerprint: Annotated[str | None, typer.Option("--host-key-fingerprint", help="Trust the new key "
                                                             "only if it has this fingerprint (SHA256:...).")]
    = None,
    peers: Annotated[int, typer.Option("--peers", min=1, help="Healthy peers to measure it against.")] = 2,
    out_dir: StateDirOpt = None,
) -> None:
    """Bring a swapped node back: trust its new host key (explicitly), record the new GUIDs, converge it alone,
    update the SM's partitions, verify it against healthy peers.

    Exit 0 passed, 1 the node was set aside or has findings, 2 could not run (e.g. the host key was refused).
    """
    from provisioner.progress import LiveReporter
    from provisioner.replace import replace_node, summary_lines

    with LiveReporter(err) as rep:
        result = replace_node(spec, node, overlay=overlay, state_dir=out_dir, accept_new_host_key=accept_new_host_key,
                              host_key_fingerprint=host_key_fingerprint, peers=peers, reporter=rep,
                              progress=lambda m: err.print(f"[replace] {m}", markup=False))
    for line in summary_lines(result):
        out.print(line, markup=False)
    raise typer.Exit(result.exit_code)


@app.command("trust-host")
def trust_host_cmd(
    spec: SpecArg,
    nodes: Annotated[str, typer.Argument(help="Nodes: a hostlist (gpu[01-04]) or Ansible pattern (compute,!gpu03).",
                                         show_default=False)],
    overlay: OverlayOpt = None,
    fingerprint: Annotated[str | None, typer.Option("--fingerprint", help="The SHA256 fingerprint read on the "
                                                    "node's console (one node only).")] = None,
    fingerprints: Annotated[Path | None, typer.Option("--fingerprints", help="File of '<node> SHA256:...' lines "
                                                      "(a rack at once).")] = None,
    out_dir: StateDirOpt = None,
) -> None:
    """Record new nodes' SSH host keys in the spec's known_hosts, only where the node offers the fingerprint you
    give. Without one it prints what each node offers and records nothing. A node whose recorded key changed is
    a swapped node: use replace-node.

    Exit 0 every node trusted (now or before), 2 anything refused or unreachable.
    """
    from provisioner.errors import UsageError
    from provisioner.phases import expand_limit
    from provisioner.remote import targets_from_cluster
    from provisioner.render.model import build_inventory
    from provisioner.state import record_host_key
    from provisioner.trust import check_fingerprint, parse_fingerprints, trust_hosts

    cluster, _ = load_cluster(spec, overlay)
    chosen = expand_limit(nodes, [n.name for n in cluster.nodes], build_inventory(cluster).groups, what="NODES")
    expected: dict[str, str] = {}
    if fingerprints is not None:
        try:
            text = fingerprints.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{fingerprints}: cannot read ({exc.strerror})") from None
        expected.update(parse_fingerprints(text, str(fingerprints)))
    if fingerprint is not None:
        if len(chosen) != 1:
            raise UsageError("--fingerprint names one node's key; for several nodes use --fingerprints FILE")
        expected[chosen[0]] = check_fingerprint(fingerprint, "--fingerprint")
    results = trust_hosts(targets_from_cluster(cluster), chosen, expected)
    state = out_dir or Path(".provision") / cluster.name
    for r in results:
        if r.status == "trusted" and r.offered:
            record_host_key(state, r.node, old=[], new=r.offered, key_type="ssh")
        out.print(f"{r.node}: {r.status}: {r.offered or '-'}: {r.detail}", markup=False)
    raise typer.Exit(0 if all(r.status in ("trusted", "known") for r in results) else 2)


export_app = typer.Typer(help="Export the expected state for other tools.", no_args_is_help=True)
app.add_typer(export_app, name="export")


@export_app.command("nhc")
def export_nhc_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Directory for one <node>.conf each; standard "
                                                 "output when unset.")] = None,
) -> None:
    """LBNL NHC checks per node from the spec (HCA rates, mounts, GPUs, the SM), for the site's health checks."""
    from provisioner.verify import export_nhc

    cluster, _ = load_cluster(spec, overlay)
    confs = export_nhc(cluster)
    if out_dir is None:
        out.print("".join(confs.values()), markup=False, end="")
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    for node, text in confs.items():
        (out_dir / f"{node}.conf").write_text(text, encoding="utf-8")
    err.print(f"wrote {len(confs)} file(s) under {out_dir}", markup=False)


@app.command("switches")
def switches_cmd(
    spec: SpecArg,
    display_only: Annotated[bool, typer.Option("--display", help="Print the commands for each managed switch; "
                                               "connect to nothing.")] = False,
    do_apply: Annotated[bool, typer.Option("--apply", help="Push the commands over SSH and read the result "
                                           "back; exit 1 when a switch fails or disagrees.")] = False,
    known_hosts: Annotated[Path | None, typer.Option("--known-hosts", help="known_hosts holding the switches' "
                                                     "host keys (default: the spec's ssh.known_hosts).")] = None,
    only: Annotated[list[str] | None, typer.Option("--switch", help="Only this switch (repeatable).")] = None,
    overlay: OverlayOpt = None,
) -> None:
    """Configure the fabric switches: embedded SM on MLNX-OS, RoCE PFC/ECN/DSCP/MTU on NVUE/Cumulus/SONiC."""
    from provisioner.errors import UsageError
    from provisioner.switches import display
    from provisioner.switches.session import apply as apply_switches

    if display_only == do_apply:
        raise UsageError("give exactly one of --display or --apply")
    cluster, _warnings = load_cluster(spec, overlay)
    if display_only:
        out.print(display(cluster), markup=False, end="")
        return
    kh = known_hosts or (spec.parent / cluster.spec.ssh.known_hosts)
    results = apply_switches(cluster, kh, only=set(only) if only else None)
    for r in results:
        (out if r.ok else err).print(r.summary(), markup=False)
    raise typer.Exit(0 if all(r.ok for r in results) else 1)


lab_app = typer.Typer(help="The lab: a simulated GPU/InfiniBand cluster of real containers (needs root).",
                      no_args_is_help=True)
app.add_typer(lab_app, name="lab")


def _log(msg: str) -> None:
    err.print(f"[lab] {msg}", markup=False)


@lab_app.command("up")
def lab_up_cmd(
    spec: SpecArg,
    max_nodes: Annotated[int | None, typer.Option("--nodes", min=1, help="Bring up only the first N nodes "
                                                  "(for small machines).")] = None,
    faults_file: Annotated[Path | None, typer.Option("--faults", help="YAML list of faults ({node, kind, <params>}, "
                                                     "or a file with a faults: list) to inject once the lab is up.",
                                                     dir_okay=False)] = None,
) -> None:
    """Start one systemd container per node of the spec, with simulated GPUs/HCAs, SSH and known_hosts."""
    from provisioner.lab import faults, fromspec
    from provisioner.lab.cluster import cluster_dir, lab_up

    cluster, warnings = load_cluster(spec)
    _print_diagnostics(warnings)
    nodes = fromspec.lab_nodes(cluster)[:max_nodes] if max_nodes else fromspec.lab_nodes(cluster)
    wanted = faults.load_fault_list(faults_file, {n.hostname: {h.device for h in n.hcas} for n in nodes}) \
        if faults_file else []
    info = lab_up(cluster.name, fromspec.lab_nodes(cluster), fromspec.lab_switches(cluster),
                  fromspec.lab_cables(cluster), max_nodes=max_nodes, progress=_log,
                  versions=fromspec.lab_versions(cluster), nfs_exports=fromspec.lab_nfs_exports(cluster))
    root = str(cluster_dir(cluster.name))
    fromspec.write_switch_links(root, fromspec.lab_switch_links(cluster))
    for record in faults.apply_fault_list(root, wanted):
        _log(f"injected {record['kind']} " + " ".join(f"{k}={v}" for k, v in record.items()
                                                      if k not in ("kind", "saved", "set")))
    out.print(f"lab {info.cluster}: {len(info.addresses)} node(s) up; overlay {info.overlay}", markup=False)
    if wanted:
        out.print(f"{len(wanted)} fault(s) injected from {faults_file}", markup=False)
    out.print(f"next: provision {spec} --overlay {info.overlay}", markup=False)


@lab_app.command("down")
def lab_down_cmd(cluster: Annotated[str, typer.Argument(help="Cluster name, or the spec file.")]) -> None:
    """Remove the lab's containers and state (no containers, mounts or state left behind)."""
    from provisioner.lab.cluster import lab_down

    removed = lab_down(_cluster_name(cluster), progress=_log)
    out.print(f"removed {len(removed)} container(s)", markup=False)


@lab_app.command("status")
def lab_status_cmd(
    cluster: Annotated[str, typer.Argument(help="Cluster name, or the spec file.")],
    as_json: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Per node: container state, address and injected faults."""
    from dataclasses import asdict

    from rich.table import Table

    from provisioner.lab.cluster import lab_status

    rows = lab_status(_cluster_name(cluster))
    if as_json:
        out.print_json(json.dumps([asdict(r) for r in rows]))
        return
    table = Table("node", "container", "state", "address", "faults")
    for r in rows:
        table.add_row(r.host, r.container, r.state, r.ip or "-", ", ".join(f["kind"] for f in r.faults) or "-")
    out.print(table)


@lab_app.command("fault")
def lab_fault_cmd(
    cluster: Annotated[str, typer.Argument(help="Cluster name, or the spec file.")],
    node: Annotated[str | None, typer.Argument(help="Node host name.")] = None,
    kind: Annotated[str | None, typer.Argument(help="port_down, port_disabled, degraded_width, degraded_rate, "
                                               "slow_link, flapping, cables_swapped, peermem_missing, gpu_missing, "
                                               "unreachable, sm_killed, hardware_swap.")] = None,
    params: Annotated[list[str] | None, typer.Argument(help="key=value parameters, e.g. device=mlx5_1 "
                                                       "bw_factor=0.5")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Clear this fault (or all faults of the node).")] = False,
    file: Annotated[Path | None, typer.Option("--file", help="Inject every fault of a YAML fault list (checked "
                                              "as a whole first).", dir_okay=False)] = None,
) -> None:
    """Inject a fault into the running lab (takes effect at once), or clear it with --clear."""
    from provisioner.errors import UsageError
    from provisioner.lab import faults
    from provisioner.lab.cluster import cluster_dir

    root = str(cluster_dir(_cluster_name(cluster)))
    if file is not None:
        if node or kind or params or clear:
            raise UsageError("--file takes no node, kind, parameters or --clear")
        records = faults.apply_fault_list(root, faults.load_fault_list(file, faults.lab_devices(root)))
        out.print(f"injected {len(records)} fault(s) from {file}", markup=False)
        return
    if not node or not kind:
        raise UsageError("give a node and a fault kind (or --file FILE)")
    kv: dict[str, Any] = {}
    for item in params or []:
        if "=" not in item:
            raise UsageError(f"parameter '{item}' is not key=value")
        k, v = item.split("=", 1)
        kv[k] = v
    if clear:
        faults.clear(root, node, None if kind == "all" else kind, **kv)
        out.print(f"{node}: cleared {kind}", markup=False)
    else:
        faults.inject(root, node, kind, **faults.check_params(kind, kv))
        out.print(f"{node}: injected {kind}", markup=False)


def _cluster_name(arg: str) -> str:
    """A cluster name given directly or through its spec file."""
    p = Path(arg)
    if arg.endswith((".yaml", ".yml")) and p.is_file():
        return load_cluster(p)[0].name
    return arg


COMMANDS = {"validate", "render", "rules", "up", "parse", "lab", "verify", "status", "replace-node", "switches",
            "export", "drift", "trust-host"}


def main(argv: list[str] | None = None) -> int:
    """Entry point: `provision FILE ...` means `provision up FILE ...`; errors become one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-") and args[0] not in COMMANDS:
        args.insert(0, "up")
    try:
        # without standalone mode click returns the code of a typer.Exit instead of raising it
        rc = app(args=args, prog_name="provision", standalone_mode=False)
    except SpecInvalid as exc:
        _print_diagnostics([d for d in exc.diagnostics if isinstance(d, Diagnostic)])
        errors = sum(1 for d in exc.diagnostics if isinstance(d, Diagnostic) and d.severity == "error")
        err.print(f"the spec has {errors} error(s); fix them and run again", markup=False)
        return exc.exit_code
    except ProvisionerError as exc:
        err.print(f"provision: error: {exc}", markup=False)
        return exc.exit_code
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        err.print("provision: aborted", markup=False)
        return 130
    except Interrupted as exc:
        err.print(f"provision: {exc}", markup=False)
        return exc.exit_code
    except OSError as exc:  # a file or directory the command needs cannot be read or written: could not run
        where = f"{exc.filename}: " if exc.filename else ""
        err.print(f"provision: error: {where}{exc.strerror or exc}", markup=False)
        return 2
    except Exception as exc:  # click usage errors and anything unexpected: one line, never a traceback
        format_message = getattr(exc, "format_message", None)
        if callable(format_message):  # click's usage errors (typer may carry its own click)
            err.print(f"provision: {format_message()} (see provision --help)", markup=False)
            return 2
        err.print(f"provision: internal error: {type(exc).__name__}: {exc} "
                  "(please report it with the command you ran)", markup=False)
        return 3
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
