"""The phase engine with a scripted runner: isolation, --max-fail, critical hosts, missing playbooks, resume."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from provisioner import collection as content
from provisioner.collection import ContentMissing
from provisioner.errors import UsageError
from provisioner.phases import (
    PHASE_NAMES,
    Engine,
    RunOptions,
    StepContext,
    StepOutcome,
    critical_hosts,
    decide,
    expand_limit,
    plan_run,
    provision_run,
    retry_command,
    select_phases,
    summary_lines,
)
from provisioner.progress import JsonReporter
from provisioner.runner import FakeRun, PlaybookResult, fake_result
from provisioner.state import journal_path, last_run, load_journal

HOSTS = [f"gpu{i:02d}" for i in range(1, 11)] + ["sm1"]
PLAYBOOKS = ["preflight.yml", "repos.yml", "ofed.yml", "gpu_stack.yml", "fabric.yml", "storage.yml", "slurm.yml"]


class ScriptedRunner:
    """Stands in for run_playbook: per playbook, which hosts fail or are unreachable; records every call."""

    def __init__(self, script: dict[str, FakeRun] | None = None) -> None:
        self.script = script or {}
        self.calls: list[tuple[str, list[str], dict[str, Any]]] = []

    def __call__(self, playbook: Path, inventory_dir: Path, *, limit: Iterable[str], **kw: Any) -> PlaybookResult:
        hosts = list(limit)
        self.calls.append((playbook.name, hosts, kw))
        handler = kw.get("event_handler")
        if handler:
            handler({"event": "playbook_on_task_start", "event_data": {"task": "scripted"}})
        return fake_result(playbook.name, hosts, self.script.get(playbook.name, FakeRun()))

    def hosts_for(self, playbook: str) -> list[str]:
        return next(h for name, h, _ in self.calls if name == playbook)


@pytest.fixture
def playbooks(tmp_path: Path) -> Path:
    d = tmp_path / "playbooks"
    d.mkdir()
    for name in PLAYBOOKS:
        (d / name).write_text("---\n")
    return d


def engine(tmp_path: Path, playbooks: Path, runner: ScriptedRunner, options: RunOptions | None = None,
           **kw: Any) -> Engine:
    steps = {"validate": lambda c: StepOutcome(), "render": lambda c: StepOutcome(),
             "verify": lambda c: StepOutcome(), "report": lambda c: StepOutcome()}
    steps.update(kw.pop("steps", {}))
    return Engine("c1", "cluster.yaml", tmp_path / "state", tmp_path / "inv", {"sm1": "subnet_manager"},
                  options or RunOptions(max_fail=20), playbooks_dir=playbooks, runner=runner, steps=steps, **kw)


def run(tmp_path: Path, playbooks: Path, runner: ScriptedRunner, options: RunOptions | None = None,
        hosts: list[str] | None = None, **kw: Any) -> Any:
    opts = options or RunOptions(max_fail=20)
    prev = last_run(tmp_path / "state") if opts.resume else None
    plan = plan_run(hosts or HOSTS, opts, prev)
    return engine(tmp_path, playbooks, runner, opts, **kw).execute(plan)


def test_all_pass(tmp_path: Path, playbooks: Path) -> None:
    r = ScriptedRunner()
    j = run(tmp_path, playbooks, r)
    assert j.status == "passed" and j.stop_reason is None
    assert [c[0] for c in r.calls] == PLAYBOOKS
    assert all(hp.completed == list(PHASE_NAMES) for hp in j.hosts.values())


def test_failed_host_is_set_aside_and_others_continue(tmp_path: Path, playbooks: Path) -> None:
    r = ScriptedRunner({"gpu_stack.yml": FakeRun(failed={"gpu03": "dkms build failed"}),
                        "preflight.yml": FakeRun(unreachable={"gpu07": "ssh timeout"})})
    j = run(tmp_path, playbooks, r)
    assert j.status == "partial"
    assert "gpu07" not in r.hosts_for("repos.yml") and "gpu03" in r.hosts_for("gpu_stack.yml")
    assert "gpu03" not in r.hosts_for("fabric.yml") and "gpu01" in r.hosts_for("storage.yml")
    assert j.set_aside["gpu03"]["phase"] == "gpu_stack" and "dkms build failed" in j.set_aside["gpu03"]["reason"]
    assert j.set_aside["gpu07"]["state"] == "unreachable"
    rec = j.phase("gpu_stack")
    assert rec.status == "partial" and "gpu03" in rec.failed and "gpu03" not in rec.ok
    assert j.hosts["gpu03"].completed == ["validate", "render", "preflight", "repos", "ofed"]
    assert retry_command(j) == "provision cluster.yaml --resume --limit 'gpu[03,07]' --max-fail 20"
    assert any("retry them: provision cluster.yaml --resume --limit 'gpu[03,07]'" in line
               for line in summary_lines(j))


def test_max_fail_stops_the_run(tmp_path: Path, playbooks: Path) -> None:
    bad = {h: "no" for h in HOSTS[:3]}  # 3 of 11 = 27 % > 20 %
    r = ScriptedRunner({"repos.yml": FakeRun(failed=bad)})
    j = run(tmp_path, playbooks, r)
    assert j.status == "stopped" and "--max-fail 20" in (j.stop_reason or "")
    assert [c[0] for c in r.calls] == ["preflight.yml", "repos.yml"]


def test_max_fail_counts_across_phases(tmp_path: Path, playbooks: Path) -> None:
    r = ScriptedRunner({"repos.yml": FakeRun(failed={"gpu01": "x"}),
                        "ofed.yml": FakeRun(failed={"gpu02": "y", "gpu03": "z"})})
    j = run(tmp_path, playbooks, r)
    assert j.status == "stopped" and j.phases[-1].name == "ofed"


def test_critical_host_stops_the_run(tmp_path: Path, playbooks: Path) -> None:
    r = ScriptedRunner({"fabric.yml": FakeRun(failed={"sm1": "opensm would not start"})})
    j = run(tmp_path, playbooks, r)
    assert j.status == "stopped"
    assert "critical host sm1 (subnet_manager)" in (j.stop_reason or "") and "opensm" in (j.stop_reason or "")
    assert "storage.yml" not in [c[0] for c in r.calls]


def test_missing_playbook_stops_before_anything_runs(tmp_path: Path, playbooks: Path) -> None:
    """A phase's playbook missing is an error naming the file and the fix, before any phase ran: never 'not built'."""
    (playbooks / "ofed.yml").unlink()
    r = ScriptedRunner()
    with pytest.raises(ContentMissing) as exc:
        run(tmp_path, playbooks, r)
    line = str(exc.value)
    assert "\n" not in line and exc.value.exit_code == 2
    assert f"phase ofed: playbook {playbooks / 'ofed.yml'} is missing" in line
    assert "give a directory that has it" in line  # not the package's own directory: no git/reinstall advice
    assert r.calls == [] and last_run(tmp_path / "state") is None  # nothing ran, no journal was started
    # leaving the phase out is a way on
    j = run(tmp_path, playbooks, r, RunOptions(only=["preflight", "repos"], max_fail=20))
    assert j.status == "passed" and [c[0] for c in r.calls] == ["preflight.yml", "repos.yml"]


def test_playbook_gone_mid_run_stops_the_run(tmp_path: Path, playbooks: Path) -> None:
    """A playbook removed after the run started (checked again when its phase comes) stops the run cleanly."""

    class Deleting(ScriptedRunner):
        def __call__(self, playbook: Path, inventory_dir: Path, **kw: Any) -> PlaybookResult:
            if playbook.name == "repos.yml":
                (playbooks / "ofed.yml").unlink()
            return super().__call__(playbook, inventory_dir, **kw)

    j = run(tmp_path, playbooks, Deleting())
    assert j.phase("ofed").status == "error" and "ofed.yml is missing" in (j.phase("ofed").note or "")
    assert j.status == "stopped" and "phase ofed could not run" in (j.stop_reason or "")
    assert load_journal(journal_path(tmp_path / "state", j.run_id)).status == "stopped"


def test_the_package_playbooks_are_found(tmp_path: Path) -> None:
    """Without a playbooks_dir the engine uses the collection's, which has every phase's playbook."""
    e = Engine("c1", "cluster.yaml", tmp_path / "state", tmp_path / "inv", {}, RunOptions())
    assert e.playbooks_dir == content.playbooks_dir()
    assert all((e.playbooks_dir / p).is_file() for p in PLAYBOOKS)


def test_python_step_missing_is_not_built(tmp_path: Path, playbooks: Path) -> None:
    r = ScriptedRunner()
    opts = RunOptions(max_fail=20)
    e = Engine("c1", "cluster.yaml", tmp_path / "state", tmp_path / "inv", {}, opts, playbooks_dir=playbooks,
               runner=r, steps={})
    j = e.execute(plan_run(HOSTS, opts))
    assert {p.name: p.status for p in j.phases}["verify"] == "not_built"
    assert j.status == "incomplete"


def test_python_step_can_set_hosts_aside(tmp_path: Path, playbooks: Path) -> None:
    seen: list[list[str]] = []

    def verify(ctx: StepContext) -> StepOutcome:
        seen.append(ctx.hosts)
        return StepOutcome(failed={"gpu05": "mlx5_1 port 1 is Down"})

    j = run(tmp_path, playbooks, ScriptedRunner(), steps={"verify": verify})
    assert seen == [HOSTS] and j.set_aside["gpu05"]["phase"] == "verify"
    assert "gpu05" not in j.phase("report").hosts


def test_runner_error_stops_the_run(tmp_path: Path, playbooks: Path) -> None:
    class Broken(ScriptedRunner):
        def __call__(self, playbook: Path, inventory_dir: Path, *, limit: Iterable[str], **kw: Any) -> PlaybookResult:
            res = super().__call__(playbook, inventory_dir, limit=limit, **kw)
            if playbook.name == "repos.yml":
                return PlaybookResult(playbook.name, "failed", 4, {}, None, error="ERROR! syntax error")
            return res

    j = run(tmp_path, playbooks, Broken())
    assert j.status == "stopped" and j.phase("repos").status == "error"
    assert "syntax error" in (j.stop_reason or "")


def test_runner_gets_the_options(tmp_path: Path, playbooks: Path) -> None:
    r = ScriptedRunner()
    opts = RunOptions(only=["ofed"], limit="gpu[01-02]", check=True, diff=True, tags=["peermem"], forks=7,
                      max_fail=50)
    j = run(tmp_path, playbooks, r, opts)
    assert [c[0] for c in r.calls] == ["ofed.yml"]
    _, hosts, kw = r.calls[0]
    assert hosts == ["gpu01", "gpu02"]
    assert kw["check"] and kw["diff"] and kw["tags"] == ["peermem"] and kw["forks"] == 7
    assert kw["private_data_dir"] == tmp_path / "state" / "runs" / j.run_id / "ofed" and kw["ident"] == "ofed"
    assert j.hosts["gpu01"].completed == []  # a check run completes nothing


def test_resume_picks_up_the_right_phase_and_hosts(tmp_path: Path, playbooks: Path) -> None:
    r1 = ScriptedRunner({"gpu_stack.yml": FakeRun(failed={"gpu03": "dkms"}),
                         "ofed.yml": FakeRun(unreachable={"gpu08": "down"})})
    j1 = run(tmp_path, playbooks, r1)
    assert j1.status == "partial"
    r2 = ScriptedRunner()
    j2 = run(tmp_path, playbooks, r2, RunOptions(resume=True, max_fail=20))
    assert j2.resumed_from == j1.run_id
    assert [c[0] for c in r2.calls] == ["ofed.yml", "gpu_stack.yml", "fabric.yml", "storage.yml", "slurm.yml"]
    assert r2.hosts_for("ofed.yml") == ["gpu08"]
    assert r2.hosts_for("gpu_stack.yml") == ["gpu03", "gpu08"]
    assert j2.phase("preflight").status == "skipped"
    assert j2.status == "passed" and j2.set_aside == {}
    assert j2.hosts["gpu01"].completed == list(PHASE_NAMES)  # carried over
    with pytest.raises(UsageError, match="nothing left"):
        run(tmp_path, playbooks, ScriptedRunner(), RunOptions(resume=True))


def test_resume_with_limit_keeps_the_others_pending(tmp_path: Path, playbooks: Path) -> None:
    run(tmp_path, playbooks, ScriptedRunner({"repos.yml": FakeRun(failed={"gpu02": "a", "gpu04": "b"})}))
    r2 = ScriptedRunner()
    j2 = run(tmp_path, playbooks, r2, RunOptions(resume=True, limit="gpu02", max_fail=20))
    assert r2.hosts_for("repos.yml") == ["gpu02"]
    assert j2.status == "partial" and list(j2.set_aside) == ["gpu04"]
    assert retry_command(j2) == "provision cluster.yaml --resume --limit gpu04 --max-fail 20"


def test_resume_needs_a_previous_run(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no previous run"):
        plan_run(HOSTS, RunOptions(resume=True), None)


def test_journal_on_disk(tmp_path: Path, playbooks: Path) -> None:
    j = run(tmp_path, playbooks, ScriptedRunner({"storage.yml": FakeRun(unreachable={"gpu09": "gone"})}))
    data = json.loads(journal_path(tmp_path / "state", j.run_id).read_text())
    assert data["status"] == "partial" and data["cluster"] == "c1"
    storage = next(p for p in data["phases"] if p["name"] == "storage")
    assert list(storage["unreachable"]) == ["gpu09"] and "gone" in storage["unreachable"]["gpu09"]
    assert storage["started"] and storage["ended"]
    assert data["hosts"]["gpu09"]["set_aside"]["phase"] == "storage"
    assert load_journal(journal_path(tmp_path / "state", j.run_id)).set_aside == j.set_aside


def test_json_reporter_streams_one_object_per_line(tmp_path: Path, playbooks: Path) -> None:
    buf = io.StringIO()
    run(tmp_path, playbooks, ScriptedRunner({"ofed.yml": FakeRun(failed={"gpu01": "x"})}),
        reporter=JsonReporter(buf))
    objs = [json.loads(line) for line in buf.getvalue().splitlines()]
    types = [o["type"] for o in objs]
    assert types[0] == "phase_start" and types[-1] == "run_end"
    assert objs[-1]["set_aside"]["gpu01"]["phase"] == "ofed"
    assert any(o["type"] == "event" and o["phase"] == "preflight" and o.get("task") == "scripted" for o in objs)


# --- pure planning --------------------------------------------------------------------------------------

def test_select_phases() -> None:
    assert select_phases() == list(PHASE_NAMES)
    assert select_phases(["fabric", "preflight"]) == ["validate", "render", "preflight", "fabric"]
    assert select_phases(from_phase="storage") == ["validate", "render", "storage", "slurm", "verify", "report"]
    with pytest.raises(UsageError, match="unknown phase"):
        select_phases(["nope"])
    with pytest.raises(UsageError, match="together"):
        select_phases(["ofed"], "ofed")


def test_expand_limit() -> None:
    assert expand_limit("sm1,gpu[02-03]", HOSTS) == ["gpu02", "gpu03", "sm1"]
    assert expand_limit(None, HOSTS) == HOSTS
    with pytest.raises(UsageError, match="not in the spec"):
        expand_limit("gpu[10-12]", HOSTS)
    with pytest.raises(UsageError, match="--limit"):
        expand_limit("gpu[03-01]", HOSTS)


def test_decide_and_critical() -> None:
    crit = critical_hosts({"sm1": ["subnet_manager"], "nfs": ["nfs_server", "x"], "gpu01": []})
    assert crit == {"sm1": "subnet_manager", "nfs": "nfs_server"}
    one = {"gpu01": {"phase": "p", "reason": "r"}}
    assert not decide(one, 10, crit, 10).stop           # 10 % is not more than 10 %
    assert decide(one, 9, crit, 10).stop                # 11 % is
    assert decide({"nfs": {"phase": "storage", "reason": "r"}}, 100, crit, 10).reason.startswith("critical host nfs")


def test_provision_run_on_the_lab_example(tmp_path: Path, playbooks: Path, examples_dir: Path) -> None:
    r = ScriptedRunner({"preflight.yml": FakeRun(unreachable={"gpu02": "paused"})})
    j = provision_run(examples_dir / "lab" / "cluster.yaml", RunOptions(max_fail=50), state_dir=tmp_path / "st",
                      runner=r, playbooks_dir=playbooks)
    assert (tmp_path / "st" / "inventory" / "hosts.yml").is_file()
    assert r.calls[0][1] == ["gpu01", "gpu02", "gpu03", "sm1", "sm2"]
    assert j.set_aside["gpu02"]["state"] == "unreachable" and j.status == "partial"
    assert j.phase("verify").status == "not_built"
    r2 = ScriptedRunner({"fabric.yml": FakeRun(failed={"sm2": "standby SM did not come up"})})
    j2 = provision_run(examples_dir / "lab" / "cluster.yaml", RunOptions(max_fail=50), state_dir=tmp_path / "st",
                       runner=r2, playbooks_dir=playbooks)
    assert j2.status == "stopped" and "sm2 (subnet_manager)" in (j2.stop_reason or "")


def _roles_in_order(playbook: Path) -> list[str]:
    """The roles a playbook applies, play by play (import_playbook entries followed)."""
    import yaml

    roles: list[str] = []
    for play in yaml.safe_load(playbook.read_text()):
        imported = play.get("ansible.builtin.import_playbook") or play.get("import_playbook")
        if imported:
            roles += _roles_in_order(playbook.parent / imported)
        for role in play.get("roles", []):
            roles.append(role["role"] if isinstance(role, dict) else role)
    return roles


def test_ofed_converges_before_the_driver_and_peermem_after_both() -> None:
    """nvidia_peermem built by DKMS before the OFED peer-memory symbols exist is a stub whose init returns
    -EINVAL (NVIDIA conftest ib_peer_memory_symbols); NVIDIA and Azure's HPC images install DOCA-OFED first."""
    from provisioner.phases import PHASES

    books = content.playbooks_dir()
    by_phases = [r for p in PHASES if p.playbook for r in _roles_in_order(books / p.playbook)]
    by_site = _roles_in_order(books / "site.yml")
    for order in (by_phases, by_site):
        assert order.index("doca_ofed") < order.index("nvidia_driver") < order.index("nvidia_peermem"), order
    assert by_site == by_phases
