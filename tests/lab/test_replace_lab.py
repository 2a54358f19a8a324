"""provision replace-node on a real lab: 2 GPU nodes + 1 SM node, a tenant partition holding both GPU nodes.

The lab is converged with the run engine (all node phases and the fabric phase), gpu01's hardware is recorded,
then a `hardware_swap` fault gives gpu01 new GUIDs, serials and SSH host keys. What must hold:
a plain verify and a plain run refuse the changed key; replace-node without a flag refuses and shows the new
fingerprint, changing nothing; with `--accept-new-host-key` it converges gpu01 alone, re-renders the SM's
partitions.conf with the new GUIDs (and nothing else in it), reloads the SM with SIGHUP (no restart, no change
of master: the simulated SM's sm/history.json counts), the partition still admits gpu01, verification passes,
and gpu02 and sm1 are unchanged (every file under /etc: content, size and mtime; every package version).

Slow on 2 shared cores (several minutes: a whole converge of 3 nodes, then one node again).
Run: ``PROVISIONER_LAB_TEST_CLUSTER=replace pytest -m lab tests/lab/test_replace_lab.py`` (root, podman).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import RemoteError
from provisioner.lab import faults
from provisioner.lab.cluster import LabInfo, cluster_dir, lab_down, lab_up
from provisioner.lab.fromspec import lab_cables, lab_nodes, lab_switches, lab_versions
from provisioner.lab.host import ensure_containers_conf, podman
from provisioner.lab.names import container_name
from provisioner.lab.simtools import fabsim_reach, fabsim_sm
from provisioner.phases import RunOptions, provision_run
from provisioner.remote import SshRemote, targets_from_cluster
from provisioner.replace import HostKeyRefused, observe, replace_node, summary_lines
from provisioner.runner import control_path_dir
from provisioner.spec import load_cluster
from provisioner.state import hardware_history, record_hardware

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

CLUSTER = os.environ.get("PROVISIONER_LAB_TEST_CLUSTER", "replace")
NODE, PEER, SM = "gpu01", "gpu02", "sm1"
TENANT_PKEY = "0x8001"
CONVERGE = ["preflight", "repos", "ofed", "gpu_stack", "fabric", "storage"]

SPEC = """\
cluster: {name: CLUSTER_NAME, os: debian-12}
ssh: {user: root, known_hosts: known_hosts}
software:
  driver: {version: "550.90.07", kernel_modules: open}
  cuda: "12.4.1"
  nccl: "2.21.5"
  ofed: {flavor: doca, version: "2.9.1"}
repositories:
  cuda: {url: http://mirror.lab.invalid/cuda/debian12/x86_64, key: keys/cuda.gpg, components: []}
  doca: {url: http://mirror.lab.invalid/doca/2.9.1/debian12/x86_64, key: keys/doca.gpg, components: []}
profiles:
  gpu2:
    gpu: {model: H100-SXM5-80GB, count: 2, nvswitch: true}
    hcas: [{device: "mlx5_[0-1]", rate: NDR}]
  svc:
    hcas: [{device: mlx5_0, rate: NDR}]
nodes:
  - {name: "gpu[01-02]", address: "10.213.38.[11-12]", profile: gpu2}
  - {name: sm1, address: 10.213.38.21, profile: svc, roles: [subnet_manager]}
switches:
  - {name: "leaf[1-2]", tier: leaf, ports: 64, uplinks: 8}
  - {name: spine1, tier: spine, ports: 64}
fabric:
  rate: NDR
  topology:
    kind: rail_optimized
    cabling:
      - {nodes: "gpu[01-02]", hca: mlx5_0, switch: leaf1, ports: 1-2}
      - {nodes: "gpu[01-02]", hca: mlx5_1, switch: leaf2, ports: 1-2}
      - {nodes: sm1, hca: mlx5_0, switch: leaf1, ports: "31"}
  subnet_manager:
    kind: opensm
    nodes: [{node: sm1, priority: 15}]
    adaptive_routing: true
  partitions:
    - {name: tenant_a, pkey: 0x8001, members: "gpu[01-02]"}
verify:
  bandwidth: {min_fraction: 0.9, mode: quick, duration: 2}
  gpudirect: {required: true}
  nccl: {min_busbw_gbps: 80}
""".replace("CLUSTER_NAME", CLUSTER)


def sh(host: str, command: str) -> str:
    """``command``'s output in ``host``'s container (the trusted local channel, not SSH)."""
    done = podman("exec", container_name(CLUSTER, host), "sh", "-c", command, check=False, timeout=120)
    return str(done.stdout)


def wait_for(what: str, probe: Callable[[], bool], deadline_s: float = 90.0) -> None:
    end = time.monotonic() + deadline_s
    while not probe():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(1.0)


def snapshot(host: str) -> dict[str, str]:
    """Every file under /etc (size, mtime, checksum) and every package version, as the container sees them."""
    files = sh(host, "find /etc -xdev -type f -printf '%p %s %T@ ' -exec md5sum {} \\; | awk '{print $1, $2, $3, $4}'")
    pkgs = sh(host, "dpkg-query -W -f '${Package} ${Version}\\n'")
    out = {f"pkg {ln.split(' ', 1)[0]}": ln for ln in pkgs.splitlines() if ln}
    out.update({f"file {ln.split(' ', 1)[0]}": ln for ln in files.splitlines() if ln})
    return out


def sm_service() -> dict[str, str]:
    text = sh(SM, "systemctl show opensmd -p MainPID -p ActiveEnterTimestampMonotonic -p ActiveState")
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)


def close_control_masters(state: Path) -> None:
    """A real swap reboots the node, which ends every SSH connection to it; the lab's swap only restarts sshd
    (sessions survive), so the multiplexed masters of the earlier run are ended here, as a reboot would."""
    cp = control_path_dir(state)
    for sock in cp.glob("*") if cp.is_dir() else []:
        subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "lab"], capture_output=True, timeout=20,
                       check=False)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("replace")
    (d / "cluster.yaml").write_text(SPEC)
    return d / "cluster.yaml"


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, spec: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabInfo]:
    os.environ.setdefault("PROVISIONER_LAB_DIR", str(tmp_path_factory.mktemp("labdir")))
    ensure_containers_conf()
    cluster, _ = load_cluster(spec)
    request.addfinalizer(lambda: lab_down(CLUSTER))
    yield lab_up(CLUSTER, lab_nodes(cluster), lab_switches(cluster), lab_cables(cluster),
                 versions=lab_versions(cluster))


def test_replace_node_after_a_hardware_swap(lab: LabInfo, spec: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    overlay = str(lab.overlay)
    root = str(cluster_dir(CLUSTER))

    converged = provision_run(spec, RunOptions(only=CONVERGE, overlay=overlay), state_dir=state)
    assert converged.status == "passed", [(p.name, p.status, p.failed, p.unreachable) for p in converged.phases]

    cluster, _ = load_cluster(spec, lab.overlay)
    targets = targets_from_cluster(cluster)
    with SshRemote(targets) as remote:  # what verify records in a normal run: the hardware as it is now
        for host in (NODE, PEER, SM):
            obs = observe(remote, host)
            record_hardware(state, host, guids=obs.guids, serials=obs.serials)
        old = observe(remote, NODE)
    peer_guid = observe_guid(targets, PEER)
    before = {h: snapshot(h) for h in (PEER, SM)}
    parts_before = sh(SM, "cat /etc/opensm/partitions.conf")
    conf_before = sh(SM, "cat /etc/opensm/opensm.conf")
    service_before = sm_service()
    history_before = fabsim_sm.load_history(root)
    kh = Path(targets[NODE].known_hosts)
    kh_before = kh.read_text()
    for guid in (old.guids["mlx5_0/1"], old.guids["mlx5_1/1"]):
        assert guid in parts_before

    faults.inject(root, NODE, "hardware_swap")
    close_control_masters(state)
    new_fp = sh(NODE, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").split()[1]

    # a plain verify and a plain run refuse the changed host key
    with SshRemote(targets) as remote, pytest.raises(RemoteError, match="host key CHANGED"):
        remote.run(NODE, ["true"], timeout=10)
    plain = provision_run(spec, RunOptions(only=["preflight"], limit=NODE, overlay=overlay), state_dir=state)
    assert plain.status == "stopped" and plain.set_aside[NODE]["state"] == "unreachable"  # its only host is out
    assert "Host key verification failed" in plain.set_aside[NODE]["reason"]

    # replace-node without a flag: refused, the new fingerprint shown, nothing changed
    with pytest.raises(HostKeyRefused) as refused:
        replace_node(spec, NODE, overlay=lab.overlay, state_dir=state)
    assert new_fp in str(refused.value)
    assert kh.read_text() == kh_before

    # with the flag: converges gpu01, re-renders the SM's partitions, verifies
    result = replace_node(spec, NODE, overlay=lab.overlay, state_dir=state, accept_new_host_key=True)
    summary = "\n".join(summary_lines(result))
    assert result.exit_code == 0, summary
    assert result.fingerprint == new_fp and new_fp in summary
    # the node's own phases; the peers' MPI SSH trust of its new keys (gpu_stack, --tags nccl_mpi_ssh_trust); the
    # SM's partitions; then the node's own fabric phase (IPoIB, NCCL_IB_PKEY from the new P_Key table) and storage
    assert [(p, h) for p, h, _ in result.phases] == [
        ("preflight", NODE), ("repos", NODE), ("ofed", NODE), ("gpu_stack", NODE), ("gpu_stack", f"{NODE},{PEER}"),
        ("fabric", SM), ("fabric", NODE), ("storage", NODE)]
    assert result.peers == [PEER] and result.report is not None and result.report.verdict.exit_code == 0

    new = result.observation
    swapped = {"mlx5_0/1", "mlx5_1/1"}
    assert all(new.guids[k] != old.guids[k] for k in swapped)
    changes = {(c.kind, c.key): (c.old, c.new) for c in hardware_history(state, NODE)}
    for key in swapped:
        assert changes[("guid", key)] == (old.guids[key], new.guids[key])
    assert ("serial", "gpu0") in changes and changes[("host_key", "ssh-ed25519")][1] == new_fp
    assert "# replaced " in kh.read_text() and new_fp not in kh_before

    # the SM: new GUIDs in partitions.conf, nothing else in it changed, opensm.conf untouched, SM reloaded
    parts_after = sh(SM, "cat /etc/opensm/partitions.conf")
    expected = parts_before
    for key in swapped:
        expected = expected.replace(old.guids[key], new.guids[key])
    assert parts_after == expected and parts_after != parts_before
    assert sh(SM, "cat /etc/opensm/opensm.conf") == conf_before
    assert result.sm_config_changed == [SM] and result.sm_reloaded == [SM] and result.sm_restarted == []
    service_after = sm_service()
    assert service_after["ActiveState"] == "active"
    assert service_after["MainPID"] == service_before["MainPID"]  # the same opensm, never stopped
    history = fabsim_sm.load_history(root)
    assert history["restarts"] == history_before["restarts"], history["events"][-8:]
    assert history["mastership_changes"] == history_before["mastership_changes"]
    assert history["outages"] == history_before["outages"]

    # the partition still admits gpu01 (as enforced by the master SM now)
    wait_for("the SM to enforce the new partitions", lambda: fabsim_reach.can_reach(
        fabsim_reach.load_partitions(root), TENANT_PKEY, new.guids["mlx5_0/1"], peer_guid))
    assert not fabsim_reach.can_reach(fabsim_reach.load_partitions(root), TENANT_PKEY, old.guids["mlx5_0/1"],
                                      peer_guid)

    # nothing else changed on the other nodes
    after = {h: snapshot(h) for h in (PEER, SM)}
    assert diff(before[PEER], after[PEER]) == set()
    assert diff(before[SM], after[SM]) == {"file /etc/opensm/partitions.conf"}


def observe_guid(targets: Any, host: str) -> str:
    with SshRemote(targets) as remote:
        return observe(remote, host).guids["mlx5_0/1"]


def diff(a: dict[str, str], b: dict[str, str]) -> set[str]:
    """The keys whose line differs (added, removed or changed)."""
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
