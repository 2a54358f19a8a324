"""Map the expanded spec onto the lab's simulated hardware: one LabNodeSpec per node, the switches and cables.

The lab rehearses exactly the cluster the operator wrote: same host names, GPUs, HCAs, rails, rates, cabling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from provisioner.fabric import switchlinks
from provisioner.lab.hardware import LabCable, LabHca, LabNodeSpec, LabSwitch
from provisioner.lab.packages import VendorVersions
from provisioner.lab.simtools import labstate
from provisioner.spec.catalog import GPU_MODELS
from provisioner.spec.cluster import Cluster


def lab_nodes(cluster: Cluster) -> list[LabNodeSpec]:
    out: list[LabNodeSpec] = []
    for n in cluster.nodes:
        model = GPU_MODELS.get(n.gpu_model or "")
        hcas = tuple(
            LabHca(device=p.device, port=p.port, rail=p.rail if p.rail is not None else 0, gpu=p.gpu,
                   rate_gbps=int(p.rate_gbps), width=p.width,
                   link_layer="InfiniBand" if p.link_layer == "infiniband" else "Ethernet",
                   numa=p.numa if p.numa is not None else (0 if (p.gpu or 0) < max(1, n.gpu_count) // 2 else 1),
                   netdev=p.netdev)
            for p in n.ports)
        out.append(LabNodeSpec(
            hostname=n.name, gpu_model=model.smi_name if model else "NVIDIA GPU",
            gpu_count=n.gpu_count, gpu_memory_mib=model.memory_mib if model else 0, nvswitch=n.nvswitch, hcas=hcas,
            address=n.address))
    return out


def lab_switches(cluster: Cluster) -> list[LabSwitch]:
    return [LabSwitch(name=s.name, ports=s.ports, tier=s.tier, uplinks=s.uplinks, uplink_rate_gbps=s.uplink_rate_gbps)
            for s in cluster.switches]


def lab_cables(cluster: Cluster) -> list[LabCable]:
    ports = {(n.name, p.device): p.port for n in cluster.nodes for p in n.ports}
    return [LabCable(node=c.node, device=c.device, port=ports.get((c.node, c.device), 1), switch=c.switch,
                     switch_port=c.switch_port) for c in cluster.cables]


@dataclass(frozen=True)
class LabSwitchLink:
    """A cable between two switches: ``switch`` port ``port`` (the lower tier) up to ``peer`` port ``peer_port``."""

    switch: str
    port: int
    peer: str
    peer_port: int
    width: str = "4X"
    speed: str = "NDR"


def lab_switch_links(cluster: Cluster) -> list[LabSwitchLink]:
    """Leaf-to-spine and spine-to-core cables exactly as the spec plans them (``switchlinks.plan``: a switch's
    uplinks are its highest ports, spread evenly over the next tier up); the lab cables the plan, the
    verification checks the live fabric against it."""
    return [LabSwitchLink(p.switch, p.port, p.peer, p.peer_port, p.width, p.speed or "NDR")
            for p in switchlinks.plan(cluster)]


def write_switch_links(root: str, links: list[LabSwitchLink]) -> bool:
    """Put the switch-to-switch cables into the lab's fabric.json (``switch_links``); True when it changed.

    ``hardware.fabric_state`` carries keys it does not own over from the previous fabric.json, so the
    list survives later ``lab up`` runs; this rewrites it each time so a changed spec is followed.
    """
    fabric: dict[str, Any] = labstate.load_fabric(root)
    want = [asdict(link) for link in links]
    if fabric.get("switch_links") == want:
        return False
    fabric["switch_links"] = want
    labstate.save_fabric(root, fabric)
    return True


def lab_nfs_exports(cluster: Cluster) -> dict[str, list[str]]:
    """``{server node: [export path, ...]}``: the directories each lab NFS server must be able to export
    (NFS-Ganesha cannot export the container's overlayfs root; the lab gives each path a tmpfs)."""
    out: dict[str, list[str]] = {}
    for export in cluster.spec.storage.nfs.exports:
        paths = out.setdefault(export.server, [])
        if export.path not in paths:
            paths.append(export.path)
    return out


DOCA_OFED: dict[str, str] = {
    "2.9.1": "24.10-1.1.4.0",
    "2.9.2": "24.10-2.1.8.0",
}
"""DOCA-Host release -> the MLNX_OFED version it ships (``ofed_info -s``); 2.9.2 from the release manifest in
Mellanox/doca-driver-build PR #81 ("MLNX_OFED_LINUX-24.10-2.1.8.0 / DOCA-Host 2.9.2-0.1.5")."""

DRIFT: dict[str, dict[str, str]] = {
    "driver": {"550.90.07": "550.127.05", "535.183.01": "535.216.01"},
    "nccl": {"2.21.5": "2.23.4", "2.20.5": "2.21.5"},
}
"""Newer releases of the same branch that a real mirror would also carry (the lab's "drift" set)."""


def lab_versions(cluster: Cluster) -> VendorVersions:
    """The pinned software set of the spec, as the stand-in package recipes take it."""
    sw = cluster.spec.software
    defaults = VendorVersions()
    flavor = sw.ofed.flavor
    ofed_kind: Literal["doca", "mlnx"]
    if flavor == "mlnx_ofed":
        ofed_kind, ofed, doca = "mlnx", sw.ofed.version or defaults.ofed, defaults.doca
    else:  # doca, or inbox (the OFED packages are then built but nothing installs them)
        doca = sw.ofed.version if flavor == "doca" and sw.ofed.version else defaults.doca
        ofed_kind, ofed = "doca", DOCA_OFED.get(doca, defaults.ofed)
    fabric_manager = sw.fabric_manager if sw.fabric_manager is not None else any(n.nvswitch for n in cluster.nodes)
    return VendorVersions(
        driver=sw.driver.version, driver_flavor=sw.driver.kernel_modules, cuda=sw.cuda, nccl=sw.nccl,
        ofed_kind=ofed_kind, ofed=ofed, doca=doca, fabric_manager=fabric_manager, nccl_tests=sw.nccl_tests,
        perftest_cuda=sw.perftest, dcgm=sw.dcgm or defaults.dcgm,
    )


def _bump(version: str) -> str:
    """A plausible next release: the last numeric field plus one (``2.21.5`` -> ``2.21.6``)."""
    head, _, last = version.rpartition(".")
    return f"{head}.{int(last) + 1:0{len(last)}d}" if last.isdigit() and head else version + ".1"


def drift_versions(pinned: VendorVersions) -> VendorVersions:
    """A newer driver and NCCL of the same branches, so that apt pinning in the roles is a real choice."""
    return replace(
        pinned,
        driver=DRIFT["driver"].get(pinned.driver, _bump(pinned.driver)),
        nccl=DRIFT["nccl"].get(pinned.nccl, _bump(pinned.nccl)),
        perftest_cuda=_bump(pinned.perftest_cuda),
    )
