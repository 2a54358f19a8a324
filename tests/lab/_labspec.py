"""The small lab the integration tests and the measurement script bring up."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence

from provisioner.lab.hardware import LabCable, LabHca, LabNodeSpec, LabSwitch

CLUSTER = os.environ.get("PROVISIONER_LAB_TEST_CLUSTER", "labtest")
"""Overridable so that two runs on one host (a CI job and a developer) do not share containers."""


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
