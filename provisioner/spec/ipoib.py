"""IP over InfiniBand from the spec: each ``fabric.ipoib`` network expanded into planned interfaces.

A network names one port of every member node (``rail: i`` or ``device: mlx5_8``), the addresses of the members
in hostlist form (in step with ``nodes``, like a node group's ``address``), its subnet, mode and MTU; each child
names a partition and gets a P_Key child interface of the port's netdev (``ibp24s0.8001``) on every member of the
partition. Expansion keeps what it can build and drops the rest silently: the IPOIB-* design rules
(``provisioner.spec.rules``) say what is wrong and where, from the same helpers.

Facts (Linux Documentation/infiniband/ipoib.rst, systemd.netdev(5) [IPoIB]): in datagram mode the interface MTU is
the IB MTU minus the 4-byte IPoIB header (2044 with the 2048-byte IPoIB group opensm creates by default, 4092 with a
4096-byte one); connected mode allows up to 65520. A child interface created for P_Key 0x8001 on ib0 is named
``ib0.8001``; the kernel sets the full-member bit of the P_Key it joins with.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from provisioner.spec import hostlist
from provisioner.spec.cluster import Cluster, IpoibIf, Node, Port
from provisioner.spec.models import IpoibNetwork, NfsMount, Partition

DATAGRAM_DEFAULT_MTU = 2044
"""Datagram mode on opensm's default IPoIB group (mtu=4, 2048 bytes, partition-config.txt) minus 4."""
DATAGRAM_MAX_MTU = 4092
"""Datagram mode on a 4096-byte IB MTU (ipoib.rst: IB MTU minus the 4-byte encapsulation header)."""
CONNECTED_MAX_MTU = 65520
"""Connected mode's largest MTU (ipoib.rst: up to the maximal IP packet size of 64K; the kernel caps it at 65520)."""
FULL_MEMBER = 0x8000
IFNAMSIZ = 15


def default_mtu(mode: str) -> int:
    return CONNECTED_MAX_MTU if mode == "connected" else DATAGRAM_DEFAULT_MTU


def max_mtu(mode: str) -> int:
    return CONNECTED_MAX_MTU if mode == "connected" else DATAGRAM_MAX_MTU


def child_name(parent: str, pkey: int) -> str:
    """The kernel's name for a P_Key child of ``parent`` (``ib0`` + 0x8001 -> ``ib0.8001``)."""
    return f"{parent}.{pkey | FULL_MEMBER:04x}"


def network_port(net: IpoibNetwork, node: Node) -> Port | None:
    """The port of ``node`` that ``net`` names (rail i, or a device), or None."""
    device = net.device.get(node.profile) if isinstance(net.device, dict) else net.device
    for p in node.ports:
        if device is not None and p.device == device:
            return p
        if net.rail is not None and p.rail == net.rail and p.purpose == "rail":
            return p
    return None


def select(expr: str, cluster: Cluster) -> list[str]:
    """Nodes named by a role or a hostlist expression, in the order written: they pair with the network's
    addresses item by item (raises HostlistError, also for a list the hostlist library would reorder)."""
    from provisioner.spec.rules import members

    return members(expr, cluster, ordered=True)


def network_members(net: IpoibNetwork, cluster: Cluster) -> list[str]:
    """The member nodes of ``net`` in order: its ``nodes``, else every node that has its port (raises HostlistError)."""
    if net.nodes is not None:
        return select(net.nodes, cluster)
    return [n.name for n in cluster.nodes if network_port(net, n) is not None]


def child_members(net: IpoibNetwork, index: int, cluster: Cluster, partition: Partition) -> list[str]:
    """The nodes that get child ``index`` of ``net``: its ``nodes``, else the partition's members on the network."""
    child = net.children[index]
    if child.nodes is not None:
        return select(child.nodes, cluster)
    in_part = set(select(partition.members, cluster))
    return [n for n in network_members(net, cluster) if n in in_part]


def subnet_of(cidr: str) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(cidr, strict=True)
    except ValueError:
        return None


def is_ipv4(addr: str) -> bool:
    try:
        ipaddress.IPv4Address(addr)
    except ValueError:
        return False
    return True


def _interfaces(cluster: Cluster) -> Iterable[IpoibIf]:
    spec = cluster.spec
    parts = {p.name: p for p in spec.fabric.partitions}
    by_name = {n.name: n for n in cluster.nodes}
    for ni, net in enumerate(spec.fabric.ipoib):
        path = ("fabric", "ipoib", ni)
        subnet = subnet_of(net.subnet)
        try:
            names = network_members(net, cluster)
            addrs = hostlist.expand(net.address, ordered=True)
        except hostlist.HostlistError:
            continue
        if subnet is None or len(names) != len(addrs):
            continue
        mtu = net.mtu or default_mtu(net.mode)
        parents: dict[str, IpoibIf] = {}
        for name, addr in zip(names, addrs, strict=True):
            node = by_name.get(name)
            port = network_port(net, node) if node else None
            if port is None or port.netdev is None or not is_ipv4(addr) or name in parents:
                continue
            parents[name] = IpoibIf(name, net.name, port.netdev, port.device, port.port, addr, subnet.prefixlen,
                                    str(subnet), net.mode, mtu, path=(*path, "address"))
            yield parents[name]
        for ci, child in enumerate(net.children):
            part = parts.get(child.partition)
            csubnet = subnet_of(child.subnet)
            if part is None or csubnet is None:
                continue
            try:
                cnames = child_members(net, ci, cluster, part)
                caddrs = hostlist.expand(child.address, ordered=True)
            except hostlist.HostlistError:
                continue
            if len(cnames) != len(caddrs):
                continue
            mode = child.mode or net.mode
            cmtu = child.mtu or (mtu if mode == net.mode else default_mtu(mode))
            pkey = part.pkey | FULL_MEMBER
            for name, addr in zip(cnames, caddrs, strict=True):
                parent = parents.get(name)
                if parent is None or not is_ipv4(addr):
                    continue
                yield IpoibIf(name, f"{net.name}.{part.name}", child_name(parent.netdev, pkey), parent.device,
                              parent.port, addr, csubnet.prefixlen, str(csubnet), mode, cmtu, parent=parent.netdev,
                              pkey=pkey, partition=part.name, path=(*path, "children", ci, "address"))


def expand_ipoib(cluster: Cluster) -> list[IpoibIf]:
    """Every planned IPoIB interface, parents before their children, networks in spec order."""
    return list(_interfaces(cluster))


# --- what storage takes from IPoIB -------------------------------------------------------------------------------
def mount_network(cluster: Cluster, mount: NfsMount, clients: Iterable[str]) -> str | None:
    """The IPoIB network an NFS mount goes over: its ``network``, or for RDMA the first network the server and
    every client are on; None: the management network."""
    if mount.network is not None:
        return mount.network
    if mount.transport != "rdma":
        return None
    wanted = {mount.server, *clients}
    for net in cluster.spec.fabric.ipoib:
        on = {i.node for i in cluster.ipoib if i.network == net.name}
        if wanted <= on:
            return net.name
    return None


def address_on(cluster: Cluster, node: str, network: str) -> IpoibIf | None:
    """The planned interface of ``node`` on ``network`` (a top-level network or ``net.partition``)."""
    return next((i for i in cluster.ipoib if i.node == node and i.network == network), None)


def nfs_server_address(cluster: Cluster, mount: NfsMount, clients: Iterable[str]) -> str:
    """The address a mount names: the server's IPoIB address on the mount's network, else its management one."""
    net = mount_network(cluster, mount, clients)
    mine = address_on(cluster, mount.server, net) if net else None
    if mine is not None:
        return mine.address
    try:
        return cluster.node(mount.server).address
    except KeyError:
        return mount.server
