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
from provisioner.fabric import registry as check_registry
from provisioner.interrupt import Interrupted
from provisioner.safetext import escaped, printable
from provisioner.spec import Diagnostic, load_cluster, load_spec, load_text
from provisioner.state import state_dir_for

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

JsonOutputOpt = Annotated[bool, typer.Option("--json", help="JSON output.")]
LabClusterArg = Annotated[str, typer.Argument(help="Cluster name, or the spec file.")]


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
        summary = f"{escaped(spec)}: {len(res.errors)} error(s), {len(res.warnings)} warning(s)"
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
                                        "iblinkinfo, ibnetdiscover, ibqueryerrors, ofed_info, lsmod, opensm-conf, "
                                        "sminfo, lspci.", show_default=False)],
    file: Annotated[str, typer.Argument(help="The captured output, or - for standard input.")] = "-",
) -> None:
    """Parse a captured tool output and print it as one JSON object (exit 2 if it is not that tool's output)."""
    from provisioner.parsers import parse_capture

    out.print_json(json.dumps(parse_capture(tool, file), sort_keys=True))


@app.command("up")
def up(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    out_dir: StateDirOpt = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only these phases (repeat or comma-separate): "
                                                   "preflight, repos, ofed, gpu_stack, fabric, storage, slurm, verify, "
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
    rolling: Annotated[bool, typer.Option("--rolling", help="Converge a running cluster a batch at a time: drain "
                                          "in Slurm, wait for jobs, converge, verify against peers, resume "
                                          "(see `provision plan`). With --resume: continue a stopped one.")]
    = False,
    batch: Annotated[str | None, typer.Option("--batch", help="With --rolling: nodes per batch, a count or a "
                                              "share (25%); default the spec's reboot.serial.")] = None,
    max_wait: Annotated[float, typer.Option("--max-wait", min=0, help="With --rolling: seconds to wait for a "
                                            "drained batch's jobs to end before stopping.")] = 3600.0,
    peers: Annotated[int, typer.Option("--peers", min=0, help="With --rolling: healthy peers to verify each "
                                       "batch against.")] = 2,
) -> None:
    """The whole bring-up (what `provision cluster.yaml` runs): validate, render, converge, verify, report.

    Exit 0 passed, 1 hosts set aside or the run stopped, 2 incomplete or could not run; 130/143/129 when
    interrupted by Ctrl-C/SIGTERM/SIGHUP (the phase is recorded as interrupted; a second Ctrl-C exits at once).
    """
    if rolling:
        _rolling(spec, overlay, out_dir, batch, max_wait, peers, resume,
                 other=bool(only or from_phase or limit or check or tags or secrets or as_json))
    if batch is not None:
        from provisioner.errors import UsageError

        raise UsageError("--batch goes with --rolling")
    from provisioner import run
    from provisioner.phases import RunOptions

    opts = RunOptions(only=[p for item in only or [] for p in item.split(",") if p], from_phase=from_phase,
                      limit=limit, check=check, diff=diff,
                      tags=[t for item in tags or [] for t in item.split(",") if t],
                      forks=forks, max_fail=max_fail, resume=resume, overlay=str(overlay) if overlay else None,
                      secret_files=list(secrets or []), vault_password_file=vault_password_file)
    raise typer.Exit(run.up(spec, opts, out_dir, as_json=as_json, err=err, progress=_progress("verify")))


def _rolling(spec: Path, overlay: Path | None, out_dir: Path | None, batch: str | None, max_wait: float,
             peers: int, resume: bool, *, other: bool) -> None:
    """`provision cluster.yaml --rolling`: see provisioner.day2.rolling. Ends the command with its exit code."""
    from provisioner.day2.rolling import rolling_run, summary_lines
    from provisioner.errors import UsageError
    from provisioner.progress import LiveReporter

    if other:
        raise UsageError("--rolling plans its own phases and hosts per batch: drop --only/--from/--limit/--check/"
                         "--tags/--secrets/--json")
    with LiveReporter(err) as rep:
        journal = rolling_run(spec, overlay=overlay, state_dir=out_dir, batch=batch, max_wait_s=max_wait,
                              peers=peers, resume=resume, reporter=rep,
                              progress=_progress("rolling"))
    for line in summary_lines(journal):
        err.print(line, markup=False)
    raise typer.Exit(0 if journal.status == "passed" else 1)


@app.command("plan")
def plan_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    out_dir: StateDirOpt = None,
    batch: Annotated[str | None, typer.Option("--batch", help="Nodes per batch, a count or a share (25%); default "
                                              "the spec's reboot.serial.")] = None,
    limit: Annotated[str | None, typer.Option("--limit", help="Only these hosts, hostlist syntax.")] = None,
    cached: Annotated[bool, typer.Option("--cached", help="Use the manifests the last run fetched instead of "
                                         "reading them over SSH.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """What a converge would change on which nodes (from their manifests and the spec), which changes need a
    reboot or an SM/OFED restart, and the batches `--rolling` would use. Touches nothing.

    Exit 0 nothing to change, 1 changes planned, 2 could not run.
    """
    from provisioner.day2.plan import plan_spec, summary_lines, to_json_text

    plan = plan_spec(spec, overlay, state_dir=out_dir, batch=batch, limit=limit, cached=cached)
    if as_json:
        out.print(to_json_text(plan), markup=False)
    else:
        for line in summary_lines(plan):
            out.print(line, markup=False)
    raise typer.Exit(1 if plan.batches else 0)


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
    from provisioner.drift import drift_spec, summary_lines

    report = drift_spec(spec, overlay, limit=limit, state_dir=out_dir)
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
    as_json: JsonOutputOpt = False,
) -> None:
    """The last runs of this cluster: status, phases, set-aside hosts and why."""
    from dataclasses import asdict

    from rich.table import Table

    from provisioner.state import status_rows

    cluster, _ = load_cluster(spec, overlay)
    rows = status_rows(state_dir_for(cluster.name, out_dir), last=last)
    if as_json:
        out.print_json(json.dumps([asdict(r) for r in rows]))
        return
    table = Table("run", "started", "status", "phases", "hosts", "set aside")
    for r in rows:
        table.add_row(r.run_id, r.started, r.status + (f" ({r.stop_reason})" if r.stop_reason else ""), r.phases,
                      str(r.hosts), r.set_aside or "-")
    out.print(table)
    _print_latest_drift(state_dir_for(cluster.name, out_dir))


@app.command("verify", epilog=check_registry.help_epilog())
def verify_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    only: Annotated[str | None, typer.Option("--only", help=check_registry.only_help())] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="Bandwidth mode quick|full (default: the spec's).")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print report.json to standard output.")] = False,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write JUnit XML here.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Also write the HTML report here.")] = None,
    nccl_launcher: Annotated[str, typer.Option(
        "--nccl-launcher", help="How the NCCL check starts: auto (srun for nodes in a Slurm partition, mpirun for "
        "the rest), srun, or mpirun (over SSH, also on nodes Slurm gave to jobs).")] = "auto",
    include_busy: Annotated[bool, typer.Option(
        "--include-busy", help="Also send bandwidth, GPUDirect and NCCL traffic to nodes running Slurm jobs (by "
        "default they are left out and reported as not run, naming the jobs).")] = False,
    out_dir: StateDirOpt = None,
) -> None:
    """Prove the fabric against the spec: the checks below, or those --only names.

    Exit 0 pass, 1 findings, 2 could not run. Reports go to <state>/verify/<time>/ (JSON, JUnit XML, HTML).
    """
    from provisioner.report import to_json
    from provisioner.report.text import verify_lines
    from provisioner.verify import verify_spec

    run = verify_spec(spec, overlay, only=only, mode=mode, state_dir=out_dir, nccl_launcher=nccl_launcher,
                      include_busy=include_busy, junit=junit, html=html,
                      progress=(lambda m: None) if as_json else _progress("verify"), warn=_print_diagnostics)
    if as_json:
        out.print(to_json(run.report), markup=False, end="", highlight=False)
    else:
        for line in verify_lines(run.report, run.directory):
            out.print(line, markup=False)
    raise typer.Exit(run.exit_code)


@app.command("tune")
def tune_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    knobs: Annotated[str | None, typer.Option("--knobs", help="Comma-separated NCCL variables to sweep (default: "
                                              "NCCL_ALGO, NCCL_PROTO, NCCL_IB_QPS_PER_CONNECTION, NCCL_MIN_NCHANNELS, "
                                              "NCCL_NET_GDR_LEVEL).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=2, max=20, help="Runs per setting: the run-to-run "
                                         "spread a setting must beat comes from them.")] = 3,
    nccl_launcher: Annotated[str, typer.Option(
        "--nccl-launcher", help="How each all-reduce starts, as in verify: auto, srun or mpirun.")] = "auto",
    include_busy: Annotated[bool, typer.Option(
        "--include-busy", help="Also run on nodes running Slurm jobs (by default they are left out, named).")]
    = False,
    out_dir: StateDirOpt = None,
) -> None:
    """Measure NCCL settings against NCCL's defaults on the GPU nodes and recommend one only when it beats the
    defaults by more than the run-to-run spread. Changes nothing on the nodes: prints the table and the spec
    snippet (software.nccl_env) for the next converge.

    Exit 0 when the sweep ran (with or without a recommendation), 2 when it could not run.
    """
    from provisioner.fabric import tune
    from provisioner.verify import tune_spec

    run = tune_spec(spec, overlay, knobs=knobs, repeats=repeats, state_dir=out_dir, nccl_launcher=nccl_launcher,
                    include_busy=include_busy, progress=lambda m: err.print(f"[tune] {m}", markup=False),
                    warn=_print_diagnostics)
    out.print(tune.report_text(run.settings, run.notes, run.error), markup=False, end="", highlight=False)
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
    from provisioner.day2.replace import replace_node, summary_lines
    from provisioner.progress import LiveReporter

    with LiveReporter(err) as rep:
        result = replace_node(spec, node, overlay=overlay, state_dir=out_dir, accept_new_host_key=accept_new_host_key,
                              host_key_fingerprint=host_key_fingerprint, peers=peers, reporter=rep,
                              progress=_progress("replace"))
    for line in summary_lines(result):
        out.print(line, markup=False)
    raise typer.Exit(result.exit_code)


@app.command("failover")
def failover_cmd(
    spec: SpecArg,
    node: Annotated[str, typer.Argument(help="The failed partition node.", show_default=False)],
    overlay: OverlayOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (the drain reason in Slurm).")] = "failed (operator)",
    peers: Annotated[int, typer.Option("--peers", min=0, help="Healthy peers to verify the spare against.")] = 2,
    no_persist: Annotated[bool, typer.Option("--no-persist", help="Only the live Slurm change and the record; "
                                             "leave slurm.conf to the next run.")] = False,
    out_dir: StateDirOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result (with its timeline) as JSON.")] = False,
) -> None:
    """Replace a failed node by a verified spare: drain it in Slurm, verify a spare of its profile against healthy
    peers, put the spare into its partitions, record the swap, persist slurm.conf.

    Exit 0 a spare took its place, 1 no spare passed (the node stays drained), 2 could not run; 130/143/129 when
    interrupted by Ctrl-C/SIGTERM/SIGHUP (what it did is recorded as interrupted under <state>/failover/).
    """
    from provisioner.day2.failover import failover_spec, summary_lines
    from provisioner.progress import LiveReporter

    with LiveReporter(err) as rep:
        result = failover_spec(spec, node, reason, overlay=overlay, state_dir=out_dir, peers=peers,
                               persist=not no_persist, reporter=rep, progress=_progress("failover"))
    if as_json:
        out.print_json(json.dumps(result.to_json()))
    else:
        for line in summary_lines(result):
            out.print(line, markup=False)
    raise typer.Exit(result.exit_code)


@app.command("watch")
def watch_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    interval: Annotated[float | None, typer.Option("--interval", min=1, help="Seconds between rounds (default: "
                                                   "the spec's spares.watch_interval_s).")] = None,
    once: Annotated[bool, typer.Option("--once", help="One round, then exit (for a systemd timer).")] = False,
    peers: Annotated[int, typer.Option("--peers", min=0, help="Healthy peers to verify a spare against.")] = 2,
    out_dir: StateDirOpt = None,
) -> None:
    """Health checks on every partition node (GPU count, Xid/ECC errors, ports Active at rate, nvidia_peermem)
    every interval; a node that fails them twice in a row is failed over to a spare.

    Exit 0 (stopped by Ctrl-C/SIGTERM/SIGHUP between failovers, or --once with nothing failed), 1 --once and a
    failover happened or failed; 130/143/129 when the signal interrupted a failover (recorded as interrupted under
    <state>/failover/, the node stays drained).
    """
    from provisioner.day2.watch import watch_spec

    def log(m: str) -> None:
        err.print(f"[watch {datetime_now()}] {m}", markup=False)

    raise typer.Exit(watch_spec(spec, overlay=overlay, state_dir=out_dir, interval=interval, once=once, peers=peers,
                                progress=log))


def datetime_now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%H:%M:%S")


def _print_trusted(r: Any) -> None:
    out.print(printable(f"{r.node}: {r.status}: {r.offered or '-'}: {r.detail}"), markup=False)


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
    from provisioner.trust import trust_spec

    results = trust_spec(spec, nodes, overlay=overlay, fingerprint=fingerprint, fingerprints=fingerprints,
                         state_dir=out_dir, each=_print_trusted)
    raise typer.Exit(0 if all(r.status in ("trusted", "known") for r in results) else 2)


@app.command("discover")
def discover_cmd(
    hosts: Annotated[str, typer.Argument(help="The nodes to read, hostlist syntax: gpu[001-128],sm[1-2].",
                                         show_default=False)],
    address: Annotated[str | None, typer.Option("--address", help="Their SSH addresses, a hostlist in step with "
                                                "the hosts (default: the host itself or what it resolves to here; "
                                                "with --jump the bastion resolves it).")]
    = None,
    user: Annotated[str, typer.Option("--user", help="SSH login user (root or a sudoer).")] = "root",
    known_hosts: Annotated[Path, typer.Option("--known-hosts", help="known_hosts with the nodes' verified keys; "
                                              "a node whose key is not there is not read (--fingerprints can "
                                              "add it).")] = Path("known_hosts"),
    key: Annotated[Path | None, typer.Option("--key", help="Private key file; the SSH agent if unset.")] = None,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="SSH port.")] = 22,
    name: Annotated[str, typer.Option("--name", help="Cluster name for the draft.")] = "cluster",
    out_file: Annotated[Path | None, typer.Option("--out", help="Write the draft spec here; standard output when "
                                                  "unset.", dir_okay=False)] = None,
    fingerprint: Annotated[str | None, typer.Option("--fingerprint", help="The SHA256 fingerprint read on the "
                                                    "node's console (one host only): its key is recorded in "
                                                    "--known-hosts if the node offers it.")] = None,
    fingerprints: Annotated[Path | None, typer.Option("--fingerprints", help="File of '<node> SHA256:...' lines "
                                                      "(as trust-host reads): each host's key is recorded in "
                                                      "--known-hosts only if it matches; any refusal stops the "
                                                      "run before a node is probed.")] = None,
    jump: Annotated[str | None, typer.Option("--jump", help="Bastion the nodes are reached through: "
                                             "user@host[:port] or {host: ..., user: ..., port: ...} (as ssh.jump); "
                                             "its key must be in --known-hosts. Written to the draft.")] = None,
) -> None:
    """Draft a spec from a running cluster: profiles from nvidia-smi and ibstat, nodes folded into hostlists, the
    switches and the cabling from ibnetdiscover, installed versions as comments. What cannot be discovered is
    marked TODO. The draft is validated.

    Exit 0 the draft validates, 1 it has errors (written all the same), 2 could not run (a host key refused
    included).
    """
    from provisioner.discover import discover_hosts

    draft = discover_hosts(hosts, address=address, user=user, known_hosts=known_hosts, key=key, port=port,
                           name=name, fingerprint=fingerprint, fingerprints=fingerprints, jump=jump,
                           progress=_progress("discover"))
    res = load_text(draft.text, str(out_file or "<draft>"))
    _write_or_print(draft.text, out_file)
    for line in draft.skipped:  # what nodes reported, shown safe (safetext)
        err.print(f"not read: {printable(line)}", markup=False)
    for line in draft.todo:
        err.print(f"TODO: {printable(line)}", markup=False)
    _print_diagnostics(res.diagnostics)
    err.print(f"draft: {draft.nodes} node(s), {draft.switches} switch(es), {draft.cables} cable(s); "
              f"{len(res.errors)} error(s), {len(res.warnings)} warning(s)", markup=False)
    raise typer.Exit(1 if res.errors else 0)


@app.command("collection-path")
def collection_path() -> None:
    """Print the directory to add to Ansible's collections_path for the collection provisioner.cluster (roles,
    playbooks and the inventory plugin provisioner.cluster.spec), e.g.
    export ANSIBLE_COLLECTIONS_PATH="$(provision collection-path)"."""
    from provisioner.collection import collections_root

    out.print(str(collections_root()), markup=False)


export_app = typer.Typer(help="Export the expected state for other tools.", no_args_is_help=True)
app.add_typer(export_app, name="export")


@export_app.command("nhc")
def export_nhc_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="Write nhc.conf here; standard output when unset.",
                                                  dir_okay=False)] = None,
) -> None:
    """One LBNL NHC nhc.conf from the spec (HCA rates, mounts, GPUs, the SM daemon), each check once for the
    nodes that share it, behind an NHC node range ({gpu[01-64]}). Nothing in it starts or restarts a service."""
    from provisioner.fabric.nhc import export_nhc

    cluster, _ = load_cluster(spec, overlay)
    _write_or_print(export_nhc(cluster), out_file)


@export_app.command("slurm")
def export_slurm_cmd(
    spec: SpecArg,
    overlay: OverlayOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Write topology.conf and gres.conf into this "
                                                 "directory; standard output when unset.", file_okay=False)] = None,
    autodetect: Annotated[bool, typer.Option("--autodetect", help="gres.conf says AutoDetect=nvml instead of "
                                             "listing /dev/nvidia* per node.")] = False,
) -> None:
    """Slurm's topology.conf (topology/tree: the leaves with their nodes, the switches above them) and gres.conf
    (the GPUs per node) from the spec."""
    from provisioner.export.slurm import export_gres, export_topology

    cluster, _ = load_cluster(spec, overlay)
    files = {"topology.conf": export_topology(cluster), "gres.conf": export_gres(cluster, autodetect=autodetect)}
    for name, text in files.items():
        if out_dir is None:
            out.print(f"# ==> {name} <==\n{text}", markup=False)
        else:
            _write_or_print(text, out_dir / name)


def _progress(tag: str) -> Any:
    """A progress callback printing ``[tag] message`` on stderr, the message shown safe: it quotes nodes."""
    return lambda m: err.print(f"[{tag}] {printable(m)}", markup=False)


def _write_or_print(text: str, path: Path | None) -> None:
    if path is None:
        out.print(text, markup=False, end="")
        return
    from provisioner.errors import UsageError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write ({exc.strerror or exc})") from None
    err.print(f"wrote {path}", markup=False)


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
    from provisioner.lab.commands import lab_up_spec

    info, injected = lab_up_spec(spec, max_nodes=max_nodes, faults_file=faults_file, progress=_log,
                                 warn=_print_diagnostics)
    out.print(f"lab {info.cluster}: {len(info.addresses)} node(s) up; overlay {info.overlay}", markup=False)
    if injected:
        out.print(f"{injected} fault(s) injected from {faults_file}", markup=False)
    out.print(f"next: provision {spec} --overlay {info.overlay}", markup=False)


@lab_app.command("down")
def lab_down_cmd(cluster: LabClusterArg) -> None:
    """Remove the lab's containers and state (no containers, mounts or state left behind)."""
    from provisioner.lab.cluster import lab_down

    removed = lab_down(_cluster_name(cluster), progress=_log)
    out.print(f"removed {len(removed)} container(s)", markup=False)


@lab_app.command("status")
def lab_status_cmd(
    cluster: LabClusterArg,
    as_json: JsonOutputOpt = False,
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
    cluster: LabClusterArg,
    node: Annotated[str | None, typer.Argument(help="Node host name, or a switch for the switch faults.")] = None,
    kind: Annotated[str | None, typer.Argument(help="port_down, port_disabled, degraded_width, degraded_rate, "
                                               "slow_link, flapping, cables_swapped, peermem_missing, gpu_missing, "
                                               "unreachable, sm_killed, hardware_swap; on a switch: uplink_down "
                                               "port=N, uplink_degraded port=N width=2X|speed=HDR, switch_down.")
                                               ] = None,
    params: Annotated[list[str] | None, typer.Argument(help="key=value parameters, e.g. device=mlx5_1 "
                                                       "bw_factor=0.5")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Clear this fault (or, without a kind, all faults of the "
                                                        "node or switch).")] = False,
    file: Annotated[Path | None, typer.Option("--file", help="Inject every fault of a YAML fault list (checked "
                                              "as a whole first).", dir_okay=False)] = None,
) -> None:
    """Inject a fault into the running lab (takes effect at once), or clear it with --clear."""
    from provisioner.lab.commands import lab_fault

    out.print(lab_fault(cluster, node, kind, params, clear=clear, file=file), markup=False)


def _cluster_name(arg: str) -> str:
    from provisioner.lab.commands import cluster_name

    return cluster_name(arg)


def command_names() -> set[str]:
    """The words `provision` takes as a command, read from the registered commands and groups (typer names an
    unnamed command after its function, '_' as '-'); any other first word is a spec file: `up FILE`."""
    names = {c.name or (c.callback.__name__ if c.callback else "").lower().replace("_", "-")
             for c in app.registered_commands}
    return names | {g.name for g in app.registered_groups if g.name}


def main(argv: list[str] | None = None) -> int:
    """Entry point: `provision FILE ...` means `provision up FILE ...`; errors become one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-") and args[0] not in command_names():
        args.insert(0, "up")
    try:
        # without standalone mode click returns the code of a typer.Exit instead of raising it
        rc = app(args=args, prog_name="provision", standalone_mode=False)
    except SpecInvalid as exc:
        _print_diagnostics([d for d in exc.diagnostics if isinstance(d, Diagnostic)])
        errors = sum(1 for d in exc.diagnostics if isinstance(d, Diagnostic) and d.severity == "error")
        err.print(f"the spec has {errors} error(s); fix them and run again", markup=False)
        return exc.exit_code
    except ProvisionerError as exc:  # one line: a path, a name or a node's words in the message
        err.print(f"provision: error: {escaped(exc)}", markup=False)
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
        err.print(escaped(f"provision: error: {where}{exc.strerror or exc}"), markup=False)
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
