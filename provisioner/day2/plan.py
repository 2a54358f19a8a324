"""``provision plan``: what a converge would change on which nodes, what that disrupts, and the batches a rolling
run (``provision cluster.yaml --rolling``) would use. Nothing is touched: the manifests are read (over SSH, or the
copies of the last run with ``--cached``) and compared with the spec's pins.

Per node, each pinned component whose installed version differs (:func:`provisioner.drift.node_pins`) is a
change, with the phase that makes it and what it disrupts:

* **reboot**: HCA firmware or an mlxconfig parameter that differs from ``software.hca_firmware``
  (:mod:`provisioner.hcafw`): the ofed phase flashes or sets it, the card runs it only after a reboot (or
  mlxfwreset), which the role never does. A new NVIDIA driver while the old module is loaded: the module in
  memory stays the old one until it is unloaded, and with a GPU job or nvidia-persistenced holding it, that means
  a reboot (the nvidia_driver role reboots such a node when the spec allows it, ``reboot.allowed``).
* **reboot** too: a Slurm node to boot with cgroup v1 (``slurm.cgroup: v1``) that runs v2 (its kernel command
  line changes only at boot).
* **ofed restart**: a new DOCA-OFED/MLNX_OFED. ``openibd`` restarts: every RDMA port of the node goes down and comes
  back, nvidia_peermem is reloaded, a subnet manager on the node restarts (the standby takes over meanwhile).
* **service restart**: fabric manager (with the driver), a Lustre client remount.
* **none**: user-space libraries (CUDA, NCCL, nccl-tests): new jobs pick them up.

A node without a manifest (never converged, or unreachable) gets every converge phase, its disruption unknown.

Batches: compute nodes (spares first: they run no job, so a bad change shows on a node that costs nothing), then
the other Slurm and non-service nodes, ``--batch`` N at a time or a share of them ("25%"); then subnet managers
and storage servers one at a time, standby SMs first and the master last. A batch that would drain every node of
a Slurm partition is refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provisioner import hcafw
from provisioner.drift import Manifest, ManifestError, matches_pin, node_pins, parse_manifest
from provisioner.errors import UsageError
from provisioner.phases import PHASE_NAMES, phase
from provisioner.safetext import escaped
from provisioner.slurm.membership import Membership
from provisioner.spec import hostlist
from provisioner.spec.cluster import Cluster

CONVERGE_PHASES = tuple(p for p in PHASE_NAMES if phase(p).playbook)
SERVICE_ROLES = ("subnet_manager", "nfs_server", "storage")
EFFECTS = ("reboot", "ofed restart", "sm restart", "service restart", "unknown", "none")
"""Strongest first."""

ITEM_PHASE = {"driver": "gpu_stack", "fabric_manager": "gpu_stack", "cuda": "gpu_stack", "nccl": "gpu_stack",
              "nccl_cuda_build": "gpu_stack", "nccl_tests": "gpu_stack", "doca_ofed": "ofed", "ofed": "ofed",
              "lustre_client": "storage", "cgroup": "slurm"}


@dataclass(frozen=True)
class Change:
    """One component to change on one node: ``current`` -> ``wanted``, made in ``phase``, disrupting ``effect``."""

    item: str
    current: str | None
    wanted: str
    phase: str
    effect: str
    why: str


@dataclass
class NodePlan:
    node: str
    kind: str                    # compute, spare, subnet_manager, storage, other
    changes: list[Change] = field(default_factory=list)
    missing: str | None = None   # no manifest: why

    @property
    def phases(self) -> list[str]:
        if self.missing is not None:
            return list(CONVERGE_PHASES)
        wanted = {c.phase for c in self.changes}
        return [p for p in CONVERGE_PHASES if p in wanted]

    @property
    def effects(self) -> list[str]:
        if self.missing is not None:
            return ["unknown"]
        got = {c.effect for c in self.changes}
        return [e for e in EFFECTS if e in got]

    @property
    def needed(self) -> bool:
        return self.missing is not None or bool(self.changes)


@dataclass
class Batch:
    index: int
    nodes: list[str]
    kind: str              # compute or service
    drain: list[str]       # the nodes of this batch that Slurm schedules on (drained first, resumed after)
    phases: list[str]
    effects: list[str]
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan:
    cluster: str
    spec: str
    batch_size: str
    nodes: dict[str, NodePlan]
    batches: list[Batch]
    manifests_from: str            # "ssh" or "cache"

    @property
    def unchanged(self) -> list[str]:
        return [n for n, p in self.nodes.items() if not p.needed]

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "spec": self.spec, "batch_size": self.batch_size,
                "manifests_from": self.manifests_from,
                "nodes": {n: {"kind": p.kind, "missing": p.missing, "phases": p.phases, "effects": p.effects,
                              "changes": [asdict(c) for c in p.changes]} for n, p in self.nodes.items()},
                "batches": [b.to_json() for b in self.batches], "unchanged": self.unchanged}


# ---------------------------------------------------------------------------------------------------------
# pure planning

def _loaded(manifest: Manifest, module: str) -> bool:
    return module in (manifest.get("modules") or {})


def node_changes(cluster: Cluster, node: str, manifest: Manifest) -> list[Change]:
    """What differs on ``node`` between its manifest and the spec's pins, with the phase and the disruption."""
    me = cluster.node(node)
    sm = "subnet_manager" in me.roles
    changes: list[Change] = []
    for pin in node_pins(cluster).get(node, []):
        got = pin.observe(manifest)
        if got is not None and matches_pin(got, pin.pin):
            continue
        ph = ITEM_PHASE.get(pin.item, "gpu_stack")
        if pin.item == "driver":
            if got is not None and _loaded(manifest, "nvidia"):
                effect, why = "reboot", (f"the loaded nvidia module stays {got} until it is unloaded; with GPU "
                                         "work or nvidia-persistenced holding it, that is a reboot")
            else:
                effect, why = "none", "the nvidia module is not loaded: the new one loads at converge"
        elif pin.item == "fabric_manager":
            effect, why = "service restart", "nvidia-fabricmanager restarts with the new driver"
        elif pin.item in ("doca_ofed", "ofed"):
            effect = "sm restart" if sm else "ofed restart"
            why = ("openibd restarts: every RDMA port of the node goes down and comes back, nvidia_peermem is "
                   "reloaded" + ("; the subnet manager on it restarts (a standby takes over meanwhile)" if sm else ""))
        elif pin.item == "cgroup":
            effect, why = "reboot", (f"the node runs cgroup {got or '(unknown)'}: the kernel command line "
                                     "(systemd.unified_cgroup_hierarchy=0 for Slurm's cgroup/v1) takes effect only "
                                     "at boot")
        elif pin.item == "lustre_client":
            effect, why = "service restart", "the Lustre client modules reload: its mounts are remounted"
        else:
            effect, why = "none", "user-space library: jobs started after the change use it"
        changes.append(Change(pin.item, got, pin.pin, ph, effect, why))
    changes += hca_changes(cluster, node, manifest)
    if sm and any(c.phase == "ofed" for c in changes):
        changes.append(Change("opensm", None, "(the OFED release's)", "fabric", "sm restart",
                              "opensm comes with the OFED packages: the fabric phase checks the SM after them"))
    return changes


def hca_changes(cluster: Cluster, node: str, manifest: Manifest) -> list[Change]:
    """Firmware and mlxconfig pins that differ on ``node``: made in the ofed phase, running only after a reboot."""
    return [Change(f"{m.item}:{m.device}", m.have, m.want, "ofed", "reboot",
                   "the HCA runs a new firmware image or mlxconfig value only after a reboot (or mlxfwreset); "
                   "the role flashes/sets it and never reboots")
            for m in hcafw.mismatches(cluster.spec.software.hca_firmware, node, manifest)]


def node_kind(cluster: Cluster, node: str, membership: Membership) -> str:
    me = cluster.node(node)
    if "subnet_manager" in me.roles:
        return "subnet_manager"
    if set(me.roles) & {"nfs_server", "storage"}:
        return "storage"
    if node in membership.spares:
        return "spare"
    if node in membership.in_partitions or "compute" in me.roles:
        return "compute"
    return "other"


def batch_count(spec: str | int | None, total: int, default: str | int = 1) -> int:
    """Nodes per batch from ``--batch`` N or "PCT%" (of ``total``, rounded up, at least 1)."""
    raw: str | int = default if spec is None or spec == "" else spec
    text = str(raw).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            return max(1, math.ceil(total * pct / 100))
        count = int(text)
        if count < 1:
            raise ValueError
        return count
    except ValueError:
        raise UsageError(f"--batch {raw!r}: give a node count (2) or a share of the nodes (25%)") from None


def _sm_order(cluster: Cluster) -> dict[str, int]:
    sm = cluster.spec.fabric.subnet_manager
    return {s.node: s.priority for s in (sm.nodes if sm else [])}


def make_batches(cluster: Cluster, plans: Mapping[str, NodePlan], membership: Membership,
                 batch: str | int | None) -> list[Batch]:
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    todo = [n for n in plans if plans[n].needed]
    compute = [n for n in todo if plans[n].kind in ("spare", "compute", "other")]
    compute.sort(key=lambda n: (0 if plans[n].kind == "spare" else 1, order[n]))
    size = batch_count(batch, len(compute), cluster.spec.reboot.serial)
    slurm_nodes = set(membership.in_partitions) | set(membership.spares) | set(membership.failed)
    batches: list[Batch] = []
    for i in range(0, len(compute), size):
        nodes = compute[i:i + size]
        for part, members in membership.partitions.items():
            if len(members) > 1 and set(members) <= set(nodes):
                raise UsageError(f"a batch of {size} would drain every node of partition {part} "
                                 f"({hostlist.compress(members)}) at once", hint="use a smaller --batch")
        batches.append(_batch(len(batches) + 1, nodes, "compute", plans, slurm_nodes,
                              "spares first: they run no job" if all(plans[n].kind == "spare" for n in nodes)
                              else ""))
    prio = _sm_order(cluster)
    service = [n for n in todo if plans[n].kind in ("subnet_manager", "storage")]
    master = max(prio, key=lambda n: prio[n]) if prio else None
    service.sort(key=lambda n: (0 if n in prio else 1, prio.get(n, 0), order[n]))
    for n in service:
        if n in prio:
            note = "master SM, last" if n == master else f"standby SM (priority {prio[n]})"
        else:
            note = "storage server"
        batches.append(_batch(len(batches) + 1, [n], "service", plans, slurm_nodes, note + ", one at a time"))
    return batches


def _batch(index: int, nodes: list[str], kind: str, plans: Mapping[str, NodePlan], slurm_nodes: set[str],
           note: str) -> Batch:
    phases = [p for p in CONVERGE_PHASES if any(p in plans[n].phases for n in nodes)]
    effects = [e for e in EFFECTS if any(e in plans[n].effects for n in nodes)]
    return Batch(index, list(nodes), kind, [n for n in nodes if n in slurm_nodes], phases, effects, note)


def make_plan(cluster: Cluster, manifests: Mapping[str, Manifest], missing: Mapping[str, str],
              membership: Membership, *, batch: str | int | None = None, nodes: Sequence[str] | None = None,
              source: str = "ssh") -> Plan:
    """The plan for ``nodes`` (all by default) given their manifests (and why the others have none)."""
    names = list(nodes) if nodes is not None else [n.name for n in cluster.nodes]
    plans: dict[str, NodePlan] = {}
    for n in names:
        kind = node_kind(cluster, n, membership)
        if n in manifests:
            plans[n] = NodePlan(n, kind, node_changes(cluster, n, manifests[n]))
        else:
            plans[n] = NodePlan(n, kind, missing=missing.get(n, "no manifest"))
    size = str(batch) if batch not in (None, "") else str(cluster.spec.reboot.serial)
    return Plan(cluster.name, cluster.file, size, plans, make_batches(cluster, plans, membership, batch), source)


# ---------------------------------------------------------------------------------------------------------
# reading manifests, printing

def cached_manifests(state_dir: Path, nodes: Sequence[str]) -> tuple[dict[str, Manifest], dict[str, str]]:
    """The manifests the last run or drift check fetched (``<state>/manifests/<node>.json``)."""
    found: dict[str, Manifest] = {}
    missing: dict[str, str] = {}
    for n in nodes:
        path = state_dir / "manifests" / f"{n}.json"
        if not path.is_file():
            missing[n] = "no cached manifest (run `provision plan` without --cached, or `provision drift`)"
            continue
        try:
            found[n] = parse_manifest(path.read_text(encoding="utf-8"), n)
        except (OSError, ManifestError) as exc:
            missing[n] = f"cached manifest unreadable: {exc}"
    return found, missing


def summary_lines(plan: Plan) -> list[str]:
    """The plan for a person: per node the changes and what they disrupt, then the batches."""
    lines = [f"plan for {plan.cluster} ({escaped(plan.spec)}; manifests read over {plan.manifests_from}): "
             f"{sum(1 for p in plan.nodes.values() if p.needed)} of {len(plan.nodes)} node(s) change"]
    for n, p in plan.nodes.items():
        if p.missing is not None:
            lines.append(f"  {n} ({p.kind}): no manifest ({p.missing}): every converge phase, disruption unknown")
            continue
        for c in p.changes:
            cur = c.current or "(not installed)"
            lines.append(f"  {n} ({p.kind}): {c.item} {cur} -> {c.wanted} [{c.phase}] {c.effect}: {c.why}")
    if plan.unchanged:
        lines.append(f"  unchanged: {hostlist.compress(plan.unchanged)}")
    if not plan.batches:
        lines.append("nothing to do")
        return lines
    lines.append(f"batches (--batch {plan.batch_size}; a failed batch stops the run and stays drained):")
    for b in plan.batches:
        drain = f"drain {hostlist.compress(b.drain)}, " if b.drain else ""
        note = f" ({b.note})" if b.note else ""
        lines.append(f"  {b.index}: {hostlist.compress(b.nodes)}{note}: {drain}converge {','.join(b.phases)}; "
                     f"{', '.join(b.effects) or 'no disruption'}; verify against healthy peers"
                     + ("; resume" if b.drain else ""))
    return lines


def to_json_text(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2, sort_keys=True)


def plan_spec(spec: Path, overlay: Path | None = None, *, state_dir: Path | None = None, batch: str | None = None,
              limit: str | None = None, cached: bool = False) -> Plan:
    """`provision plan`: the spec loaded once, the nodes' manifests read over SSH (or the last run's with
    ``cached``), the plan against the spec and the recorded Slurm membership. Touches nothing."""
    from provisioner.drift import fetch_manifests
    from provisioner.phases import expand_limit
    from provisioner.remote import SshRemote, targets_from_cluster
    from provisioner.slurm.membership import current
    from provisioner.spec import load_cluster
    from provisioner.state import state_dir_for

    cluster, _ = load_cluster(spec, overlay)
    sdir = state_dir_for(cluster.name, state_dir)
    nodes = expand_limit(limit, [n.name for n in cluster.nodes])
    if cached:
        manifests, missing = cached_manifests(sdir, nodes)
    else:
        with SshRemote(targets_from_cluster(cluster)) as ssh:
            manifests, missing = fetch_manifests(ssh, nodes)
    return make_plan(cluster, manifests, missing, current(cluster, sdir), batch=batch, nodes=nodes,
                     source="cache" if cached else "ssh")
