"""Roles with one apt call where they had several (nfs_client, nfs_server, nccl): each installs what those did."""

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


@pytest.mark.parametrize(("mpi", "from_source", "expected"), [
    (True, True, ["openmpi-bin"]),
    (True, False, ["openmpi-bin", "nccl-tests=2.13.10-1+cuda12.4"]),
    (False, False, ["nccl-tests=2.13.10-1+cuda12.4"]),
    (False, True, []),
])
def test_the_mpi_and_a_site_built_nccl_tests_are_one_apt_call(mpi: bool, from_source: bool, expected: list) -> None:
    install = yaml.safe_load((TASKS.parents[2] / "nccl" / "tasks" / "install.yml").read_text())
    task = next(t for t in install if t.get("vars", {}).get("nccl_apt_packages"))
    assert task["when"] == "nccl_apt_packages | length > 0" and task["ansible.builtin.apt"]["allow_downgrade"]
    got = render_role("nccl", task["vars"]["nccl_apt_packages"], vars_files=("Debian.yml",),
                      nccl_mpi_install=mpi, nccl_tests_install=True, nccl_tests_build_from_source=from_source,
                      nccl_tests_package="nccl-tests", nccl_tests_package_version="2.13.10-1+cuda12.4")
    assert got == expected
    names = [t["ansible.builtin.apt"]["name"] for t in install if "ansible.builtin.apt" in t]
    assert "{{ nccl_mpi_packages }}" not in names and len(names) == 3  # NCCL pinned, this one, the MPI headers
