"""Names and addresses the lab's parts agree on (kept apart to avoid import cycles)."""

from __future__ import annotations

import re

NETWORK = "provisioner-lab"
SUBNET = "10.213.38.0/24"
"""The lab's own subnet (the testbed uses 10.213.37.0/24; the two must not overlap)."""
GATEWAY = "10.213.38.1"
FIRST_HOST_OCTET = 10
CONTAINER_PREFIX = "plab"
CLUSTER_LABEL = "provisioner-lab.cluster"
HOST_LABEL = "provisioner-lab.host"

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def check_name(value: str, what: str) -> str:
    """Cluster and host names reach podman command lines: only DNS-label characters pass."""
    if not _NAME.match(value):
        raise ValueError(f"{what} {value!r} is not a lower-case DNS label (a-z, 0-9, '-')")
    return value


def container_name(cluster: str, host: str) -> str:
    """``plab-<cluster>-<host>``: the node's container."""
    return f"{CONTAINER_PREFIX}-{check_name(cluster, 'cluster name')}-{check_name(host, 'hostname')}"
