"""Pairwise RDMA bandwidth per rail: the scheduler plans the pairs, ``ib_write_bw`` measures, localisation names.

Quick mode (the default) tests every port once and, when a pair is slow, re-pairs the suspects with
known-good nodes so the bad port or link is named (see :mod:`provisioner.fabric.schedule`). Full mode tests
every pair. A pair passes at ``spec.verify.bandwidth.min_fraction`` × the rail's line rate (the spec's port
rate; the slower end's when they differ).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.perftest import BASE_TCP_PORT, PairRun, PerftestSettings, run_pair
from provisioner.fabric.schedule import (
    Localisation,
    PairResult,
    Round,
    judge,
    localise,
    plan_full,
    run_quick,
    verdict_findings,
)
from provisioner.remote import Remote
from provisioner.spec.cluster import Cluster, Node, Port

CHECK = "bandwidth"
MAX_PARALLEL = 16

#: Runs one pair on one rail: (server, client, rail) → outcome. Injected so tests need no perftest.
PairRunner = Callable[[str, str, int], PairRun]


@dataclass
class BandwidthOutcome:
    """What the bandwidth check produced: the result, the per-rail matrix, the line rates and the rounds."""

    result: CheckResult
    matrix: dict[int, dict[tuple[str, str], float]] = field(default_factory=dict)
    line_rate: dict[int, float] = field(default_factory=dict)
    rounds: list[Round] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def rail_port(node: Node, rail: int) -> Port | None:
    return next((p for p in node.rail_ports if p.rail == rail), None)


def bandwidth_nodes(cluster: Cluster) -> list[Node]:
    """Compute nodes with rail ports: the ones jobs run on (service nodes' ports are checked by links)."""
    return [n for n in cluster.nodes_with_role("compute") if n.rail_ports]


def rail_groups(nodes: Sequence[Node]) -> dict[tuple[str, ...], list[int]]:
    """Rails grouped by the nodes that have them, so each group is scheduled once for all its rails."""
    by_rail: dict[int, list[str]] = defaultdict(list)
    for n in nodes:
        for p in n.rail_ports:
            if p.rail is not None:
                by_rail[p.rail].append(n.name)
    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for rail, names in sorted(by_rail.items()):
        groups[tuple(sorted(names))].append(rail)
    return dict(groups)


def line_rates(nodes: Sequence[Node]) -> dict[int, float]:
    """Expected per-port rate per rail: the slowest spec rate among the rail's ports."""
    rates: dict[int, float] = {}
    for n in nodes:
        for p in n.rail_ports:
            if p.rail is not None:
                rates[p.rail] = min(rates.get(p.rail, p.rate_gbps), p.rate_gbps)
    return rates


def make_measure(
    runner: PairRunner, rates: Mapping[int, float], min_fraction: float, sink: list[PairResult]
) -> Callable[[Round, Sequence[int]], list[PairResult]]:
    """The scheduler's ``measure``: every pair × rail of a round at once (bounded), judged against the floor."""

    def measure(rnd: Round, rails: Sequence[int]) -> list[PairResult]:
        jobs = [(p, r) for p in rnd.pairs for r in rails]
        if not jobs:
            return []
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(jobs))) as pool:
            runs = list(pool.map(lambda job: runner(job[0].server, job[0].client, job[1]), jobs))
        results = []
        for (pair, rail), run in zip(jobs, runs, strict=True):
            res = judge(pair, rail, run.gbps, rates[rail], min_fraction)
            if run.detail:
                res = replace(res, detail=run.detail if res.gbps is None else f"{res.detail}; {run.detail}")
            results.append(res)
        sink.extend(results)
        return results

    return measure


def run_schedule(
    names: Sequence[str], rails: Sequence[int], measure: Callable[[Round, Sequence[int]], list[PairResult]],
    mode: str,
) -> tuple[list[Round], Localisation]:
    """Quick (round 1 + localisation) or full (every pair) over one group of rails."""
    if mode == "full":
        rounds = plan_full(names)
        results: list[PairResult] = []
        for rnd in rounds:
            results.extend(measure(rnd, list(rails)))
        return rounds, localise(results, nodes=names, rails=rails)
    return run_quick(names, rails, measure)


def pair_detail_findings(results: Sequence[PairResult], devices: Mapping[int, str]) -> list[Finding]:
    """One info line per failed pair with what perftest said (timeouts, errors, the figure)."""
    return [
        Finding(CHECK, "info", r.pair.server, devices.get(r.rail), None, "pass", r.detail or "failed",
                f"{r.pair.server} → {r.pair.client} rail {r.rail}: "
                + (f"{r.gbps:.1f} Gb/s" if r.gbps is not None else "no result")
                + (f" ({r.detail})" if r.detail else ""),
                "see the localisation findings for the port or link at fault", rail=r.rail, peer=r.pair.client)
        for r in results if not r.passed
    ]


def unexplained_failures(
    results: Sequence[PairResult], verdicts: Sequence[Finding], devices: Mapping[int, str]
) -> list[Finding]:
    """An error per rail whose failed pairs no localisation error explains (e.g. nothing passed at all).

    Localisation only convicts with evidence; a rail where every pair failed yields "unknown" warnings, yet
    the fabric is certainly not at line rate, so the check must fail.
    """
    explained = {f.rail for f in verdicts if f.severity == "error"}
    failed: dict[int, list[PairResult]] = defaultdict(list)
    for r in results:
        if not r.passed:
            failed[r.rail].append(r)
    total = defaultdict(int, {rail: sum(1 for r in results if r.rail == rail) for rail in failed})
    return [
        Finding(CHECK, "error", None, devices.get(rail), None, "every pair at line rate",
                f"{len(bad)} of {total[rail]} pairs failed",
                f"rail {rail}: {len(bad)} of {total[rail]} pairs failed and no single port or link explains it "
                f"(first: {bad[0].pair.server} → {bad[0].pair.client}: {bad[0].detail or 'failed'})",
                "a rail-wide cause (switch, subnet manager, expected rate, perftest missing) is likely; see the "
                "notes and the per-pair lines", rail=rail)
        for rail, bad in sorted(failed.items()) if rail not in explained
    ]


def check_bandwidth(cluster: Cluster, runner: PairRunner, mode: str | None = None) -> BandwidthOutcome:
    """Run the bandwidth check with ``runner`` doing each measurement; pure apart from what runner does."""
    cfg = cluster.spec.verify.bandwidth
    mode = mode or cfg.mode
    nodes = bandwidth_nodes(cluster)
    rates = line_rates(nodes)
    devices = {r: p.device for n in nodes for p in n.rail_ports if p.rail is not None for r in [p.rail]}
    outcome = BandwidthOutcome(result=CheckResult.from_findings(CHECK, None, []), line_rate=rates)
    if len(nodes) < 2:
        why = f"needs two compute nodes with rails, found {len(nodes)}"
        outcome.result = CheckResult.could_not_run(CHECK, None, why)
        return outcome
    findings: list[Finding] = []
    measured: list[PairResult] = []
    for names, rails in sorted(rail_groups(nodes).items()):
        if len(names) < 2:
            outcome.notes.append(f"rails {rails}: only {names[0]} has them; no pair to test")
            continue
        rounds, loc = run_schedule(names, rails, make_measure(runner, rates, cfg.min_fraction, measured), mode)
        outcome.rounds += rounds
        outcome.notes += list(loc.notes)
        findings += verdict_findings(loc, device_by_rail=devices)
    findings += unexplained_failures(measured, findings, devices)
    findings += pair_detail_findings(measured, devices)
    if measured and all(r.gbps is None and "exit 127" in r.detail for r in measured):
        outcome.result = CheckResult.could_not_run(CHECK, None, "ib_write_bw is not installed (exit 127 everywhere); "
                                                   "install perftest on the nodes")
        return outcome
    for res in measured:
        if res.gbps is not None:
            outcome.matrix.setdefault(res.rail, {})[(res.pair.server, res.pair.client)] = res.gbps
    passed = sum(1 for r in measured if r.passed)
    outcome.result = CheckResult.from_findings(
        CHECK, None, findings,
        {"mode": mode, "pairs_tested": len(measured), "pairs_passed": passed, "rounds": len(outcome.rounds),
         "min_fraction": cfg.min_fraction},
    )
    return outcome


def ssh_runner(
    remote: Remote, cluster: Cluster, numactl: Mapping[str, bool], settings: PerftestSettings | None = None,
    *, use_cuda: bool = False, cuda_gpu: Mapping[tuple[str, str], int] | None = None, cuda_dmabuf: bool = False,
) -> PairRunner:
    """A :data:`PairRunner` that runs ib_write_bw over ``remote`` (TCP port 18515 + rail).

    With ``use_cuda`` each end uses the GPU ``cuda_gpu[(node, device)]`` (from ``nvidia-smi topo -m``), else
    the spec's ``gpu:`` of that port; ``cuda_dmabuf`` registers it through DMA-BUF (``--use_cuda_dmabuf``).
    """
    cfg = cluster.spec.verify.bandwidth
    st = settings or PerftestSettings(size=cfg.message_size, duration=cfg.duration)

    def run(server: str, client: str, rail: int) -> PairRun:
        s_node, c_node = cluster.node(server), cluster.node(client)
        s_port, c_port = rail_port(s_node, rail), rail_port(c_node, rail)
        if s_port is None or c_port is None:
            return PairRun(None, f"rail {rail} missing on {server if s_port is None else client} in the spec")
        gpus = cuda_gpu or {}
        s_gpu, c_gpu = gpus.get((server, s_port.device), s_port.gpu), gpus.get((client, c_port.device), c_port.gpu)
        cuda = (s_gpu, c_gpu) if use_cuda and s_gpu is not None and c_gpu is not None else None
        return run_pair(remote, (server, s_port, numactl.get(server, False)),
                        (client, c_port, numactl.get(client, False)), s_node.address, st,
                        BASE_TCP_PORT + rail, use_cuda=cuda, cuda_dmabuf=cuda_dmabuf and cuda is not None)

    return run
