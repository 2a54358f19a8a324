"""The progress model and views fed by runner events (rich live view rendered to a string, JSON lines)."""

from __future__ import annotations

import io
import json

from rich.console import Console

from provisioner.progress import JsonReporter, LiveReporter, ProgressModel, event_line, render
from provisioner.state import PhaseRecord

EVENTS = [
    {"event": "playbook_on_task_start", "event_data": {"task": "Install the driver"}},
    {"event": "runner_on_ok", "event_data": {"host": "a", "task": "Install the driver", "res": {"changed": True}}},
    {"event": "runner_on_failed", "event_data": {"host": "b", "task": "Install the driver", "res": {"msg": "dkms"}}},
    {"event": "runner_on_failed", "event_data": {"host": "a", "ignore_errors": True, "res": {}}},
    {"event": "runner_on_unreachable", "event_data": {"host": "c", "res": {"msg": "ssh: timeout"}}},
]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_model_counts_and_task() -> None:
    clock = Clock()
    m = ProgressModel(clock=clock)
    m.start_phase("gpu_stack", ["a", "b", "c", "d"])
    for ev in EVENTS:
        m.feed(ev)
    assert m.counts() == {"hosts": 4, "done": 1, "failed": 1, "unreachable": 1}
    assert m.task == "Install the driver"
    clock.t = 142.0
    assert m.elapsed == 42.0
    m.end_phase(PhaseRecord("gpu_stack", "partial"))
    assert m.finished == ["gpu_stack"] and m.task is None


def test_render_shows_phase_counts_elapsed() -> None:
    m = ProgressModel(clock=Clock())
    m.start_phase("ofed", ["a", "b"])
    m.feed(EVENTS[0])
    m.feed(EVENTS[2])
    con = Console(file=io.StringIO(), width=100)
    con.print(render(m))
    text = con.file.getvalue()  # type: ignore[attr-defined]
    assert "ofed" in text and "0/2 done, 1 failed, 0 unreachable" in text and "Install the driver" in text
    assert "1: Install the driver" in text and "1/2 hosts answered this task" in text
    assert "b: failed in Install the driver" in text  # named as it happens, not only counted


def test_the_task_bar_restarts_with_each_task_and_lists_the_unreachable() -> None:
    m = ProgressModel(clock=Clock())
    m.start_phase("gpu_stack", ["a", "b", "c", "d"])
    for ev in EVENTS:
        m.feed(ev)
    assert m.tasks == 1 and m.task_hosts == {"a", "b", "c"}
    assert m.why == {"b": "failed in Install the driver", "c": "unreachable in Install the driver"}
    m.feed({"event": "playbook_on_task_start", "event_data": {"task": "Hold the driver"}})
    assert m.tasks == 2 and m.task_hosts == set() and m.task == "Hold the driver"
    con = Console(file=io.StringIO(), width=100)
    con.print(render(m))
    text = con.file.getvalue()  # type: ignore[attr-defined]
    assert "2: Hold the driver" in text and "0/4 hosts answered this task" in text
    assert "c: unreachable in Install the driver" in text


def test_each_phase_line_is_printed_once() -> None:
    """The live view prints a phase's line when it ends; the summary leaves those out (validate and render were
    printed twice, once live and once in the summary)."""
    from provisioner.phases import summary_lines
    from provisioner.state import RunJournal

    buf = io.StringIO()
    con = Console(file=buf, width=120, force_terminal=False)
    records = [PhaseRecord("validate", "ok", note="5 nodes, 0 warning(s)"),
               PhaseRecord("preflight", "partial", hosts=["a", "b"], ok=["a"], failed={"b": "dkms"})]
    with LiveReporter(con) as rep:
        for rec in records:
            rep.phase_started(rec.name, ["a", "b"])
            rep.phase_finished(rec)
    journal = RunJournal(run_id="r1", cluster="c1", spec="cluster.yaml", phases_planned=["validate", "preflight"],
                         hosts={}, status="partial", phases=records)
    for line in summary_lines(journal, printed=rep.printed):
        con.print(line)
    out = buf.getvalue()
    assert out.count("validate: ok (5 nodes, 0 warning(s))") == 1
    assert out.count("preflight: partial (1 ok, 1 failed, 0 unreachable)") == 1
    assert "run r1: partial" in out
    assert "  validate: ok" in "\n".join(summary_lines(journal))  # without a live view, the summary has them


def test_live_reporter_prints_phase_lines() -> None:
    buf = io.StringIO()
    con = Console(file=buf, width=100, force_terminal=False)
    with LiveReporter(con) as rep:
        rep.phase_started("preflight", ["a"])
        rep.event("preflight", EVENTS[1])
        rep.phase_finished(PhaseRecord("preflight", "not_built", note="playbooks/preflight.yml does not exist yet"))
    assert "preflight: not built (playbooks/preflight.yml does not exist yet)" in buf.getvalue()


def test_event_line_is_small_and_stable() -> None:
    line = event_line("gpu_stack", {**EVENTS[2], "counter": 7, "created": "2025-01-01T00:00:00"})
    assert line == {"type": "event", "phase": "gpu_stack", "event": "runner_on_failed", "counter": 7,
                    "created": "2025-01-01T00:00:00", "host": "b", "task": "Install the driver", "msg": "dkms"}
    stats = event_line("p", {"event": "playbook_on_stats", "event_data": {"ok": {"a": 2}, "dark": {"c": 1}}})
    assert stats["stats"]["ok"] == {"a": 2} and stats["stats"]["dark"] == {"c": 1}


def test_json_reporter_lines_parse() -> None:
    buf = io.StringIO()
    rep = JsonReporter(buf)
    rep.phase_started("repos", ["a", "b"])
    rep.event("repos", EVENTS[1])
    rep.phase_finished(PhaseRecord("repos", "ok", ok=["a", "b"]))
    objs = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert [o["type"] for o in objs] == ["phase_start", "event", "phase_end"]
    assert objs[1]["changed"] is True and objs[2]["ok"] == ["a", "b"]
