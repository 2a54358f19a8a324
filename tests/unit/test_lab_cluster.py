"""cluster: the pure parts of bring-up (addresses, known_hosts, overlay, podman run arguments)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import LabError
from provisioner.lab import cluster
from provisioner.lab.names import container_name


def test_allocate_keeps_existing_and_skips_used() -> None:
    got = cluster.allocate_addresses(["a", "b", "c"], {"b": "10.213.38.40"}, {"10.213.38.10"})
    assert got == {"a": "10.213.38.11", "b": "10.213.38.40", "c": "10.213.38.12"}


def test_allocate_runs_out() -> None:
    with pytest.raises(LabError, match="no free address"):
        cluster.allocate_addresses(["a", "b"], {}, set(), subnet="10.0.0.0/29")


def test_known_hosts_roundtrip() -> None:
    entries = {"gpu01": ("10.213.38.10", "ssh-ed25519 AAAAkey1 root@gpu01")}
    text = cluster.known_hosts_text(entries)
    assert text == "gpu01,10.213.38.10 ssh-ed25519 AAAAkey1\n"
    assert cluster.parse_known_hosts(text) == {"gpu01": ("10.213.38.10", "ssh-ed25519 AAAAkey1")}


def test_overlay_shape() -> None:
    data = cluster.overlay_data(Path("/k"), Path("/kh"), {"b": "2", "a": "1"})
    assert data == {"ssh": {"user": "root", "key": "/k", "known_hosts": "/kh"}, "addresses": {"a": "1", "b": "2"},
                    "site_vars": {"preflight_gpu_evidence": "nvidia-smi"}}


def test_run_args_mounts_state_and_sysfs() -> None:
    args = cluster.run_args("c1", "gpu01", "10.213.38.10", Path("/lab/c1"))
    assert "--systemd=always" in args and args[-1] == "/sbin/init"
    assert "/lab/c1:/run/lab:rw" in args
    assert "/lab/c1/nodes/gpu01/sys/class:/sys/class:ro" in args
    assert args[args.index("--ip") + 1] == "10.213.38.10"
    assert args[args.index("--name") + 1] == "plab-c1-gpu01"


def test_names_are_validated() -> None:
    with pytest.raises(ValueError):
        container_name("c1", "gpu01; rm -rf /")


def test_ssh_key_is_private_and_reused(tmp_path: Path) -> None:
    pub = cluster.ensure_ssh_key(tmp_path / "ssh")
    assert pub.startswith("ssh-ed25519 ")
    assert (tmp_path / "ssh" / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert cluster.ensure_ssh_key(tmp_path / "ssh") == pub


def test_host_conf_text() -> None:
    from provisioner.lab.host import containers_conf_text, parse_dpkg_status

    text = containers_conf_text()
    assert 'runtime = "runc"' in text and "nofile=1024:1024" in text and 'cgroup_manager = "cgroupfs"' in text
    assert parse_dpkg_status("podman install ok installed\nrunc deinstall ok config-files\n") == {"podman"}
