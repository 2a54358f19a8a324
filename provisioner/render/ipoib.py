"""What the inventory takes from the spec's IPoIB networks: the ipoib role's interfaces, the address NFS mounts
use, LNet's o2ib interface, the SM's IPoIB group MTU and the OFED release Lustre's modules must match."""

from __future__ import annotations

from typing import Any

from provisioner.spec import compat, ipoib
from provisioner.spec.cluster import Cluster, IpoibIf
from provisioner.spec.models import LustreMount, Spec

PEERS = 3
"""Peers per interface the role may ping (the next members of the network, in spec order): the first that answers
proves the interface; more only cost time when the network is down."""
IB_MTU_4096 = 5
"""IBTA MTU code of 4096 bytes (opensm partition-config.txt: 'mtu=4 for 2048')."""


def _peers(cluster: Cluster) -> dict[tuple[str, str], list[dict[str, str]]]:
    by_net: dict[str, list[IpoibIf]] = {}
    for i in cluster.ipoib:
        by_net.setdefault(i.network, []).append(i)
    out: dict[tuple[str, str], list[dict[str, str]]] = {}
    for members in by_net.values():
        for k, me in enumerate(members):
            others = [members[(k + j) % len(members)] for j in range(1, len(members))]
            out[(me.node, me.netdev)] = [{"host": o.node, "address": o.address} for o in others[:PEERS]]
    return out


def ipoib_interfaces(cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    """``{node: ipoib_interfaces}`` for the ipoib role: parents before their children."""
    peers = _peers(cluster)
    out: dict[str, list[dict[str, Any]]] = {}
    for i in cluster.ipoib:
        out.setdefault(i.node, []).append({
            "name": i.netdev, "device": i.device, "port": i.port, "address": i.address, "prefix": i.prefix,
            "mode": i.mode, "mtu": i.mtu, "network": i.network, "parent": i.parent,
            "pkey": f"{i.pkey:#06x}" if i.pkey is not None else None, "peers": peers.get((i.node, i.netdev), [])})
    return out


def lustre_lnet(cluster: Cluster, fs: LustreMount, host: str) -> list[str]:
    """LNet networks of ``host`` for one mount: an o2ib network without an interface gets the host's IPoIB netdev
    on the mount's network (or the one every client is on)."""
    nets = [fs.network] if fs.network else [n.name for n in cluster.spec.fabric.ipoib]
    mine = next((x for net in nets if (x := ipoib.address_on(cluster, host, net)) is not None), None)
    return [f"{n}({mine.netdev})" if n.startswith("o2ib") and "(" not in n and mine is not None else n
            for n in fs.lnet]


def built_against_ofed(spec: Spec) -> str:
    """The OFED release the Lustre client modules must match (``ofed_info -s`` without prefix); empty: unchecked."""
    ofed = spec.software.ofed
    if ofed.flavor == "doca" and ofed.version:
        return compat.DOCA_OFED.get(ofed.version, "")
    if ofed.flavor == "mlnx_ofed" and ofed.version:
        return ofed.version
    return ""


def ipoib_group_mtus(cluster: Cluster) -> dict[str | None, int]:
    """``{partition name or None (the default partition): IBTA MTU code}`` where a datagram interface asks for
    more than 2044 bytes: the SM must create that partition's IPoIB group with a 4096-byte MTU."""
    out: dict[str | None, int] = {}
    for i in cluster.ipoib:
        if i.mode == "datagram" and i.mtu > ipoib.DATAGRAM_DEFAULT_MTU:
            out[i.partition] = IB_MTU_4096
    return out


def nfs_rdma_servers(cluster: Cluster) -> set[str]:
    """Servers some mount reaches over NFS/RDMA: their kernel server must listen on rdma 20049."""
    return {m.server for m in cluster.spec.storage.nfs.mounts if m.transport == "rdma"}


NFS_RDMA_PACKAGES = {"doca": ["mlnx-nfsrdma-dkms"], "mlnx_ofed": ["mlnx-nfsrdma-dkms"]}
"""The NFS/RDMA kernel modules of each OFED flavour: DOCA-OFED and MLNX_OFED replace ib_core, so the kernel's own
rpcrdma no longer loads and their mlnx-nfsrdma-dkms provides one built against it (DOCA-Host installation guide,
"Storage Installation": apt install mlnx-nfsrdma-dkms); the inbox stack keeps the kernel's."""


def nfs_rdma_packages(spec: Spec) -> list[str]:
    return list(NFS_RDMA_PACKAGES.get(spec.software.ofed.flavor, []))
