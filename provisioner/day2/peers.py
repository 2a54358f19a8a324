"""Peers: the healthy nodes a node or a batch is measured against, the verification against them, its merge.

``replace-node`` measures one node, ``--rolling`` a batch and ``failover`` a spare; all three pick peers with
:func:`pick`, run :func:`verify` and keep one merged report (:func:`merge`). Which nodes are GPU compute nodes,
which run an SM and the subset a check runs on are the model's (:class:`provisioner.spec.cluster.Cluster`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provisioner.remote import Remote
from provisioner.report import VerifyReport
from provisioner.safetext import printable
from provisioner.slurm.ctl import SlurmCtl, SlurmError
from provisioner.slurm.membership import spec_membership
from provisioner.spec.cluster import Cluster
from provisioner.state import last_run

DEFAULT_PEERS = 2
"""Peers per node or batch unless ``--peers`` says otherwise (more only to cover a rail)."""

Progress = Callable[[str], None]


def pick(cluster: Cluster, nodes: Sequence[str], unhealthy: Collection[str], count: int = DEFAULT_PEERS, *,
         done: Collection[str] = (), busy: Collection[str] = ()) -> list[str]:
    """Healthy GPU compute peers sharing a rail with ``nodes``: ``count`` of them, more only to cover a rail; none
    when ``nodes`` hold no GPU compute node (an SM node's links are checked alone).

    Healthy = not in ``unhealthy`` (set aside in the last run, or with error findings in the last verification).
    Idle peers come before those running Slurm jobs (``busy``: a job's traffic would slow the measurement and the
    measurement the job), then those in ``done`` (a rolling run's finished batches), then spec order: a rerun
    measures the same pairs.
    """
    mine = [cluster.node(n) for n in nodes]
    if not any(n.gpu_compute for n in mine):
        return []
    rails = frozenset().union(*(n.rail_set for n in mine))
    pool = [n for n in cluster.gpu_compute_nodes() if n.name not in nodes and n.name not in unhealthy
            and rails & n.rail_set]
    pool.sort(key=lambda n: (n.name in busy, n.name not in done))
    chosen = pool[:max(0, count)]
    for rail in sorted(rails):
        if not any(rail in n.rail_set for n in chosen):
            extra = next((n for n in pool if n not in chosen and rail in n.rail_set), None)
            if extra is not None:
                chosen.append(extra)
    return [n.name for n in chosen]


def _planned_here(cluster: Cluster, nodes: Sequence[str], name: str) -> bool:
    """Whether the spec plans what a ``new_hardware`` check looks at for ``nodes``: cables, IPoIB interfaces."""
    if name == "ipoib":
        return any(cluster.ipoib_of(n) for n in nodes)
    return bool(cluster.cables)


def checks(cluster: Cluster, nodes: Sequence[str], peers: Sequence[str], *,
           new_hardware: bool = False) -> tuple[list[str], list[str]]:
    """(checks on ``nodes`` and their peers together, checks on each GPU compute node with its first peer), taken
    from the check registry (:attr:`provisioner.fabric.registry.Check.day2`).

    Links and versions always run: a reinstalled node with a wrong driver or a dead port is the usual failure.
    ``new_hardware`` (replace-node: a new board) adds its cables and IPoIB interfaces where the spec lists them;
    otherwise (a rolling batch, a spare) an SM among ``nodes`` is checked.
    """
    from provisioner.fabric import registry

    wanted = set(cluster.spec.verify.tests)
    pairs = bool(peers) and any(cluster.node(n).gpu_compute for n in nodes)
    holds_sm = any(n in nodes for n in cluster.sm_nodes())

    def runs(c: registry.Check) -> bool:
        if c.day2 == "new_hardware":
            return new_hardware and c.name in wanted and _planned_here(cluster, nodes, c.name)
        return {"always": True, "together": pairs and c.name in wanted, "pair": pairs and c.name in wanted,
                "sm": holds_sm and not new_hardware}.get(c.day2, False)

    chosen = [c for c in registry.CHECKS if runs(c)]
    return [c.name for c in chosen if c.day2 != "pair"], [c.name for c in chosen if c.day2 == "pair"]


def verify(cluster: Cluster, nodes: Sequence[str], peers: Sequence[str], directory: Path, progress: Progress,
           remote: Remote | None = None, *, new_hardware: bool = False) -> VerifyReport:
    """``nodes`` against ``peers`` (:func:`checks`), one merged report written under ``directory``.

    mpirun, not srun: the nodes are drained (or a spare in no partition, or a replaced node), where Slurm starts no
    job step; their peers are measured even while they run jobs (the nodes cannot be proven without one)."""
    from provisioner.verify import verify as run_checks

    together, pair = checks(cluster, nodes, peers, new_hardware=new_hardware)
    names = [*nodes, *peers]
    if "sm" in together:
        names += [n for n in cluster.sm_nodes() if n not in names]
    run = run_checks(cluster.subset(names), tests=together, mode="full", remote=remote, state_dir=directory,
                     write=False, progress=progress, nccl_launcher="mpirun", include_busy=True)
    more = [run_checks(cluster.subset([node, peers[0]]), tests=pair, remote=remote, state_dir=directory,
                       write=False, progress=progress, include_busy=True).report
            for node in nodes if pair and cluster.node(node).gpu_compute]
    return merge(run.report, more, directory, run.inventory)


def merge(first: VerifyReport, more: Sequence[VerifyReport], directory: Path, inventory: Any) -> VerifyReport:
    """One report of a verification run in parts (the main run, then the node-and-one-peer runs), finished now,
    written under ``directory`` (JSON, JUnit, HTML) with the main run's inventory."""
    from provisioner.verify import write_reports

    checks = [*first.checks, *(c for r in more for c in r.checks)]
    merged = replace(first, checks=tuple(checks), finished=datetime.now(UTC))
    write_reports(merged, directory, inventory)
    return merged


# ---------------------------------------------------------------------------------------------------------
# health and the verdict

def unhealthy_nodes(state_dir: Path) -> set[str]:
    """Nodes set aside in the last run or with error findings in the last verification: not peers."""
    bad: set[str] = set()
    journal = last_run(state_dir)
    if journal is not None:
        bad |= set(journal.set_aside)
    latest = state_dir / "verify" / "latest" / "report.json"
    if latest.is_file():
        try:
            doc = json.loads(latest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return bad
        bad |= {str(f["node"]) for f in doc.get("findings", []) if f.get("severity") == "error" and f.get("node")}
    return bad


def busy_peers(ctl: SlurmCtl | None, cluster: Cluster, batch: Sequence[str], progress: Progress) -> set[str]:
    """The GPU compute nodes outside ``batch`` that run Slurm jobs now (none without Slurm, or when slurmctld does
    not answer: said, and peers are then picked as if all were idle)."""
    if ctl is None:
        return set()
    spec = spec_membership(cluster)
    slurm_nodes = set(spec.in_partitions) | set(spec.spares)  # every NodeName slurm.conf defines
    others = [n.name for n in cluster.gpu_compute_nodes() if n.name not in batch and n.name in slurm_nodes]
    if not others:
        return set()
    try:
        return set(ctl.busy_nodes(others))
    except SlurmError as exc:
        progress(f"could not ask Slurm which peers run jobs ({exc}); picking peers without it")
        return set()


def batch_failures(report: VerifyReport, nodes: Sequence[str]) -> list[str]:
    """Why verification fails the batch: errors and could-not-run results on its nodes or cluster-wide (a
    finding on a peer alone, e.g. its older version in a rolling version change, does not count)."""
    mine = set(nodes)
    why: list[str] = []
    for check in report.checks:
        if check.error is not None and (check.node is None or check.node in mine):
            why.append(f"{check.name} on {check.node or 'the batch'} could not run: {check.error}")
        for f in check.findings:
            if f.severity == "error" and (f.node is None or f.node in mine):
                why.append(f"{f.location()}: {f.message}")
    return [printable(w) for w in why]  # nodes' words, for the journal and the summary
