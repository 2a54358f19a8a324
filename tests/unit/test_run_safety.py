"""The run engine under careless and concurrent use (issue #16): --limit, --check, the run lock, dead runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import UsageError
from provisioner.phases import RunOptions, StepContext, StepOutcome, plan_run, provision_run
from provisioner.runner import FakeRun, PlaybookResult, fake_result
from provisioner.state import list_runs, load_journal, status_rows

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "examples" / "lab" / "cluster.yaml"
HOSTS = ["gpu01", "gpu02", "gpu03", "sm1", "sm2"]
PLAYBOOKS = ["preflight.yml", "repos.yml", "ofed.yml", "gpu_stack.yml", "fabric.yml", "storage.yml", "slurm.yml"]


class Runner:
    """A scripted run_playbook; `during` is called inside the named playbook (a second run, a kill)."""

    def __init__(self, during: dict[str, Callable[[], None]] | None = None,
                 script: dict[str, FakeRun] | None = None) -> None:
        self.during = during or {}
        self.script = script or {}
        self.calls: list[tuple[str, list[str], dict[str, Any]]] = []

    def __call__(self, playbook: Path, inventory_dir: Path, *, limit: Iterable[str], **kw: Any) -> PlaybookResult:
        hosts = list(limit)
        self.calls.append((playbook.name, hosts, {**kw, "inventory_dir": inventory_dir}))
        if playbook.name in self.during:
            self.during[playbook.name]()
        return fake_result(playbook.name, hosts, self.script.get(playbook.name, FakeRun()))


@pytest.fixture
def playbooks(tmp_path: Path) -> Path:
    d = tmp_path / "playbooks"
    d.mkdir()
    for name in PLAYBOOKS:
        (d / name).write_text("---\n")
    return d


def up(tmp_path: Path, playbooks: Path, runner: Runner, steps: dict[str, Any] | None = None,
       **opts: Any) -> Any:
    quiet = {"verify": lambda ctx: StepOutcome(), "report": lambda ctx: StepOutcome()}
    return provision_run(LAB, RunOptions(max_fail=50, **opts), state_dir=tmp_path / "st", runner=runner,
                         playbooks_dir=playbooks, steps={**quiet, **(steps or {})})


# --- item 3: --limit ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("limit", ["", " ", ",", " , "], ids=["empty", "blank", "comma", "blank-commas"])
def test_empty_limit_is_an_error_and_converges_nothing(tmp_path: Path, playbooks: Path, limit: str) -> None:
    r = Runner()
    with pytest.raises(UsageError, match="empty"):
        up(tmp_path, playbooks, r, limit=limit)
    assert r.calls == []  # the old engine ran every playbook on every host
    with pytest.raises(UsageError, match="empty"):
        plan_run(HOSTS, RunOptions(limit=limit))


@pytest.mark.parametrize(("limit", "hosts"), [
    ("compute", ["gpu01", "gpu02", "gpu03"]),
    ("compute,!gpu02", ["gpu01", "gpu03"]),
    ("compute:!gpu02", ["gpu01", "gpu03"]),
    ("!gpu01", ["gpu02", "gpu03", "sm1", "sm2"]),
    ("subnet_manager", ["sm1", "sm2"]),
    ("all,&subnet_manager", ["sm1", "sm2"]),
    ("gpu_nodes:&rail_1", ["gpu01", "gpu02", "gpu03"]),
    ("gpu0*", ["gpu01", "gpu02", "gpu03"]),
    ("~sm[12]", ["sm1", "sm2"]),
    ("compute[0:1]", ["gpu01", "gpu02"]),
    ("compute[2]", ["gpu03"]),
    ("gpu[01-02],sm1", ["gpu01", "gpu02", "sm1"]),
    ("sm2, gpu03", ["gpu03", "sm2"]),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_limit_takes_ansible_patterns(tmp_path: Path, playbooks: Path, limit: str, hosts: list[str]) -> None:
    r = Runner()
    j = up(tmp_path, playbooks, r, limit=limit)
    assert r.calls[0][1] == hosts
    assert list(j.hosts) == hosts


@pytest.mark.parametrize(("limit", "why"), [
    ("gpu09", "matches no host or group"),
    ("compute,!gpu99", "matches no host or group"),
    ("nosuchgroup*", "matches no host or group"),
    ("compute,!compute", "leaves no host"),
    ("compute,!", "without a name"),
    ("gpu[03-01]", "--limit"),
    ("compute[7]", "has 3 host"),
], ids=["unknown-host", "unknown-exclusion", "glob-matches-nothing", "nothing-left", "bare-bang", "bad-hostlist",
        "subscript-out-of-range"])
def test_limit_mistakes_are_errors(tmp_path: Path, playbooks: Path, limit: str, why: str) -> None:
    r = Runner()
    with pytest.raises(UsageError, match=why.replace("[", r"\[")):
        up(tmp_path, playbooks, r, limit=limit)
    assert r.calls == []


# --- item 4: --check changes nothing ------------------------------------------------------------------------------
def test_check_run_measures_nothing_and_writes_no_live_state(tmp_path: Path, playbooks: Path) -> None:
    measured: list[str] = []

    def verify(ctx: StepContext) -> StepOutcome:
        measured.append("verify")  # the real step runs ib_write_bw, NCCL and dd, and records hardware
        return StepOutcome()

    def report(ctx: StepContext) -> StepOutcome:
        measured.append("report")
        return StepOutcome()

    r = Runner()
    j = up(tmp_path, playbooks, r, {"verify": verify, "report": report}, check=True, diff=True)
    assert measured == []
    assert j.phase("verify").status == "skipped" and "--check" in (j.phase("verify").note or "")
    state = tmp_path / "st"
    assert not (state / "inventory").exists(), "a check run rewrote the live inventory"
    assert not (state / "facts").exists() and not (state / "hardware.json").exists()
    run_dir = state / "runs" / j.run_id
    for _, _, kw in r.calls:
        assert kw["check"] and kw["diff"]
        assert kw["inventory_dir"] == run_dir / "inventory" and (run_dir / "inventory" / "hosts.yml").is_file()
        assert kw["state_dir"] == run_dir  # the fact cache of a check run stays in its own directory
    assert all(not hp.completed for hp in j.hosts.values())


def test_resume_never_continues_a_check_run(tmp_path: Path, playbooks: Path) -> None:
    up(tmp_path, playbooks, Runner(), check=True)
    with pytest.raises(UsageError, match="no previous run"):
        up(tmp_path, playbooks, Runner(), resume=True)
    real = up(tmp_path, playbooks, Runner(script={"ofed.yml": FakeRun(failed={"gpu02": "x"})}))
    up(tmp_path, playbooks, Runner(), check=True)
    r = Runner()
    j = up(tmp_path, playbooks, r, resume=True)
    assert j.resumed_from == real.run_id  # not the newer check run
    assert r.calls[0][0] == "ofed.yml" and r.calls[0][1] == ["gpu02"]


# --- item 5: one run at a time; dead runs ------------------------------------------------------------------------
def second_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provisioner.cli", "up", str(LAB), "--out", str(tmp_path / "st"),
                           "--json", *args], capture_output=True, text=True, timeout=120, check=False)


def test_a_second_run_on_the_same_state_is_refused(tmp_path: Path, playbooks: Path) -> None:
    seen: dict[str, subprocess.CompletedProcess[str]] = {}

    def during() -> None:
        seen["up"] = second_run(tmp_path)
        seen["resume"] = second_run(tmp_path, "--resume")

    j = up(tmp_path, playbooks, Runner({"repos.yml": during}))
    for name, done in seen.items():
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert "another provision run is working on" in done.stderr and j.run_id in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert [x.run_id for x in list_runs(tmp_path / "st")] == [j.run_id]  # the refused runs left no journal
    assert j.status == "passed"


KILLED = """
import os, signal, sys
from pathlib import Path
from provisioner.phases import RunOptions, provision_run
from provisioner.runner import FakeRun, fake_result

def runner(playbook, inventory_dir, *, limit, **kw):
    if playbook.name == "ofed.yml":
        os.kill(os.getpid(), signal.SIGKILL)
    return fake_result(playbook.name, list(limit), FakeRun())

provision_run(Path(sys.argv[1]), RunOptions(max_fail=50), state_dir=Path(sys.argv[2]), runner=runner,
              playbooks_dir=Path(sys.argv[3]))
"""


def test_a_killed_run_is_dead_and_resumes(tmp_path: Path, playbooks: Path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED))
    done = subprocess.run([sys.executable, str(script), str(LAB), str(tmp_path / "st"), str(playbooks)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -9, done.stderr
    [killed] = list_runs(tmp_path / "st")
    assert killed.status == "running"  # SIGKILL: nothing could close it
    assert [r.status for r in status_rows(tmp_path / "st")] == ["dead"]  # but nobody holds the lock
    r = Runner()
    j = up(tmp_path, playbooks, r, resume=True)
    assert j.resumed_from == killed.run_id and j.status == "passed"
    assert [c[0] for c in r.calls] == ["ofed.yml", "gpu_stack.yml", "fabric.yml", "storage.yml", "slurm.yml"]
    closed = load_journal(tmp_path / "st" / "runs" / killed.run_id / "journal.json")
    assert closed.status == "dead" and j.run_id in (closed.stop_reason or "")
    assert closed.phase("ofed").status == "interrupted"  # type: ignore[union-attr]  # the phase it died in
    assert [r.status for r in status_rows(tmp_path / "st")] == ["passed", "dead"]
    assert os.path.exists(tmp_path / "st" / "run.lock")


HOLD = """
import sys
from pathlib import Path
from provisioner.state import acquire_run_lock
acquire_run_lock(Path(sys.argv[1]), run_id="20250101T000000.000000Z-abcdef")
print("held", flush=True)
sys.stdin.read()
"""


def test_verify_and_replace_node_wait_for_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`provision verify` measuring during a converge, or replace-node during a run, would both be wrong."""
    from provisioner.cli import main

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "st")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for args in (["verify", str(LAB), "--out", str(tmp_path / "st")],
                     ["replace-node", str(LAB), "gpu01", "--out", str(tmp_path / "st")]):
            assert main(args) == 2, args
            err = capsys.readouterr().err
            assert "another provision run is working on" in err and "20250101T000000.000000Z-abcdef" in err, err
    finally:
        holder.communicate("", timeout=30)
    assert main(["status", str(LAB), "--out", str(tmp_path / "st")]) == 0  # the lock went with its process


def test_a_state_dir_ansible_would_misread_is_refused_before_the_run(tmp_path: Path, playbooks: Path) -> None:
    """Issue #26: the run engine refuses the state directory (here with ' ;', an ansible.cfg comment) before it
    takes the lock, writes a journal or renders, not at the first playbook with a run half recorded."""
    r = Runner()
    state = tmp_path / "st ;x"
    quiet = {"verify": lambda ctx: StepOutcome(), "report": lambda ctx: StepOutcome()}
    with pytest.raises(UsageError, match=r"the state directory .* has ';'"):
        provision_run(LAB, RunOptions(max_fail=50), state_dir=state, runner=r, playbooks_dir=playbooks, steps=quiet)
    assert r.calls == [] and not state.exists()
