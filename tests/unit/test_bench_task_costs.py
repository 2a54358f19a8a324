"""bench/task_costs.py: the per-task cost bench_run.py prints is summed from the run's job_events as stated."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import task_costs  # type: ignore[import-not-found]  # noqa: E402


def _event(run: Path, phase: str, n: int, event: str, **data: object) -> None:
    events = run / phase / "artifacts" / phase / "job_events"
    events.mkdir(parents=True, exist_ok=True)
    (events / f"{n}-x.json").write_text(json.dumps({"event": event, "event_data": data}), encoding="utf-8")


def test_host_results_are_summed_per_phase_action_and_task(tmp_path: Path) -> None:
    _event(tmp_path, "repos", 1, "runner_on_ok", role="vendor_repos", task="Refresh", resolved_action="apt",
           duration=2.5)
    _event(tmp_path, "repos", 2, "runner_on_ok", role="vendor_repos", task="Refresh", resolved_action="apt",
           duration=1.5, res={"changed": True})
    _event(tmp_path, "ofed", 3, "runner_on_skipped", role="doca_ofed", task="Hold", task_action="dpkg_selections",
           duration=1.0)
    _event(tmp_path, "ofed", 4, "playbook_on_task_start", task="Hold", duration=99.0)  # not a host result
    (tmp_path / "ofed" / "artifacts" / "ofed" / "job_events" / "5-x.json").write_text("{trunc", encoding="utf-8")
    costs = task_costs.task_costs(tmp_path)
    assert costs.summary() == {"host_results": 3, "tasks": 2, "changed": 1, "host_task_s": 5.0, "per_result_s": 1.667}
    assert (costs.actions["apt"].seconds, costs.actions["apt"].results) == (4.0, 2)
    assert costs.phases["ofed"].results == 1
    text = task_costs.render(costs, 5)
    assert "3 host results of 2 tasks (1 changed), 5.0 host-task-s" in text
    assert "changed: repos/vendor_repos: Refresh x1" in text


def test_a_missing_run_dir_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert task_costs.main([str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
