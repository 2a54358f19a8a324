"""NCCL all-reduce across the compute nodes, judged on bus bandwidth at the largest size.

The figure that matters is the *largest-size* bus bandwidth (the "Avg bus bandwidth" line averages in the
latency-bound small sizes and reads far lower). When it misses ``spec.verify.nccl.min_busbw_gbps`` (or the
run fails), two-node follow-up runs planned by the pairwise scheduler name the slow node or pair.

Launch: ``mpirun`` when it exists on the first node (one rank per GPU, ``-g 1``); otherwise the lab's
launcher convention, ``NCCL_TESTS_HOSTS=a,b,c`` and ``NCCL_TESTS_PROCS_PER_HOST`` in the environment of one
``all_reduce_perf`` (that is what the simulated nccl-tests read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from provisioner.errors import ParseError
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.schedule import PairResult, Round, judge, run_quick, verdict_findings
from provisioner.parsers import parse
from provisioner.remote import Completed
from provisioner.spec.cluster import Cluster

CHECK = "nccl"

#: Runs ``argv`` with ``env`` on the first of ``hosts`` (the launcher host) and returns what it printed.
NcclRunner = Callable[[Sequence[str], Sequence[str], dict[str, str]], Completed]


def perf_argv(max_bytes: str) -> list[str]:
    return ["all_reduce_perf", "-b", "8", "-e", max_bytes, "-f", "2", "-g", "1"]


def launch(
    hosts: Sequence[str], gpus_per_node: int, max_bytes: str, *, mpirun: bool, as_root: bool
) -> tuple[list[str], dict[str, str]]:
    """argv and env for a run over ``hosts`` (one rank per GPU)."""
    if mpirun:
        argv = ["mpirun", "-np", str(len(hosts) * gpus_per_node),
                "-H", ",".join(f"{h}:{gpus_per_node}" for h in hosts), "--bind-to", "none",
                "-x", "NCCL_DEBUG=WARN"]
        if as_root:
            argv.insert(1, "--allow-run-as-root")
        return [*argv, *perf_argv(max_bytes)], {}
    env = {"NCCL_TESTS_HOSTS": ",".join(hosts), "NCCL_TESTS_PROCS_PER_HOST": str(gpus_per_node)}
    return perf_argv(max_bytes), env


def read_busbw(done: Completed) -> tuple[float | None, str]:
    """Bus bandwidth (GB/s) at the largest size, or None and why (failure text, wrong results)."""
    try:
        parsed = parse("nccl-tests", done.stdout)
    except ParseError:
        tail = " | ".join(ln.strip() for ln in (done.stderr or done.stdout).strip().splitlines()[-2:])
        return None, ("timed out" if done.timed_out else f"exit {done.rc}") + (f": {tail}" if tail else "")
    largest = parsed.get("largest") or {}
    busbw = largest.get("busbw_gbs")
    if not parsed.get("ok", True) or done.rc != 0:
        errs = "; ".join(parsed.get("errors", [])) or f"exit {done.rc}"
        return None, errs
    if busbw is None:
        return None, "no result rows"
    wrong = sum(int(r.get("wrong") or 0) for r in parsed.get("rows", []) if isinstance(r.get("wrong"), int))
    return float(busbw), (f"{wrong} wrong results" if wrong else "")


def check_nccl(cluster: Cluster, runner: NcclRunner, *, mpirun: bool, as_root: bool) -> CheckResult:
    """All-reduce across every GPU compute node; on a miss, pairwise follow-ups name the slow node or pair."""
    cfg = cluster.spec.verify.nccl
    nodes = sorted((n for n in cluster.nodes_with_role("compute") if n.gpu_count), key=lambda n: n.name)
    if len(nodes) < 2:
        return CheckResult.could_not_run(CHECK, None, f"needs two GPU compute nodes, found {len(nodes)}")
    gpus = min(n.gpu_count for n in nodes)
    names = [n.name for n in nodes]

    def busbw_of(hosts: Sequence[str]) -> tuple[float | None, str]:
        argv, env = launch(hosts, gpus, cfg.max_bytes, mpirun=mpirun, as_root=as_root)
        return read_busbw(runner(hosts, argv, env))

    busbw, why = busbw_of(names)
    floor = cfg.min_busbw_gbps
    measurements: dict[str, float | int | str | None] = {"nodes": len(names), "busbw_gbps": busbw,
                                                         "max_bytes": cfg.max_bytes}
    findings: list[Finding] = []
    if busbw is not None and (floor is None or busbw >= floor) and not why:
        return CheckResult.from_findings(CHECK, None, [], measurements)
    if busbw is None:
        findings.append(Finding(CHECK, "error", None, None, None, "a completed run", why,
                                f"all_reduce_perf over {len(names)} nodes failed: {why}",
                                "see the per-pair follow-ups below; NCCL_DEBUG=INFO on a 2-node run shows the "
                                "transport NCCL picked"))
    elif why:
        findings.append(Finding(CHECK, "error", None, None, None, "0 wrong results", why,
                                f"all_reduce_perf reported {why}", "a node corrupts data: run the pair follow-ups"))
    else:
        assert floor is not None
        findings.append(Finding(CHECK, "error", None, None, None, floor, busbw,
                                f"all-reduce bus bandwidth {busbw:.1f} GB/s at {cfg.max_bytes} is below "
                                f"{floor:g} GB/s over {len(names)} nodes",
                                "check GPUDirect (nvidia_peermem), NCCL_IB_HCA and the rails; the pair "
                                "follow-ups name the slow node"))
    findings += follow_up(names, busbw_of, floor)
    return CheckResult.from_findings(CHECK, None, findings, measurements)


def follow_up(
    names: Sequence[str], busbw_of: Callable[[Sequence[str]], tuple[float | None, str]], floor: float | None
) -> list[Finding]:
    """Two-node runs planned by the scheduler (quick mode on one pseudo-rail) to name the slow node or pair."""
    if len(names) < 3:
        return []  # a 2-node run is already the pair
    pairs_seen: dict[tuple[str, str], float | None] = {}

    def measure(rnd: Round, rails: Sequence[int]) -> list[PairResult]:
        out = []
        for pair in rnd.pairs:
            bw, why = busbw_of([pair.server, pair.client])
            pairs_seen[pair.key] = bw
            expected = floor if floor is not None else max([v for v in pairs_seen.values() if v] or [1.0])
            res = judge(pair, 0, bw if not why else None, expected, 1.0)
            out.append(replace(res, detail=why or res.detail))
        return out

    _, loc = run_quick(names, [0], measure)
    found = [
        replace(f, check=CHECK, rail=None, device=None,
                message=f.message.replace(" rail 0", "").replace("port is bad", "node is slow in NCCL"))
        for f in verdict_findings(loc)
    ]
    found += [
        Finding(CHECK, "info", a, None, None, floor, bw, f"2-node all-reduce {a} + {b}: "
                + (f"{bw:.1f} GB/s" if bw is not None else "failed"), "", peer=b)
        for (a, b), bw in sorted(pairs_seen.items())
    ]
    return found
