"""``provision verify``: measure the cluster over SSH, judge it against the spec, write the reports.

Data flows one way: spec → remote probes → parsers → checks (pure functions) → findings → report files.
Every check is a pure function of parsed tool output and the :class:`Cluster`; this module only decides
what to run where, in parallel, and turns "could not run" into results of its own (a dead node is news, not
a crash). Exit codes come from :class:`provisioner.fabric.findings.Verdict`: 0 pass, 1 findings, 2 could not
run.

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
from typing import Any

from provisioner.errors import ParseError, UsageError
from provisioner.fabric import bandwidth, baseline, cabling, gpudirect, links, nccl, sm_verify, storage, versions
from provisioner.fabric.findings import CheckResult, Finding, Value
from provisioner.fabric.nhc import export_nhc
from provisioner.fabric.perftest import PerftestSettings
from provisioner.fabric.sm import SmInfo, sminfo_result
from provisioner.parsers import parse
from provisioner.remote import Completed, Remote, SshRemote, targets_from_cluster
from provisioner.report import VerifyReport, to_html, to_json, to_junit
from provisioner.spec.cluster import Cluster, Node
from provisioner.state import symlink_atomic, write_text_atomic

__all__ = ["ALL_TESTS", "VerifyRun", "export_nhc", "run_verify", "verify", "write_reports"]

ALL_TESTS = ("links", "versions", "sm", "bandwidth", "gpudirect", "nccl", "cabling", "storage")
PROBE_TIMEOUT_S = 30.0
NCCL_TIMEOUT_S = 900.0

Progress = Callable[[str], None]


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
    """The tests to run: ``--only`` if given (validated), else the spec's list (versions go with links)."""
    if only is not None:
        chosen = [t.strip() for t in only if t.strip()]
        unknown = sorted(set(chosen) - set(ALL_TESTS))
        if unknown:
            raise UsageError(f"unknown test(s): {', '.join(unknown)}", hint=f"choose from {', '.join(ALL_TESTS)}")
        return [t for t in ALL_TESTS if t in chosen]
    wanted: set[str] = set(cluster.spec.verify.tests)
    if "links" in wanted:
        wanted.update(("versions", "sm"))
    if not storage.expected_mounts(cluster):
        wanted.discard("storage")  # on by default, but a spec without NFS/Lustre mounts has nothing to check
    return [t for t in ALL_TESTS if t in wanted]


def _parsed(tool: str, done: Completed) -> tuple[dict[str, Any] | None, str]:
    """Parsed output, or None and the reason (unreachable, timeout, not that tool's output)."""
    if done.unreachable:
        return None, done.stderr.strip() or "unreachable"
    if done.timed_out:
        return None, f"{tool} timed out"
    try:
        return parse(tool, done.stdout), ""
    except ParseError as exc:
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        return None, f"{exc.message}" + (f" (stderr: {tail})" if tail else "") + f" [exit {done.rc}]"


class _Verifier:
    """One run's state: the remote, the cluster, what was measured so far."""

    def __init__(self, cluster: Cluster, remote: Remote, progress: Progress, grace_s: float) -> None:
        self.cluster = cluster
        self.remote = remote
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

    def on_all(self, argv: Sequence[str], nodes: Sequence[str] | None = None) -> dict[str, Completed]:
        names = list(nodes) if nodes is not None else [n.name for n in self.cluster.nodes]
        return self.remote.run_many({n: list(argv) for n in names}, timeout=PROBE_TIMEOUT_S)

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
        nodes = [n for n in self.cluster.nodes if n.name in self._links_at and self._counters.get(n.name)]
        if not nodes:
            return
        done = self.on_all(["sh", "-c", links.COUNTERS_SCRIPT], [n.name for n in nodes])
        for node in nodes:
            after = links.parse_counters(done[node.name].stdout)
            if not after:
                self.notes.append(f"links: port counters of {node.name} could not be re-read at the end of the run")
                continue
            self.checks[self._links_at[node.name]] = self._links_result(node, after)

    def versions_check(self) -> None:
        observed: dict[str, dict[str, str | None]] = {}
        unreachable: set[str] = set()
        comps_by_node = {n.name: versions.components_for(self.cluster, bool(n.gpu_count)) for n in self.cluster.nodes}
        for comp, argv in versions.PROBES.items():
            nodes = [n for n, comps in comps_by_node.items() if comp in comps]
            for node, done in self.on_all(argv, nodes).items():
                if done.unreachable:
                    unreachable.add(node)
                    continue
                observed.setdefault(node, {})[comp] = versions.read_version(comp, done.stdout) if done.rc == 0 else None
        fw = {n: links.firmware(obs) for n, obs in self.ibstat().items()}
        found = versions.version_findings(self.cluster, observed) + versions.firmware_findings(fw)
        for node in sorted(comps_by_node):
            if node in unreachable:
                self.checks.append(CheckResult.could_not_run(versions.CHECK, node, "unreachable"))
                continue
            mine = [f for f in found if f.node == node]
            self.checks.append(CheckResult.from_findings(versions.CHECK, node, mine))
            row = {c: v for c, v in observed.get(node, {}).items() if v is not None}
            row.update({f"firmware {d}": v for d, v in fw.get(node, {}).items()})
            self.versions[node] = row

    def subnet_manager(self) -> None:
        """``sminfo`` (the master) and ``sminfo <lid>`` per spec SM node, asked from one node that answered."""
        if not any(p.link_layer == "infiniband" for n in self.cluster.nodes for p in n.ports):
            return  # Ethernet/RoCE: no subnet manager to check
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

    # -- bandwidth, gpudirect, nccl ----------------------------------------------------------------------
    def numactl(self) -> dict[str, bool]:
        done = self.on_all(["sh", "-c", "command -v numactl"])
        return {n: d.rc == 0 and bool(d.stdout.strip()) for n, d in done.items()}

    def bandwidth(self, numactl: Mapping[str, bool], mode: str | None) -> None:
        cfg = self.cluster.spec.verify.bandwidth
        settings = PerftestSettings(size=cfg.message_size, duration=cfg.duration, server_grace_s=self.grace_s)
        out = bandwidth.check_bandwidth(
            self.cluster, bandwidth.ssh_runner(self.remote, self.cluster, numactl, settings), mode=mode)
        self.checks.append(out.result)
        self.matrix = out.matrix
        self.line_rate = out.line_rate
        self.notes += out.notes

    def gpudirect(self, numactl: Mapping[str, bool], mode: str | None) -> None:
        nodes = [n.name for n in gpudirect.gpu_nodes(self.cluster)]
        lsmod = {n: _parsed("lsmod", d)[0] for n, d in self.on_all(["lsmod"], nodes).items()}
        smi = self.on_all(["nvidia-smi", "topo", "-m"], nodes)
        topo = {n: _parsed("nvidia-smi-topo", d)[0] for n, d in smi.items()}
        cfg = self.cluster.spec.verify.bandwidth
        settings = PerftestSettings(size=cfg.message_size, duration=cfg.duration, server_grace_s=self.grace_s)
        runner = bandwidth.ssh_runner(self.remote, self.cluster, numactl, settings, use_cuda=True,
                                      cuda_gpu=gpudirect.nic_gpus(self.cluster, topo))
        self.checks += gpudirect.check_gpudirect(self.cluster, lsmod, topo, runner, mode)

    def nccl(self) -> None:
        gpu_nodes = sorted(n.name for n in self.cluster.nodes_with_role("compute") if n.gpu_count)
        if not gpu_nodes:
            self.checks.append(CheckResult.could_not_run(nccl.CHECK, None, "no GPU compute nodes"))
            return
        probe = self.remote.run_many({gpu_nodes[0]: ["sh", "-c", "command -v mpirun"]}, timeout=PROBE_TIMEOUT_S)
        has_mpirun = probe[gpu_nodes[0]].rc == 0 and bool(probe[gpu_nodes[0]].stdout.strip())

        def runner(hosts: Sequence[str], argv: Sequence[str], env: dict[str, str]) -> Completed:
            return self.remote.run_many({hosts[0]: list(argv)}, timeout=NCCL_TIMEOUT_S, env=env)[hosts[0]]

        result = nccl.check_nccl(self.cluster, runner, mpirun=has_mpirun,
                                 as_root=self.cluster.spec.ssh.user == "root")
        busbw = result.measurements.get("busbw_gbps")
        self.nccl_busbw = float(busbw) if isinstance(busbw, int | float) else None
        self.checks.append(result)

    def cabling(self) -> None:
        if not self.cluster.cables:
            self.checks.append(CheckResult.could_not_run(cabling.CHECK, None, "the spec lists no cabling"))
            return
        sm = self.cluster.spec.fabric.subnet_manager
        order = [s.node for s in (sm.nodes if sm else [])] + sorted(n.name for n in self.cluster.nodes)
        reasons = []
        for host in dict.fromkeys(order):  # first node that answers
            done = self.remote.run_many({host: ["iblinkinfo"]}, timeout=120)[host]
            parsed, why = _parsed("iblinkinfo", done)
            if parsed is not None:
                found = cabling.cabling_findings(self.cluster, parsed)
                self.checks.append(CheckResult.from_findings(cabling.CHECK, None, found, {"queried_on": host}))
                return
            reasons.append(f"{host}: {why}")
            if len(reasons) >= 3:
                break
        self.checks.append(CheckResult.could_not_run(cabling.CHECK, None, "; ".join(reasons)))


    # -- storage ----------------------------------------------------------------------------------------------
    def shared_storage(self) -> None:
        if not storage.expected_mounts(self.cluster):
            self.checks.append(CheckResult.could_not_run(storage.CHECK, None, "the spec lists no NFS or Lustre mounts"))
            return
        self.checks += storage.check_storage(self.cluster, self.remote)


def write_reports(report: VerifyReport, directory: Path, inventory: Mapping[str, Mapping[str, str]]) -> None:
    """report.json, junit.xml, report.html and inventory.json under ``directory``; ``latest`` points at it."""
    write_text_atomic(directory / "report.json", to_json(report))
    write_text_atomic(directory / "junit.xml", to_junit(report))
    write_text_atomic(directory / "report.html", to_html(report))
    write_text_atomic(directory / "inventory.json", json.dumps(inventory, indent=2, sort_keys=True) + "\n")
    symlink_atomic(directory.name, directory.parent / "latest")


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
) -> VerifyRun:
    """Run the selected checks and write the reports; see the module docstring."""
    chosen = select_tests(cluster, tests)
    started = now()
    own = remote is None
    rem: Remote = remote if remote is not None else SshRemote(targets_from_cluster(cluster))
    v = _Verifier(cluster, rem, progress, server_grace_s)
    try:
        if "links" in chosen:
            progress("links: ibstat on every node")
            v.links()
        if "versions" in chosen:
            progress("versions: driver, CUDA, NCCL, OFED, firmware")
            v.versions_check()
        if "sm" in chosen:
            progress("sm: the spec's master SM is master, every planned SM answers (sminfo)")
            v.subnet_manager()
        numactl = v.numactl() if {"bandwidth", "gpudirect"} & set(chosen) else {}
        if "bandwidth" in chosen:
            progress(f"bandwidth: ib_write_bw per rail ({mode or cluster.spec.verify.bandwidth.mode} mode)")
            v.bandwidth(numactl, mode)
        if "gpudirect" in chosen:
            progress("gpudirect: nvidia_peermem, GPU–NIC affinity, ib_write_bw --use_cuda")
            v.gpudirect(numactl, mode)
        if "nccl" in chosen:
            progress("nccl: all_reduce_perf across the compute nodes")
            v.nccl()
        if "cabling" in chosen:
            progress("cabling: iblinkinfo against the spec's cabling")
            v.cabling()
        if "storage" in chosen:
            progress("storage: mounts, a file round trip, the exports (user space where no kernel client)")
            v.shared_storage()
        if "links" in chosen:
            progress("links: port counters again (a port whose link_downed grew during the run fails)")
            v.links_counters_again()
    finally:
        if own and isinstance(rem, SshRemote):
            rem.close()
    finished = now()
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    root = (state_dir or Path(".provision") / cluster.name) / "verify"
    base_path = root / "baseline.json"
    size = cluster.spec.verify.bandwidth.message_size
    drift = baseline.compare(baseline.load(base_path), v.matrix, size, v.nccl_busbw)
    checks = [*v.checks]
    if v.matrix or v.nccl_busbw is not None:
        checks.append(CheckResult.from_findings(baseline.CHECK, None, drift))
    report = VerifyReport(cluster=cluster.name, started=started, finished=finished, checks=tuple(checks),
                          bandwidth=v.matrix, line_rate=v.line_rate, versions=v.versions, notes=tuple(v.notes))
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
