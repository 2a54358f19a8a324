"""Simulated IPoIB in the lab: the spec's IPoIB ports as real links between the node containers.

A real ``ip link add ... type ipoib`` needs an InfiniBand device and the ib_ipoib module; the lab's shared kernel has
neither, so the lab stands in for each IPoIB network with a podman network of its own (no IPAM: no address is
given, the ipoib role must configure it; internal: nothing leaves the host) and gives every member container an
interface on it named exactly as the spec names the port's netdev (``ibp23s0``). The links are veth pairs on a Linux
bridge: addressing, MTU, link state and ping between the nodes are real; the IPoIB mode and RDMA-CM over them are
not (they are Ethernet, link/ether): the lab's site_vars say so with ``ipoib_require_infiniband: false``, which the
role and ``provision verify`` honour by reporting those parts as not checked. The network's own MTU is the IPoIB
connected-mode maximum, so the interfaces start at 65520 and only the role's MTU brings them to the planned value.

P_Key children (``ibp23s0.8001``) are not attached here: like the driver's ``create_child``, the node makes one when
its network configuration asks for it, on a running lab too (a partition member added on day 2), on top of its
port's link (``nodetools/ipoib_child_sim.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from provisioner.errors import LabError
from provisioner.lab.host import podman
from provisioner.lab.names import check_name
from provisioner.spec.cluster import Cluster

IPOIB_NETWORK_MTU = 65520
_SAFE = re.compile(r"[^a-z0-9-]")


def network_name(cluster: str, network: str) -> str:
    """The podman network of one IPoIB network (``rail0``) or P_Key child network (``rail0.tenant_a``)."""
    return f"plab-{check_name(cluster, 'cluster name')}-ib-{_SAFE.sub('-', network.lower())}"


def network_prefix(cluster: str) -> str:
    return f"plab-{check_name(cluster, 'cluster name')}-ib-"


def lab_ipoib_links(cluster: Cluster) -> dict[str, list[tuple[str, str]]]:
    """``{host: [(podman network, interface name), ...]}`` for every planned IPoIB port interface, in plan order
    (the P_Key children are made on the node, on these links, when the ipoib role configures them)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for i in cluster.ipoib:
        if i.parent is not None:
            continue
        out.setdefault(i.node, []).append((network_name(cluster.name, i.network), i.netdev))
    return out


def network_args(links: Sequence[tuple[str, str]]) -> list[str]:
    """``podman run`` arguments that attach the IPoIB networks with the spec's interface names."""
    if not links:
        return []
    args = ["--cap-add=NET_ADMIN"]  # the node's own systemd-networkd configures them, as on a real node
    # P_Key children are macvlans on their parent's link here, where a real child's partition never reaches the
    # parent: without these, the parent answered ARP for the child's address (Linux's default arp_ignore=0), a peer
    # sent to the parent's MAC, and a ping bound to the child (the ipoib role's peer check) missed its reply.
    args += ["--sysctl", "net.ipv4.conf.all.arp_ignore=1", "--sysctl", "net.ipv4.conf.all.arp_announce=2"]
    for net, ifname in links:
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,15}", ifname):
            raise LabError(f"IPoIB interface name {ifname!r} cannot be given to a lab container")
        args += ["--network", f"{net}:interface_name={ifname}"]
    return args


def create_args(name: str) -> list[str]:
    """``podman network create`` arguments of one simulated IPoIB network."""
    return ["network", "create", "--internal", "--ipam-driver", "none", "--opt", f"mtu={IPOIB_NETWORK_MTU}", name]


def ensure_networks(links: Mapping[str, Sequence[tuple[str, str]]]) -> list[str]:
    """Create the podman networks the links need (idempotent); return those created."""
    made = []
    for name in sorted({net for per_host in links.values() for net, _ in per_host}):
        if podman("network", "exists", name, check=False).returncode != 0:
            podman(*create_args(name))
            made.append(name)
    return made


def remove_networks(cluster: str) -> list[str]:
    """Remove the cluster's simulated IPoIB networks that no container uses any more; return those removed."""
    prefix = network_prefix(cluster)
    names = podman("network", "ls", "--format", "{{.Name}}", check=False).stdout.split()
    removed = []
    for name in names:
        if not name.startswith(prefix):
            continue
        users = podman("ps", "-a", "--filter", f"network={name}", "--format", "{{.Names}}", check=False).stdout
        if not users.strip():
            podman("network", "rm", name, check=False)
            removed.append(name)
    return removed


def attached(container: str) -> set[str]:
    """The podman networks a container is attached to."""
    fmt = "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}"
    return set(podman("inspect", "--format", fmt, container, check=False).stdout.split())
