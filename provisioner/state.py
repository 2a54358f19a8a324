"""What a run leaves behind: the run journal (for `--resume` and `provision status`) and the hardware history.

Layout under the state dir (`.provision/<cluster>/`):

    runs/<run-id>/journal.json   one per run, rewritten after every phase (a crash leaves the last phase done)
    runs/<run-id>/<phase>/       ansible-runner's private data dir for that phase (artifacts/<phase>/...)
    hardware.json                per node the port GUIDs and serials seen, with old -> new records
    run.lock                     held (flock) by the one run working on this state; names its holder
    day2.lock                    held (flock) from reading Slurm membership to recording a change (failover,
                                 watch, rolling drains/resumes, replace-node); names its holder

The journal is the only memory between runs: `--resume` reads the newest one (never a --check run's) and
continues each host from the first phase it has not completed. Run ids sort by time, so "newest" is the last
name in sorted order. A journal still `running` whose run does not hold the lock belongs to a run that died
(killed, crashed, machine down): it is shown as `dead`, and the next run closes it so.

Every file here is written atomically and durably (unique temp name, fsync, rename, fsync of the directory):
after a crash or power loss a reader sees the old or the new file, never half of one or none.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets as _secrets
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NotRequired

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

from provisioner.errors import UsageError

STATE_ROOT = Path(".provision")
"""Where state directories live unless --out says otherwise: one per cluster, relative to the working directory."""


def state_dir_for(cluster_name: str, out: Path | None = None) -> Path:
    """The state directory of a cluster: ``out`` when given, else ``.provision/<cluster>`` (the one place that says)."""
    return out if out is not None else STATE_ROOT / cluster_name


JOURNAL = "journal.json"
HARDWARE = "hardware.json"
LOCK = "run.lock"
DAY2_LOCK = "day2.lock"
DAY2_WAIT_S = 900.0
"""How long a long-running day-2 command (a rolling step, replace-node's return of a node) waits for the day-2
lock before giving up naming its holder: longer than a failover with its verification and persist run takes."""
SCHEMA = 1


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id(now: datetime | None = None) -> str:
    """Sortable by time (to the microsecond: `last_run` picks the newest by name), with a random tail."""
    when = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{when}-{_secrets.token_hex(3)}"


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new entry in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dir(directory: Path) -> Path:
    """``directory`` (and its parents) created, and made 0700 when it already existed looser: what it holds is
    node data (facts, artifacts, reports) for the operator only."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if stat.S_IMODE(directory.stat().st_mode) != 0o700:
        os.chmod(directory, 0o700)
    return directory


def make_files_private(directory: Path) -> None:
    """Every regular file directly under ``directory`` made 0600 (Ansible's jsonfile cache writes 0644)."""
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False) and stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) != 0o600:
            with contextlib.suppress(FileNotFoundError):  # a concurrent cache write replaced it
                os.chmod(entry.path, 0o600)


def write_text_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write `text` to `path` so that a reader (or a crash) sees the old file or the new one, never half.

    A uniquely named temp file in the same directory (two writers never share one), fsync'd before the
    rename, and the directory fsync'd after it (else the rename itself can be lost on power failure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def symlink_atomic(target: str, link: Path) -> None:
    """Point `link` at `target` in one rename (a uniquely named temp link), durably."""
    tmp = link.with_name(f".{link.name}.{_secrets.token_hex(6)}.tmp")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(link.parent)


def write_json_atomic(path: Path, data: Any, *, mode: int = 0o600) -> None:
    """JSON through :func:`write_text_atomic` (journals and records stay private to the operator)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=mode)


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
    pid: int | None = None     # the process that ran it, on `host` (so `status` can tell a dead run)
    host: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> RunJournal:
        """The journal in `data`; ValueError (one line: the first field that is wrong) for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, found {type(data).__name__}")
        try:
            return _JOURNAL.validate_python(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top)"
            raise ValueError(f"{where}: {first['msg']}") from None

    @property
    def check_run(self) -> bool:
        """A --check run: it changed nothing, so nothing may continue from it."""
        return bool(self.options.get("check"))

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


_JOURNAL: TypeAdapter[RunJournal] = TypeAdapter(RunJournal)


def load_journal(path: Path) -> RunJournal:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return RunJournal.from_json(data)
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        why = " ".join(str(exc).split())[:200]
        raise UsageError(f"{path}: not a readable run journal ({why})",
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


def resumable_run(state_dir: Path) -> RunJournal | None:
    """The run `--resume` continues: the newest one that was not a --check run (a dry run completes nothing,
    and its hosts' progress says nothing about the cluster)."""
    runs = [j for j in list_runs(state_dir) if not j.check_run]
    return runs[-1] if runs else None


# ---------------------------------------------------------------------------------------------------------
# locks: one run per state dir (run.lock), one day-2 change at a time (day2.lock), one known_hosts writer

class _Held(threading.local):
    """The locks this thread holds, by path: re-entrant within a thread, exclusive between threads and processes
    (each acquisition opens its own descriptor, and flock excludes other descriptors even in one process)."""

    def __init__(self) -> None:
        self.locks: dict[str, StateLock] = {}


_HELD = _Held()


@dataclass
class StateLock:
    """An exclusive flock on a lock file, held until released (the kernel drops it when the process dies,
    however it dies); the file names its holder. Re-entrant within a thread: replace-node runs several runs in
    one run lock, a failover's persist run holds the day-2 lock it already has."""

    path: Path
    fd: int
    depth: int = 1

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            _HELD.locks.pop(str(self.path), None)
            os.close(self.fd)  # closing the only descriptor releases the flock


RunLock = StateLock


def _read_holder(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_holder(holder: dict[str, Any]) -> str:
    """``provision failover gpu01, pid 4242 on head1, started 2026-...``: who holds a lock, from its file."""
    if not holder:
        return "another process"
    run = f", run {holder['run_id']}" if holder.get("run_id") else ""
    return (f"{holder.get('command') or 'provision'}, pid {holder.get('pid')} on {holder.get('host')}{run}, "
            f"started {holder.get('started')}")


def _flock(fd: int, wait_s: float | None) -> bool:
    """Take an exclusive flock on ``fd``: at once, within ``wait_s`` seconds, or (None) however long it takes."""
    if wait_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + wait_s
    pause = 0.02
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 1.0)


def acquire_lock(path: Path, *, command: str, refusal: Callable[[str], str], hint: str,
                 wait_s: float | None = 0.5, run_id: str | None = None) -> StateLock:
    """Hold the lock file ``path`` (created private), or raise UsageError ``refusal(<its holder>)``.

    ``wait_s``: how long to wait for another holder (None: as long as it takes; short writers only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path = path.resolve()
    held = _HELD.locks.get(str(path))
    if held is not None:
        held.depth += 1
        return held
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        taken = _flock(fd, wait_s)
    except OSError:
        os.close(fd)
        raise
    if not taken:
        holder = _read_holder(path)
        os.close(fd)
        raise UsageError(refusal(describe_holder(holder)), hint=hint)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": run_id, "started": utcnow(),
            "command": command}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    lock = StateLock(path, fd)
    _HELD.locks[str(path)] = lock
    return lock


def acquire_run_lock(state_dir: Path, *, run_id: str | None = None, command: str = "provision") -> RunLock:
    """Hold the state dir's run lock, or raise UsageError naming the run that holds it."""
    # a moment's patience: `provision status` probes the lock with a shared lock for a few microseconds
    return acquire_lock(state_dir / LOCK, command=command, run_id=run_id, wait_s=0.5,
                        refusal=lambda who: f"another provision run is working on {state_dir} ({who})",
                        hint="wait for it to end; one run per cluster state at a time")


@contextlib.contextmanager
def run_lock(state_dir: Path, *, run_id: str | None = None, command: str = "provision") -> Iterator[RunLock]:
    lock = acquire_run_lock(state_dir, run_id=run_id, command=command)
    try:
        yield lock
    finally:
        lock.release()


@contextlib.contextmanager
def day2_lock(state_dir: Path, *, command: str, wait_s: float | None = 0.5) -> Iterator[StateLock]:
    """Hold ``<state>/day2.lock`` while Slurm membership is read, changed and recorded (failover, watch, rolling's
    drains and resumes, replace-node's return of a node): one day-2 change at a time. Refused, naming the holder,
    when another command holds it past ``wait_s``."""
    lock = acquire_lock(state_dir / DAY2_LOCK, command=command, wait_s=wait_s,
                        refusal=lambda who: f"the day-2 lock {state_dir / DAY2_LOCK} is held by {who}",
                        hint="wait for it to end (one failover, watch round or rolling step at a time), then "
                             "look again: the node may be failed over already")
    try:
        yield lock
    finally:
        lock.release()


def lock_holder(state_dir: Path) -> dict[str, Any] | None:
    """Who holds the run lock now (its pid, host, run id), or None when no run is working on this state."""
    path = state_dir / LOCK
    held = _HELD.locks.get(str(path.resolve())) if path.exists() else None
    if held is not None:
        return _read_holder(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _read_holder(path) or {"pid": None}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def run_is_alive(state_dir: Path, journal: RunJournal, holder: dict[str, Any] | None = None) -> bool:
    """Whether the run that wrote `journal` is still going: it says running and it holds the lock."""
    if journal.status != "running":
        return False
    holder = lock_holder(state_dir) if holder is None else holder
    return holder is not None and bool(holder) and holder.get("run_id") in (None, journal.run_id)


def close_dead_runs(state_dir: Path, *, found_by: str) -> list[str]:
    """Mark every journal left `running` by a run that is gone as `dead` (its open phase `interrupted`).

    Call only while holding the run lock (then no other run is alive). Returns the run ids closed."""
    closed = []
    for j in list_runs(state_dir):
        if j.status != "running" or j.run_id == found_by:
            continue
        j.status = "dead"
        j.stop_reason = (f"the run ended without closing its journal (killed, crashed or its machine went "
                         f"down); found by run {found_by}")
        for rec in j.phases:
            if rec.status == "pending":
                rec.status, rec.note = "interrupted", "the run died during this phase"
        save_journal(state_dir, j)
        closed.append(j.run_id)
    return closed


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
    """The newest `last` runs, newest first, ready to print as a table or JSON.

    A journal still `running` whose run no longer holds the lock is shown `dead` (read only: the next run
    closes it in the file)."""
    rows: list[StatusRow] = []
    holder = lock_holder(state_dir)
    for j in reversed(list_runs(state_dir)[-last:] if last > 0 else list_runs(state_dir)):
        aside = ", ".join(f"{h} ({sa.get('state')} at {sa.get('phase')})" for h, sa in sorted(j.set_aside.items()))
        status, reason = j.status, j.stop_reason
        if status == "running" and not run_is_alive(state_dir, j, holder or {}):
            status, reason = "dead", reason or "the run ended without closing its journal (killed or crashed)"
        rows.append(StatusRow(j.run_id, j.started, j.ended, status,
                              " ".join(f"{p.name}:{p.status}" for p in j.phases), len(j.hosts), aside, reason))
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


class _HwCurrent(TypedDict):
    guids: NotRequired[dict[str, str]]
    serials: NotRequired[dict[str, str]]
    host_key: NotRequired[dict[str, str]]


class _HwChange(TypedDict):
    when: str
    kind: str
    key: str
    old: str | None
    new: str | None


class _HwNode(TypedDict):
    first_seen: NotRequired[str]
    last_seen: NotRequired[str]
    current: NotRequired[_HwCurrent]
    history: NotRequired[list[_HwChange]]


class _HwFile(TypedDict):
    schema: NotRequired[int]
    nodes: NotRequired[dict[str, _HwNode]]


_HARDWARE: TypeAdapter[_HwFile] = TypeAdapter(_HwFile)


def load_hardware(state_dir: Path) -> dict[str, Any]:
    """hardware.json as data; UsageError (one line) when it is not readable or not the expected shape."""
    path = state_dir / HARDWARE
    if not path.is_file():
        return {"schema": SCHEMA, "nodes": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        _HARDWARE.validate_python(data, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise UsageError(f"{path}: not readable hardware history ({where}: {first['msg']})",
                         hint="restore it from a backup or move it aside (the history starts again)") from None
    except (OSError, ValueError, RecursionError) as exc:
        why = " ".join(str(exc).split())[:200]
        raise UsageError(f"{path}: not readable hardware history ({why})",
                         hint="restore it from a backup or move it aside (the history starts again)") from None
    out: dict[str, Any] = data
    out.setdefault("nodes", {})
    for entry in out["nodes"].values():
        entry.setdefault("current", {}).setdefault("guids", {})
        entry["current"].setdefault("serials", {})
        entry.setdefault("history", [])
    return out


@contextlib.contextmanager
def _hardware_lock(state_dir: Path) -> Iterator[None]:
    """Serialise read-modify-write of hardware.json between processes (two writers lost entries before)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / (HARDWARE + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record_hardware(state_dir: Path, node: str, *, guids: dict[str, str], serials: dict[str, str] | None = None,
                    when: str | None = None) -> list[HardwareChange]:
    """Record what was seen on `node`; return the old -> new changes (a swapped HCA, a replaced board).

    The history keeps every change forever; `current` is the merge of everything seen, newest wins.
    """
    when = when or utcnow()
    with _hardware_lock(state_dir):
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
    with _hardware_lock(state_dir):
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
