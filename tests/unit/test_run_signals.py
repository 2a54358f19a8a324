"""Interrupting a run (issue #16, item 6): Ctrl-C, SIGTERM and SIGHUP end it cleanly with the journal closed.

The playbooks here run through the real ansible-runner against local hosts (connection local), because the
bug was ansible-runner's own signal handlers, which it leaves installed after the first playbook.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from provisioner.phases import Engine, RunOptions, StepContext, StepOutcome, plan_run, provision_run
from provisioner.runner import FakeRun, PlaybookResult, fake_result, run_playbook
from provisioner.state import list_runs

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "examples" / "lab" / "cluster.yaml"

INVENTORY = """\
all:
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  hosts:
    alpha: {ansible_connection: local}
    beta: {ansible_connection: local}
"""
QUICK = """\
- name: Quick preflight
  hosts: all
  gather_facts: false
  tasks:
    - name: Reach the host
      ansible.builtin.ping:
"""
SLOW = """\
- name: Slow preflight
  hosts: all
  gather_facts: false
  tasks:
    - name: Hold
      ansible.builtin.wait_for:
        path: /nonexistent/provisioner-never-there
        timeout: 300
"""


def workdir(tmp_path: Path, playbook: str) -> Path:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "preflight.yml").write_text(playbook)
    (tmp_path / "inventory.yml").write_text(INVENTORY)
    return tmp_path


def engine(tmp_path: Path, steps: dict[str, Any], runner: Any = run_playbook) -> Engine:
    quiet = {name: (lambda ctx: StepOutcome()) for name in ("validate", "render", "verify", "report")}
    return Engine("c1", "cluster.yaml", tmp_path / "state", tmp_path / "inventory.yml", {}, RunOptions(),
                  playbooks_dir=tmp_path / "playbooks", runner=runner, steps={**quiet, **steps})


def test_sigterm_after_a_playbook_ends_the_run(tmp_path: Path) -> None:
    """After the first playbook, ansible-runner's leftover handler swallowed SIGTERM and the run 'passed'."""
    workdir(tmp_path, QUICK)
    reported: list[str] = []

    def verify(ctx: StepContext) -> StepOutcome:
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill <pid>` would, while verify measures
        return StepOutcome()

    def report(ctx: StepContext) -> StepOutcome:
        reported.append("report")
        return StepOutcome()

    before = signal.getsignal(signal.SIGTERM)
    e = engine(tmp_path, {"verify": verify, "report": report})
    with pytest.raises(BaseException) as info:
        e.execute(plan_run(["alpha", "beta"], RunOptions(only=["preflight", "verify", "report"])))
    assert getattr(info.value, "exit_code", None) == 143, repr(info.value)
    [j] = list_runs(tmp_path / "state")
    assert j.phase("preflight").status == "ok"  # type: ignore[union-attr]
    assert j.status == "interrupted" and j.phase("verify").status == "interrupted"  # type: ignore[union-attr]
    assert j.stop_reason == "interrupted by SIGTERM" and j.ended
    assert reported == [] and j.phase("report") is None
    assert signal.getsignal(signal.SIGTERM) == before  # no handler left behind (ansible-runner's stayed)


def test_ctrl_c_before_any_playbook_closes_the_journal(tmp_path: Path) -> None:
    calls: list[str] = []

    def runner(playbook: Path, inventory_dir: Path, *, limit: Iterable[str], **kw: Any) -> PlaybookResult:
        calls.append(playbook.name)
        return fake_result(playbook.name, list(limit), FakeRun())

    def render(ctx: StepContext) -> StepOutcome:
        os.kill(os.getpid(), signal.SIGINT)
        return StepOutcome()

    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "preflight.yml").write_text("---\n")
    with pytest.raises(BaseException) as info:
        provision_run(LAB, RunOptions(only=["preflight"]), state_dir=tmp_path / "st", runner=runner,
                      playbooks_dir=playbooks, steps={"render": render})
    assert getattr(info.value, "exit_code", None) == 130, repr(info.value)
    [j] = list_runs(tmp_path / "st")
    assert j.status == "interrupted" and j.phase("render").status == "interrupted"  # type: ignore[union-attr]
    assert calls == []
    assert getattr(info.value, "journal", None) is not None


def test_sighup_exits_129_with_the_journal_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import provisioner.verify
    from provisioner.cli import main

    def hangup(*args: Any, **kw: Any) -> Any:
        os.kill(os.getpid(), signal.SIGHUP)  # the terminal went away
        raise AssertionError("SIGHUP did not stop the run")

    monkeypatch.setattr(provisioner.verify, "verify", hangup)
    rc = main(["up", str(LAB), "--out", str(tmp_path), "--only", "verify", "--json"])
    assert rc == 129
    [j] = list_runs(tmp_path)
    assert j.status == "interrupted" and j.phase("verify").status == "interrupted"  # type: ignore[union-attr]
    events = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert events[-1]["type"] == "run_end" and events[-1]["status"] == "interrupted"


SCRIPT = """
import sys
from pathlib import Path
from provisioner.phases import Engine, NullReporter, RunOptions, StepOutcome, plan_run

class Say(NullReporter):
    def event(self, phase, event):
        if event.get("event") == "playbook_on_task_start":
            print("task", event.get("event_data", {}).get("task"), flush=True)

d = Path(sys.argv[1])
quiet = {n: (lambda ctx: StepOutcome()) for n in ("validate", "render", "verify", "report")}
e = Engine("c1", "cluster.yaml", d / "state", d / "inventory.yml", {}, RunOptions(),
           playbooks_dir=d / "playbooks", steps=quiet, reporter=Say())
try:
    j = e.execute(plan_run(["alpha", "beta"], RunOptions(only=["preflight"])))
except BaseException as exc:
    print("raised", type(exc).__name__, flush=True)
    sys.exit(getattr(exc, "exit_code", 99))
print("finished", j.status, flush=True)
"""


def leftovers(run_dir: Path) -> list[int]:
    """Processes still running with their ANSIBLE_CONFIG under `run_dir` (ansible-playbook and its workers),
    once those already killed have had 10 s to go (waited for through pidfds, not by sleeping)."""
    found = _running_with(run_dir)
    for pid in found:
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
            try:
                select.select([fd], [], [], 10)
            finally:
                os.close(fd)
    return _running_with(run_dir)


def _running_with(run_dir: Path) -> list[int]:
    marker = f"ANSIBLE_CONFIG={run_dir.resolve()}/".encode()
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            env = Path(f"/proc/{p}/environ").read_bytes()
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(x.startswith(marker) for x in env.split(b"\0")):
            found.append(int(p))
    return found


@pytest.mark.parametrize("presses", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_during_a_playbook(tmp_path: Path, presses: int) -> None:
    """One Ctrl-C stops ansible-playbook and closes the journal; a second one does not wait for anything."""
    workdir(tmp_path, SLOW)
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until ansible-playbook has started the slow task
        assert line.strip() == "task Hold", (line, proc.stderr.read() if proc.stderr else "")
        started = time.monotonic()
        for _ in range(presses):
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert took < 60, took  # the task alone would have waited 300 s
    [j] = list_runs(tmp_path / "state")
    assert j.status == "interrupted" and j.phase("preflight").status == "interrupted", j  # type: ignore[union-attr]
    assert j.hosts["alpha"].completed == ["validate", "render"]
    assert leftovers(tmp_path / "state" / "runs" / j.run_id) == []


def test_orphans_of_a_dead_run_are_killed(tmp_path: Path) -> None:
    from provisioner.interrupt import kill_run_processes

    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "preflight").mkdir(parents=True)
    env = {**os.environ, "ANSIBLE_CONFIG": str(run_dir / "preflight" / "ansible.cfg")}
    orphan = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert kill_run_processes(run_dir) == [orphan.pid]
        assert orphan.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for p in (orphan, other):
            if p.poll() is None:
                p.kill()
                p.wait()


STUBBORN = """
import subprocess, sys, time
from pathlib import Path
from provisioner import interrupt

hooked = Path(sys.argv[1])
# a child in its own session that ignores SIGTERM, as an ansible-playbook stuck in a worker would
child = subprocess.Popen(["sh", "-c", "trap '' TERM; echo $$; exec sleep 300"], start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
print("child", child.stdout.readline().strip(), flush=True)
with interrupt.interruptible(), interrupt.on_abort(lambda signum: hooked.write_text(str(signum))), \\
        interrupt.child_running():
    print("ready", flush=True)
    said = False
    while True:  # what run_playbook does while ansible-runner waits: only cancel_requested ends it, after GRACE_S
        if interrupt.requested() is not None and not said:
            print("first", flush=True)
            said = True
        if interrupt.cancel_requested():
            print("waited out the grace", flush=True)
            sys.exit(3)
        time.sleep(0.05)
"""


def test_a_second_ctrl_c_aborts_at_once_under_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    """The first Ctrl-C asks the child to stop and would wait GRACE_S for it; the second runs the abort hooks, kills
    the child's process group and exits 130 at once (interrupt.abort_now), far inside the grace period."""
    from provisioner.interrupt import GRACE_S

    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    hooked = tmp_path / "hooked"
    proc = subprocess.Popen([sys.executable, str(script), str(hooked)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    child = 0
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline().split()[1])
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "first"  # handled: the child got SIGTERM and ignores it
        assert os.path.exists(f"/proc/{child}")
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=GRACE_S * 3)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(OSError):
            os.killpg(child, signal.SIGKILL)
    assert proc.returncode == 130, (out, err)
    assert "waited out the grace" not in out
    assert took < GRACE_S / 2, took  # ABORT_GRACE_S for the child, then SIGKILL of its group
    assert hooked.read_text() == str(int(signal.SIGINT))  # the abort hook (the engine closes its journal there)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and _state(child) != "Z" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or _state(child) == "Z"  # killed with its group


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
