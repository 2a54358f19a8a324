"""The small lab the integration tests and the measurement script bring up."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from provisioner.lab import fromspec
from provisioner.lab.cluster import LabInfo, cluster_dir, lab_down, lab_up
from provisioner.lab.hardware import LabCable, LabHca, LabNodeSpec, LabSwitch
from provisioner.lab.host import ensure_containers_conf
from provisioner.lab.ipoib import lab_ipoib_links
from provisioner.spec import load_cluster


def cluster_name(own: str) -> str:
    """A lab test module's cluster: its ``own`` name, after ``$PROVISIONER_LAB_TEST_CLUSTER-`` when that is set
    (two runs on one host, a CI job and a developer, must not share containers). A prefix rather than the whole
    name: the modules of one run go on being distinct clusters, which parallel workers bring up at once."""
    prefix = os.environ.get("PROVISIONER_LAB_TEST_CLUSTER")
    return f"{prefix}-{own}" if prefix else own


CLUSTER = cluster_name("labtest")


# The apt pinning the gpu_stack and perftest_cuda roles write for examples/lab/cluster.yaml's pins: with it the
# pinned releases win over the lab repository's newer drift set when a test installs packages by hand.
APT_PINS = """\
Package: nvidia-* libnvidia-* cuda-drivers-*
Pin: version 550.90.07*
Pin-Priority: 1001

Package: libnccl2 libnccl-dev
Pin: version 2.21.5*
Pin-Priority: 1001

Package: nccl-tests
Pin: version /\\+nccl2\\.21\\.5\\+/
Pin-Priority: 1001

Package: perftest-cuda
Pin: version 25.10.0-0.128-*
Pin-Priority: 1001
"""
APT = "DEBIAN_FRONTEND=noninteractive apt-get -q -o Dir::Etc::SourceList=/dev/null"
"""apt-get that reads only the sources the test put in /etc/apt/sources.list.d (not the image's own list)."""


def nodes(count: int = 3) -> list[LabNodeSpec]:
    """``count`` 8-GPU nodes with two NDR rails each (mlx5_0 on GPU 0, mlx5_1 on GPU 4)."""
    return [
        LabNodeSpec(
            hostname=f"gpu{i:02d}",
            hcas=(
                LabHca("mlx5_0", rail=0, gpu=0, rate_gbps=400, numa=0),
                LabHca("mlx5_1", rail=1, gpu=4, rate_gbps=400, numa=1),
            ),
        )
        for i in range(1, count + 1)
    ]


def fabric(count: int = 3) -> tuple[list[LabSwitch], list[LabCable]]:
    """One leaf per rail, node i on port i."""
    switches = [LabSwitch("leaf0", 64), LabSwitch("leaf1", 64)]
    cables = [
        LabCable(f"gpu{i:02d}", f"mlx5_{r}", 1, f"leaf{r}", i) for i in range(1, count + 1) for r in (0, 1)
    ]
    return switches, cables


MPI_PACKAGES = "openmpi-bin"
"""The Open MPI runtime the nccl role installs for a site-built nccl-tests (headers only for a source build)."""


def mpi_trust(run: Callable[[str, str], str], gpu_nodes: Sequence[str], known_hosts: str) -> None:
    """What the nccl role's mpi_ssh.yml does, over the trusted local channel: every GPU node gets the lab's
    verified known_hosts as /etc/ssh/ssh_known_hosts and a root key of its own, authorised on the others."""
    keys = []
    for host in gpu_nodes:
        run(host, f"printf '%s' {shlex.quote(known_hosts)} > /etc/ssh/ssh_known_hosts && mkdir -p -m 700 /root/.ssh"
                  " && { [ -f /root/.ssh/id_ed25519 ] || ssh-keygen -q -t ed25519 -N '' -f /root/.ssh/id_ed25519; }")
        keys.append(run(host, "cat /root/.ssh/id_ed25519.pub").strip())
    for host in gpu_nodes:
        run(host, f"printf '%s\\n' {' '.join(shlex.quote(k) for k in keys)} >> /root/.ssh/authorized_keys")


@dataclass
class SpecLab:
    """A lab brought up from one of the test specs (renamed to the lab's cluster name) and the state directory the
    module's runs share."""

    cluster: str
    info: LabInfo
    spec: Path
    state: Path

    @property
    def root(self) -> str:
        return str(cluster_dir(self.cluster))


def spec_lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, spec: Path,
             cluster: str) -> SpecLab:
    """Bring up SPEC's lab as `provision lab up` does (its NFS exports, IPoIB links and switch links included) under
    the name CLUSTER; taken down when the requesting fixture's scope ends."""
    os.environ.setdefault("PROVISIONER_LAB_DIR", str(tmp_path_factory.mktemp("labdir")))
    d = tmp_path_factory.mktemp(spec.stem)
    text = spec.read_text(encoding="utf-8")
    renamed = re.sub(r"^cluster: \{name: [a-z0-9-]+,", f"cluster: {{name: {cluster},", text, count=1, flags=re.M)
    assert f"cluster: {{name: {cluster}," in renamed, f"{spec}: no 'cluster: {{name: ...,' line to rename"
    path = d / "cluster.yaml"
    path.write_text(renamed, encoding="utf-8")
    ensure_containers_conf()
    parsed, _ = load_cluster(path)
    request.addfinalizer(lambda: lab_down(cluster))
    info = lab_up(cluster, fromspec.lab_nodes(parsed), fromspec.lab_switches(parsed), fromspec.lab_cables(parsed),
                  versions=fromspec.lab_versions(parsed), nfs_exports=fromspec.lab_nfs_exports(parsed),
                  ipoib_links=lab_ipoib_links(parsed))
    fromspec.write_switch_links(str(cluster_dir(cluster)), fromspec.lab_switch_links(parsed))
    return SpecLab(cluster, info, path, d / "state")
