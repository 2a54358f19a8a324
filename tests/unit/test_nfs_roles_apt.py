"""nfs_client and nfs_server: one apt call each where there were several, installing what those did."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.unit._role_render import render_role

TASKS = Path(__file__).resolve().parents[2] / "roles" / "nfs_client" / "tasks" / "main.yml"
TCP = {"path": "/home", "transport": "tcp"}
RDMA = {"path": "/data", "transport": "rdma"}


def _install() -> dict:
    apts = [t for t in yaml.safe_load(TASKS.read_text()) if "ansible.builtin.apt" in t]
    assert len(apts) == 1
    return apts[0]


@pytest.mark.parametrize(("install", "userspace", "mounts", "expected"), [
    (True, False, [TCP], ["nfs-common"]),
    (True, False, [TCP, RDMA], ["nfs-common", "mlnx-nfsrdma-dkms"]),
    (True, True, [RDMA], ["nfs-common", "mlnx-nfsrdma-dkms", "libnfs-utils"]),
    (False, True, [RDMA], ["libnfs-utils"]),
    (False, False, [RDMA], []),
])
def test_one_apt_call_installs_what_the_three_did(install: bool, userspace: bool, mounts: list, expected: list) -> None:
    task = _install()
    expr = task["vars"]["nfs_client_apt_packages"]
    got = render_role("nfs_client", expr, vars_files=("Debian.yml",), nfs_client_install_packages=install,
                      nfs_client_userspace_tools=userspace, nfs_client_mounts=mounts,
                      nfs_client_rdma_packages=["mlnx-nfsrdma-dkms"])
    assert got == expected
    assert "nfs_client_apt_packages | length > 0" in task["when"]  # nothing to install: no apt call at all


@pytest.mark.parametrize(("rdma", "expected"), [(False, ["nfs-kernel-server"]),
                                               (True, ["nfs-kernel-server", "mlnx-nfsrdma-dkms"])])
def test_the_kernel_server_and_its_rdma_modules_are_one_apt_call(rdma: bool, expected: list) -> None:
    tasks = yaml.safe_load((TASKS.parents[2] / "nfs_server" / "tasks" / "kernel.yml").read_text())
    apts = [t for t in tasks if "ansible.builtin.apt" in t]
    assert len(apts) == 1
    got = render_role("nfs_server", apts[0]["ansible.builtin.apt"]["name"], vars_files=("Debian.yml",),
                      nfs_server_rdma=rdma, nfs_server_rdma_packages=["mlnx-nfsrdma-dkms"])
    assert got == expected
