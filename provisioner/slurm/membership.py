"""Who is in which Slurm partition: the spec's partitions and spares, changed by recorded failovers.

The spec says which nodes make each partition and which nodes stand by as spares. A failover (``provision
failover``) takes a failed node out of its partitions and puts a spare in; that swap is recorded under
``<state>/slurm/swaps.json`` and every later run renders slurm.conf from the spec *with the swaps applied*, so a
routine ``provision cluster.yaml`` never puts the failed node back. A failed node that comes back through
``provision replace-node`` becomes a spare (it stays out of the partitions; the spare that took its place
keeps it).

Pure functions over the Cluster and the swap records; only :func:`load_swaps`/:func:`record_swap` touch files.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError
from provisioner.spec.cluster import Cluster
from provisioner.spec.rules import members
from provisioner.state import utcnow, write_json_atomic

SWAPS = Path("slurm") / "swaps.json"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Swap:
    """One failover: ``failed`` left ``partitions``, ``spare`` took its place there."""

    failed: str
    spare: str
    partitions: tuple[str, ...]
    at: str
    reason: str = ""
    returned: str | None = None   # when the failed node came back (replace-node) as a spare

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "partitions": list(self.partitions)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Swap:
        return cls(str(data["failed"]), str(data["spare"]), tuple(str(p) for p in data.get("partitions") or []),
                   str(data.get("at") or ""), str(data.get("reason") or ""), data.get("returned"))


@dataclass
class Membership:
    """The partitions (name -> nodes, spec order) and the spares as they are now."""

    partitions: dict[str, list[str]] = field(default_factory=dict)
    spares: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)   # out of every partition, not yet back as spares

    def partitions_of(self, node: str) -> list[str]:
        return [p for p, nodes in self.partitions.items() if node in nodes]

    @property
    def in_partitions(self) -> list[str]:
        seen: dict[str, None] = {}
        for nodes in self.partitions.values():
            seen.update(dict.fromkeys(nodes))
        return list(seen)


def spec_membership(cluster: Cluster) -> Membership:
    """The partitions and spares exactly as the spec writes them (empty without ``slurm:``)."""
    slurm = cluster.spec.slurm
    if slurm is None:
        return Membership()
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    parts = {p.name: sorted(members(p.nodes, cluster), key=lambda n: order.get(n, len(order)))
             for p in slurm.partitions}
    spares = members(cluster.spec.spares.nodes, cluster) if cluster.spec.spares else []
    return Membership(parts, sorted(spares, key=lambda n: order.get(n, len(order))))


def apply_swaps(base: Membership, swaps: list[Swap], order: dict[str, int] | None = None) -> Membership:
    """``base`` with every swap applied in order (a swap whose nodes no longer fit is an error)."""
    key = (lambda n: order.get(n, len(order))) if order else (lambda n: 0)
    parts = {p: list(nodes) for p, nodes in base.partitions.items()}
    spares = list(base.spares)
    failed: list[str] = []
    for s in swaps:
        if s.spare not in spares:
            raise UsageError(f"swap record {s.failed} -> {s.spare} ({s.at}): {s.spare} is no spare at that point",
                             hint=f"check {SWAPS} under the state directory")
        spares.remove(s.spare)
        for p in s.partitions:
            nodes = parts.get(p)
            if nodes is None:
                continue
            if s.failed in nodes:
                nodes.remove(s.failed)
            if s.spare not in nodes:
                nodes.append(s.spare)
            nodes.sort(key=key)
        if s.returned:
            spares.append(s.failed)
            spares.sort(key=key)
        else:
            failed.append(s.failed)
    return Membership(parts, spares, failed)


def load_swaps(state_dir: Path) -> list[Swap]:
    """The recorded swaps, oldest first; a record that repeats an earlier one still in force (the same node to
    the same spare, not returned since: two failovers raced before the day-2 lock) is left out with a warning."""
    path = state_dir / SWAPS
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        swaps = [Swap.from_json(s) for s in data.get("swaps") or []]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{path}: not a readable swap record ({exc})") from None
    return _without_duplicates(path, swaps)


def _without_duplicates(path: Path, swaps: list[Swap]) -> list[Swap]:
    kept: list[Swap] = []
    earlier: dict[tuple[str, str], tuple[int, Swap]] = {}     # (failed, spare) -> its first record and number
    for number, s in enumerate(swaps, 1):
        first = earlier.get((s.failed, s.spare))
        if first is not None and (first[1].returned is None or first[1].returned > s.at):
            _warn_once(f"{path}: record {number} ({s.failed} -> {s.spare} in {','.join(s.partitions)} at {s.at}) "
                       f"repeats record {first[0]} (at {first[1].at}): ignored; remove it from the file once no "
                       "failover is running")
            continue
        earlier[(s.failed, s.spare)] = (number, s)
        kept.append(s)
    return kept


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    """Say it once per process: membership is read many times per command (every watch round)."""
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("warning: %s", message)


def _save(state_dir: Path, swaps: list[Swap]) -> None:
    write_json_atomic(state_dir / SWAPS, {"schema": 1, "swaps": [s.to_json() for s in swaps]})


def record_swap(state_dir: Path, failed: str, spare: str, partitions: list[str], reason: str,
                when: str | None = None) -> Swap:
    swap = Swap(failed, spare, tuple(partitions), when or utcnow(), reason)
    _save(state_dir, [*load_swaps(state_dir), swap])
    return swap


def mark_returned(state_dir: Path, node: str, when: str | None = None) -> bool:
    """The failed ``node`` is back (replace-node passed): it stands by as a spare from now on."""
    swaps = load_swaps(state_dir)
    changed = False
    out: list[Swap] = []
    for s in swaps:
        if s.failed == node and not s.returned:
            s = Swap(s.failed, s.spare, s.partitions, s.at, s.reason, when or utcnow())
            changed = True
        out.append(s)
    if changed:
        _save(state_dir, out)
    return changed


def current(cluster: Cluster, state_dir: Path) -> Membership:
    """The membership now: the spec's, with the recorded swaps applied."""
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    return apply_swaps(spec_membership(cluster), load_swaps(state_dir), order)


def run_vars(cluster: Cluster, state_dir: Path) -> dict[str, Any]:
    """Extra vars for a run when swaps changed the spec's membership (nothing when none did): the slurm role
    renders slurm.conf from these, so a run never puts a failed node back into its partition."""
    if cluster.spec.slurm is None or not load_swaps(state_dir):
        return {}
    now = current(cluster, state_dir)
    parts = [{"name": p.name, "nodes": now.partitions.get(p.name, []), "default": p.default,
              "max_time": p.max_time} for p in cluster.spec.slurm.partitions]
    return {"slurm_partitions": parts, "slurm_spares": now.spares, "slurm_failed": now.failed}
