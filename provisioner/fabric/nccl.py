"""NCCL all-reduce across the compute nodes, judged on bus bandwidth at the largest size and on what NCCL used.

The figure that matters is the *largest-size* bus bandwidth (the "Avg bus bandwidth" line averages in the
latency-bound small sizes and reads far lower). When it misses ``spec.verify.nccl.min_busbw_gbps`` (or the
run fails), two-node follow-up runs planned by the pairwise scheduler name the slow node or pair.

Launch: nccl-tests built with ``MPI=1`` under Open MPI's ``mpirun`` on the first node: a hostfile of the
nodes' addresses with ``slots=<GPUs>``, ``--map-by ppr:<GPUs>:node`` and one rank per GPU (``-g 1``), every
daemon started from the launcher (``--mca plm_rsh_no_tree_spawn 1``: only the launcher needs SSH trust to the
others). ``NCCL_DEBUG=INFO`` with ``NCCL_DEBUG_SUBSYS=INIT,NET`` makes every rank print the HCAs NCCL selected
(``NET/IB : Using [0]mlx5_0:1/IB ... ; OOB ...``); a node whose selection differs from the spec's rails is named.
The run must have ``nodes x GPUs`` ranks: an nccl-tests built without MPI under mpirun runs one job per rank.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import replace

from provisioner.errors import ParseError
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.schedule import PairResult, Round, judge, run_quick, verdict_findings
from provisioner.parsers import parse
from provisioner.remote import Completed
from provisioner.spec.cluster import Cluster, Node
from provisioner.spec.rules import full_pkey, nccl_pkey

CHECK = "nccl"

#: Runs ``argv`` with ``env`` on the first of ``hosts`` (the launcher host) and returns what it printed.
NcclRunner = Callable[[Sequence[str], Sequence[str], dict[str, str]], Completed]

DEBUG_ENV = ("NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET")
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+\S+\s+device\s+\d+", re.M)
_USING = re.compile(r"^(?P<host>[^:\s]+):\d+:\d+ \[\d+\] NCCL INFO NET/IB : Using(?P<devs>.*?);\s*OOB ", re.M)
_NO_IB = re.compile(r"^(?P<host>[^:\s]+):\d+:\d+ \[\d+\] NCCL INFO NET/IB : No device found", re.M)
_DEV = re.compile(r"\[\d+\]\s?([A-Za-z0-9_.+-]+):(\d+)/(?:IB|RoCE)")
_WARN = re.compile(r"^\S+:\d+:\d+ \[\d+\] \S+ NCCL WARN (.*)$", re.M)


def perf_argv(max_bytes: str) -> list[str]:
    return ["all_reduce_perf", "-b", "8", "-e", max_bytes, "-f", "2", "-g", "1"]


def mpirun_argv(hostfile: str, nodes: int, gpus_per_node: int, max_bytes: str, *, as_root: bool,
                ssh_port: int = 22) -> list[str]:
    """Open MPI's mpirun over ``hostfile``: one rank per GPU, ``gpus_per_node`` ranks on every node."""
    argv = ["mpirun", "--hostfile", hostfile, "-np", str(nodes * gpus_per_node),
            "--map-by", f"ppr:{gpus_per_node}:node", "--bind-to", "none", "--mca", "plm_rsh_no_tree_spawn", "1"]
    if ssh_port != 22:
        argv += ["--mca", "plm_rsh_args", f"-p {ssh_port}"]
    if as_root:
        argv.insert(1, "--allow-run-as-root")
    for setting in DEBUG_ENV:
        argv += ["-x", setting]
    return [*argv, *perf_argv(max_bytes)]


def hostfile_text(addresses: Sequence[str], gpus_per_node: int) -> str:
    return "".join(f"{a} slots={gpus_per_node}\n" for a in addresses)


def launch(addresses: Sequence[str], gpus_per_node: int, max_bytes: str, *, as_root: bool,
           ssh_port: int = 22) -> list[str]:
    """``sh -c`` on the launcher: write the hostfile to a private temp file, run mpirun, remove the file."""
    marker = "@HOSTFILE@"
    command = shlex.join(mpirun_argv(marker, len(addresses), gpus_per_node, max_bytes, as_root=as_root,
                                     ssh_port=ssh_port))
    script = (f"f=$(mktemp) || exit 1; trap 'rm -f \"$f\"' EXIT; "
              f"printf %s {shlex.quote(hostfile_text(addresses, gpus_per_node))} > \"$f\" || exit 1; "
              + command.replace(marker, '"$f"'))
    return ["sh", "-c", script]


def observed_ranks(stdout: str) -> int | None:
    """Ranks of the job: distinct rank numbers in the ``#  Rank N ...`` rows (an nccl-tests built without MPI
    under mpirun prints one table per process, each with its own rank 0)."""
    ranks = {int(m.group(1)) for m in _RANK.finditer(stdout)}
    return len(ranks) or None


def selected_rails(stdout: str) -> dict[str, set[tuple[str, int]]]:
    """host -> the (device, port) NCCL said it uses (``NET/IB : Using ...``; empty after ``No device found``)."""
    out: dict[str, set[tuple[str, int]]] = {}
    for m in _USING.finditer(stdout):
        out.setdefault(m.group("host"), set()).update((d, int(p)) for d, p in _DEV.findall(m.group("devs")))
    for m in _NO_IB.finditer(stdout):
        out.setdefault(m.group("host"), set())
    return out


def _rails_text(rails: set[tuple[str, int]] | Sequence[tuple[str, int]]) -> str:
    return ",".join(f"{d}:{p}" for d, p in sorted(rails, key=lambda r: (len(r[0]), r))) or "none (sockets)"


def rail_findings(nodes: Sequence[Node], stdout: str) -> list[Finding]:
    """One error per node whose NCCL selection is not the spec's rail ports."""
    seen = selected_rails(stdout)
    by_name = {n.name: n for n in nodes} | {n.name.split(".")[0]: n for n in nodes}
    found = []
    for host, rails in sorted(seen.items()):
        node = by_name.get(host) or by_name.get(host.split(".")[0])
        if node is None:
            continue
        want = {(p.device, p.port) for p in node.rail_ports}
        if rails != want:
            found.append(Finding(
                CHECK, "error", node.name, None, None, _rails_text(want), _rails_text(rails),
                f"NCCL on {node.name} uses {_rails_text(rails)}, not the spec's rails {_rails_text(want)}",
                "NCCL_IB_HCA takes one leading '=' (exact) or '^' (exclude) for the whole list: "
                "=mlx5_0:1,mlx5_1:1; check /etc/nccl.conf, ~/.nccl.conf and the job environment on the node, "
                "and that every rail port is Active"))
    return found


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


def pkey_groups(cluster: Cluster, nodes: Sequence[Node]) -> list[tuple[str, list[Node]]]:
    """The nodes by the P_Key their NCCL traffic uses, each with a label (``tenant_a (P_Key 0x8001)``).

    The nccl role points NCCL_IB_PKEY at the first partition a GPU node is a full member of (the default
    partition otherwise), and a queue pair only talks to one with the same partition (IBA P_Key matching): a
    job spanning two groups cannot connect. So NCCL is run the way jobs can run, one all-reduce per group."""
    by_key: dict[str | None, list[Node]] = {}
    for n in nodes:
        by_key.setdefault(nccl_pkey(cluster, n), []).append(n)
    names = {full_pkey(p.pkey): p.name for p in cluster.spec.fabric.partitions}
    return [(f"{names.get(key, 'partition')} (P_Key {key})" if key else "the default partition", group)
            for key, group in by_key.items()]


def check_nccl(cluster: Cluster, runner: NcclRunner, *, mpirun: bool, as_root: bool) -> CheckResult:
    """All-reduce across the GPU compute nodes, one run per P_Key group (:func:`pkey_groups`); on a miss,
    pairwise follow-ups name the slow node or pair."""
    nodes = sorted((n for n in cluster.nodes_with_role("compute") if n.gpu_count), key=lambda n: n.name)
    if len(nodes) < 2:
        return CheckResult.could_not_run(CHECK, None, f"needs two GPU compute nodes, found {len(nodes)}")
    if not mpirun:
        return CheckResult.could_not_run(CHECK, None, f"no mpirun on {nodes[0].name}: multi-node nccl-tests need "
                                         "an MPI launcher (the nccl role installs Open MPI, nccl_mpi_install)")
    groups = pkey_groups(cluster, nodes)
    if len(groups) == 1:
        return _check_group(cluster, nodes, runner, as_root=as_root)
    runnable = [(label, group) for label, group in groups if len(group) >= 2]
    if not runnable:
        return CheckResult.could_not_run(CHECK, None, "no two GPU compute nodes share a partition for NCCL: "
                                         + "; ".join(f"{', '.join(n.name for n in g)} in {label}"
                                                     for label, g in groups))
    findings: list[Finding] = []
    measurements: dict[str, float | int | str | None] = {"nodes": len(nodes), "groups": len(groups)}
    figures: list[float | None] = []
    for label, group in groups:
        names = ", ".join(n.name for n in group)
        if len(group) < 2:
            findings.append(Finding(CHECK, "info", group[0].name, None, None, "another node in its partition",
                                    label, f"{names}: the only GPU node whose NCCL traffic uses {label}; "
                                    "no multi-node all-reduce can include it", ""))
            continue
        part = _check_group(cluster, group, runner, as_root=as_root)
        findings += [replace(f, message=f"{label}: {f.message}") for f in part.findings]
        busbw = part.measurements.get("busbw_gbps")
        measurements[f"busbw_gbps {label}"] = busbw
        figures.append(float(busbw) if isinstance(busbw, int | float) else None)
    # the cluster's figure (the baseline's) is the slowest group's; none when any group's run failed
    measurements["busbw_gbps"] = None if None in figures else min(f for f in figures if f is not None)
    return CheckResult.from_findings(CHECK, None, findings, measurements)


def _check_group(cluster: Cluster, nodes: Sequence[Node], runner: NcclRunner, *, as_root: bool) -> CheckResult:
    cfg = cluster.spec.verify.nccl
    gpus = min(n.gpu_count for n in nodes)
    names = [n.name for n in nodes]
    address = {n.name: n.address for n in nodes}
    outputs: dict[tuple[str, ...], Completed] = {}

    def busbw_of(hosts: Sequence[str]) -> tuple[float | None, str]:
        argv = launch([address[h] for h in hosts], gpus, cfg.max_bytes, as_root=as_root,
                      ssh_port=cluster.spec.ssh.port)
        done = runner(hosts, argv, {})
        outputs[tuple(hosts)] = done
        return read_busbw(done)

    busbw, why = busbw_of(names)
    whole = outputs[tuple(names)]
    nranks = observed_ranks(whole.stdout)
    want_ranks = len(names) * gpus
    floor = cfg.min_busbw_gbps
    measurements: dict[str, float | int | str | None] = {"nodes": len(names), "busbw_gbps": busbw,
                                                         "max_bytes": cfg.max_bytes, "nranks": nranks}
    findings: list[Finding] = []
    if nranks is not None and nranks != want_ranks:
        findings.append(Finding(CHECK, "error", None, None, None, want_ranks, nranks,
                                f"all_reduce_perf ran with {nranks} ranks, not {len(names)} nodes x {gpus} GPUs "
                                f"= {want_ranks}",
                                "nccl-tests must be built with MPI=1 against the MPI that launches it; without "
                                "MPI every rank runs a job of its own"))
    findings += rail_findings(nodes, whole.stdout)
    warns = sorted({m.group(1).strip() for m in _WARN.finditer(whole.stdout)})
    if busbw is not None and (floor is None or busbw >= floor) and not why and not findings:
        extra = [Finding(CHECK, "warning", None, None, None, None, w, f"NCCL warned: {w}", "") for w in warns]
        return CheckResult.from_findings(CHECK, None, extra, measurements)
    if busbw is None:
        findings.append(Finding(CHECK, "error", None, None, None, "a completed run", why,
                                f"all_reduce_perf over {len(names)} nodes failed: {why}",
                                "see the per-pair follow-ups below; NCCL_DEBUG=INFO on a 2-node run shows the "
                                "transport NCCL picked"))
    elif why:
        findings.append(Finding(CHECK, "error", None, None, None, "0 wrong results", why,
                                f"all_reduce_perf reported {why}", "a node corrupts data: run the pair follow-ups"))
    elif floor is not None and busbw < floor:
        findings.append(Finding(CHECK, "error", None, None, None, floor, busbw,
                                f"all-reduce bus bandwidth {busbw:.1f} GB/s at {cfg.max_bytes} is below "
                                f"{floor:g} GB/s over {len(names)} nodes",
                                "check GPUDirect (nvidia_peermem), NCCL_IB_HCA and the rails; the pair "
                                "follow-ups name the slow node"))
    findings += [Finding(CHECK, "warning", None, None, None, None, w, f"NCCL warned: {w}", "") for w in warns]
    if busbw is None or why or (floor is not None and busbw < floor):
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
