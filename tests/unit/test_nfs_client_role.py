"""nfs_client's one apt call: the package list it installs for each combination the three tasks covered."""

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
