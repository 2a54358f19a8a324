"""The run engine against real lab containers over SSH, host keys verified from the lab's known_hosts.

A copy of examples/lab/cluster.yaml under its own cluster name, a trivial preflight playbook (ping and
read the hostname), gpu02 paused: gpu02 is set aside as unreachable, the other four pass; after the fault
is cleared, `--resume` runs preflight on gpu02 alone and completes it.
Run: ``pytest -m lab tests/lab/test_run_lab.py`` (root, podman; the first run builds the lab image).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.lab import faults
from provisioner.lab.cluster import LabInfo, cluster_dir, lab_down, lab_up
from provisioner.lab.fromspec import lab_cables, lab_nodes, lab_switches
from provisioner.lab.host import ensure_containers_conf
from provisioner.phases import RunOptions, provision_run, retry_command
from provisioner.runner import run_playbook
from provisioner.spec import load_cluster

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "runlab"

PREFLIGHT = """\
- name: Trivial preflight
  hosts: all
  gather_facts: false
  tasks:
    - name: Reach the node
      ansible.builtin.ping:
    - name: Read the hostname
      ansible.builtin.command: hostname
      register: preflight_hostname
      changed_when: false
    - name: The node is who the inventory says
      ansible.builtin.assert:
        that: preflight_hostname.stdout == inventory_hostname
"""

REPOS = """\
- name: Trivial second phase
  hosts: all
  gather_facts: false
  tasks:
    - name: Reach the node
      ansible.builtin.ping:
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("runlab")
    text = (ROOT / "examples" / "lab" / "cluster.yaml").read_text()
    text = text.replace("cluster: {name: lab,", f"cluster: {{name: {CLUSTER},")
    assert f"name: {CLUSTER}" in text
    (d / "cluster.yaml").write_text(text)
    (d / "playbooks").mkdir()
    (d / "playbooks" / "preflight.yml").write_text(PREFLIGHT)
    (d / "playbooks" / "repos.yml").write_text(REPOS)
    return d / "cluster.yaml"


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, spec: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabInfo]:
    os.environ.setdefault("PROVISIONER_LAB_DIR", str(tmp_path_factory.mktemp("labdir")))
    ensure_containers_conf()
    cluster, _ = load_cluster(spec)

    def teardown() -> None:
        lab_down(CLUSTER)

    request.addfinalizer(teardown)
    yield lab_up(CLUSTER, lab_nodes(cluster), lab_switches(cluster), lab_cables(cluster))


@pytest.fixture(autouse=True)
def short_ssh_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSIBLE_TIMEOUT", "5")  # a paused node answers TCP but never SSH: fail in 5 s, not 10


def test_run_playbook_over_ssh_with_verified_host_keys(lab: LabInfo, spec: Path, tmp_path: Path) -> None:
    from provisioner.render import render_inventory

    cluster, _ = load_cluster(spec, lab.overlay)
    inv = render_inventory(cluster, tmp_path).out_dir
    overlay: dict[str, Any] = yaml.safe_load(lab.overlay.read_text())
    assert "UserKnownHostsFile=" + overlay["ssh"]["known_hosts"] in (inv / "group_vars" / "all.yml").read_text()
    result = run_playbook(spec.parent / "playbooks" / "preflight.yml", inv, private_data_dir=tmp_path / "pdd",
                          state_dir=tmp_path, limit=["gpu01", "sm1"])
    assert result.ok_hosts == ["gpu01", "sm1"], {h: s.reason for h, s in result.hosts.items()}


def test_unknown_host_key_is_refused(lab: LabInfo, spec: Path, tmp_path: Path) -> None:
    from provisioner.render import render_inventory

    overlay: dict[str, Any] = yaml.safe_load(lab.overlay.read_text())
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    overlay["ssh"]["known_hosts"] = str(empty)
    (tmp_path / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    cluster, _ = load_cluster(spec, tmp_path / "overlay.yaml")
    inv = render_inventory(cluster, tmp_path).out_dir
    result = run_playbook(spec.parent / "playbooks" / "preflight.yml", inv, private_data_dir=tmp_path / "pdd",
                          state_dir=tmp_path, limit="gpu01")
    assert result.unreachable_hosts == ["gpu01"]
    assert "Host key verification failed" in (result.hosts["gpu01"].message or "")


def test_paused_node_set_aside_then_resumed(lab: LabInfo, spec: Path, tmp_path: Path) -> None:
    root = str(cluster_dir(CLUSTER))
    state = tmp_path / "state"
    # the two phases this test has playbooks for (a phase whose playbook is missing stops the run before it starts)
    opts = RunOptions(overlay=str(lab.overlay), max_fail=50, only=["preflight", "repos"])
    faults.inject(root, "gpu02", "unreachable")
    try:
        j1 = provision_run(spec, opts, state_dir=state, playbooks_dir=spec.parent / "playbooks")
    finally:
        faults.clear(root, "gpu02", "unreachable")
    pre = j1.phase("preflight")
    assert pre is not None and pre.ok == ["gpu01", "gpu03", "sm1", "sm2"]
    assert list(pre.unreachable) == ["gpu02"]
    assert j1.status == "partial" and j1.set_aside["gpu02"]["state"] == "unreachable"
    assert j1.phase("repos").ok == ["gpu01", "gpu03", "sm1", "sm2"]  # type: ignore[union-attr]
    assert retry_command(j1) == (f"provision {spec} --resume --limit gpu02 --overlay {lab.overlay} --out {state} "
                                 "--max-fail 50")

    j2 = provision_run(spec, RunOptions(overlay=str(lab.overlay), resume=True, limit="gpu02", max_fail=50),
                       state_dir=state, playbooks_dir=spec.parent / "playbooks")
    pre2 = j2.phase("preflight")
    assert pre2 is not None and pre2.hosts == ["gpu02"] and pre2.ok == ["gpu02"]
    assert j2.resumed_from == j1.run_id and j2.set_aside == {}
    assert j2.hosts["gpu02"].completed == ["validate", "render", "preflight", "repos"]
    assert j2.status == "passed"


HOLD = """\
- name: Preflight that holds until released
  hosts: all
  gather_facts: false
  tasks:
    - name: Reach the node
      ansible.builtin.ping:
    - name: Hold the phase
      ansible.builtin.wait_for:
        path: "{{ release_file }}"
        timeout: 300
      delegate_to: localhost
      run_once: true
"""

KILLABLE = """
import sys
from pathlib import Path
from provisioner.phases import NullReporter, RunOptions, provision_run

class Say(NullReporter):
    def event(self, phase, event):
        if event.get("event") == "playbook_on_task_start":
            print("task", event.get("event_data", {}).get("task"), flush=True)

spec, overlay, state, playbooks, release = sys.argv[1:6]
provision_run(Path(spec), RunOptions(overlay=overlay, only=["preflight"], max_fail=50,
                                     extravars={"release_file": release}),
              state_dir=Path(state), playbooks_dir=Path(playbooks), reporter=Say())
"""


def test_killed_mid_phase_then_resumed_and_a_second_run_refused(lab: LabInfo, spec: Path, tmp_path: Path) -> None:
    """Chaos: kill -9 the run in the middle of preflight; a concurrent run is refused while it lives; the next run
    finds it dead, ends its orphaned ansible-playbook, and --resume completes preflight on every node."""
    import signal
    import subprocess
    import sys

    from provisioner.interrupt import kill_run_processes
    from provisioner.state import list_runs, status_rows

    hold = tmp_path / "playbooks"
    hold.mkdir()
    (hold / "preflight.yml").write_text(HOLD)
    script = tmp_path / "killable.py"
    script.write_text(KILLABLE)
    state = tmp_path / "state"
    release = tmp_path / "release"
    first = subprocess.Popen([sys.executable, str(script), str(spec), str(lab.overlay), str(state), str(hold),
                              str(release)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        for line in first.stdout:  # until ansible-playbook holds the phase (every node reached)
            if line.strip() == "task Hold the phase":
                break
        else:
            raise AssertionError(first.stderr.read() if first.stderr else "the run ended early")
        second = subprocess.run([sys.executable, "-m", "provisioner.cli", "up", str(spec), "--overlay",
                                 str(lab.overlay), "--out", str(state), "--only", "preflight", "--json"],
                                capture_output=True, text=True, timeout=120, check=False)
        assert second.returncode == 2 and "another provision run is working on" in second.stderr, second.stderr
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
    [killed] = list_runs(state)
    assert killed.status == "running" and [r.status for r in status_rows(state)] == ["dead"]

    j = provision_run(spec, RunOptions(overlay=str(lab.overlay), resume=True, max_fail=50), state_dir=state,
                      playbooks_dir=spec.parent / "playbooks")
    try:
        assert j.resumed_from == killed.run_id and j.status == "passed", j.stop_reason
        pre = j.phase("preflight")
        assert pre is not None and pre.ok == ["gpu01", "gpu02", "gpu03", "sm1", "sm2"]
        closed = {r.run_id: r for r in list_runs(state)}[killed.run_id]
        assert closed.status == "dead" and closed.phase("preflight").status == "interrupted"  # type: ignore[union-attr]
        assert kill_run_processes(state / "runs" / killed.run_id) == []  # the resumed run ended the orphans
    finally:
        release.write_text("")  # whatever still waits may end
