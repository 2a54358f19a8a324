"""What a run leaves behind: the run journal (for `--resume` and `provision status`) and the hardware history.

Layout under the state dir (`.provision/<cluster>/`):

    runs/<run-id>/journal.json   one per run, rewritten after every phase (a crash leaves the last phase done)
    runs/<run-id>/<phase>/       ansible-runner's private data dir for that phase (artifacts/<phase>/...)
    hardware.json                per node the port GUIDs and serials seen, with old -> new records

The journal is the only memory between runs: `--resume` reads the newest one and continues each host from
the first phase it has not completed. Run ids sort by time, so "newest" is the last name in sorted order.
"""

from __future__ import annotations

import json
import os
import secrets as _secrets
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError

JOURNAL = "journal.json"
HARDWARE = "hardware.json"
SCHEMA = 1


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id(now: datetime | None = None) -> str:
    """Sortable by time (to the microsecond: `last_run` picks the newest by name), with a random tail."""
    when = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{when}-{_secrets.token_hex(3)}"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temp file and rename, so a reader never sees half a journal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------------
# run journal

@dataclass
class PhaseRecord:
    """One phase of one run. `status`: ok, partial (some hosts set aside), failed, not_built, skipped, error."""

    name: str
    status: str = "pending"
    started: str | None = None
    ended: str | None = None
    hosts: list[str] = field(default_factory=list)           # hosts the phase ran on
    ok: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)      # host -> reason
    unreachable: dict[str, str] = field(default_factory=dict)
    artifact_dir: str | None = None
    note: str | None = None


@dataclass
class HostProgress:
    """Across runs: the phases a host has completed, and why it was set aside (if it was)."""

    completed: list[str] = field(default_factory=list)
    set_aside: dict[str, str] | None = None  # {"phase", "state", "reason"}


@dataclass
class RunJournal:
    run_id: str
    cluster: str
    spec: str
    phases_planned: list[str]
    hosts: dict[str, HostProgress]
    options: dict[str, Any] = field(default_factory=dict)
    started: str = field(default_factory=utcnow)
    ended: str | None = None
    status: str = "running"   # running, passed, incomplete, partial, stopped, failed
    stop_reason: str | None = None
    resumed_from: str | None = None
    phases: list[PhaseRecord] = field(default_factory=list)
    schema: int = SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunJournal:
        d = dict(data)
        d["hosts"] = {h: HostProgress(**hp) for h, hp in (d.get("hosts") or {}).items()}
        d["phases"] = [PhaseRecord(**p) for p in d.get("phases") or []]
        return cls(**d)

    def phase(self, name: str) -> PhaseRecord | None:
        for p in self.phases:
            if p.name == name:
                return p
        return None

    @property
    def set_aside(self) -> dict[str, dict[str, str]]:
        return {h: hp.set_aside for h, hp in self.hosts.items() if hp.set_aside}

    def unfinished_hosts(self) -> list[str]:
        """Hosts that have not completed every planned phase (what `--resume` would pick up)."""
        return [h for h, hp in self.hosts.items() if any(p not in hp.completed for p in self.phases_planned)]


def runs_dir(state_dir: Path) -> Path:
    return state_dir / "runs"


def journal_path(state_dir: Path, run_id: str) -> Path:
    return runs_dir(state_dir) / run_id / JOURNAL


def save_journal(state_dir: Path, journal: RunJournal) -> Path:
    path = journal_path(state_dir, journal.run_id)
    write_json_atomic(path, journal.to_json())
    return path


def load_journal(path: Path) -> RunJournal:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return RunJournal.from_json(data)
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"{path}: not a readable run journal ({exc})",
                         hint="remove that run directory or run without --resume") from None


def list_runs(state_dir: Path) -> list[RunJournal]:
    """Every run journal under the state dir, oldest first."""
    base = runs_dir(state_dir)
    if not base.is_dir():
        return []
    return [load_journal(p / JOURNAL) for p in sorted(base.iterdir()) if (p / JOURNAL).is_file()]


def last_run(state_dir: Path) -> RunJournal | None:
    runs = list_runs(state_dir)
    return runs[-1] if runs else None


@dataclass(frozen=True)
class StatusRow:
    """One line of `provision status`."""

    run_id: str
    started: str
    ended: str | None
    status: str
    phases: str         # "preflight:ok repos:not_built ..."
    hosts: int
    set_aside: str      # "gpu02 (unreachable at preflight)"
    stop_reason: str | None


def status_rows(state_dir: Path, last: int = 10) -> list[StatusRow]:
    """The newest `last` runs, newest first, ready to print as a table or JSON."""
    rows: list[StatusRow] = []
    for j in reversed(list_runs(state_dir)[-last:] if last > 0 else list_runs(state_dir)):
        aside = ", ".join(f"{h} ({sa.get('state')} at {sa.get('phase')})" for h, sa in sorted(j.set_aside.items()))
        rows.append(StatusRow(j.run_id, j.started, j.ended, j.status,
                              " ".join(f"{p.name}:{p.status}" for p in j.phases), len(j.hosts), aside,
                              j.stop_reason))
    return rows


# ---------------------------------------------------------------------------------------------------------
# hardware history

@dataclass(frozen=True)
class HardwareChange:
    node: str
    kind: str          # guid, serial or host_key
    key: str           # port ("mlx5_0/1") or component ("board", "gpu0", "mlx5_0")
    old: str | None
    new: str | None
    when: str


def diff_hardware(node: str, old: dict[str, dict[str, str]], new: dict[str, dict[str, str]],
                  when: str) -> list[HardwareChange]:
    """What changed between two observations of one node. A key missing from `new` was not observed, so it
    is not a removal (a down port reports no GUID); only different values count."""
    changes: list[HardwareChange] = []
    for kind, section in (("guid", "guids"), ("serial", "serials")):
        before, after = old.get(section, {}), new.get(section, {})
        for key in sorted(after):
            if key in before and before[key] != after[key]:
                changes.append(HardwareChange(node, kind, key, before[key], after[key], when))
            elif key not in before and before:
                changes.append(HardwareChange(node, kind, key, None, after[key], when))
    return changes


def load_hardware(state_dir: Path) -> dict[str, Any]:
    path = state_dir / HARDWARE
    if not path.is_file():
        return {"schema": SCHEMA, "nodes": {}}
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not readable hardware history ({exc})") from None
    data.setdefault("nodes", {})
    return data


def record_hardware(state_dir: Path, node: str, *, guids: dict[str, str], serials: dict[str, str] | None = None,
                    when: str | None = None) -> list[HardwareChange]:
    """Record what was seen on `node`; return the old -> new changes (a swapped HCA, a replaced board).

    The history keeps every change forever; `current` is the merge of everything seen, newest wins.
    """
    when = when or utcnow()
    data = load_hardware(state_dir)
    entry = data["nodes"].setdefault(node, {"first_seen": when, "current": {"guids": {}, "serials": {}},
                                            "history": []})
    observed = {"guids": dict(guids), "serials": dict(serials or {})}
    changes = diff_hardware(node, entry["current"], observed, when)
    for section in ("guids", "serials"):
        entry["current"].setdefault(section, {}).update(observed[section])
    entry["last_seen"] = when
    entry["history"].extend({"when": c.when, "kind": c.kind, "key": c.key, "old": c.old, "new": c.new}
                            for c in changes)
    write_json_atomic(state_dir / HARDWARE, data)
    return changes


def record_host_key(state_dir: Path, node: str, *, old: list[str], new: str, key_type: str,
                    when: str | None = None) -> HardwareChange:
    """Record that `node`'s SSH host key was replaced (old fingerprints -> new), next to its hardware changes.

    A reinstalled or swapped node gets a new key; keeping the old fingerprints says which key the cluster
    trusted before and when that changed, for whoever later wonders why a fingerprint differs.
    """
    when = when or utcnow()
    data = load_hardware(state_dir)
    entry = data["nodes"].setdefault(node, {"first_seen": when, "current": {"guids": {}, "serials": {}},
                                            "history": []})
    change = HardwareChange(node, "host_key", key_type, ", ".join(old) or None, new, when)
    entry.setdefault("current", {}).setdefault("host_key", {})[key_type] = new
    entry["history"].append({"when": when, "kind": change.kind, "key": change.key, "old": change.old,
                             "new": change.new})
    write_json_atomic(state_dir / HARDWARE, data)
    return change


def current_hardware(state_dir: Path, node: str) -> dict[str, dict[str, str]]:
    """What the history holds for `node` now ({"guids": {...}, "serials": {...}}); empty when never seen."""
    entry = load_hardware(state_dir)["nodes"].get(node) or {}
    current = entry.get("current") or {}
    return {"guids": dict(current.get("guids") or {}), "serials": dict(current.get("serials") or {})}


def hardware_history(state_dir: Path, node: str) -> list[HardwareChange]:
    """Every recorded change of `node`, oldest first (GUIDs, serials, host keys)."""
    entry = load_hardware(state_dir)["nodes"].get(node) or {}
    return [HardwareChange(node, str(h.get("kind")), str(h.get("key")), h.get("old"), h.get("new"),
                           str(h.get("when"))) for h in entry.get("history", [])]
