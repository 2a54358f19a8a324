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

Where Slurm runs the nodes (``slurm:`` in the spec), nodes in a partition are tested the way their jobs start: one
``srun --mpi=pmix`` job step per partition (``--exclusive``, so no job shares the nodes while NCCL measures, and
``--immediate``: busy or drained nodes make the check *could not run*, with Slurm's reason, never a slow-node
verdict). Open MPI 4.1 initialises from the PMIx server srun starts (docs.open-mpi.org "Launching with Slurm");
nothing is started over SSH on nodes Slurm may have given to a job. Nodes in no partition (spares) hold no jobs and
are tested among themselves under mpirun; rolling and failover verification use mpirun throughout, since the nodes
they test are drained or in no partition, where srun cannot start (:data:`LAUNCHES`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from provisioner.errors import ParseError
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.schedule import PairResult, Round, judge, run_quick, verdict_findings
from provisioner.parsers import parse
from provisioner.remote import Completed
from provisioner.spec import expected, hostlist
from provisioner.spec.cluster import Cluster, Node
from provisioner.spec.models import NcclCheck
from provisioner.spec.rules import full_pkey, nccl_pkey

CHECK = "nccl"
EFFICIENCY_KEYS = ("expected_busbw_gbps", "expected_from", "efficiency", "floor_gbps", "floor_from")
"""What :func:`efficiency` adds to a run's measurements (per group, suffixed with its label, when several ran)."""

#: Runs ``argv`` with ``env`` on the first of ``hosts`` (the launcher host) and returns what it printed.
NcclRunner = Callable[[Sequence[str], Sequence[str], dict[str, str]], Completed]

DEBUG_ENV = ("NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET")


def debug_env(settings: Sequence[str] = ()) -> tuple[str, ...]:
    """NCCL's debug settings, then ``settings`` (``NAME=value``, e.g. from `provision tune`): with settings, the ENV
    subsystem too, so every rank says which it took ("NCCL_ALGO set by environment to Ring", src/misc/param.cc)."""
    if not settings:
        return DEBUG_ENV
    return ("NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET,ENV", *settings)
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+\S+\s+device\s+\d+", re.M)
_USING = re.compile(r"^(?P<host>[^:\s]+):\d+:\d+ \[\d+\] NCCL INFO NET/IB : Using(?P<devs>.*?);\s*OOB ", re.M)
_NO_IB = re.compile(r"^(?P<host>[^:\s]+):\d+:\d+ \[\d+\] NCCL INFO NET/IB : No device found", re.M)
_DEV = re.compile(r"\[\d+\]\s?([A-Za-z0-9_.+-]+):(\d+)/(?:IB|RoCE)")
_WARN = re.compile(r"^\S+:\d+:\d+ \[\d+\] \S+ NCCL WARN (.*)$", re.M)


def perf_argv(max_bytes: str) -> list[str]:
    return ["all_reduce_perf", "-b", "8", "-e", max_bytes, "-f", "2", "-g", "1"]


def mpirun_argv(hostfile: str, nodes: int, gpus_per_node: int, max_bytes: str, *, as_root: bool,
                ssh_port: int = 22, settings: Sequence[str] = ()) -> list[str]:
    """Open MPI's mpirun over ``hostfile``: one rank per GPU, ``gpus_per_node`` ranks on every node."""
    argv = ["mpirun", "--hostfile", hostfile, "-np", str(nodes * gpus_per_node),
            "--map-by", f"ppr:{gpus_per_node}:node", "--bind-to", "none", "--mca", "plm_rsh_no_tree_spawn", "1"]
    if ssh_port != 22:
        argv += ["--mca", "plm_rsh_args", f"-p {ssh_port}"]
    if as_root:
        argv.insert(1, "--allow-run-as-root")
    for setting in debug_env(settings):
        argv += ["-x", setting]
    return [*argv, *perf_argv(max_bytes)]


#: ``--nccl-launcher`` choices: ``auto`` is srun for nodes in a Slurm partition, mpirun for the rest.
LAUNCHES = ("auto", "srun", "mpirun")
SRUN_WAIT_S = 60
"""srun ``--immediate``: how long the job may wait for its nodes before the check says it could not run."""
SRUN_TIME_MIN = 15
"""srun ``--time`` (minutes): a step that hangs is ended by Slurm, not left holding the nodes."""
# srun could not get the nodes, or could not reach slurmctld: no task ran (srun(1); captured on Debian 12's Slurm
# 22.05, docs/lab-hardware-model.md "Slurm")
_SRUN_NO_ALLOCATION = re.compile(r"srun: error: (Unable to allocate resources: .*|Unable to contact slurm controller.*"
                                 r"|Invalid partition name specified.*)$", re.M)
_SRUN_NODE_UNAVAILABLE = re.compile(r"^srun: (Required node not available \(down, drained or reserved\))$", re.M)
_SRUN_NO_MPI = re.compile(r"^srun: error: (.*(?:mpi/pmix|Invalid MPI type).*)$", re.M)
CONTAINER_CHECK = "nccl_container"
# The container never ran the test: srun without pyxis does not know --container-image (srun's "unrecognized
# option"), pyxis could not import or start the image, or the image has no all_reduce_perf (slurmstepd's execve()
# error). pyxis's lines as in NVIDIA/pyxis issue 127 (tests/fixtures/nccl/pyxis_import_failed.txt).
_CONTAINER_NOT_RUN = re.compile(
    r"^(?:srun|slurmstepd(?:-\S+)?): (?:error: )?(unrecognized option '--container-image[^']*'"
    r"|pyxis: (?:failed to import docker image|couldn't start container|container start failed.*)"
    r"|execve\(\): all_reduce_perf: No such file or directory)$", re.M)


@dataclass(frozen=True)
class Launcher:
    """How one all-reduce starts: ``mpirun`` over SSH from the first node, or ``srun`` in a Slurm partition."""

    kind: str  # "mpirun" | "srun"
    partition: str | None = None
    gres: bool = False
    image: str | None = None
    """srun only: run the ranks in this container image (pyxis's ``--container-image``)."""

    @property
    def tool(self) -> str:
        return self.kind


MPIRUN = Launcher("mpirun")


def srun_argv(names: Sequence[str], gpus_per_node: int, max_bytes: str, launcher: Launcher,
              settings: Sequence[str] = ()) -> list[str]:
    """One srun job step over ``names`` (Slurm's node names are the spec's): a rank per GPU, PMIx for MPI_Init.

    NCCL's debug settings go in the environment srun exports (its default, ``--export=ALL``): ``--export`` itself
    splits on commas, and NCCL_DEBUG_SUBSYS holds one."""
    argv = ["env", *debug_env(settings), "srun", "--mpi=pmix", "--job-name=provisioner-nccl",
            f"--nodelist={','.join(names)}", f"--nodes={len(names)}", f"--ntasks-per-node={gpus_per_node}",
            "--exclusive", f"--immediate={SRUN_WAIT_S}", f"--time={SRUN_TIME_MIN}", "--kill-on-bad-exit=1"]
    if launcher.partition:
        argv.append(f"--partition={launcher.partition}")
    if launcher.gres:
        argv.append(f"--gres=gpu:{gpus_per_node}")
    if launcher.image:
        argv.append(f"--container-image={launcher.image}")
    return [*argv, *perf_argv(max_bytes)]


def srun_not_started(done: Completed) -> str | None:
    """Why srun ran no task (no allocation, no controller), from its own lines; None when the step started."""
    text = f"{done.stderr}\n{done.stdout}"
    found = [m.group(1).strip() for m in _SRUN_NODE_UNAVAILABLE.finditer(text)]
    found += [m.group(1).strip() for m in _SRUN_NO_ALLOCATION.finditer(text)]
    return "; ".join(dict.fromkeys(found)) or None


def container_not_run(done: Completed) -> str | None:
    """Why the container never ran all_reduce_perf (no pyxis, import or start failed, no test in the image)."""
    found = [m.group(1).strip() for m in _CONTAINER_NOT_RUN.finditer(f"{done.stderr}\n{done.stdout}")]
    return "; ".join(dict.fromkeys(found)) or None


def srun_without_mpi(done: Completed) -> str | None:
    """srun could not load its MPI plugin (the step never started its ranks)."""
    found = [m.group(1).strip() for m in _SRUN_NO_MPI.finditer(f"{done.stderr}\n{done.stdout}")]
    return "; ".join(dict.fromkeys(found)) or None


def hostfile_text(addresses: Sequence[str], gpus_per_node: int) -> str:
    return "".join(f"{a} slots={gpus_per_node}\n" for a in addresses)


def launch(addresses: Sequence[str], gpus_per_node: int, max_bytes: str, *, as_root: bool,
           ssh_port: int = 22, settings: Sequence[str] = ()) -> list[str]:
    """``sh -c`` on the launcher: write the hostfile to a private temp file, run mpirun, remove the file."""
    marker = "@HOSTFILE@"
    command = shlex.join(mpirun_argv(marker, len(addresses), gpus_per_node, max_bytes, as_root=as_root,
                                     ssh_port=ssh_port, settings=settings))
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


def launch_groups(cluster: Cluster, nodes: Sequence[Node], launch: str,
                  partitions: Mapping[str, str]) -> list[tuple[str, list[Node], Launcher]]:
    """The all-reduces to run: one per P_Key group (:func:`pkey_groups`), split by how they start.

    ``partitions`` is node -> the Slurm partition it serves in now (empty without Slurm). ``auto`` starts the
    nodes of a partition with srun, the rest with mpirun; ``srun`` and ``mpirun`` start every group that way."""
    slurm = cluster.spec.slurm
    out: list[tuple[str, list[Node], Launcher]] = []
    for label, group in pkey_groups(cluster, nodes):
        if launch == "mpirun" or (launch == "auto" and (slurm is None or not partitions)):
            out.append((label, group, MPIRUN))
            continue
        by_part: dict[str | None, list[Node]] = {}
        for n in group:
            by_part.setdefault(partitions.get(n.name), []).append(n)
        for part, members in by_part.items():
            if part is None:
                kind = MPIRUN if launch == "auto" else Launcher("srun")
                out.append((f"{label}, in no Slurm partition", members, kind))
            else:
                out.append((f"{label}, Slurm partition {part}", members,
                            Launcher("srun", part, bool(slurm and slurm.gres))))
    return out


def check_nccl(cluster: Cluster, runner: NcclRunner, *, has_tool: Callable[[str, str], bool], as_root: bool,
               launch: str = "mpirun", partitions: Mapping[str, str] | None = None, settings: Sequence[str] = (),
               follow_ups: bool = True) -> CheckResult:
    """All-reduce across the GPU compute nodes, one run per P_Key group and launcher (:func:`launch_groups`);
    on a miss, pairwise follow-ups name the slow node or pair. ``has_tool(host, tool)``: is the launcher there.
    ``settings`` (``NAME=value``) go to every rank's environment; `provision tune` runs without ``follow_ups``."""
    run = Run(runner, has_tool, as_root=as_root, settings=tuple(settings), follow_ups=follow_ups)
    nodes = sorted((n for n in cluster.nodes_with_role("compute") if n.gpu_count), key=lambda n: n.name)
    if len(nodes) < 2:
        return CheckResult.could_not_run(CHECK, None, f"needs two GPU compute nodes, found {len(nodes)}")
    groups = launch_groups(cluster, nodes, launch, partitions or {})
    runnable = [g for g in groups if len(g[1]) >= 2]
    if not runnable:
        return CheckResult.could_not_run(CHECK, None, "no two GPU compute nodes share a partition for NCCL: "
                                         + "; ".join(f"{', '.join(n.name for n in g)} in {label}"
                                                     for label, g, _ in groups))
    if len(groups) == 1:
        label, group, launcher = groups[0]
        return _launch_group(cluster, group, run, launcher, label=label)
    findings: list[Finding] = []
    measurements: dict[str, float | int | str | None] = {"nodes": len(nodes), "groups": len(groups)}
    figures: list[float | None] = []
    unrun: list[str] = []
    for label, group, launcher in groups:
        names = ", ".join(n.name for n in group)
        if len(group) < 2:
            alone = (f"{names} is the only GPU node of {label}: srun cannot start where Slurm schedules no job, "
                     "and mpirun would share nodes with jobs; `provision failover` tests a spare against a peer "
                     "before it takes a place") if launcher.kind == "mpirun" and partitions else (
                f"{names}: the only GPU node whose NCCL traffic uses {label}; no multi-node all-reduce can "
                "include it")
            findings.append(Finding(CHECK, "info", group[0].name, None, None, "another node in its group",
                                    label, alone, ""))
            continue
        part = _launch_group(cluster, group, run, launcher, label=label)
        if part.error is not None:
            unrun.append(f"{label}: {part.error}")
            continue
        findings += [f if f.message.startswith(label) else replace(f, message=f"{label}: {f.message}")
                     for f in part.findings]
        busbw = part.measurements.get("busbw_gbps")
        for key in ("busbw_gbps", *EFFICIENCY_KEYS, "launcher"):
            measurements[f"{key} {label}"] = part.measurements.get(key)
        figures.append(float(busbw) if isinstance(busbw, int | float) else None)
    if unrun:
        # a group that could not run leaves the cluster unproven: that is the verdict unless another group failed
        if not any(f.severity == "error" for f in findings):
            measured = [f"{k.removeprefix('busbw_gbps ')} {v:.1f} GB/s" for k, v in measurements.items()
                        if k.startswith("busbw_gbps ") and isinstance(v, int | float)]
            return CheckResult.could_not_run(CHECK, None, "; ".join(unrun) + (
                f" (measured: {'; '.join(measured)})" if measured else ""))
        findings += [Finding(CHECK, "warning", None, None, None, "a run", "could not run", f"could not run: {u}", "")
                     for u in unrun]
    # the cluster's figure (the baseline's) is the slowest group's; none when any group's run failed
    measurements["busbw_gbps"] = None if None in figures or not figures else min(f for f in figures if f is not None)
    return CheckResult.from_findings(CHECK, None, findings, measurements)


def check_nccl_container(cluster: Cluster, runner: NcclRunner, image: str, *, has_tool: Callable[[str, str], bool],
                         as_root: bool, partitions: Mapping[str, str]) -> CheckResult:
    """The NCCL check once more inside ``image`` (pyxis's ``srun --container-image``): one run over the largest
    group of GPU compute nodes in one Slurm partition, no follow-ups, judged and reported like the plain run with
    the image in its label. Could not run, never a fabric finding, when no partition holds two such nodes or the
    container never ran the test (:func:`container_not_run`)."""
    nodes = sorted((n for n in cluster.nodes_with_role("compute") if n.gpu_count), key=lambda n: n.name)
    groups = [g for g in launch_groups(cluster, nodes, "srun", partitions) if g[2].partition and len(g[1]) >= 2]
    if not groups:
        return CheckResult.could_not_run(CONTAINER_CHECK, None, "no two GPU compute nodes serve in one Slurm "
                                         "partition: pyxis starts containers only in srun's job steps")
    label, group, launcher = max(groups, key=lambda g: len(g[1]))
    label = f"in container {image}, {label}"
    run = Run(runner, has_tool, as_root=as_root, follow_ups=False)
    result = _launch_group(cluster, group, run, replace(launcher, image=image), label=label)
    figures = {f"{k} {label}": result.measurements[k] for k in ("busbw_gbps", *EFFICIENCY_KEYS)
               if k in result.measurements}
    rest = {k: v for k, v in result.measurements.items() if k not in ("busbw_gbps", *EFFICIENCY_KEYS)}
    return replace(result, name=CONTAINER_CHECK, measurements={**rest, **figures, "image": image},
                   findings=tuple(replace(f, check=CONTAINER_CHECK) for f in result.findings))


@dataclass(frozen=True)
class Run:
    """How the all-reduces of one check start: the runner, the launcher probe, and what every rank gets."""

    runner: NcclRunner
    has_tool: Callable[[str, str], bool]
    as_root: bool
    settings: tuple[str, ...] = ()
    follow_ups: bool = True


def _launch_group(cluster: Cluster, nodes: Sequence[Node], run: Run, launcher: Launcher, *, label: str
                  ) -> CheckResult:
    first = nodes[0].name
    if not run.has_tool(first, launcher.tool):
        what = ("an MPI launcher (the nccl role installs Open MPI, nccl_mpi_install)" if launcher.kind == "mpirun"
                else "Slurm's srun (the slurm role installs slurm-client)")
        return CheckResult.could_not_run(CHECK, None, f"no {launcher.tool} on {first}: multi-node nccl-tests need "
                                         + what)
    return _check_group(cluster, nodes, run, launcher, label=label)


def efficiency(nodes: Sequence[Node], cfg: NcclCheck, busbw: float | None) -> dict[str, float | str | None]:
    """The run's expected figure, efficiency and floor (:mod:`provisioner.spec.expected`), as measurements."""
    want = expected.inter_node(nodes)
    floor, source = expected.floor(cfg.min_busbw_gbps, want, cfg.min_fraction)
    return {"expected_busbw_gbps": want.busbw_gbps if want else None, "expected_from": want.why if want else None,
            "efficiency": round(busbw / want.busbw_gbps, 3) if want and busbw is not None else None,
            "floor_gbps": floor, "floor_from": source}


def _below_floor(label: str, names: Sequence[str], busbw: float, cfg: NcclCheck,
                 eff: Mapping[str, float | str | None]) -> Finding:
    want, ratio = eff["expected_busbw_gbps"], eff["efficiency"]
    expected_text = (f"; expected {want:g} GB/s from {eff['expected_from']}, {ratio:.0%} of it"
                     if isinstance(want, float) and isinstance(ratio, float) else "")
    return Finding(CHECK, "error", None, None, None, eff["floor_gbps"], busbw,
                   f"{label}: all-reduce bus bandwidth {busbw:.1f} GB/s at {cfg.max_bytes} over {len(names)} nodes "
                   f"is below the floor {eff['floor_gbps']:g} GB/s ({eff['floor_from']}){expected_text}",
                   "check GPUDirect (nvidia_peermem), NCCL_IB_HCA and the rails; the pair follow-ups name the "
                   "slow node; with every link and pair healthy, `provision tune` looks for NCCL settings")


def _srun_failed(whole: Completed, names: Sequence[str], launcher: Launcher) -> CheckResult | None:
    """The result of an srun step that never ran the test (no nodes, no MPI plugin, no container); None when it
    ran."""
    if (why := srun_not_started(whole)) is not None:
        return CheckResult.could_not_run(
            CHECK, None, f"srun could not start the all-reduce on {hostlist.compress(names)} within "
            f"{SRUN_WAIT_S} s: {why} (a node running jobs, drained or down; `provision verify "
            "--nccl-launcher mpirun` tests over SSH instead, sharing the nodes with what runs there)")
    if launcher.image and (why := container_not_run(whole)) is not None:
        return CheckResult.could_not_run(
            CHECK, None, f"the container {launcher.image} did not run all_reduce_perf on {hostlist.compress(names)}:"
            f" {why} (pyxis and enroot on the nodes, the image and its nccl-tests: not the fabric)")
    if (why := srun_without_mpi(whole)) is not None:
        return CheckResult.from_findings(CHECK, None, [Finding(
            CHECK, "error", None, None, None, "srun --mpi=pmix starts MPI ranks", why,
            f"srun cannot start MPI ranks on {hostlist.compress(names)}: {why}",
            "no MPI job starts under srun on these nodes: Debian's mpi/pmix plugin needs libpmix-dev "
            "(slurm_pmix_packages) and slurmd restarted after it is installed")],
            {"nodes": len(names), "busbw_gbps": None, "launcher": "srun"})
    return None


def _check_group(cluster: Cluster, nodes: Sequence[Node], run: Run, launcher: Launcher, *, label: str
                 ) -> CheckResult:
    cfg = cluster.spec.verify.nccl
    gpus = min(n.gpu_count for n in nodes)
    names = [n.name for n in nodes]
    address = {n.name: n.address for n in nodes}
    outputs: dict[tuple[str, ...], Completed] = {}

    def start(hosts: Sequence[str]) -> Completed:
        if launcher.kind == "srun":
            argv = srun_argv(hosts, gpus, cfg.max_bytes, launcher, run.settings)
        else:
            argv = launch([address[h] for h in hosts], gpus, cfg.max_bytes, as_root=run.as_root,
                          ssh_port=cluster.spec.ssh.port, settings=run.settings)
        done = run.runner(hosts, argv, {})
        outputs[tuple(hosts)] = done
        return done

    def busbw_of(hosts: Sequence[str]) -> tuple[float | None, str]:
        done = start(hosts)
        if launcher.kind == "srun" and (why := srun_not_started(done)):
            return None, f"srun got no nodes: {why}"
        return read_busbw(done)

    whole = start(names)
    if launcher.kind == "srun" and (failed := _srun_failed(whole, names, launcher)) is not None:
        return failed
    busbw, why = read_busbw(whole)
    nranks = observed_ranks(whole.stdout)
    want_ranks = len(names) * gpus
    eff = efficiency(nodes, cfg, busbw)
    floor = eff["floor_gbps"] if isinstance(eff["floor_gbps"], float) else None
    measurements: dict[str, float | int | str | None] = {"nodes": len(names), "busbw_gbps": busbw,
                                                         "max_bytes": cfg.max_bytes, "nranks": nranks,
                                                         "launcher": launcher.kind, **eff}
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
        findings.append(_below_floor(label, names, busbw, cfg, eff))
    findings += [Finding(CHECK, "warning", None, None, None, None, w, f"NCCL warned: {w}", "") for w in warns]
    if run.follow_ups and (busbw is None or why or (floor is not None and busbw < floor)):
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
