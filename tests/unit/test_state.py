"""The run journal on disk, `provision status` rows, and the hardware history."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from provisioner.errors import UsageError
from provisioner.state import (
    HostProgress,
    PhaseRecord,
    RunJournal,
    diff_hardware,
    last_run,
    list_runs,
    load_hardware,
    load_journal,
    new_run_id,
    record_hardware,
    save_journal,
    status_rows,
)


def journal(run_id: str, status: str = "passed", aside: dict[str, str] | None = None) -> RunJournal:
    hosts = {"gpu01": HostProgress(["validate", "preflight"]), "gpu02": HostProgress(["validate"], aside)}
    j = RunJournal(run_id, "lab", "cluster.yaml", ["validate", "preflight"], hosts, status=status)
    j.phases = [PhaseRecord("validate", "ok", hosts=["gpu01", "gpu02"], ok=["gpu01", "gpu02"]),
                PhaseRecord("preflight", "partial", hosts=["gpu01", "gpu02"], ok=["gpu01"],
                            unreachable={"gpu02": "ssh: timeout"}, artifact_dir="/x/preflight")]
    return j


def test_run_ids_sort_by_time() -> None:
    a = new_run_id(datetime(2025, 1, 1, 12, 0, 0, 1, tzinfo=UTC))
    b = new_run_id(datetime(2025, 1, 1, 12, 0, 0, 2, tzinfo=UTC))
    c = new_run_id(datetime(2025, 1, 2, 0, 0, 0, tzinfo=UTC))
    assert sorted([c, b, a]) == [a, b, c] and a != new_run_id(datetime(2025, 1, 1, 12, 0, 0, 1, tzinfo=UTC))


def test_journal_round_trip(tmp_path: Path) -> None:
    j = journal("20250101T000000.000001Z-aaaaaa", "partial",
                {"phase": "preflight", "state": "unreachable", "reason": "ssh: timeout"})
    path = save_journal(tmp_path, j)
    assert path == tmp_path / "runs" / j.run_id / "journal.json"
    back = load_journal(path)
    assert back == j
    assert back.set_aside == {"gpu02": {"phase": "preflight", "state": "unreachable", "reason": "ssh: timeout"}}
    assert back.unfinished_hosts() == ["gpu02"]
    assert json.loads(path.read_text())["phases"][1]["unreachable"] == {"gpu02": "ssh: timeout"}


def test_last_run_and_status_rows(tmp_path: Path) -> None:
    assert last_run(tmp_path) is None and status_rows(tmp_path) == []
    save_journal(tmp_path, journal("20250101T000000.000001Z-aaaaaa"))
    save_journal(tmp_path, journal("20250102T000000.000001Z-bbbbbb", "partial",
                                   {"phase": "preflight", "state": "unreachable", "reason": "r"}))
    assert [j.run_id[:8] for j in list_runs(tmp_path)] == ["20250101", "20250102"]
    assert last_run(tmp_path).run_id.startswith("20250102")  # type: ignore[union-attr]
    rows = status_rows(tmp_path)
    assert [r.status for r in rows] == ["partial", "passed"]
    assert rows[0].set_aside == "gpu02 (unreachable at preflight)" and rows[1].set_aside == ""
    assert rows[0].phases == "validate:ok preflight:partial" and rows[0].hosts == 2
    assert len(status_rows(tmp_path, last=1)) == 1


def test_broken_journal_says_which(tmp_path: Path) -> None:
    bad = tmp_path / "runs" / "x" / "journal.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="journal"):
        list_runs(tmp_path)


def test_hardware_history_records_old_and_new(tmp_path: Path) -> None:
    assert record_hardware(tmp_path, "gpu01", guids={"mlx5_0/1": "0xa"}, serials={"board": "S1"},
                           when="t1") == []
    assert record_hardware(tmp_path, "gpu01", guids={"mlx5_0/1": "0xa"}, when="t2") == []  # unchanged; no serials
    changes = record_hardware(tmp_path, "gpu01", guids={"mlx5_0/1": "0xb"}, serials={"board": "S1"}, when="t3")
    assert [(c.kind, c.key, c.old, c.new) for c in changes] == [("guid", "mlx5_0/1", "0xa", "0xb")]
    data = load_hardware(tmp_path)
    node = data["nodes"]["gpu01"]
    assert node["current"] == {"guids": {"mlx5_0/1": "0xb"}, "serials": {"board": "S1"}}
    assert node["history"] == [{"when": "t3", "kind": "guid", "key": "mlx5_0/1", "old": "0xa", "new": "0xb"}]
    assert node["first_seen"] == "t1" and node["last_seen"] == "t3"


def test_diff_hardware_new_port_and_unobserved() -> None:
    old = {"guids": {"mlx5_0/1": "0xa"}, "serials": {}}
    new = {"guids": {"mlx5_1/1": "0xc"}, "serials": {"board": "S9"}}
    changes = diff_hardware("n", old, new, "t")
    assert [(c.kind, c.key, c.old, c.new) for c in changes] == [("guid", "mlx5_1/1", None, "0xc")]
