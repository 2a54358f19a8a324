"""``provision replace-node``: bring one swapped or reinstalled node back into a running cluster.

A node whose board, HCA or disk was replaced comes back with a new SSH host key and new port GUIDs. The rest
of the cluster is fine and must stay untouched; what depends on the node's hardware elsewhere (the subnet
manager's partition members, its own ``guid`` when the node is an SM) must follow. The steps, in order:

1. **Host key.** The key the node offers is shown (SHA256) and trusted only when the operator says so
   (``--accept-new-host-key``, or ``--host-key-fingerprint`` that must match). known_hosts gets the old lines
   commented out and the new one added; the hardware history keeps old → new fingerprints. Never automatic.
2. **Hardware.** Port GUIDs (``ibstat``), node GUIDs and board ids (sysfs), GPU serials (``nvidia-smi``) and
   the board serial (DMI, where readable) are read over SSH and recorded: the history says old → new.
3. **Converge the node only**: the node phases of the run engine with ``--limit NODE``; the GPU peers then run
   only the nccl role's node-to-node SSH tasks (they must trust the new host key and the new mpirun user key).
4. **The SM side**: the fabric phase limited to the SM nodes. The opensm role reads the members' port GUIDs
   live, so partitions.conf is re-rendered with the new ones; a changed partitions.conf reaches the running SMs
   by SIGHUP (a heavy sweep re-reads it), with no restart and no change of master. Only an opensm.conf option
   that a running SM cannot take (e.g. the ``guid`` of a replaced SM node) restarts SMs, standbys first. Then
   the node's own fabric phase (IPoIB, and NCCL_IB_PKEY from the P_Key table the SM has just programmed).
5. **Verify the node against healthy peers**: links and versions on it, bandwidth against each peer on every
   rail (full mode on the small set, so each node–peer pair is measured), GPUDirect with a peer, NCCL across
   it and its peers. The report lands under ``<state>/replace/<node>/<time>/``.

Exit codes like the other commands: 0 all passed, 1 a phase set the node aside or verification found
problems, 2 could not run (refused host key, unreachable, a phase not built).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provisioner import hostkeys
from provisioner.day2 import peers as peers_mod
from provisioner.day2.peers import DEFAULT_PEERS, Progress
from provisioner.errors import ParseError, ProvisionerError, RemoteError, UsageError
from provisioner.fabric import links
from provisioner.hostkeys import (
    KeyVerdict,
    decide,
    fetch_host_key,
    fingerprint,
    known_hosts_lock,
    recorded_host_keys,
    replace_host_key,
)
from provisioner.parsers import parse
from provisioner.phases import NullReporter, Reporter, RunOptions, provision_run
from provisioner.remote import Remote, SshRemote, SshTarget, targets_from_cluster
from provisioner.report import VerifyReport
from provisioner.safetext import printable
from provisioner.spec.cluster import Cluster
from provisioner.spec.diagnostics import Diagnostic
from provisioner.state import (
    DAY2_WAIT_S,
    HardwareChange,
    PhaseRecord,
    RunJournal,
    current_hardware,
    day2_lock,
    record_hardware,
    record_host_key,
    run_lock,
    state_dir_for,
    utcnow,
)

NODE_PHASES = ("preflight", "repos", "ofed", "gpu_stack")
"""Converged on the replaced node alone, before the SM side (the normal run's order)."""
AFTER_FABRIC_PHASES = ("storage",)
SLURM_PHASE = "slurm"
MPI_TRUST_TAG = "nccl_mpi_ssh_trust"
"""The nccl role's node-to-node SSH tasks (roles/nccl/tasks/main.yml imports mpi_ssh.yml with this tag)."""
"""Run after storage on a node Slurm knows: it gives a reinstalled node the cluster's MUNGE key, slurm.conf and
slurmd again."""
SM_CONFIG_TASKS = frozenset({"Write opensm.conf", "Write partitions.conf"})
"""Task names of roles/opensm whose change means the SM's configuration changed."""
SM_RESTART_TASK = "Restart opensm"
"""The opensm role's only restart path (roles/opensm/tasks/restart_one.yml: one SM at a time, master last)."""
SM_RELOAD_TASK = "Reload opensm (SIGHUP)"
"""The opensm role's reload: a heavy sweep that re-reads partitions.conf and the runtime options."""
PROBE_TIMEOUT_S = 30.0

# Constant shell snippets (no spec value reaches them): one line per HCA / the DMI board serial.
SYSFS_PROBE = (
    'for d in /sys/class/infiniband/*; do [ -d "$d" ] || continue; '
    'printf "%s %s %s\\n" "${d##*/}" "$(cat "$d/node_guid" 2>/dev/null)" "$(cat "$d/board_id" 2>/dev/null)"; '
    "done"
)
BOARD_PROBE = "cat /sys/class/dmi/id/board_serial 2>/dev/null || dmidecode -s baseboard-serial-number 2>/dev/null"
GPU_PROBE = ["nvidia-smi", "--query-gpu=index,serial", "--format=csv,noheader"]



class HostKeyRefused(ProvisionerError):
    """The node offers a key the operator has not accepted: nothing was changed."""

    exit_code = 2


# ---------------------------------------------------------------------------------------------------------
# pure parts


def check_fingerprint(value: str | None) -> str | None:
    """``--host-key-fingerprint`` as OpenSSH prints it (``SHA256:`` + 43 base64 characters), or a UsageError."""
    return None if value is None else hostkeys.check_fingerprint(value, "--host-key-fingerprint")


def decide_host_key(node: str, offered: str, known: Sequence[str], *, accept_new: bool,
                    expected: str | None) -> KeyVerdict:
    """hostkeys.decide for a replaced node: ``known`` or ``replace``, else HostKeyRefused (nothing changed)."""
    verdict = decide(node, offered, known, expected=expected, replacing=True, accept_new=accept_new)
    if verdict.action == "refused":
        raise HostKeyRefused(verdict.reason, hint=verdict.hint)
    return verdict


def _norm_guid(value: str) -> str | None:
    """sysfs ``0c42:a103:0012:3456`` or ``0x0c42a10300123456`` → ``0x0c42a10300123456``; None if not a GUID."""
    digits = value.strip().lower().removeprefix("0x").replace(":", "")
    if not re.fullmatch(r"[0-9a-f]{16}", digits) or int(digits, 16) == 0:
        return None
    return "0x" + digits


def parse_sysfs_probe(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """The SYSFS_PROBE lines → ({device: node GUID}, {"<device> board_id": board id})."""
    guids: dict[str, str] = {}
    boards: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or not re.fullmatch(r"[A-Za-z0-9_]+", parts[0]):
            continue
        guid = _norm_guid(parts[1]) if len(parts) > 1 else None
        if guid:
            guids[parts[0]] = guid
        if len(parts) > 2 and parts[2]:
            boards[f"{parts[0]} board_id"] = parts[2]
    return guids, boards


def parse_gpu_serials(text: str) -> dict[str, str]:
    """``nvidia-smi --query-gpu=index,serial --format=csv,noheader`` → {"gpu0": serial}; N/A rows skipped."""
    serials: dict[str, str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[0].isdigit() and cells[1] and cells[1] not in ("N/A", "[N/A]"):
            serials[f"gpu{cells[0]}"] = cells[1]
    return serials


def parse_board_serial(text: str) -> str | None:
    """The DMI board serial, None when the firmware left it blank or a placeholder."""
    value = text.strip().splitlines()[0].strip() if text.strip() else ""
    placeholders = {"", "not specified", "default string", "to be filled by o.e.m.", "none", "0"}
    return None if value.lower() in placeholders else value


@dataclass
class Observation:
    """What the node reported about its hardware, in the hardware history's shape."""

    guids: dict[str, str] = field(default_factory=dict)     # "mlx5_0/1" port GUIDs, "mlx5_0" node GUIDs
    serials: dict[str, str] = field(default_factory=dict)   # "board", "gpu0", "mlx5_0 board_id"
    unreadable: list[str] = field(default_factory=list)     # what could not be read, and why


# ---------------------------------------------------------------------------------------------------------
# the steps


@dataclass
class ReplaceResult:
    """Everything the summary shows; ``exit_code`` follows the other commands (0 / 1 / 2)."""

    node: str
    fingerprint: str = ""
    key_action: str = ""
    old_fingerprints: tuple[str, ...] = ()
    changes: list[HardwareChange] = field(default_factory=list)
    first_record: bool = False
    observation: Observation = field(default_factory=Observation)
    phases: list[tuple[str, str, str]] = field(default_factory=list)   # (phase, hosts, status)
    journals: list[RunJournal] = field(default_factory=list)
    sm_config_changed: list[str] = field(default_factory=list)
    sm_restarted: list[str] = field(default_factory=list)
    sm_reloaded: list[str] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)
    report: VerifyReport | None = None
    report_dir: Path | None = None
    stopped: str | None = None       # why the command stopped early, with what to do next
    returned_as_spare: bool = False  # a failed-over node, back as a spare

    @property
    def exit_code(self) -> int:
        if self.stopped is not None:
            statuses = {j.status for j in self.journals}
            return 1 if statuses & {"partial", "stopped"} else 2
        if any(j.status in ("partial", "stopped") for j in self.journals):
            return 1
        if any(j.status != "passed" for j in self.journals):
            return 2
        return self.report.verdict.exit_code if self.report is not None else 2


class _Capture:
    """Passes events on to the live view and notes which SM hosts changed their config, reloaded or restarted."""

    def __init__(self, inner: Reporter) -> None:
        self.inner = inner
        self.config_changed: set[str] = set()
        self.restarted: set[str] = set()
        self.reloaded: set[str] = set()

    def phase_started(self, name: str, hosts: Sequence[str]) -> None:
        self.inner.phase_started(name, hosts)

    def event(self, phase: str, event: Mapping[str, Any]) -> None:
        data = event.get("event_data") or {}
        res = data.get("res")
        changed = isinstance(res, Mapping) and bool(res.get("changed"))
        if phase == "fabric" and event.get("event") == "runner_on_ok" and changed and data.get("host"):
            task = str(data.get("task") or "")
            if task in SM_CONFIG_TASKS:
                self.config_changed.add(str(data["host"]))
            elif task == SM_RESTART_TASK:
                self.restarted.add(str(data["host"]))
            elif task == SM_RELOAD_TASK:
                self.reloaded.add(str(data["host"]))
        self.inner.event(phase, event)

    def phase_finished(self, record: PhaseRecord) -> None:
        self.inner.phase_finished(record)

    def run_finished(self, journal: RunJournal) -> None:
        self.inner.run_finished(journal)


def trust_new_key(target: SshTarget, state_dir: Path, *, accept_new: bool, expected: str | None,
                  progress: Progress) -> KeyVerdict:
    """Step 1: fetch the offered key, decide, and replace the known_hosts line (old one kept as a comment)."""
    key = fetch_host_key(target)
    offered = fingerprint(key)
    progress(f"{target.name} offers host key {key.get_name()} {offered}")
    with known_hosts_lock(target.known_hosts, command=f"provision replace-node {target.name}"):
        known = [fingerprint(k) for k in recorded_host_keys(target)]
        decision = decide_host_key(target.name, offered, known, accept_new=accept_new, expected=expected)
        if decision.action != "replace":
            return decision
        when = utcnow()
        replace_host_key(target, key, f"replaced {when} by provision replace-node")
        record_host_key(state_dir, target.name, old=list(known), new=offered, key_type=key.get_name(), when=when)
        progress(f"{target.known_hosts}: trusts {offered} for {target.name} now (old line kept as a comment)")
    return decision


def observe(remote: Remote, node: str) -> Observation:
    """Step 2: read the node's GUIDs and serials over SSH (what cannot be read is noted, not fatal)."""
    obs = Observation()
    done = remote.run(node, ["ibstat"], timeout=PROBE_TIMEOUT_S)
    try:
        obs.guids.update(links.port_guids(parse("ibstat", done.stdout)))
    except ParseError as exc:
        obs.unreadable.append(f"ibstat: {exc.message}")
    sysfs = remote.run(node, ["sh", "-c", SYSFS_PROBE], timeout=PROBE_TIMEOUT_S)
    node_guids, boards = parse_sysfs_probe(sysfs.stdout)
    obs.guids.update(node_guids)
    obs.serials.update(boards)
    gpus = remote.run(node, GPU_PROBE, timeout=PROBE_TIMEOUT_S)
    if gpus.rc == 0:
        obs.serials.update(parse_gpu_serials(gpus.stdout))
    board = remote.run(node, ["sh", "-c", BOARD_PROBE], timeout=PROBE_TIMEOUT_S)
    serial = parse_board_serial(board.stdout) if board.rc == 0 else None
    if serial:
        obs.serials["board"] = serial
    else:
        obs.unreadable.append("board serial (no /sys/class/dmi/id/board_serial, no dmidecode)")
    if not obs.guids:
        raise RemoteError(f"{node}: no InfiniBand port GUID could be read (ibstat and sysfs)",
                          hint="check that the HCA driver is loaded on the node (ibstat), then rerun")
    return obs


def _record_phases(result: ReplaceResult, journal: RunJournal, hosts: str) -> None:
    result.journals.append(journal)
    for rec in journal.phases:
        if rec.name in ("validate", "render"):
            continue
        result.phases.append((rec.name, hosts, rec.status))


def replace_node(
    spec: Path,
    node: str,
    *,
    overlay: Path | None = None,
    state_dir: Path | None = None,
    accept_new_host_key: bool = False,
    host_key_fingerprint: str | None = None,
    peers: int = DEFAULT_PEERS,
    progress: Progress = lambda _m: None,
    reporter: Reporter | None = None,
    run: Callable[..., RunJournal] = provision_run,
    remote_factory: Callable[[Mapping[str, SshTarget]], Remote] | None = None,
    verifier: Callable[..., VerifyReport] = peers_mod.verify,
) -> ReplaceResult:
    """The whole replacement; see the module docstring. Raises ProvisionerError before anything changed."""
    from provisioner.spec import load_cluster

    expected = check_fingerprint(host_key_fingerprint)
    cluster, warnings = load_cluster(spec, overlay)
    names = [n.name for n in cluster.nodes]
    if node not in names:
        raise UsageError(f"{node} is not a node of {spec}", hint="one of " + ", ".join(names))
    sdir = state_dir_for(cluster.name, state_dir)
    with run_lock(sdir, command=f"provision replace-node {node}"):  # its runs take the same lock (re-entrant)
        return _replace_node(spec, node, cluster, sdir, overlay=overlay, accept_new_host_key=accept_new_host_key,
                             warnings=warnings, expected=expected, peers=peers, progress=progress,
                             reporter=reporter, run=run,
                             remote_factory=remote_factory, verifier=verifier)


def _replace_node(
    spec: Path, node: str, cluster: Cluster, sdir: Path, *, overlay: Path | None, accept_new_host_key: bool,
    warnings: list[Diagnostic], expected: str | None, peers: int, progress: Progress, reporter: Reporter | None,
    run: Callable[..., RunJournal], remote_factory: Callable[[Mapping[str, SshTarget]], Remote] | None,
    verifier: Callable[..., VerifyReport],
) -> ReplaceResult:
    targets = targets_from_cluster(cluster)
    result = ReplaceResult(node)

    decision = trust_new_key(targets[node], sdir, accept_new=accept_new_host_key, expected=expected,
                             progress=progress)
    result.fingerprint, result.key_action, result.old_fingerprints = (decision.offered, decision.action,
                                                                      decision.known)
    before = current_hardware(sdir, node)
    result.first_record = not (before["guids"] or before["serials"])
    make_remote = remote_factory or (lambda t: SshRemote(t))
    remote = make_remote({node: targets[node]})
    try:
        result.observation = observe(remote, node)
    finally:
        close = getattr(remote, "close", None)
        if callable(close):
            close()
    result.changes = record_hardware(sdir, node, guids=result.observation.guids,
                                     serials=result.observation.serials)
    progress(f"{node}: {len(result.changes)} hardware change(s) recorded")

    capture = _Capture(reporter or NullReporter())
    ov = str(overlay) if overlay else None
    sms = cluster.sm_nodes()
    plan: list[tuple[tuple[str, ...], list[str], list[str]]] = [(NODE_PHASES, [node], [])]
    gpu_peers = [n.name for n in cluster.nodes if n.gpu_count]  # the inventory's gpu_nodes group
    if node in gpu_peers and len(gpu_peers) > 1:
        # The new board has a new host key and makes a new mpirun user key: the peers must trust both or every
        # multi-node NCCL run from or to it fails ("Host key verification failed", "Permission denied"). Only the
        # nccl role's node-to-node SSH tasks run on the peers (known_hosts block, authorized keys), nothing else.
        plan.append((("gpu_stack",), gpu_peers, [MPI_TRUST_TAG]))
    if sms:
        plan.append((("fabric",), sms, []))
    if node not in sms:
        # the node's own fabric phase once the SM knows its new port GUIDs: IPoIB, RoCE QoS, and NCCL_IB_PKEY,
        # an index in the P_Key table the SM programs only after its partitions name the new ports
        plan.append((("fabric",), [node], []))
    after: tuple[str, ...] = AFTER_FABRIC_PHASES
    slurm = cluster.spec.slurm
    if slurm is not None:
        from provisioner.slurm.membership import spec_membership

        known = spec_membership(cluster)
        if node == slurm.controller or node in {*known.in_partitions, *known.spares}:
            after = (*after, SLURM_PHASE)
    plan.append((after, [node], []))
    for phases, hosts, tags in plan:
        label = ",".join(hosts)
        journal = run(spec, RunOptions(only=list(phases), limit=label, overlay=ov, tags=tags), state_dir=sdir,
                      reporter=capture, loaded=(cluster, warnings))  # the model loaded once
        _record_phases(result, journal, label)
        if journal.status != "passed":
            why = journal.stop_reason or "; ".join(
                f"{h}: {sa.get('state')} in {sa.get('phase')}: {sa.get('reason')}"
                for h, sa in journal.set_aside.items()) or f"run ended {journal.status}"
            result.stopped = (f"{'/'.join(phases)} on {label}: {why}; fix it, then rerun provision replace-node "
                              f"{spec} {node}")
            break
    result.sm_config_changed = sorted(capture.config_changed)
    result.sm_restarted = sorted(capture.restarted)
    result.sm_reloaded = sorted(capture.reloaded)
    if result.stopped is not None:
        return result

    result.peers = peers_mod.pick(cluster, [node], peers_mod.unhealthy_nodes(sdir) - {node}, peers)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    result.report_dir = sdir / "replace" / node / stamp
    remote_v = make_remote(targets) if remote_factory else None
    # a new board: its cables and IPoIB interfaces are checked too
    result.report = verifier(cluster, [node], result.peers, result.report_dir, progress, remote=remote_v,
                             new_hardware=True)
    if result.report.verdict.exit_code == 0:
        result.returned_as_spare = return_as_spare(cluster, sdir, node, progress, remote_v)
    return result


def return_as_spare(cluster: Cluster, state_dir: Path, node: str, progress: Progress,
                    remote: Remote | None = None) -> bool:
    """A node a failover took out of its partitions, repaired and verified: it stands by as a spare from now on
    (the swap record says so) and is resumed in Slurm, where it is in no partition."""
    from provisioner.slurm.ctl import SlurmCtl
    from provisioner.slurm.membership import current, mark_returned

    if cluster.spec.slurm is None:
        return False
    with day2_lock(state_dir, command=f"provision replace-node {node}", wait_s=DAY2_WAIT_S):
        if node not in current(cluster, state_dir).failed:
            return False
        mark_returned(state_dir, node)
        ssh = remote or SshRemote(targets_from_cluster(cluster))
        try:
            SlurmCtl(ssh, cluster.spec.slurm.controller).resume([node])
        finally:
            if remote is None:
                close = getattr(ssh, "close", None)
                if callable(close):
                    close()
    progress(f"{node} returns as a spare (in no partition, resumed in Slurm)")
    return True


def summary_lines(result: ReplaceResult) -> list[str]:
    """What a person reads at the end: key, GUIDs old → new, phases, SM restart, verdict, what next."""
    r = result
    lines = [f"replace-node {r.node}"]
    if r.key_action == "replace":
        was = ", ".join(r.old_fingerprints) or "none"
        lines.append(f"  host key: {r.fingerprint} accepted (was {was}; old line kept as a comment in known_hosts)")
    elif r.key_action:
        lines.append(f"  host key: {r.fingerprint} (already trusted, unchanged)")
    if r.first_record:
        lines.append("  hardware: no earlier record of this node; recorded as first seen:")
        lines += [f"    {k}: {v}" for k, v in sorted(r.observation.guids.items())]
    elif r.changes:
        lines.append("  hardware changes (old -> new):")
        lines += [f"    {c.kind} {c.key}: {c.old or '-'} -> {c.new or '-'}" for c in r.changes]
    else:
        lines.append("  hardware: same GUIDs and serials as recorded before")
    lines += [f"  not readable: {u}" for u in r.observation.unreadable]
    for name, hosts, status in r.phases:
        lines.append(f"  {name} ({hosts}): {status.replace('_', ' ')}")
    if r.sm_config_changed or r.sm_restarted or r.sm_reloaded:
        lines.append(f"  SM config changed on {', '.join(r.sm_config_changed) or '-'}; "
                     f"reloaded (SIGHUP) on {', '.join(r.sm_reloaded) or '-'}; "
                     f"restarted on {', '.join(r.sm_restarted) or '-'}")
    if r.stopped:
        lines.append(f"stopped: {r.stopped}")
        return lines
    if r.report is not None:
        lines.append(f"  verified against {', '.join(r.peers) or 'no peer (links and versions only)'}")
        for f in r.report.findings():
            lines.append(f"    {f.severity.upper():7s} {printable(f.location())}: {printable(f.message)}")
        lines.append(f"  verify: {r.report.verdict.label} ({r.report_dir})")
    if r.returned_as_spare:
        lines.append(f"  {r.node} was failed over before: it stands by as a spare now (in no Slurm partition)")
    return lines
