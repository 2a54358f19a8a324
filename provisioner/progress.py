"""Progress of a run, fed by the engine and the runner's events: a rich live view, or JSON lines for machines.

`ProgressModel` is the pure part (what phase, which hosts are done/failed/unreachable, the current task,
elapsed time); `LiveReporter` draws it with rich.Live; `JsonReporter` writes one JSON object per line per
event, so a CI job or another tool can follow a run with `jq` without scraping text.
Events reach here already redacted (runner.py redacts before anyone sees them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from provisioner.state import PhaseRecord, RunJournal

# runner events that say something about one host's outcome
_HOST_EVENTS = {"runner_on_ok": "ok", "runner_on_failed": "failed", "runner_on_unreachable": "unreachable",
                "runner_on_skipped": "skipped"}


@dataclass
class ProgressModel:
    """What the live view shows; updated by the reporter calls, read by `render`."""

    clock: Callable[[], float] = time.monotonic
    phase: str | None = None
    hosts: list[str] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    unreachable: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)       # hosts with at least one task result this phase
    task: str | None = None
    tasks: int = 0                                      # tasks started in this phase
    task_hosts: set[str] = field(default_factory=set)   # hosts that reported on the current task
    why: dict[str, str] = field(default_factory=dict)   # failed/unreachable host -> the task it happened in
    started: float = 0.0
    phase_started: float = 0.0
    finished: list[str] = field(default_factory=list)  # phases already printed above the panel

    def __post_init__(self) -> None:
        self.started = self.phase_started = self.clock()

    def start_phase(self, name: str, hosts: Sequence[str]) -> None:
        self.phase, self.hosts, self.task, self.tasks = name, list(hosts), None, 0
        self.failed, self.unreachable, self.seen, self.task_hosts, self.why = set(), set(), set(), set(), {}
        self.phase_started = self.clock()

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_task_start":
            self.task = data.get("task") or self.task
            self.tasks += 1
            self.task_hosts = set()
            return
        host = data.get("host")
        if not host or kind not in _HOST_EVENTS:
            return
        self.task_hosts.add(host)
        if kind == "runner_on_failed" and data.get("ignore_errors"):
            return
        self.seen.add(host)
        if kind == "runner_on_failed":
            self.failed.add(host)
        elif kind == "runner_on_unreachable":
            self.unreachable.add(host)
        if kind in ("runner_on_failed", "runner_on_unreachable"):
            self.why.setdefault(host, f"{_HOST_EVENTS[kind]} in {data.get('task') or self.task or '?'}")

    def end_phase(self, record: PhaseRecord) -> None:
        self.finished.append(record.name)
        self.task = None

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def counts(self) -> dict[str, int]:
        bad = self.failed | self.unreachable
        return {"hosts": len(self.hosts), "done": len(self.seen - bad), "failed": len(self.failed),
                "unreachable": len(self.unreachable - self.failed)}


WHY_SHOWN = 8
"""Failed and unreachable hosts listed by name in the panel; more are counted (the summary names them all)."""


def render(model: ProgressModel) -> RenderableType:
    """The live panel under the printed phase lines: the current phase, its task with a bar of the hosts that have
    answered it, counts, the hosts that failed or went unreachable (and where) as they happen, elapsed time."""
    table = Table.grid(padding=(0, 2))
    table.add_column(justify="right", style="bold")
    table.add_column()
    if model.phase:
        c = model.counts()
        total = max(1, len(model.hosts))
        table.add_row("phase", Text(model.phase, style="bold cyan"))
        table.add_row("task", Text(f"{model.tasks}: {model.task}" if model.task else "-"))
        bar = Table.grid(padding=(0, 1))
        bar.add_row(ProgressBar(total=total, completed=len(model.task_hosts), width=30),
                    Text(f"{len(model.task_hosts)}/{len(model.hosts)} hosts answered this task"))
        table.add_row("", bar)
        table.add_row("hosts", Text(f"{c['done']}/{c['hosts']} done, {c['failed']} failed, "
                                    f"{c['unreachable']} unreachable"))
        for host in sorted(model.why)[:WHY_SHOWN]:
            table.add_row("", Text(f"{host}: {model.why[host]}", style="red"))
        if len(model.why) > WHY_SHOWN:
            table.add_row("", Text(f"... and {len(model.why) - WHY_SHOWN} more", style="red"))
    table.add_row("elapsed", Text(f"{model.elapsed:.0f} s"))
    return Group(table)


class LiveReporter:
    """The engine's Reporter drawing a rich live view on stderr; prints the summary at the end."""

    def __init__(self, console: Console | None = None, model: ProgressModel | None = None) -> None:
        self.console = console or Console(stderr=True, markup=False, emoji=False, highlight=False)
        self.model = model or ProgressModel()
        self.live = Live(render(self.model), console=self.console, refresh_per_second=4, transient=True)

    def __enter__(self) -> LiveReporter:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def _refresh(self) -> None:
        self.live.update(render(self.model))

    def phase_started(self, name: str, hosts: Sequence[str]) -> None:
        self.model.start_phase(name, hosts)
        self._refresh()

    def event(self, phase: str, event: Mapping[str, Any]) -> None:
        self.model.feed(event)
        self._refresh()

    def phase_finished(self, record: PhaseRecord) -> None:
        from provisioner.phases import phase_line

        self.model.end_phase(record)
        self.console.print(phase_line(record), markup=False, highlight=False, emoji=False)
        self._refresh()

    @property
    def printed(self) -> list[str]:
        """The phases whose line this view printed (the end-of-run summary leaves them out)."""
        return list(self.model.finished)

    def run_finished(self, journal: RunJournal) -> None:
        self._refresh()


def event_line(phase: str, event: Mapping[str, Any]) -> dict[str, Any]:
    """One runner event as a small, stable JSON object (the full event is in the artifacts)."""
    data = event.get("event_data") or {}
    out: dict[str, Any] = {"type": "event", "phase": phase, "event": event.get("event"),
                           "counter": event.get("counter"), "created": event.get("created")}
    for key in ("host", "task", "play", "task_action"):
        if data.get(key):
            out[key] = data[key]
    res = data.get("res")
    if isinstance(res, Mapping):
        if "changed" in res:
            out["changed"] = bool(res["changed"])
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable") and res.get("msg"):
            out["msg"] = str(res["msg"])
    if event.get("event") == "playbook_on_stats":
        out["stats"] = {k: data.get(k) or {} for k in ("ok", "changed", "failures", "dark", "skipped")}
    return out


class JsonReporter:
    """`--json`: one JSON object per line: run/phase boundaries and every runner event."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def _emit(self, obj: Mapping[str, Any]) -> None:
        self.stream.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
        self.stream.flush()

    def phase_started(self, name: str, hosts: Sequence[str]) -> None:
        self._emit({"type": "phase_start", "phase": name, "hosts": list(hosts)})

    def event(self, phase: str, event: Mapping[str, Any]) -> None:
        self._emit(event_line(phase, event))

    def phase_finished(self, record: PhaseRecord) -> None:
        self._emit({"type": "phase_end", "phase": record.name, "status": record.status, "ok": record.ok,
                    "failed": record.failed, "unreachable": record.unreachable, "note": record.note,
                    "artifact_dir": record.artifact_dir})

    def run_finished(self, journal: RunJournal) -> None:
        self._emit({"type": "run_end", "run_id": journal.run_id, "status": journal.status,
                    "set_aside": journal.set_aside, "stop_reason": journal.stop_reason})
