"""``provision verify``: measure the cluster over SSH, judge it against the spec, write the reports.

Data flows one way: spec → remote probes → parsers → checks (pure functions) → findings → report files.
Every check is a pure function of parsed tool output and the :class:`Cluster`; this module only decides
what to run where, in parallel, and turns "could not run" into results of its own (a dead node is news, not
a crash). A node that cannot be reached is reported once and kept out of every check, its pairs skipped
(:mod:`provisioner.fabric.reach`): it is never measured, so it is never localised as bad ports. Exit codes
come from :class:`provisioner.fabric.findings.Verdict`: 0 pass, 1 findings, 2 could not run.

Output directory: ``<state>/verify/<UTC timestamp>/`` (``report.json``, ``junit.xml``, ``report.html``,
``inventory.json``), a ``latest`` symlink to it, and ``<state>/verify/baseline.json`` (the first passing
run).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from provisioner.drift import peer_groups
from provisioner.errors import ParseError, RemoteError, UsageError
from provisioner.fabric import (
    bandwidth,
    baseline,
    cabling,
    causes,
    dcgm,
    gpudirect,
    ipoib,
    links,
    load,
    memlock,
    nccl,
    nccl_node,
    pcie,
    reach,
    registry,
    sm_verify,
    storage,
    switchlinks,
    switchports,
    tune,
    versions,
    xid,
)
from provisioner.fabric.findings import CheckResult, Finding, Value
from provisioner.fabric.nccl import NcclRunner
from provisioner.fabric.nhc import export_nhc
from provisioner.fabric.perftest import PairRun, PerftestSettings, run_pair
from provisioner.fabric.sm import SmInfo, sminfo_result
from provisioner.parsers import parse
from provisioner.remote import Completed, Remote, SshRemote, targets_from_cluster
from provisioner.report import VerifyReport, fabric_picture, to_html, to_json, to_junit
from provisioner.slurm.ctl import SlurmCtl, SlurmError
from provisioner.slurm.membership import current as current_membership
from provisioner.spec import hostlist, load_cluster
from provisioner.spec.cluster import Cluster, Node
from provisioner.spec.diagnostics import Diagnostic
from provisioner.state import private_dir, run_lock, state_dir_for, symlink_atomic, write_text_atomic

__all__ = ["ALL_TESTS", "VerifyRun", "export_nhc", "run_verify", "verify", "write_reports"]

ALL_TESTS = registry.NAMES
PROBE_TIMEOUT_S = 30.0
NCCL_TIMEOUT_S = 900.0

Progress = Callable[[str], None]
_T = TypeVar("_T")


def _quiet(_: str) -> None:
    return None


@dataclass
class VerifyRun:
    """A finished run: the report, where its files are (None when not written) and the hardware inventory."""

    report: VerifyReport
    directory: Path | None
    inventory: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return self.report.verdict.exit_code


def select_tests(cluster: Cluster, only: Iterable[str] | None) -> list[str]:
    """The checks to run, in run order: ``--only`` if given (validated), else the spec's (see
    :mod:`provisioner.fabric.registry`)."""
    return registry.parse_only(only) if only is not None else registry.default_for(cluster)


def _parsed(tool: str, done: Completed, *, with_stderr: bool = False) -> tuple[dict[str, Any] | None, str]:
    """Parsed output, or None and the reason (unreachable, timeout, not that tool's output). ``with_stderr``:
    the tool's stderr is parsed after its stdout (ibqueryerrors prints there which paths it could not query)."""
    if done.unreachable:
        return None, done.stderr.strip() or "unreachable"
    if done.timed_out:
        return None, f"{tool} timed out"
    text = done.stdout + ("\n" + done.stderr if with_stderr and done.stderr.strip() else "")
    try:
        return parse(tool, text), ""
    except ParseError as exc:
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        return None, f"{exc.message}" + (f" (stderr: {tail})" if tail else "") + f" [exit {done.rc}]"


class _Verifier:
    """One run's state: the remote, the cluster, what was measured so far."""

    def __init__(self, cluster: Cluster, remote: Remote, progress: Progress, grace_s: float,
                 nccl_launch: str = "mpirun", partitions: Mapping[str, str] | None = None,
                 job_partitions: Mapping[str, str] | None = None) -> None:
        self.cluster = cluster
        self.nccl_launch = nccl_launch
        self.busy: dict[str, str] = {}
        """Nodes running Slurm jobs -> why no traffic is sent to them (:meth:`find_busy`)."""
        self.partitions = dict(partitions or {})
        """node -> the Slurm partition it serves in now (the NCCL check starts those with srun)."""
        self.job_partitions = dict(job_partitions or {})
        """The same membership for the memlock check, whatever launcher NCCL uses: a user's job starts there."""
        self.remote = reach.ReachableRemote(remote)
        self.progress = progress
        self.grace_s = grace_s
        self.checks: list[CheckResult] = []
        self.notes: list[str] = []
        self.versions: dict[str, dict[str, str]] = {}
        self.inventory: dict[str, dict[str, str]] = {}
        self.matrix: dict[int, dict[tuple[str, str], float]] = {}
        self.line_rate: dict[int, float] = {}
        self.nccl_busbw: float | None = None
        self._ibstat: dict[str, dict[str, Any]] | None = None
        self._ibstatus: dict[str, dict[str, Any]] = {}
        self._counters: dict[str, dict[tuple[str, int], dict[str, int]]] = {}
        self._links_at: dict[str, int] = {}
        """node -> index in ``checks`` of its links result (rebuilt when the counters are re-read)."""
        self.fabric_host: str | None = None
        """The node whose fabric-wide view (iblinkinfo, ibqueryerrors) the cabling checks used."""
        self.uplinks: dict[str, switchlinks.Uplinks] = {}
        self.switch_view: switchlinks.Comparison | None = None
        self._switch_counts: switchports.Counts | None = None
        self._switch_peers: dict[tuple[str, int], str] = {}
        self._switch_ports_at: int | None = None
        self._switch_gaps: list[Finding] = []
        """What the switch counter sweep could not reach (discovery timeouts, PMA query failures)."""
        self._numactl: dict[str, bool] | None = None
        self._tools: dict[tuple[str, str], bool] = {}
        """(host, tool) -> whether ``command -v`` found it (the NCCL launchers)."""

    @property
    def lost(self) -> dict[str, str]:
        """Nodes that could not be reached, with the reason (reported once, at the end)."""
        return self.remote.lost

    def reachable(self) -> Cluster:
        """The cluster without the lost nodes."""
        return reach.reachable(self.cluster, self.lost)

    def traffic(self) -> Cluster:
        """What the checks that send traffic (bandwidth, GPUDirect, NCCL) run over: the reachable nodes minus those
        running Slurm jobs (:meth:`find_busy`)."""
        return reach.reachable(self.cluster, {**self.busy, **self.lost})

    def find_busy(self, nodes: Sequence[str]) -> None:
        """Ask slurmctld which of ``nodes`` run jobs now: a measurement there would compete with the job (and blame
        the fabric for the job's traffic) and slow the job down. Slurm not answering is said, and measured anyway."""
        slurm = self.cluster.spec.slurm
        if slurm is None or not nodes:
            return
        try:
            held = SlurmCtl(self.remote, slurm.controller).busy_nodes(nodes)
        except (SlurmError, RemoteError) as exc:
            note = f"could not ask Slurm which nodes run jobs ({exc}); the traffic checks measured every node"
            self.notes.append(note)
            self.progress(f"slurm: {note}")
            return
        for node, jobs in sorted(held.items()):
            what = f"job {', '.join(jobs)}" if jobs else "a completing job"
            self.busy[node] = (f"Slurm runs {what} on {node}: a measurement there would compete with it and slow "
                               "it down; drain the node and let its jobs end, or `provision verify --include-busy`")
        if self.busy:
            self.progress(f"slurm: {hostlist.compress(list(self.busy))} run jobs: no traffic is sent to them")

    def on_all(self, argv: Sequence[str], nodes: Sequence[str] | None = None) -> dict[str, Completed]:
        """``argv`` on every node that can be reached (or on those of ``nodes``); lost nodes are left out."""
        names = list(nodes) if nodes is not None else [n.name for n in self.cluster.nodes]
        live = [n for n in names if n not in self.lost]
        return self.remote.run_many({n: list(argv) for n in live}, timeout=PROBE_TIMEOUT_S) if live else {}

    def reach(self) -> None:
        """``true`` on every node: the ones that cannot be reached are lost before any check runs."""
        self.remote.probe([n.name for n in self.cluster.nodes], timeout=PROBE_TIMEOUT_S)

    # -- links, versions -------------------------------------------------------------------------------
    def ibstat(self) -> dict[str, dict[str, Any]]:
        """ibstat per node, from the links probe (which also brings ibstatus and the port counters along)."""
        if self._ibstat is None:
            self._ibstat = {}
            for node, done in self.on_all(["sh", "-c", links.PROBE_SCRIPT]).items():
                ibstat_text, status_text, counters_text = links.split_probe(done.stdout)
                parsed, why = _parsed("ibstat", done._replace(stdout=ibstat_text))
                if parsed is None:
                    self.checks.append(CheckResult.could_not_run(links.CHECK, node, why))
                    continue
                self._ibstat[node] = parsed
                with contextlib.suppress(ParseError):  # no ibstatus: rate_cause falls back to explain_rate
                    self._ibstatus[node] = parse("ibstatus", status_text)
                self._counters[node] = links.parse_counters(counters_text)
        return self._ibstat

    def links(self) -> None:
        observed = self.ibstat()
        for node in self.cluster.nodes:
            if node.name in observed:
                obs = observed[node.name]
                self._links_at[node.name] = len(self.checks)
                self.checks.append(self._links_result(node, None))
                self.inventory[node.name] = links.port_guids(obs)
        sm = links.sm_lid_findings(self.cluster.nodes, observed)
        self.checks.append(CheckResult.from_findings("sm_lid", None, sm))

    def _links_result(self, node: Node, after: dict[tuple[str, int], dict[str, int]] | None) -> CheckResult:
        found = links.port_findings(node, self.ibstat()[node.name], self._ibstatus.get(node.name))
        found += links.counter_findings(node, self._counters.get(node.name, {}), after)
        measured: dict[str, Value] = {"ports_expected": len(node.ports),
                                      "counters_read": "start and end" if after is not None else "start"}
        return CheckResult.from_findings(links.CHECK, node.name, found, measured)

    def links_counters_again(self) -> None:
        """Re-read the port counters at the end of the run; ports whose flap counters grew become errors.

        Only nodes whose counters could be read at the start are asked again (one more round trip); a node
        that does not answer now keeps its start-of-run result and gets a note.
        """
        nodes = [n for n in self.cluster.nodes if n.name in self._links_at and self._counters.get(n.name)
                 and n.name not in self.lost]
        if not nodes:
            return
        done = self.on_all(["sh", "-c", links.COUNTERS_SCRIPT], [n.name for n in nodes])
        for node in nodes:
            after = links.parse_counters(done[node.name].stdout) if node.name in done else {}
            if not after:
                self.notes.append(f"links: port counters of {node.name} could not be re-read at the end of the run")
                continue
            self.checks[self._links_at[node.name]] = self._links_result(node, after)

    def versions_check(self) -> None:
        observed: dict[str, dict[str, str | None]] = {}
        unreachable: set[str] = set()
        comps_by_node = {n.name: versions.components_for(self.cluster, bool(n.gpu_count)) for n in self.cluster.nodes
                         if n.name not in self.lost}
        for comp, argv in versions.PROBES.items():
            nodes = [n for n, comps in comps_by_node.items() if comp in comps]
            for node, done in self.on_all(argv, nodes).items():
                if done.unreachable:
                    unreachable.add(node)
                    continue
                observed.setdefault(node, {})[comp] = versions.read_version(comp, done.stdout) if done.rc == 0 else None
        fw = {n: links.firmware(obs) for n, obs in self.ibstat().items()}
        groups = peer_groups(self.cluster)
        found = versions.version_findings(self.cluster, observed, groups) + versions.firmware_findings(fw, groups)
        for node in sorted(comps_by_node):
            if node in unreachable:
                self.checks.append(CheckResult.could_not_run(versions.CHECK, node, "unreachable"))
                continue
            mine = [f for f in found if f.node == node]
            self.checks.append(CheckResult.from_findings(versions.CHECK, node, mine))
            row = {c: v for c, v in observed.get(node, {}).items() if v is not None and c != versions.PERSISTENCE}
            row.update({f"firmware {d}": v for d, v in fw.get(node, {}).items()})
            self.versions[node] = row

    def subnet_manager(self) -> None:
        """``sminfo`` (the master) and ``sminfo <lid>`` per spec SM node, asked from one node that answered (an
        Ethernet/RoCE spec has no SM: the registry's ``needs`` keeps this from running there)."""
        observed = self.ibstat()
        compute = [n.name for n in self.cluster.nodes_with_role("compute")]
        order = [n for n in compute if n in observed] + sorted(observed)
        if not order:
            self.checks.append(CheckResult.could_not_run(sm_verify.CHECK, None, "no node answered ibstat"))
            return
        host = order[0]
        try:
            master = self._sminfo(host, [])
            own = {s.node: self._sminfo(host, [str(s.lid)])
                   for s in sm_verify.planned_sms(self.cluster, observed) if s.lid}
        except ParseError as exc:
            self.checks.append(CheckResult.could_not_run(sm_verify.CHECK, None, f"{host}: {exc.message}"))
            return
        found = sm_verify.sm_findings(self.cluster, observed, master, own, host)
        measured = {"queried_on": host, "master_lid": master.lid if master else None,
                    "master_guid": master.guid if master else None}
        self.checks.append(CheckResult.from_findings(sm_verify.CHECK, None, found, measured))

    def _sminfo(self, host: str, args: list[str]) -> SmInfo | None:
        done = self.remote.run_many({host: ["sminfo", *args]}, timeout=PROBE_TIMEOUT_S)[host]
        if done.timed_out:
            raise ParseError(f"sminfo {' '.join(args)} timed out")
        try:  # sminfo's own "no answer" exits 255 (ibexit), which Completed also uses for an unreachable host
            return sminfo_result(done.rc, done.stdout, done.stderr)
        except ParseError:
            if done.unreachable:
                raise ParseError(f"unreachable: {done.stderr.strip()}") from None
            raise

    # -- pcie ------------------------------------------------------------------------------------------------
    def pcie_check(self) -> None:
        """One lspci -vvv (and the GPU/HCA names) per GPU node."""
        nodes = [n.name for n in gpudirect.gpu_nodes(self.cluster)]
        for node, done in sorted(self.on_all(["sh", "-c", pcie.PROBE_SCRIPT], nodes).items()):
            self.checks.append(pcie.check_node(node, done))

    # -- bandwidth, gpudirect, nccl ----------------------------------------------------------------------
    def numactl(self) -> dict[str, bool]:
        """Which nodes have numactl: asked once, by the first check that runs ib_write_bw."""
        if self._numactl is None:
            done = self.on_all(["sh", "-c", "command -v numactl"])
            self._numactl = {n: d.rc == 0 and bool(d.stdout.strip()) for n, d in done.items()}
        return self._numactl

    def _without_lost(self, what: str, check: Callable[[Cluster], _T]) -> _T:
        """``check`` over the reachable nodes; again without any node it lost on the way (its pairs' failures
        would otherwise be pinned on its ports and on its peers')."""
        while True:
            before = set(self.lost)
            out = check(self.traffic())
            if set(self.lost) == before:
                return out
            gone = ", ".join(sorted(set(self.lost) - before))
            self.progress(f"{what}: {gone} stopped answering; measuring again without it")

    def bandwidth_and_load(self, mode: str | None) -> None:
        """The ``bandwidth`` check: pairs per rail, then the load round across leaves (which leaves the ports the
        pairs blamed out of its own verdict)."""
        numactl = self.numactl()
        self.bandwidth(numactl, mode)
        self.progress("bandwidth: every port at once to a partner on another leaf (load across leaves)")
        self.load_round(numactl)

    def bandwidth(self, numactl: Mapping[str, bool], mode: str | None) -> None:
        cfg = self.cluster.spec.verify.bandwidth
        settings = PerftestSettings(size=cfg.message_size, duration=cfg.duration, server_grace_s=self.grace_s)
        out = self._without_lost("bandwidth", lambda c: bandwidth.check_bandwidth(
            c, bandwidth.ssh_runner(self.remote, c, numactl, settings), mode=mode))
        every = [n.name for n in bandwidth.bandwidth_nodes(self.cluster)]
        self.checks.append(reach.unless_lost(out.result, every, self.lost))
        self.checks += reach.skipped(bandwidth.CHECK, every, self.lost)
        self.matrix = out.matrix
        self.line_rate = out.line_rate
        self.notes += out.notes

    def gpudirect(self, numactl: Mapping[str, bool], mode: str | None) -> None:
        every = [n.name for n in gpudirect.gpu_nodes(self.cluster)]
        results = self._without_lost("gpudirect", lambda c: self._gpudirect(c, numactl, mode))
        self.checks += [reach.unless_lost(r, every, self.lost) for r in results]
        self.checks += reach.skipped(gpudirect.BW_CHECK, every, self.lost)

    def _gpudirect(self, cluster: Cluster, numactl: Mapping[str, bool], mode: str | None) -> list[CheckResult]:
        nodes = [n.name for n in gpudirect.gpu_nodes(cluster)]
        node_probe = self.on_all(["sh", "-c", gpudirect.NODE_PROBE], nodes)
        lsmod = {n: _parsed("lsmod", d._replace(stdout=xid.split_probe(d.stdout)[0]))[0]
                 for n, d in node_probe.items()}
        kernel_logs = [xid.node_result(n, d) for n, d in sorted(node_probe.items())]
        smi = self.on_all(["nvidia-smi", "topo", "-m"], nodes)
        topo = {n: _parsed("nvidia-smi-topo", d)[0] for n, d in smi.items()}
        probe = self.on_all(["sh", "-c", gpudirect.PERFTEST_PROBE], nodes)
        perftest = {n: gpudirect.perftest_support(d) for n, d in probe.items()}
        cfg = cluster.spec.verify.bandwidth
        settings = PerftestSettings(size=cfg.message_size, duration=cfg.duration, server_grace_s=self.grace_s)
        runner = bandwidth.ssh_runner(self.remote, cluster, numactl, settings, use_cuda=True,
                                      cuda_gpu=gpudirect.nic_gpus(cluster, topo),
                                      cuda_dmabuf=gpudirect.dmabuf_mode(cluster))
        return kernel_logs + gpudirect.check_gpudirect(cluster, lsmod, topo, runner, mode, perftest)

    def dcgm_check(self) -> None:
        """``dcgmi diag`` on the GPU nodes not running jobs; the NVSwitch fabric state on every NVSwitch node (reading
        it loads nothing)."""
        lvl = dcgm.level(self.cluster)
        quiet = {n.name for n in dcgm.dcgm_nodes(self.traffic())}
        nodes = [n.name for n in dcgm.dcgm_nodes(self.cluster) if n.name in quiet]
        live = [n for n in nodes if n not in self.lost]
        probes = self.remote.run_many({n: ["sh", "-c", dcgm.PROBE, "sh", str(lvl)] for n in live},
                                      timeout=dcgm.TIMEOUT_S[lvl]) if live else {}
        self.checks += [dcgm.diag_result(n, lvl, done) for n, done in sorted(probes.items())]
        fabric = [n.name for n in dcgm.fabric_nodes(self.cluster)]
        self.checks += [dcgm.fabric_result(n, done) for n, done in
                        sorted(self.on_all(list(dcgm.FABRIC_ARGV), fabric).items())] if fabric else []

    def nccl_single_node(self) -> None:
        """all_reduce_perf across each quiet GPU node's own GPUs, the network disabled (:mod:`nccl_node`)."""
        cfg = self.cluster.spec.verify.nccl
        nodes = {n.name: n for n in nccl_node.node_nodes(self.traffic()) if n.name not in self.lost}
        probes = self.remote.run_many({name: nccl_node.argv(n, cfg) for name, n in nodes.items()},
                                      timeout=nccl_node.TIMEOUT_S) if nodes else {}
        self.checks += [nccl_node.node_result(nodes[name], cfg, done) for name, done in sorted(probes.items())]

    def nccl(self) -> None:
        self.nccl_single_node()
        every = sorted(n.name for n in self.cluster.nodes_with_role("compute") if n.gpu_count)
        cluster = self.traffic()
        gpu_nodes = [n for n in every if n not in self.lost and n not in self.busy]
        if not gpu_nodes:
            self.checks.append(reach.unless_lost(CheckResult.could_not_run(nccl.CHECK, None, "no GPU compute nodes"),
                                                 every, self.lost))
            self.checks += reach.skipped(nccl.CHECK, every, self.lost)
            return
        result = self.run_nccl(cluster)
        busbw = result.measurements.get("busbw_gbps")
        self.nccl_busbw = float(busbw) if isinstance(busbw, int | float) else None
        self.checks.append(reach.unless_lost(result, every, self.lost))
        self.checks += reach.skipped(nccl.CHECK, every, self.lost)
        containers = self.cluster.spec.software.containers
        if containers is not None and containers.image:
            runner, has_tool = self._nccl_io()
            self.checks.append(reach.unless_lost(nccl.check_nccl_container(
                cluster, runner, containers.image, has_tool=has_tool, as_root=self.cluster.spec.ssh.user == "root",
                partitions=self.partitions), every, self.lost))

    def run_nccl(self, cluster: Cluster, settings: Sequence[str] = (), follow_ups: bool = True,
                 seen: Callable[[str], None] | None = None) -> CheckResult:
        """One NCCL check over ``cluster`` (see :func:`nccl.check_nccl`); ``seen`` gets each run's output."""
        runner, has_tool = self._nccl_io(seen)
        return nccl.check_nccl(cluster, runner, has_tool=has_tool, as_root=self.cluster.spec.ssh.user == "root",
                               launch=self.nccl_launch, partitions=self.partitions, settings=settings,
                               follow_ups=follow_ups)

    def _nccl_io(self, seen: Callable[[str], None] | None = None
                 ) -> tuple[NcclRunner, Callable[[str, str], bool]]:
        """How an NCCL run starts on its launcher host, and whether a launcher is there (asked once per host)."""
        def has_tool(host: str, tool: str) -> bool:
            if (host, tool) not in self._tools:
                done = self.remote.run_many({host: ["sh", "-c", f"command -v {tool}"]}, timeout=PROBE_TIMEOUT_S)[host]
                self._tools[host, tool] = done.rc == 0 and bool(done.stdout.strip())
            return self._tools[host, tool]

        def runner(hosts: Sequence[str], argv: Sequence[str], env: dict[str, str]) -> Completed:
            done = self.remote.run_many({hosts[0]: list(argv)}, timeout=NCCL_TIMEOUT_S, env=env)[hosts[0]]
            if seen is not None:
                seen(done.stdout)
            return done

        return runner, has_tool

    def cabling(self) -> None:
        """Node cables and inter-switch links from one node's ``iblinkinfo``; switch port counters from the same."""
        planned = switchlinks.plan(self.cluster)
        if not self.cluster.cables and not planned:
            self.checks.append(CheckResult.could_not_run(cabling.CHECK, None, "the spec lists no cabling"))
            return
        sm = self.cluster.spec.fabric.subnet_manager
        order = [s.node for s in (sm.nodes if sm else [])] + sorted(n.name for n in self.cluster.nodes)
        reasons = []
        for host in (h for h in dict.fromkeys(order) if h not in self.lost):  # first node that answers
            done = self.remote.run_many({host: ["iblinkinfo"]}, timeout=120)[host]
            parsed, why = _parsed("iblinkinfo", done)
            if parsed is not None:
                self.fabric_host = host
                self._fabric_view(host, parsed, planned)
                return
            reasons.append(f"{host}: {why}")
            if len(reasons) >= 3:
                break
        names = ([cabling.CHECK] if self.cluster.cables else []) + ([switchlinks.CHECK] if planned else [])
        self.checks += [CheckResult.could_not_run(n, None, "; ".join(reasons)) for n in names]

    def _fabric_view(self, host: str, parsed: dict[str, Any], planned: list[switchlinks.PlannedLink]) -> None:
        measured: dict[str, Value] = {"queried_on": host}
        if self.cluster.cables:
            found = cabling.cabling_findings(self.cluster, parsed)
            self.checks.append(CheckResult.from_findings(cabling.CHECK, None, found, measured))
        if planned:
            view = switchlinks.live_view(self.cluster, parsed)
            self.switch_view = switchlinks.compare(self.cluster, planned, view)
            self.uplinks = self.switch_view.uplinks
            self.checks.append(CheckResult.from_findings(
                switchlinks.CHECK, None, self.switch_view.findings,
                {**measured, "planned_links": len(planned), "live_links": len(view.links)}))
        self._switch_peers = switchlinks.port_peers(self.cluster, parsed)
        self._switch_counts = self._read_switch_ports(host)
        if self._switch_counts is not None:
            self._switch_ports_at = len(self.checks)
            self.checks.append(CheckResult.from_findings(
                switchports.CHECK, None,
                self._switch_gaps + switchports.port_findings(self._switch_counts, None, self._switch_peers),
                {**measured, "counters_read": "start"}))

    def _read_switch_ports(self, host: str) -> switchports.Counts | None:
        """Every switch port's error counters (``ibqueryerrors --switch``); None, with a could-not-run, on failure."""
        done = self.remote.run_many({host: switchports.COMMAND}, timeout=300)[host]
        parsed, why = _parsed("ibqueryerrors", done, with_stderr=True)
        if parsed is None or not parsed.get("complete"):
            tail = "; ".join(parsed["errors"] if parsed else [])
            why = why or f"no summary line: the sweep did not finish ({tail or 'no message'})"
            self.checks.append(CheckResult.could_not_run(switchports.CHECK, None, f"{host}: {why}"))
            return None
        self._switch_gaps = switchports.sweep_gaps(parsed)
        return switchports.read_counters(self.cluster, parsed)

    def switch_ports_again(self) -> None:
        """Re-read the switch port counters at the end; a port whose link_downed grew during the run fails."""
        if self._switch_counts is None or self._switch_ports_at is None or self.fabric_host is None:
            return
        done = self.remote.run_many({self.fabric_host: switchports.COMMAND}, timeout=300)[self.fabric_host]
        parsed, _ = _parsed("ibqueryerrors", done, with_stderr=True)
        if parsed is None or not parsed.get("complete"):
            self.notes.append(f"switch_ports: counters could not be re-read on {self.fabric_host} at the end")
            return
        after = switchports.read_counters(self.cluster, parsed)
        gaps = self._switch_gaps + [g for g in switchports.sweep_gaps(parsed) if g not in self._switch_gaps]
        self.checks[self._switch_ports_at] = CheckResult.from_findings(
            switchports.CHECK, None,
            gaps + switchports.port_findings(self._switch_counts, after, self._switch_peers),
            {"queried_on": self.fabric_host, "counters_read": "start and end"})

    # -- load across leaves ---------------------------------------------------------------------------------
    def load_round(self, numactl: Mapping[str, bool]) -> None:
        """Every port at once to a partner on another leaf (see :mod:`provisioner.fabric.load`)."""
        planned = switchlinks.plan(self.cluster)
        every = [n.name for n in bandwidth.bandwidth_nodes(self.cluster)]

        def once(cluster: Cluster) -> CheckResult | None:
            flows, notes = load.plan_flows(cluster, bandwidth.bandwidth_nodes(cluster), planned)
            self.notes.extend(n for n in notes if n not in self.notes)
            if not flows:
                return None
            runs = load.measure(flows, self._flow_runner(cluster, numactl))
            return load.judge(flows, runs, load.expected_gbps(cluster, flows, planned),
                              cluster.spec.verify.bandwidth.min_fraction, self._bad_ports(), self.uplinks)

        result = self._without_lost("fabric_load", once)
        if result is None:
            return
        self.checks.append(reach.unless_lost(result, every, self.lost))
        self.checks += reach.skipped(load.CHECK, every, self.lost)

    def _flow_runner(self, cluster: Cluster, numactl: Mapping[str, bool]) -> load.FlowRunner:
        cfg = cluster.spec.verify.bandwidth
        settings = PerftestSettings(size=cfg.message_size, duration=cfg.duration, server_grace_s=self.grace_s)

        def run(flow: load.Flow) -> PairRun:
            server, client = cluster.node(flow.dst), cluster.node(flow.src)
            s_port = next(p for p in server.ports if p.device == flow.dst_dev)
            c_port = next(p for p in client.ports if p.device == flow.src_dev)
            return run_pair(self.remote, (server.name, s_port, numactl.get(server.name, False)),
                            (client.name, c_port, numactl.get(client.name, False)), server.address, settings,
                            load.TCP_BASE + flow.dst_rail)

        return run

    def _bad_ports(self) -> set[tuple[str, str]]:
        """Ports the port-level checks named (an error or a warning): their slow flows in the load round are
        theirs, not the fabric's."""
        out: set[tuple[str, str]] = set()
        for c in self.checks:
            for f in c.findings:
                if f.severity in ("error", "warning") and f.node and f.device \
                        and f.check in (links.CHECK, "pairwise_bandwidth"):
                    out.add((f.node, f.device))
        return out

    # -- ipoib -------------------------------------------------------------------------------------------------
    def ipoib_check(self) -> None:
        """Every planned IPoIB interface (a spec that plans none never gets here: see the registry's ``needs``)."""
        self.checks += ipoib.check_ipoib(self.cluster, self.remote)

    # -- memlock ----------------------------------------------------------------------------------------------
    def memlock_check(self) -> None:
        """The locked-memory limit a job of ``verify.user`` gets on each GPU node (srun in its partition, else a
        runuser login): root's checks cannot see it (root is exempt)."""
        planned = {n: p for n, p in memlock.plan(self.cluster, self.job_partitions).items() if n not in self.lost}
        if not planned:
            return
        srun = {n: list(argv) for n, (argv, how) in planned.items() if how.startswith("srun")}
        login = {n: list(argv) for n, (argv, how) in planned.items() if n not in srun}
        done = self.remote.run_many(login, timeout=PROBE_TIMEOUT_S) if login else {}
        if srun:
            done.update(self.remote.run_many(srun, timeout=memlock.SRUN_TIMEOUT_S))
        self.checks += memlock.check_memlock(self.cluster, done, planned)

    # -- storage ----------------------------------------------------------------------------------------------
    def shared_storage(self) -> None:
        """The spec's mounts and exports (a spec that lists none never gets here: see the registry's ``needs``)."""
        self.checks += storage.check_storage(self.cluster, self.remote)


_RUN: dict[str, Callable[[_Verifier, str | None], None]] = {
    "links": lambda v, _mode: v.links(),
    "versions": lambda v, _mode: v.versions_check(),
    "pcie": lambda v, _mode: v.pcie_check(),
    "sm": lambda v, _mode: v.subnet_manager(),
    "ipoib": lambda v, _mode: v.ipoib_check(),
    "cabling": lambda v, _mode: v.cabling(),
    "dcgm": lambda v, _mode: v.dcgm_check(),
    "bandwidth": _Verifier.bandwidth_and_load,
    "gpudirect": lambda v, mode: v.gpudirect(v.numactl(), mode),
    "nccl": lambda v, _mode: v.nccl(),
    "memlock": lambda v, _mode: v.memlock_check(),
    "storage": lambda v, _mode: v.shared_storage(),
}
"""How the verifier runs each check of :data:`registry.CHECKS` (its ``--mode`` passed along); a unit test holds
the two to the same names."""

_REREAD: dict[str, Callable[[_Verifier], None]] = {
    "links": _Verifier.links_counters_again,
    "cabling": _Verifier.switch_ports_again,
}
"""Checks whose counters are read again once every check has run: what grew during the run fails."""


def write_reports(report: VerifyReport, directory: Path, inventory: Mapping[str, Mapping[str, str]]) -> None:
    """report.json, junit.xml, report.html and inventory.json under ``directory``; ``latest`` points at it.
    They hold what the nodes reported and their addresses: the directory and files are the operator's only."""
    private_dir(directory)
    write_text_atomic(directory / "report.json", to_json(report), mode=0o600)
    write_text_atomic(directory / "junit.xml", to_junit(report), mode=0o600)
    write_text_atomic(directory / "report.html", to_html(report), mode=0o600)
    write_text_atomic(directory / "inventory.json", json.dumps(inventory, indent=2, sort_keys=True) + "\n",
                      mode=0o600)
    symlink_atomic(directory.name, directory.parent / "latest")


def serving_partitions(cluster: Cluster, state_dir: Path | None) -> dict[str, str]:
    """node -> the Slurm partition it serves in now (the spec's membership with the recorded failovers applied)."""
    if cluster.spec.slurm is None:
        return {}
    serving = current_membership(cluster, state_dir_for(cluster.name, state_dir))
    return {n: parts[0] for n in serving.in_partitions if (parts := serving.partitions_of(n))}


def _run_checks(v: _Verifier, chosen: Sequence[str], lacking: Mapping[str, str], steps: Sequence[registry.Check],
                mode: str | None) -> None:
    """Each chosen check in run order (one with nothing to check in this spec could not run), then the port
    counters read again in the same order: the nodes', then the switches'."""
    for check in (registry.BY_NAME[name] for name in chosen or lacking):
        if check.name in lacking:
            v.checks.append(CheckResult.could_not_run(check.results[0], None, lacking[check.name]))
            continue
        v.progress(registry.progress_label(check, v.cluster, mode))
        _RUN[check.name](v, mode)
    for check in steps:
        if check.name in _REREAD:
            if check.reread_label:
                v.progress(check.reread_label)
            _REREAD[check.name](v)


def verify(
    cluster: Cluster,
    *,
    tests: Iterable[str] | None = None,
    progress: Progress = _quiet,
    remote: Remote | None = None,
    state_dir: Path | None = None,
    mode: str | None = None,
    write: bool = True,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    server_grace_s: float = 0.5,
    nccl_launcher: str = "auto",
    include_busy: bool = False,
) -> VerifyRun:
    """Run the selected checks and write the reports; see the module docstring.

    ``nccl_launcher`` (:data:`provisioner.fabric.nccl.LAUNCHES`): ``auto`` starts the NCCL check with srun on the
    nodes Slurm serves in a partition now (the spec's membership with the recorded failovers applied). Where Slurm
    runs, no traffic check (:attr:`registry.Check.traffic`) sends anything to a node running a job unless
    ``include_busy``:
    those results could not run there, naming the jobs."""
    chosen = select_tests(cluster, tests)
    # a check asked for by name with nothing to check in this spec (sm on RoCE, storage without mounts) could not
    # run; so could each one the spec lists when dropping them leaves a run without --only nothing to check
    lacking = dict(registry.emptied(cluster)) if not chosen else {
        name: why for name in chosen if (why := registry.unmet(registry.BY_NAME[name], cluster)) is not None}
    steps = [registry.BY_NAME[name] for name in chosen if name not in lacking]
    started = now()
    own = remote is None
    rem: Remote = remote if remote is not None else SshRemote(targets_from_cluster(cluster))
    traffic = [c.name for c in steps if c.traffic]
    serving = serving_partitions(cluster, state_dir) if traffic or any(c.name == "memlock" for c in steps) else {}
    partitions = serving if traffic else {}
    v = _Verifier(cluster, rem, progress, server_grace_s, nccl_launcher,
                  partitions if nccl_launcher != "mpirun" else {}, job_partitions=serving)
    try:
        if any(c.every_node for c in steps):  # sm and cabling ask one node that answers; the rest every node
            progress("ssh: every node answers (a node that does not is reported once and left out)")
            v.reach()
        if partitions and not include_busy:
            progress("slurm: which nodes run jobs (no traffic is sent to them)")
            v.find_busy([n for n in partitions if n not in v.lost])
        _run_checks(v, chosen, lacking, steps, mode)
    finally:
        if own and isinstance(rem, SshRemote):
            rem.close()
    gpu_nodes = {n.name for n in dcgm.dcgm_nodes(cluster)}
    for name in traffic:  # what was not measured on a node running jobs: could not run there, with the jobs
        v.checks += [CheckResult.could_not_run(registry.BY_NAME[name].results[0], node, why)
                     for node, why in sorted(v.busy.items()) if name != "dcgm" or node in gpu_nodes]
    finished = now()
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    root = state_dir_for(cluster.name, state_dir) / "verify"
    base_path = root / "baseline.json"
    size = cluster.spec.verify.bandwidth.message_size
    drift = baseline.compare(baseline.load(base_path), v.matrix, size, v.nccl_busbw)
    checks = causes.fold(reach.settle(links.blame_flapping_ends(v.checks, cluster), v.lost))
    if not checks:  # a run that checked nothing has not passed
        checks.append(CheckResult.could_not_run("verify", None, f"no check gave a result ({', '.join(chosen)})"
                                                if chosen else "the spec's verify.tests names no check"))
    if v.matrix or v.nccl_busbw is not None:
        checks.append(CheckResult.from_findings(baseline.CHECK, None, drift))
    peers = {node: group for group, nodes in peer_groups(cluster).items() for node in nodes}
    picture = fabric_picture.build(cluster, checks, switchlinks.plan(cluster), v.switch_view, v.lost)
    report = VerifyReport(cluster=cluster.name, started=started, finished=finished, checks=tuple(checks),
                          bandwidth=v.matrix, line_rate=v.line_rate, versions=v.versions, notes=tuple(v.notes),
                          peers=peers, fabric=picture)
    directory = None
    if write:
        directory = root / stamp
        write_reports(report, directory, v.inventory)
        doc = baseline.make_baseline(v.matrix, size, v.versions, v.nccl_busbw, started.isoformat())
        if "bandwidth" in chosen and baseline.store_if_first(base_path, doc, report.verdict.exit_code == 0):
            progress(f"baseline stored: {base_path}")
    progress(f"verify: {report.verdict.label}")
    return VerifyRun(report=report, directory=directory, inventory=v.inventory)


def run_verify(cluster: Cluster, tests: Iterable[str] | None = None, progress: Progress = _quiet,
               **kwargs: Any) -> VerifyReport:
    """The report of :func:`verify` (the files are written as a side effect)."""
    return verify(cluster, tests=tests, progress=progress, **kwargs).report


def findings_text(findings: Iterable[Finding]) -> str:
    """One line per finding, for a plain-text console summary."""
    return "\n".join(f"{f.severity.upper():7s} {f.location()}: {f.message}" for f in findings)


@dataclass(frozen=True)
class TuneRun:
    """What `provision tune` measured (``settings[0]`` are NCCL's defaults), or why it could not run."""

    settings: list[tune.Setting]
    error: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        return 2 if self.error is not None else 0


def tune_nccl(cluster: Cluster, *, knobs: Sequence[str] | None = None, repeats: int = tune.DEFAULT_REPEATS,
              progress: Progress = _quiet, remote: Remote | None = None, state_dir: Path | None = None,
              nccl_launcher: str = "auto", include_busy: bool = False) -> TuneRun:
    """Sweep :data:`tune.KNOBS` over the GPU compute nodes the way the NCCL check runs (the same groups and
    launchers, no follow-ups), leaving out nodes that cannot be reached or run Slurm jobs, and changing nothing."""
    rem: Remote = remote if remote is not None else SshRemote(targets_from_cluster(cluster))
    partitions = serving_partitions(cluster, state_dir) if nccl_launcher != "mpirun" else {}
    v = _Verifier(cluster, rem, progress, 0.5, nccl_launcher, partitions)
    settings = tune.plan(knobs)
    try:
        v.reach()
        if partitions and not include_busy:
            v.find_busy([n for n in partitions if n not in v.lost])
        left_out = [f"{n}: {why}" for n, why in sorted({**v.lost, **v.busy}.items())]
        for note in left_out:
            progress(f"left out {note}")

        def measure(env: Mapping[str, str]) -> tune.Sample:
            outputs: list[str] = []
            result = v.run_nccl(v.traffic(), [f"{k}={val}" for k, val in env.items()], follow_ups=False,
                                seen=outputs.append)
            if result.error is not None:
                raise _CouldNotRun(result.error + (f" (left out: {'; '.join(left_out)})" if left_out else ""))
            busbw = result.measurements.get("busbw_gbps")
            why = "; ".join(f.message for f in result.findings if f.severity == "error")
            return tune.Sample(float(busbw) if isinstance(busbw, int | float) else None, why,
                               tune.taken("\n".join(outputs)))

        tune.sweep(settings, measure, repeats, progress)
    except _CouldNotRun as exc:
        return TuneRun([s for s in settings if s.samples], str(exc), tuple(v.notes))
    finally:
        if remote is None and isinstance(rem, SshRemote):
            rem.close()
    return TuneRun(settings, None, tuple([*v.notes, *(f"left out {n}" for n in left_out)]))


class _CouldNotRun(Exception):
    """The all-reduce could not start at all (no launcher, no two nodes, Slurm refused): the sweep stops."""


# ---------------------------------------------------------------------------------------------------------
# the commands: `provision verify` and `provision tune` from a spec file

def check_launcher(nccl_launcher: str) -> None:
    """--nccl-launcher is one of nccl.LAUNCHES (a UsageError before any SSH)."""
    if nccl_launcher not in nccl.LAUNCHES:
        raise UsageError(f"--nccl-launcher {nccl_launcher}: use {', '.join(nccl.LAUNCHES)}")


def verify_spec(spec: Path, overlay: Path | None = None, *, only: str | None = None, mode: str | None = None,
                state_dir: Path | None = None, nccl_launcher: str = "auto", include_busy: bool = False,
                junit: Path | None = None, html: Path | None = None, progress: Progress = _quiet,
                warn: Callable[[list[Diagnostic]], None] = lambda _d: None) -> VerifyRun:
    """`provision verify`: the options checked before any SSH (UsageError), the spec loaded once (its warnings
    to ``warn``), the checks run under the run lock (not during a run), the extra JUnit/HTML reports written."""
    if mode not in (None, "quick", "full"):
        raise UsageError(f"--mode {mode}: use quick or full")
    check_launcher(nccl_launcher)
    # a wrong name, or none (--only , / --only ""), fails before any SSH
    tests = registry.parse_only(only.split(",")) if only is not None else None
    cluster, warnings = load_cluster(spec, overlay)
    warn(warnings)
    with run_lock(state_dir_for(cluster.name, state_dir), command="provision verify"):  # not during a run
        run = verify(cluster, tests=tests, mode=mode, state_dir=state_dir, nccl_launcher=nccl_launcher,
                     include_busy=include_busy, progress=progress)
    if junit:
        junit.write_text(to_junit(run.report), encoding="utf-8")
    if html:
        html.write_text(to_html(run.report), encoding="utf-8")
    return run


def tune_spec(spec: Path, overlay: Path | None = None, *, knobs: str | None = None,
              repeats: int = tune.DEFAULT_REPEATS, state_dir: Path | None = None, nccl_launcher: str = "auto",
              include_busy: bool = False, progress: Progress = _quiet,
              warn: Callable[[list[Diagnostic]], None] = lambda _d: None) -> TuneRun:
    """`provision tune`: the options checked first (UsageError), the spec loaded once (its warnings to ``warn``),
    the sweep run under the run lock (not during a run)."""
    check_launcher(nccl_launcher)
    try:
        names = tune.parse_knobs(knobs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cluster, warnings = load_cluster(spec, overlay)
    warn(warnings)
    with run_lock(state_dir_for(cluster.name, state_dir), command="provision tune"):  # not during a run
        return tune_nccl(cluster, knobs=names, repeats=repeats, state_dir=state_dir, nccl_launcher=nccl_launcher,
                         include_busy=include_busy, progress=progress)
