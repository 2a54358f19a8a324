"""What a run's tasks cost: host results, task count and summed host-task seconds, per phase and per action.

Run: .venv/bin/python bench/task_costs.py STATE/runs/RUN_ID [--top 40]

It reads ansible-runner's job_events of each phase of one run (``<run dir>/<phase>/artifacts/*/job_events``) and
sums ``event_data.duration`` of every host result (ok, failed, skipped, unreachable). The "per-task cost" is
those seconds over the host results: what one task on one host costs, waits for the control node included.
bench_run.py prints the summary after each converge it times.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = frozenset({"runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable"})


@dataclass
class Cost:
    seconds: float = 0.0
    results: int = 0

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.results += 1


@dataclass
class TaskCosts:
    total: Cost = field(default_factory=Cost)
    phases: dict[str, Cost] = field(default_factory=lambda: defaultdict(Cost))
    actions: dict[str, Cost] = field(default_factory=lambda: defaultdict(Cost))
    tasks: dict[tuple[str, str, str], Cost] = field(default_factory=lambda: defaultdict(Cost))
    changed: list[str] = field(default_factory=list)  # "phase/role: task" of each changed host result

    @property
    def per_result_s(self) -> float:
        return self.total.seconds / self.total.results if self.total.results else 0.0

    def summary(self) -> dict[str, float | int]:
        return {"host_results": self.total.results, "tasks": len(self.tasks), "changed": len(self.changed),
                "host_task_s": round(self.total.seconds, 1), "per_result_s": round(self.per_result_s, 3)}


def _events(run_dir: Path) -> list[tuple[str, dict[str, object]]]:
    found = []
    for path in sorted(run_dir.glob("*/artifacts/*/job_events/*.json")):
        try:
            event = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a partial event of a killed run counts for nothing
        if isinstance(event, dict) and event.get("event") in RESULTS and isinstance(event.get("event_data"), dict):
            found.append((path.relative_to(run_dir).parts[0], event["event_data"]))
    return found


def task_costs(run_dir: Path) -> TaskCosts:
    costs = TaskCosts()
    for phase, data in _events(run_dir):
        duration = data.get("duration")
        seconds = float(duration) if isinstance(duration, int | float) else 0.0
        action = str(data.get("resolved_action") or data.get("task_action") or "")
        costs.total.add(seconds)
        costs.phases[phase].add(seconds)
        costs.actions[action].add(seconds)
        costs.tasks[(phase, str(data.get("role") or ""), str(data.get("task") or ""))].add(seconds)
        res = data.get("res")
        if isinstance(res, dict) and res.get("changed") is True:
            costs.changed.append(f"{phase}/{data.get('role') or ''}: {data.get('task') or ''}")
    return costs


def render(costs: TaskCosts, top: int) -> str:
    s = costs.summary()
    lines = [f"{s['host_results']} host results of {s['tasks']} tasks ({s['changed']} changed), "
             f"{s['host_task_s']} host-task-s, {s['per_result_s']} s per host result"]
    lines += [f"  changed: {name} x{n}" for name, n in sorted(Counter(costs.changed).items())[:top]]
    lines.append("by phase:")
    lines += [f"  {name:10} {c.seconds:7.1f} s x{c.results}" for name, c in
              sorted(costs.phases.items(), key=lambda kv: -kv[1].seconds)]
    lines.append("by action:")
    lines += [f"  {c.seconds:7.1f} s x{c.results:4d} {name}" for name, c in
              sorted(costs.actions.items(), key=lambda kv: -kv[1].seconds)[:15]]
    lines.append("top tasks:")
    lines += [f"  {c.seconds:6.1f} s x{c.results:2d} {phase}/{role}: {task[:70]}" for (phase, role, task), c in
              sorted(costs.tasks.items(), key=lambda kv: -kv[1].seconds)[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="STATE/runs/RUN_ID")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"task_costs: {args.run_dir}: not a directory", file=sys.stderr)
        return 2
    print(render(task_costs(args.run_dir), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
