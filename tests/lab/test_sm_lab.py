"""The opensm role on a small lab (2 SM nodes + 2 GPU nodes): election, partition isolation, changes
without outages (a partition edit is a SIGHUP; an option that needs a restart restarts the standby, then the
master, one at a time; sm/history.json of the simulated SM counts), failover, handover.

The role runs with ansible-playbook from the venv over real SSH (the lab's known_hosts,
StrictHostKeyChecking=yes).  Tests run in file order and share the lab (module scope); waits
poll a condition with a deadline, nothing asserts on timing.  Own PROVISIONER_LAB_DIR (a
temp dir), so no other lab is touched.  Run: ``pytest -m lab tests/lab/test_sm_lab.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from _labspec import cluster_name  # type: ignore[import-not-found]

from provisioner.fabric import sm
from provisioner.lab import cluster, faults
from provisioner.lab.hardware import LabHca, LabNodeSpec
from provisioner.lab.host import podman
from provisioner.lab.names import container_name
from provisioner.lab.packages import VendorVersions
from provisioner.lab.simtools import fabsim_reach, fabsim_sm, labstate

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

REPO = Path(__file__).resolve().parents[2]
CLUSTER = cluster_name("smlab")
SMS = ("sm1", "sm2")
GPUS = ("gpu01", "gpu02")
TENANT_PKEY = "0x0002"


@dataclass(frozen=True)
class Lab:
    info: cluster.LabInfo
    root: str
    workdir: Path


def sh(host: str, command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in ``host``'s container (the trusted local channel)."""
    return podman("exec", container_name(CLUSTER, host), "sh", "-c", command, check=False, timeout=60)


def wait_for(what: str, probe: Callable[[], bool], deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not probe():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.5)


def _nodes() -> list[LabNodeSpec]:
    sms = [LabNodeSpec(hostname=h, gpu_count=0, nvswitch=False, hcas=(LabHca("mlx5_0"),)) for h in SMS]
    gpus = [LabNodeSpec(hostname=h, gpu_count=1, nvswitch=False, hcas=(LabHca("mlx5_0", gpu=0),)) for h in GPUS]
    return sms + gpus


def _inventory(overlay: dict[str, Any]) -> dict[str, Any]:
    ssh = overlay["ssh"]
    repo = overlay["repositories"]["cuda"]
    return {
        "all": {
            "hosts": {h: {"ansible_host": overlay["addresses"][h]} for h in SMS + GPUS},
            "vars": {
                "ansible_user": ssh["user"],
                "ansible_ssh_private_key_file": ssh["key"],
                "ansible_ssh_common_args": f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={ssh['known_hosts']}",
                "ansible_python_interpreter": "/usr/bin/python3",
                "vendor_repos_offline": True,
                "vendor_repos_disable_default_sources": True,
                "vendor_repos_cuda": {"url": repo["url"], "key": repo["key"], "suite": repo["suite"],
                                      "components": repo["components"]},
                "vendor_repos_doca": None,
                "vendor_repos_os": None,
                "opensm_build": "nvidia",
                "opensm_adaptive_routing": True,
                "opensm_routing_engines": ["ar_updn", "updn"],
                "opensm_handover": False,
                "opensm_default_partition": "full",
                "opensm_partitions": [{"name": "tenant_a", "pkey": TENANT_PKEY, "membership": "full",
                                       "members": ["gpu01"], "ipoib": True}],
                "opensm_check_delay": 1,
            },
            "children": {
                "opensm": {"hosts": {"sm1": {"opensm_priority": 15}, "sm2": {"opensm_priority": 14}}},
            },
        }
    }


def converge(lab: Lab, *extra: str, playbook: str = "site.yml") -> subprocess.CompletedProcess[str]:
    """ansible-playbook of ``playbook`` in the work dir (site.yml: the vendor_repos + opensm roles on the SM nodes)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(lab.workdir / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(lab.workdir / "hosts.yml"),
           str(lab.workdir / playbook), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    saved = os.environ.get("PROVISIONER_LAB_DIR")
    os.environ["PROVISIONER_LAB_DIR"] = str(tmp_path_factory.mktemp("smlab"))

    def teardown() -> None:
        try:
            cluster.lab_down(CLUSTER)
        finally:
            if saved is None:
                os.environ.pop("PROVISIONER_LAB_DIR", None)
            else:
                os.environ["PROVISIONER_LAB_DIR"] = saved

    request.addfinalizer(teardown)
    info = cluster.lab_up(CLUSTER, _nodes(), versions=VendorVersions())
    overlay = yaml.safe_load(info.overlay.read_text())
    work = tmp_path_factory.mktemp("smplay")
    (work / "hosts.yml").write_text(yaml.safe_dump(_inventory(overlay)))
    (work / "ansible.cfg").write_text(
        f"[defaults]\nroles_path = {REPO / 'roles'}\nhost_key_checking = True\nretry_files_enabled = False\n"
    )
    (work / "site.yml").write_text(yaml.safe_dump([{
        "name": "Subnet managers", "hosts": "opensm", "gather_facts": False,
        "roles": [{"role": "vendor_repos"}, {"role": "opensm"}],
    }], sort_keys=False))
    yield Lab(info, str(info.state_dir), work)


def _guid(lab: Lab, host: str) -> str:
    hca = labstate.load_node(lab.root, host)["hcas"][0]
    return sm.norm_guid(str(hca["port_guid"]))


def _master_seen_from(host: str) -> sm.SmInfo | None:
    done = sh(host, "sminfo")
    return sm.sminfo_result(done.returncode, done.stdout, done.stderr)


def _port_state(lab: Lab, host: str) -> str:
    return str(labstate.load_node(lab.root, host)["hcas"][0].get("state"))


def test_role_elects_sm1_and_activates_every_port(lab: Lab) -> None:
    done = converge(lab)
    assert done.returncode == 0, done.stdout[-4000:]
    master = _master_seen_from("gpu02")
    assert master is not None and (master.guid, master.priority) == (_guid(lab, "sm1"), 15)
    assert all(_port_state(lab, h) == "active" for h in SMS + GPUS)
    own = sh("sm2", "cat /etc/opensm/opensm.conf").stdout
    assert f"guid {_guid(lab, 'sm2')}" in own and "sm_priority 14" in own


def test_partition_isolation(lab: Lab) -> None:
    parts = fabsim_reach.load_partitions(lab.root)
    gpu01, gpu02, sm1 = _guid(lab, "gpu01"), _guid(lab, "gpu02"), _guid(lab, "sm1")
    tenant = next(p for p in parts if p["name"] == "tenant_a")
    assert [sm.norm_guid(m["member"]) for m in tenant["members"]] == [gpu01]
    assert not fabsim_reach.can_reach(parts, TENANT_PKEY, gpu02, gpu01)
    assert fabsim_reach.can_reach(parts, "0x7fff", gpu02, gpu01, sm_guid=sm1)


def _history(lab: Lab) -> dict[str, Any]:
    return fabsim_sm.load_history(lab.root)


def _no_config_drift(lab: Lab) -> None:
    """Every running SM runs with what its opensm.conf says (no change left waiting for a restart)."""
    for host in SMS:
        record = json.loads(Path(lab.root, "sm", f"{_guid(lab, host)}.json").read_text())
        text = sh(host, "cat /etc/opensm/opensm.conf").stdout
        assert fabsim_sm.config_drift(record["config"], text, upstream=False) == [], host


EXTRA: dict[str, Any] = {}
"""Variables the later converges keep passing (-e), so each test changes one thing."""


def test_partition_edit_is_a_sighup_not_a_restart(lab: Lab) -> None:
    """A new partition reaches the running master by SIGHUP: no restart, no new master, the partition in force."""
    before = _history(lab)
    EXTRA["opensm_partitions"] = [
        {"name": "tenant_a", "pkey": TENANT_PKEY, "membership": "full", "members": ["gpu01"], "ipoib": True},
        {"name": "tenant_b", "pkey": "0x0003", "membership": "full", "members": ["gpu02"], "ipoib": True},
    ]
    done = converge(lab, "-e", json.dumps(EXTRA))
    assert done.returncode == 0, done.stdout[-4000:]
    after = _history(lab)
    assert after["restarts"] == before["restarts"], after["events"][-8:]
    assert after["mastership_changes"] == before["mastership_changes"]
    sm1 = _guid(lab, "sm1")
    assert after["reloads"].get(sm1, 0) == before["reloads"].get(sm1, 0) + 1
    tenant_b = next(p for p in fabsim_reach.load_partitions(lab.root) if p["name"] == "tenant_b")
    assert [sm.norm_guid(m["member"]) for m in tenant_b["members"]] == [_guid(lab, "gpu02")]
    _no_config_drift(lab)


def test_option_needing_a_restart_rolls_standby_then_master(lab: Lab) -> None:
    """root_guid_file cannot change at runtime: both SMs restart, sm2 (standby) first, never both down."""
    before = _history(lab)
    for host in SMS:
        assert sh(host, "touch /etc/opensm/root_guids.conf").returncode == 0
    EXTRA["opensm_root_guid_file"] = "/etc/opensm/root_guids.conf"
    done = converge(lab, "-e", json.dumps(EXTRA))
    assert done.returncode == 0, done.stdout[-4000:]
    after = _history(lab)
    sm1, sm2 = _guid(lab, "sm1"), _guid(lab, "sm2")
    restarted = {g: after["restarts"].get(g, 0) - before["restarts"].get(g, 0) for g in (sm1, sm2)}
    assert restarted == {sm1: 1, sm2: 1}, after["events"][-12:]
    events = [(e["guid"], e["event"]) for e in after["events"] if e["seq"] > before.get("seq", 0)]
    ups_downs = [ev for ev in events if ev[1] in ("stop", "start")]
    assert ups_downs == [(sm2, "stop"), (sm2, "start"), (sm1, "stop"), (sm1, "start")], events
    # the standby was back in the election before the master went
    assert events.index((sm2, "standby")) < events.index((sm1, "stop")), events
    assert after["outages"] == before["outages"]
    assert after["mastership_changes"] - before["mastership_changes"] <= 2  # to sm2 while sm1 restarts, and back
    master = _master_seen_from("gpu02")
    assert master is not None and (master.guid, master.priority) == (sm1, 15)
    _no_config_drift(lab)


def test_master_killed_standby_takes_over_ports_stay_active(lab: Lab) -> None:
    faults.inject(lab.root, "sm1", "sm_killed", unit="opensmd")

    def sm2_master() -> bool:
        seen = _master_seen_from("gpu01")
        return seen is not None and seen.guid == _guid(lab, "sm2")

    wait_for("sm2 master", sm2_master)
    assert all(_port_state(lab, h) == "active" for h in GPUS)


def test_returning_master_stays_standby_without_handover(lab: Lab) -> None:
    done = converge(lab, "-e", json.dumps(EXTRA))
    assert done.returncode == 0, done.stdout[-4000:]
    master = _master_seen_from("gpu01")
    assert master is not None and master.guid == _guid(lab, "sm2")
    assert "sm_priority 13" in sh("sm1", "cat /etc/opensm/opensm.conf").stdout
    assert sh("sm1", "systemctl is-active opensmd").stdout.strip() == "active"


def test_handover_true_gives_the_master_role_back(lab: Lab) -> None:
    before = _history(lab)
    done = converge(lab, "-e", json.dumps({**EXTRA, "opensm_handover": True}))
    assert done.returncode == 0, done.stdout[-4000:]
    master = _master_seen_from("gpu01")
    assert master is not None and (master.guid, master.priority) == (_guid(lab, "sm1"), 15)
    assert all(_port_state(lab, h) == "active" for h in SMS + GPUS)
    # sm_priority can change at runtime: SIGHUP, and the master hands over to the SM that now outranks it
    after = _history(lab)
    assert after["restarts"] == before["restarts"] and after["outages"] == before["outages"]
    assert after["mastership_changes"] == before["mastership_changes"] + 1
    _no_config_drift(lab)
    faults.clear(lab.root, "sm1", "sm_killed")  # the unit already runs: clearing only forgets the record


def test_ofed_install_under_running_sms_swaps_the_stack_one_sm_at_a_time(lab: Lab) -> None:
    """DOCA-OFED comes to the SM nodes while both SMs run: openibd refuses to unload the RDMA stack under a running
    opensm (mod_load_funcs check_if_ok_to_stop), so the doca_ofed role stops each SM for the swap and starts it
    again, sm2 (the standby) first, each back in the election before the next goes: never no SM, one master."""
    before = _history(lab)
    play = lab.workdir / "ofed.yml"
    play.write_text(yaml.safe_dump([{
        "name": "OFED under running subnet managers", "hosts": "opensm", "gather_facts": False,
        "vars": {"doca_ofed_flavor": "doca", "doca_ofed_version": VendorVersions().doca,
                 "doca_ofed_sm_back_delay": 1},
        "roles": [{"role": "doca_ofed"}],
    }], sort_keys=False))
    done = converge(lab, "-e", json.dumps(EXTRA), playbook=play.name)
    assert done.returncode == 0, done.stdout[-5000:]
    after = _history(lab)
    sm1, sm2 = _guid(lab, "sm1"), _guid(lab, "sm2")
    events = [(e["guid"], e["event"]) for e in after["events"] if e["seq"] > before.get("seq", 0)]
    assert [ev for ev in events if ev[1] in ("stop", "start")] == [
        (sm2, "stop"), (sm2, "start"), (sm1, "stop"), (sm1, "start")], events
    assert events.index((sm2, "standby")) < events.index((sm1, "stop")), events  # back before the master went
    assert after["outages"] == before["outages"]
    for host in SMS:
        assert sh(host, "systemctl is-active opensmd openibd").stdout.split() == ["active", "active"], host
        assert "mlx_compat" in labstate.load_modules(lab.root, host), host  # the OFED build is loaded now
    master = _master_seen_from("gpu01")
    assert master is not None and master.guid in (sm1, sm2)
    assert all(_port_state(lab, h) == "active" for h in SMS + GPUS)
