"""State files under concurrency, crashes and corruption (issue #16, items 5, 7 and 9)."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import UsageError
from provisioner.state import load_hardware, record_hardware, record_host_key, write_json_atomic

ROOT = Path(__file__).resolve().parents[2]


# --- item 5: the hardware record under two writers -----------------------------------------------------------
def _record_many(state: str, start: int, count: int) -> None:
    for i in range(start, start + count):
        record_hardware(Path(state), f"n{i:03d}", guids={"mlx5_0/1": f"0x{i:016x}"}, when="t")


def test_concurrent_writers_lose_no_hardware_entry(tmp_path: Path) -> None:
    """Two runs recording at once lost 123 of 300 entries (read, modify, write without a lock)."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), k * 30, 30)) for k in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    assert len(load_hardware(tmp_path)["nodes"]) == 120


# --- item 7: malformed hardware records are one line, exit 2 -------------------------------------------------
@pytest.mark.parametrize("doc", ["[]", '{"nodes": []}', '{"nodes": {"a": {"history": 5}}}',
                                 '{"nodes": {"a": {"current": {"guids": [1]}}}}', '{"nodes": {"a": 7}}',
                                 "[" * 100000],
                         ids=["list", "nodes-list", "history-number", "guids-list", "node-number", "deep"])
@pytest.mark.parametrize("write", [
    lambda d: record_hardware(d, "a", guids={"mlx5_0/1": "0x1"}),
    lambda d: record_host_key(d, "a", old=[], new="SHA256:x", key_type="ssh-ed25519"),
], ids=["guids", "host_key"])
def test_malformed_hardware_record_is_a_usage_error(tmp_path: Path, doc: str,
                                                    write: Callable[[Path], Any]) -> None:
    (tmp_path / "hardware.json").write_text(doc)
    with pytest.raises(UsageError) as info:
        write(tmp_path)
    assert "hardware.json" in str(info.value) and "\n" not in str(info.value)
    assert info.value.exit_code == 2
    assert (tmp_path / "hardware.json").read_text() == doc  # left as found


# --- item 9: durable atomic writes with unique temp names ----------------------------------------------------
class DiskLog:
    """Records fsyncs (file or directory) and renames, to check the write-fsync-rename-fsync(dir) order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, str]] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd: int) -> None:
            kind = "fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file"
            self.events.append((kind, os.readlink(f"/proc/self/fd/{fd}")))
            real_fsync(fd)

        def replace(src: Any, dst: Any) -> None:
            self.events.append(("rename", f"{os.fspath(src)} -> {os.fspath(dst)}"))
            real_replace(src, dst)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def check(self, target: Path, *, link: bool = False) -> str:
        """The temp name `target` was renamed from, after checking it was synced before (a symlink has no
        data of its own to sync) and its directory after."""
        renames = [i for i, (k, v) in enumerate(self.events) if k == "rename" and v.endswith(f" -> {target}")]
        assert renames, f"{target} was not written by a rename: {self.events}"
        i = renames[-1]
        src = self.events[i][1].split(" -> ")[0]
        assert Path(src).parent == target.parent
        before = [v for k, v in self.events[:i] if k == "fsync-file"]
        assert link or src in before, f"{src} not fsync'd before the rename"
        after = [v for k, v in self.events[i + 1:] if k == "fsync-dir"]
        assert str(target.parent) in after, f"{target.parent} not fsync'd after the rename"
        return src


def test_journal_write_is_durable_and_unique(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = DiskLog(monkeypatch)
    target = tmp_path / "runs" / "r1" / "journal.json"
    write_json_atomic(target, {"a": 1})
    first = log.check(target)
    write_json_atomic(target, {"a": 2})
    assert log.check(target) != first
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in target.parent.iterdir()] == ["journal.json"]


def test_render_writes_durably(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.render import render_inventory
    from provisioner.spec import load_cluster

    cluster, _ = load_cluster(ROOT / "examples" / "h100-ndr-8node.yaml")
    log = DiskLog(monkeypatch)
    res = render_inventory(cluster, tmp_path)
    log.check(res.out_dir / "hosts.yml")
    log.check(res.out_dir / "host_vars" / "gpu01.yml")


def test_baseline_write_is_durable_and_unique(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.fabric import baseline

    log = DiskLog(monkeypatch)
    path = tmp_path / "verify" / "baseline.json"
    assert baseline.store_if_first(path, {"message_size": 1}, True)
    src = log.check(path)
    assert not src.endswith("baseline.tmp")  # a fixed temp name: two runs would write into one file


def test_latest_link_uses_a_unique_temp_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provisioner.report import VerifyReport
    from provisioner.verify import write_reports

    log = DiskLog(monkeypatch)
    now = datetime(2025, 1, 1, tzinfo=UTC)
    report = VerifyReport(cluster="c", started=now, finished=now, checks=())
    write_reports(report, tmp_path / "verify" / "20250101T000000Z", {})
    src = log.check(tmp_path / "verify" / "latest", link=True)
    assert Path(src).name != ".latest.tmp"
    log.check(tmp_path / "verify" / "20250101T000000Z" / "report.json")
    assert os.readlink(tmp_path / "verify" / "latest") == "20250101T000000Z"


def test_one_place_knows_the_default_state_directory() -> None:
    """`.provision/<cluster>` is spelled in provisioner.state alone; every command asks state_dir_for."""
    from provisioner.state import state_dir_for

    root = Path(__file__).resolve().parents[2] / "provisioner"
    spelled = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if p.name != "state.py" and '".provision"' in p.read_text(encoding="utf-8")]
    assert spelled == []
    assert state_dir_for("c1") == Path(".provision/c1") and state_dir_for("c1", Path("/x")) == Path("/x")


# --- issue #26 item 4: files holding node data are the operator's only ---------------------------------------
def test_verify_reports_are_private(tmp_path: Path) -> None:
    from provisioner.report import VerifyReport
    from provisioner.verify import write_reports

    now = datetime(2025, 1, 1, tzinfo=UTC)
    report = VerifyReport(cluster="c", started=now, finished=now, checks=())
    directory = tmp_path / "verify" / "20250101T000000Z"
    write_reports(report, directory, {"gpu01": {"address": "10.0.0.1"}})
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700  # old: 0755 with 0644 files
    for name in ("report.json", "junit.xml", "report.html", "inventory.json"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name


def test_a_run_directory_is_private(tmp_path: Path) -> None:
    from provisioner.phases import RunOptions, StepOutcome, provision_run
    from provisioner.runner import FakeRun, PlaybookResult, fake_result

    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    for name in ("preflight", "repos", "ofed", "gpu_stack", "fabric", "storage", "slurm"):
        (playbooks / f"{name}.yml").write_text("---\n")

    def runner(playbook: Path, inventory_dir: Path, *, limit: list[str], **kw: Any) -> PlaybookResult:
        return fake_result(playbook.name, list(limit), FakeRun())

    lab = Path(__file__).resolve().parents[2] / "examples" / "lab" / "cluster.yaml"
    quiet = {"verify": lambda ctx: StepOutcome(), "report": lambda ctx: StepOutcome()}
    journal = provision_run(lab, RunOptions(), state_dir=tmp_path / "st", runner=runner, playbooks_dir=playbooks,
                            steps=quiet)
    run_dir = tmp_path / "st" / "runs" / journal.run_id
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700  # old: 0755
    assert stat.S_IMODE((run_dir / "journal.json").stat().st_mode) == 0o600
