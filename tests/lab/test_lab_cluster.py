"""A 3-node lab: real systemd containers, real SSH with verified host keys, Debian's real ibstat.

Needs root, podman and the Debian mirror (the first run builds the image, about a minute;
later runs import it from the cache).  Run: ``pytest -m lab tests/lab``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml

from provisioner.lab import cluster, faults
from provisioner.lab.host import ensure_containers_conf, podman
from provisioner.lab.names import NETWORK
from provisioner.lab.simtools import labstate

sys.path.insert(0, str(Path(__file__).parent))
import _labspec  # type: ignore[import-not-found]

pytestmark = [
    pytest.mark.lab,
    pytest.mark.lab_alone,  # its teardown asserts that the lab network is gone: no other lab may be up
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("apt-get") is None, reason="needs root on Debian"),
]


def _leftovers(state_dir: Path) -> list[str]:
    names = podman("ps", "-a", "--filter", f"label=provisioner-lab.cluster={_labspec.CLUSTER}",
                   "--format", "{{.Names}}", check=False).stdout.split()
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(state_dir) in line]
    net = podman("network", "exists", NETWORK, check=False).returncode == 0
    return names + mounts + (["network " + NETWORK] if net else []) + ([str(state_dir)] if state_dir.exists() else [])


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.LabInfo]:
    os.environ.setdefault("PROVISIONER_LAB_DIR", str(tmp_path_factory.mktemp("labdir")))
    ensure_containers_conf()
    switches, cables = _labspec.fabric(3)
    state_dir = cluster.cluster_dir(_labspec.CLUSTER)

    def teardown() -> None:
        cluster.lab_down(_labspec.CLUSTER)
        assert _leftovers(state_dir) == []

    request.addfinalizer(teardown)  # runs after a failed bring-up too
    yield cluster.lab_up(_labspec.CLUSTER, _labspec.nodes(3), switches, cables)


def _ssh(info: cluster.LabInfo, host: str) -> paramiko.SSHClient:
    overlay = yaml.safe_load(info.overlay.read_text())
    client = paramiko.SSHClient()
    client.load_host_keys(overlay["ssh"]["known_hosts"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(overlay["addresses"][host], username=overlay["ssh"]["user"],
                   key_filename=overlay["ssh"]["key"], look_for_keys=False, allow_agent=False, timeout=10)
    return client


def _run(client: paramiko.SSHClient, command: str) -> str:
    _, stdout, stderr = client.exec_command(command, timeout=20)
    out = stdout.read().decode()
    assert stdout.channel.recv_exit_status() == 0, stderr.read().decode()
    return out


def test_overlay_names_every_node(lab: cluster.LabInfo) -> None:
    overlay: dict[str, Any] = yaml.safe_load(lab.overlay.read_text())
    assert sorted(overlay["addresses"]) == ["gpu01", "gpu02", "gpu03"]
    assert Path(overlay["ssh"]["key"]).stat().st_mode & 0o777 == 0o600


def test_ssh_with_verified_host_keys(lab: cluster.LabInfo) -> None:
    for host in ("gpu01", "gpu02", "gpu03"):
        with _ssh(lab, host) as client:
            assert _run(client, "hostname").strip() == host
            assert _run(client, "systemctl is-system-running || true").strip() in ("running", "degraded")


def test_unknown_host_key_is_rejected(lab: cluster.LabInfo, tmp_path: Path) -> None:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        client.connect(lab.addresses["gpu01"], username="root", key_filename=str(lab.state_dir / "ssh/id_ed25519"),
                       look_for_keys=False, allow_agent=False, timeout=10)


def test_real_ibstat_reads_simulated_ports(lab: cluster.LabInfo) -> None:
    node = labstate.load_node(str(lab.state_dir), "gpu02")
    with _ssh(lab, "gpu02") as client:
        out = _run(client, "ibstat")
        status = _run(client, "ibstatus")
        umads = _run(client, "ls /dev/infiniband").split()
    for hca in node["hcas"]:
        assert f"CA '{hca['device']}'" in out
        assert f"Port GUID: {hca['port_guid']}" in out
    assert out.count("Rate: 400") == 2 and out.count("State: Initializing") == 2
    assert "Physical state: LinkUp" in out
    assert "rate:\t\t 400 Gb/sec (4X NDR)" in status
    assert umads == ["umad0", "umad1"]


def test_fault_shows_at_once(lab: cluster.LabInfo) -> None:
    root = str(lab.state_dir)
    faults.inject(root, "gpu01", "port_down", device="mlx5_0")
    faults.inject(root, "gpu01", "degraded_width", device="mlx5_1")
    try:
        with _ssh(lab, "gpu01") as client:
            down = _run(client, "ibstat mlx5_0 1")
            narrow = _run(client, "ibstatus mlx5_1")
        assert "State: Down" in down and "Physical state: Polling" in down
        assert "200 Gb/sec (2X NDR)" in narrow
        status = {s.host: s for s in cluster.lab_status(_labspec.CLUSTER)}
        assert [f["kind"] for f in status["gpu01"].faults] == ["port_down", "degraded_width"]
        assert status["gpu01"].state == "running" and status["gpu01"].ip == lab.addresses["gpu01"]
    finally:
        faults.clear(root, "gpu01")
    with _ssh(lab, "gpu01") as client:
        assert "State: Initializing" in _run(client, "ibstat mlx5_0 1")


def test_simulated_modprobe_fails_like_kmod(lab: cluster.LabInfo) -> None:
    with _ssh(lab, "gpu03") as client:
        _, stdout, stderr = client.exec_command("modprobe nvidia_peermem")
        assert stdout.channel.recv_exit_status() == 1
        kver = _run(client, "uname -r").strip()
        expected = f"modprobe: FATAL: Module nvidia_peermem not found in directory /lib/modules/{kver}\n"
        assert stderr.read().decode() == expected
        assert _run(client, "lsmod").startswith("Module                  Size  Used by\n")


def test_second_lab_up_changes_nothing(lab: cluster.LabInfo) -> None:
    known = (lab.state_dir / "ssh/known_hosts").read_text()
    switches, cables = _labspec.fabric(3)
    again = cluster.lab_up(_labspec.CLUSTER, _labspec.nodes(3), switches, cables)
    assert again.created == [] and again.addresses == lab.addresses
    assert (lab.state_dir / "ssh/known_hosts").read_text() == known


def test_lab_traffic_has_a_fallback_route(lab: cluster.LabInfo) -> None:
    routes = subprocess.run(["ip", "route", "show", "type", "unreachable"], capture_output=True, text=True).stdout
    assert "10.213.38.0/24" in routes
