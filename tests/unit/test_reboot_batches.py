"""Driver reboots go a batch at a time: the spec's opt-in, the inventory, the engine's extra var and the play.

The batching itself is Ansible's (`serial`, `max_fail_percentage`): the reboot play's header is taken from
playbooks/gpu_stack.yml as shipped and run by ansible-playbook on local hosts, with the reboot replaced by a
task that records the batch, so what is checked is what the real play does with the real keywords. (Lab
containers restart on a reboot, so molecule/nvidia_driver reboots one for real: see its verify.yml.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.phases import RunOptions, provision_run
from provisioner.render.model import build_inventory, play_vars
from provisioner.spec import load_cluster
from provisioner.spec.load import load_text
from tests.unit.test_phases import PLAYBOOKS, ScriptedRunner

REPO = Path(__file__).resolve().parents[2]
GPU_STACK = REPO / "playbooks" / "gpu_stack.yml"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def _reboot_play() -> dict[str, Any]:
    plays = yaml.safe_load(GPU_STACK.read_text())
    return next(p for p in plays if p.get("hosts") == "nvidia_driver_reboot_pending")


def test_the_reboot_play_is_batched_and_stops_on_a_failed_batch() -> None:
    play = _reboot_play()
    assert play["serial"] == "{{ provisioner_reboot_serial | default(1) }}"
    assert play["max_fail_percentage"] == 0
    roles = [t["ansible.builtin.include_role"] for t in play["tasks"]]
    # a Slurm node is drained (and its jobs waited for) before the reboot and resumed after the driver check
    assert roles == [{"name": "slurm", "tasks_from": "drain.yml"},
                     {"name": "nvidia_driver", "tasks_from": "reboot.yml"},
                     {"name": "slurm", "tasks_from": "resume.yml"}]
    drain = play["tasks"][0]
    assert drain["vars"]["slurm_drain_reason"] == "provision: reboot for NVIDIA driver {{ nvidia_driver_version }}"
    assert all((REPO / "roles/slurm/tasks" / r["tasks_from"]).is_file() for r in roles if r["name"] == "slurm")
    plays = yaml.safe_load(GPU_STACK.read_text())
    # The role never reboots by itself: the only reboot is in this play, after the parallel install play.
    assert plays.index(play) == 1 and plays[0]["hosts"] == "all"
    assert "ansible.builtin.reboot" not in (REPO / "roles/nvidia_driver/tasks/install.yml").read_text()
    assert "ansible.builtin.reboot" not in (REPO / "roles/nvidia_driver/handlers/main.yml").read_text()


def _batches(tmp_path: Path, extra: dict[str, Any], failing: str = "") -> list[list[str]]:
    """Run the reboot play's header over 5 marked hosts (+1 unmarked); return the hosts of each batch."""
    header = {k: v for k, v in _reboot_play().items() if k != "tasks"}
    play = {**header, "tasks": [
        {"name": "Stand-in for the reboot", "ansible.builtin.debug": {"msg": "reboot {{ inventory_hostname }}"}},
        {"name": "A node that does not come back", "ansible.builtin.fail": {"msg": "timed out"},
         "when": "inventory_hostname == failing_host"},
    ]}
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    hosts = {f"n{i}": {} for i in range(1, 6)}
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                  "failing_host": failing},
                         "hosts": {"other": {}},
                         "children": {"nvidia_driver_reboot_pending": {"hosts": hosts}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")  # not the repository's (its callbacks, fact cache)
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
           "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_HOME": str(tmp_path / "home")}
    cmd = [str(ANSIBLE_PLAYBOOK), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")]
    for key, value in extra.items():
        cmd += ["-e", f"{key}={value}"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert done.returncode == (2 if failing else 0), done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    return [sorted(p["tasks"][0]["hosts"]) for p in result["plays"]]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, [["n1"], ["n2"], ["n3"], ["n4"], ["n5"]]),  # no opt-in value reached the play: one at a time
        ({"provisioner_reboot_serial": "40%"}, [["n1", "n2"], ["n3", "n4"], ["n5"]]),  # share of the marked nodes
    ],
)
def test_marked_nodes_reboot_in_batches(tmp_path: Path, extra: dict[str, Any], expected: list[list[str]]) -> None:
    assert _batches(tmp_path, extra) == expected  # "other" is not marked: never rebooted


def test_a_node_that_does_not_come_back_stops_the_later_batches(tmp_path: Path) -> None:
    assert _batches(tmp_path, {"provisioner_reboot_serial": 2}, failing="n2") == [["n1", "n2"]]


SPEC = (REPO / "examples" / "lab" / "cluster.yaml").read_text()


def _cluster(extra: str) -> Any:
    res = load_text(SPEC + extra, "cluster.yaml")
    return res


def test_spec_reboot_opt_in_renders_and_is_validated() -> None:
    plain = _cluster("")
    assert plain.cluster is not None and not plain.errors
    allv = build_inventory(plain.cluster).groupvars["all"]
    assert (allv["nvidia_driver_allow_reboot"], allv["provisioner_reboot_serial"]) == (False, 1)
    opted = _cluster('\nreboot: {allowed: true, serial: "25%"}\n')
    assert opted.cluster is not None and not opted.errors, opted.diagnostics
    assert play_vars(opted.cluster) == {"provisioner_reboot_serial": "25%"}
    assert build_inventory(opted.cluster).groupvars["all"]["nvidia_driver_allow_reboot"] is True
    gpu_nodes = sum(1 for n in opted.cluster.nodes if n.gpu_count)
    whole = _cluster(f"\nreboot: {{allowed: true, serial: {gpu_nodes}}}\n")
    assert [d.rule for d in whole.errors] == ["REBOOT-BATCH"]
    assert f"reboots all {gpu_nodes} GPU nodes at once" in whole.errors[0].message
    for bad in ('"100%"', '"0%"', "0", "true", '"half"'):
        res = _cluster(f"\nreboot: {{allowed: true, serial: {bad}}}\n")
        assert res.cluster is None and res.errors, bad


def test_provision_passes_the_batch_size_to_ansible(tmp_path: Path, examples_dir: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    spec.write_text((examples_dir / "lab" / "cluster.yaml").read_text() + '\nreboot: {allowed: true, serial: "25%"}\n')
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    for name in PLAYBOOKS:
        (playbooks / name).write_text("---\n")
    runner = ScriptedRunner()
    provision_run(spec, RunOptions(only=["gpu_stack"]), state_dir=tmp_path / "st", runner=runner,
                  playbooks_dir=playbooks)
    call = next(kw for name, _, kw in runner.calls if name == "gpu_stack.yml")
    assert call["extravars"] == {"provisioner_reboot_serial": "25%"}
    runner2 = ScriptedRunner()
    provision_run(spec, RunOptions(only=["gpu_stack"], extravars={"provisioner_reboot_serial": 1}),
                  state_dir=tmp_path / "st", runner=runner2, playbooks_dir=playbooks)
    assert next(kw for n, _, kw in runner2.calls if n == "gpu_stack.yml")["extravars"] == {
        "provisioner_reboot_serial": 1}  # the command line's -e wins
    assert load_cluster(spec)[0].spec.reboot.allowed is True


def test_the_drain_lets_a_node_without_slurm_reboot(tmp_path: Path) -> None:
    """A fresh cluster: the driver reboots before the slurm phase ever ran, so the controller has no scontrol.

    The slurm role's drain.yml, as shipped, on a local host whose controller (itself) has no Slurm: nothing is
    drained, the host goes on (no slurmstepd runs here), and resume.yml resumes nothing. The drain against a real
    slurmctld with a running job is molecule/slurm's (drain.yml there).
    """
    play = [{"name": "drain", "hosts": "n1", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": "slurm", "tasks_from": "drain.yml"},
         "vars": {"slurm_drain_reason": "provision: reboot for NVIDIA driver 550.127.05"}},
        {"ansible.builtin.include_role": {"name": "slurm", "tasks_from": "resume.yml"}},
        {"name": "Report", "ansible.builtin.debug": {"msg": "{{ {'drained': slurm_drained_here,"
                                                            " 'known': slurm_drain_known,"
                                                            " 'unknown': slurm_drain_unknown} }}"}},
    ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    bare_path = tmp_path / "bin"   # the controller's PATH: python, pgrep, no Slurm
    bare_path.mkdir()
    # this node runs no job steps, whatever the test machine runs (a lab's slurmd in a container shows in pgrep)
    (bare_path / "pgrep").write_text("#!/bin/sh\nexit 1\n")
    (bare_path / "pgrep").chmod(0o755)
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                  "slurm_enabled": True, "slurm_controller": "n1",
                                  "slurm_nodes": [{"name": "n1", "address": "n1", "gpus": 8}]},
                         "hosts": {"n1": {}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "ansible.cfg").write_text(f"[defaults]\nroles_path = {REPO / 'roles'}\n")
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
           "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_HOME": str(tmp_path / "home"),
           "PATH": f"{bare_path}:/usr/bin:/bin"}
    assert not any((Path(d) / "scontrol").exists() for d in env["PATH"].split(":")), "this machine has scontrol"
    done = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    report = next(t for t in tasks if t["task"]["name"] == "Report")["hosts"]["n1"]["msg"]
    assert report == {"drained": False, "known": False, "unknown": False}
    names = {t["task"]["name"].removeprefix("slurm : "): t["hosts"]["n1"] for t in tasks}
    assert "Drain the node" in names and names["Drain the node"].get("skipped") is True
    assert names["Go on without Slurm only where no job step runs"]["msg"].startswith(
        "no Slurm drain for n1: slurmctld on n1 did not answer (")
    assert names["Resume the node this run drained"].get("skipped") is True
