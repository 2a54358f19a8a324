"""Simulated hardware of a lab: node.json per node and fabric.json, from plain dataclasses.

The lead adapts the real spec models to :class:`LabNodeSpec`, :class:`LabSwitch` and
:class:`LabCable`; everything else here is derived *deterministically* from
(cluster, hostname, device, generation): GUIDs, GPU UUIDs and serials, PCI addresses,
netdev names, firmware.  So the same spec gives the same lab every time, and a
hardware-swap fault (generation + 1) gives every GUID of that node a new value, as a
real board swap does.  Ports start at ``init``/``linkup`` with LID 0: cabled and
trained, but no subnet manager has swept the fabric yet.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from provisioner.fabric import switchlinks
from provisioner.lab.simtools import labstate

MELLANOX_OUI = "a088c2"
GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
"""PCI buses of the 8 GPUs of an HGX H100 board, in nvidia-smi index order."""

SPEED_PREFERENCE = ("NDR", "HDR", "EDR", "FDR", "QDR", "DDR", "SDR", "XDR")

ADAPTERS: dict[str, dict[str, str]] = {
    # speed -> what a ConnectX of that generation reports in sysfs
    "XDR": {"ca_type": "MT4131", "fw_ver": "40.44.1036", "board_id": "MT_0000001070"},
    "NDR": {"ca_type": "MT4129", "fw_ver": "28.39.1002", "board_id": "MT_0000000838"},
    "HDR": {"ca_type": "MT4123", "fw_ver": "20.39.1002", "board_id": "MT_0000000223"},
    "EDR": {"ca_type": "MT4119", "fw_ver": "16.35.3006", "board_id": "MT_0000000008"},
}
DEFAULT_ADAPTER = ADAPTERS["EDR"]


@dataclass(frozen=True)
class LabHca:
    """One HCA port of a node as the spec describes it."""

    device: str
    port: int = 1
    rail: int = 0
    gpu: int | None = None
    rate_gbps: int = 400
    width: str = "4X"
    link_layer: str = "InfiniBand"
    numa: int = 0
    netdev: str | None = None  # the spec's netdev name; None: the name udev would give (ibp<bus>s0)


@dataclass(frozen=True)
class LabNodeSpec:
    """One node: its GPUs and HCA ports."""

    hostname: str
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    gpu_count: int = 8
    gpu_memory_mib: int = 81559
    nvswitch: bool = True
    hcas: tuple[LabHca, ...] = ()
    address: str | None = None
    """The spec's management address: the lab gives it to the node when it is free on the lab network."""


@dataclass(frozen=True)
class LabSwitch:
    """A fabric switch with ``ports`` ports (numbered from 1); ``tier``/``uplinks``/``uplink_rate_gbps`` as the
    spec gives them, from which the lab cables the links between tiers the spec plans."""

    name: str
    ports: int
    tier: str = "leaf"
    uplinks: int = 0
    uplink_rate_gbps: float = 400.0


@dataclass(frozen=True)
class LabCable:
    """A cable from a node's HCA port to a switch port."""

    node: str
    device: str
    port: int
    switch: str
    switch_port: int


@dataclass
class _GuidPool:
    """GUIDs already handed out in this lab, so a hash collision is salted away."""

    taken: set[str] = field(default_factory=set)

    def derive(self, *parts: object) -> str:
        salt = 0
        while True:
            guid = derive_guid(*parts, salt=salt)
            if guid not in self.taken:
                self.taken.add(guid)
                return guid
            salt += 1


# ---------------------------------------------------------------- pure derivations


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()


def derive_guid(*parts: object, salt: int = 0) -> str:
    """A ConnectX-looking GUID (Mellanox OUI, ``0300``, 24 hashed bits) from ``parts``."""
    tail = int.from_bytes(_digest(*parts, salt)[:3], "big")
    return f"0x{MELLANOX_OUI}0300{tail:06x}"


def speed_for(rate_gbps: float, width: str) -> str:
    """The IB speed name a port of this rate and width trains at (``400``, ``4X`` -> ``NDR``)."""
    lanes = labstate.WIDTH_LANES.get(width)
    if lanes is None:
        raise ValueError(f"unknown link width {width!r}")
    for name in SPEED_PREFERENCE:
        if labstate.LANE_GBPS[name] * lanes == rate_gbps:
            return name
    raise ValueError(f"no InfiniBand speed gives {rate_gbps} Gb/s at {width}")


def gpu_bus(index: int) -> int:
    """PCI bus of GPU ``index`` (HGX layout for the first 8)."""
    return GPU_BUSES[index] if index < len(GPU_BUSES) else 0x20 + 0x10 * index


def hca_bus(hca: LabHca, index: int) -> int:
    """HCAs paired with a GPU sit under the same PCIe switch, one bus before it."""
    return gpu_bus(hca.gpu) - 1 if hca.gpu is not None else 0x0C + index


def netdev_name(bus: int, link_layer: str) -> str:
    """The predictable name udev gives the port's netdev (``ibp23s0``, ``enp23s0np0``)."""
    return f"ibp{bus}s0" if link_layer == "InfiniBand" else f"enp{bus}s0np0"


def spec_hash(spec: LabNodeSpec) -> str:
    """Fingerprint of a node spec: lab_up regenerates a node only when it changes."""
    return hashlib.sha256(repr(asdict(spec)).encode()).hexdigest()[:16]


def gpu_records(cluster: str, spec: LabNodeSpec, generation: int) -> list[dict[str, Any]]:
    """node.json ``gpus`` for a spec."""
    gpus = []
    for index in range(spec.gpu_count):
        digest = _digest(cluster, spec.hostname, "gpu", index, generation)
        gpus.append(
            {
                "index": index,
                "name": spec.gpu_model,
                "pci_bus_id": f"00000000:{gpu_bus(index):02X}:00.0",
                "uuid": f"GPU-{uuid.UUID(bytes=digest[:16])}",
                "serial": f"1652{int.from_bytes(digest[16:24], 'big') % 10**9:09d}",
                "memory_mib": spec.gpu_memory_mib,
                "numa_node": 0 if index < max(1, spec.gpu_count // 2) else 1,
                "present": True,
            }
        )
    return gpus


def hca_record(cluster: str, host: str, hca: LabHca, index: int, generation: int,
               pool: _GuidPool) -> dict[str, Any]:
    """node.json entry of one HCA port, freshly cabled (no SM yet)."""
    speed = speed_for(hca.rate_gbps, hca.width)
    adapter = ADAPTERS.get(speed, DEFAULT_ADAPTER)
    node_guid = pool.derive(cluster, host, hca.device, generation)
    port_guid = node_guid if hca.port == 1 else pool.derive(cluster, host, hca.device, hca.port, generation)
    bus = hca_bus(hca, index)
    ethernet = hca.link_layer != "InfiniBand"
    return {
        "device": hca.device,
        "port": hca.port,
        "rail": hca.rail,
        "gpu": hca.gpu,
        "numa_node": hca.numa,
        "pci": f"0000:{bus:02x}:00.0",
        **adapter,
        "hw_rev": "0x0",
        "node_guid": node_guid,
        "sys_image_guid": node_guid,
        "port_guid": port_guid,
        "netdev": hca.netdev or netdev_name(bus, hca.link_layer),
        "link_layer": hca.link_layer,
        "rate_gbps": hca.rate_gbps,
        "width": hca.width,
        "speed": speed,
        # RoCE ports are ACTIVE as soon as the link is up; IB ports wait for the SM.
        "state": "active" if ethernet else "init",
        "phys_state": "linkup",
        "lid": 0,
        "sm_lid": 0,
        "bw_factor": 1.0,
        "flapping": False,
        "counters": dict.fromkeys(labstate.PORT_COUNTERS, 0),  # sysfs ports/N/counters: a clean port
    }


def nvlink_gbps(smi_name: str) -> float:
    """The catalog's NVLink figure (GB/s per GPU, one direction) of the GPU ``nvidia-smi`` names; 0 for none: the
    simulated all_reduce_perf reads it from node.json (it runs on the node, without the catalog)."""
    from provisioner.spec.catalog import GPU_MODELS

    return float(next((m.nvlink_gbps for m in GPU_MODELS.values() if m.smi_name == smi_name), 0))


def node_state(cluster: str, spec: LabNodeSpec, generation: int = 0,
               pool: _GuidPool | None = None) -> dict[str, Any]:
    """The whole node.json for a spec at a hardware generation."""
    pool = pool or _GuidPool()
    return {
        "hostname": spec.hostname,
        "cluster": cluster,
        "generation": generation,
        "spec_hash": spec_hash(spec),
        "reachable": True,
        "gpus": gpu_records(cluster, spec, generation),
        "nvswitch": spec.nvswitch,
        "nvlink_gbps": nvlink_gbps(spec.gpu_model),
        "hcas": [hca_record(cluster, spec.hostname, h, i, generation, pool) for i, h in enumerate(spec.hcas)],
        "faults": [],
    }


def regenerate_identity(node: dict[str, Any], generation: int, taken: set[str]) -> None:
    """Give ``node`` the GUIDs, UUIDs and serials of a new board (hardware swap), in place.

    Port state, rates and injected faults are kept: only identities change (and the port counters,
    which live on the board, start again from zero).
    """
    cluster, host = str(node["cluster"]), str(node["hostname"])
    pool = _GuidPool(set(taken))
    for hca in node["hcas"]:
        guid = pool.derive(cluster, host, hca["device"], generation)
        hca["node_guid"] = hca["sys_image_guid"] = guid
        port = int(hca["port"])
        hca["port_guid"] = guid if port == 1 else pool.derive(cluster, host, hca["device"], port, generation)
        hca["counters"] = dict.fromkeys(labstate.PORT_COUNTERS, 0)  # a new board starts counting from zero
    for gpu in node["gpus"]:
        digest = _digest(cluster, host, "gpu", gpu["index"], generation)
        gpu["uuid"] = f"GPU-{uuid.UUID(bytes=digest[:16])}"
        gpu["serial"] = f"1652{int.from_bytes(digest[16:24], 'big') % 10**9:09d}"
    node["generation"] = generation


def fabric_node_entry(node: dict[str, Any]) -> dict[str, Any]:
    """What fabric.json keeps of a node: its ports and identities."""
    keep = ("device", "port", "rail", "node_guid", "port_guid", "link_layer", "rate_gbps", "width", "speed")
    return {"generation": node.get("generation", 0), "hcas": [{k: h[k] for k in keep} for h in node["hcas"]]}


def fabric_state(
    cluster: str,
    nodes: list[dict[str, Any]],
    switches: Sequence[LabSwitch] = (),
    cables: Sequence[LabCable] = (),
    previous: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """fabric.json: all nodes' ports and GUIDs, switches, cabling.

    The shape is the one documented in docs/lab-hardware-model.md and read by the
    simulated SM and MAD tools (``fabsim_sm``): ``cables`` is always a list; an empty
    list means the spec declared no cabling, so every linked-up port counts as cabled.
    Keys other parts of the lab own (``sm``, ``link_model``) are carried over from
    ``previous`` so rewriting the fabric never wipes the SM's configuration; so are a switch's
    fault state and counters (``down``, ``counters``). When a switch has ``uplinks``, the links
    between tiers are cabled as the spec plans them (``switchlinks.plan_links``), replacing
    any ``switch_links`` from before; otherwise those are carried over.
    """
    pool = _GuidPool({h["port_guid"] for n in nodes for h in n["hcas"]})
    fabric: dict[str, Any] = {
        "cluster": cluster,
        "subnet_prefix": "0xfe80000000000000",
        "nodes": {n["hostname"]: fabric_node_entry(n) for n in nodes},
        "switches": [
            {"name": sw.name, "ports": sw.ports, "guid": pool.derive(cluster, "switch", sw.name),
             "description": sw.name}
            for sw in switches
        ],
        "cables": [asdict(c) for c in cables],
        "sm": {},
        "link_model": {},
    }
    for key, value in (previous or {}).items():
        if key not in ("cluster", "subnet_prefix", "nodes", "switches", "cables"):
            fabric[key] = value
    before = {str(s.get("name")): s for s in (previous or {}).get("switches", [])}
    for sw in fabric["switches"]:
        sw.update({k: v for k, v in before.get(sw["name"], {}).items() if k in ("down", "counters")})
    if any(sw.uplinks for sw in switches):
        fabric["switch_links"] = [
            {"switch": p.switch, "port": p.port, "peer": p.peer, "peer_port": p.peer_port, "width": p.width,
             "speed": p.speed or "NDR"} for p in switchlinks.plan_links(switches)]
    return fabric


def validate_cabling(nodes: list[LabNodeSpec], switches: Sequence[LabSwitch],
                     cables: Sequence[LabCable]) -> list[str]:
    """Problems with the cabling (unknown ends, a switch port used twice); [] when fine."""
    problems: list[str] = []
    ports = {(n.hostname, h.device, h.port) for n in nodes for h in n.hcas}
    sizes = {s.name: s.ports for s in switches}
    used: set[tuple[str, int]] = set()
    for cable in cables:
        if (cable.node, cable.device, cable.port) not in ports:
            problems.append(f"cable from unknown HCA port {cable.node}/{cable.device}/{cable.port}")
        if cable.switch not in sizes:
            problems.append(f"cable to unknown switch {cable.switch}")
        elif not 1 <= cable.switch_port <= sizes[cable.switch]:
            problems.append(f"{cable.switch} has no port {cable.switch_port}")
        if (cable.switch, cable.switch_port) in used:
            problems.append(f"{cable.switch} port {cable.switch_port} is cabled twice")
        used.add((cable.switch, cable.switch_port))
    return problems


def write_lab_state(root: str, cluster: str, specs: list[LabNodeSpec],
                    switches: Sequence[LabSwitch] = (),
                    cables: Sequence[LabCable] = ()) -> list[str]:
    """Write node.json (+ sysfs), modules.json and fabric.json; return the hosts (re)generated.

    A node whose node.json already matches its spec is left as it is, faults included,
    so calling this again is a no-op.
    """
    existing: dict[str, dict[str, Any]] = {}
    for spec in specs:
        try:
            existing[spec.hostname] = labstate.load_node(root, spec.hostname)
        except FileNotFoundError:
            continue
    kept = {h: n for h, n in existing.items() if n.get("spec_hash") == spec_hash(_by_host(specs, h))}
    pool = _GuidPool({g for n in kept.values() for h in n["hcas"] for g in (h["node_guid"], h["port_guid"])})
    nodes: list[dict[str, Any]] = []
    changed: list[str] = []
    for spec in specs:
        if spec.hostname in kept:
            nodes.append(kept[spec.hostname])
            continue
        current = existing.get(spec.hostname)
        generation = int(current.get("generation", 0)) if current else 0
        node = node_state(cluster, spec, generation, pool)
        labstate.save_node(root, node)
        if not labstate.load_modules(root, spec.hostname):
            labstate.save_modules(root, spec.hostname, list(labstate.DEFAULT_MODULES))
        nodes.append(node)
        changed.append(spec.hostname)
    try:
        previous: dict[str, Any] | None = labstate.load_fabric(root)
    except FileNotFoundError:
        previous = None
    fabric = fabric_state(cluster, nodes, switches, cables, previous)
    if fabric != previous:
        labstate.save_fabric(root, fabric)
    return changed


def _by_host(specs: list[LabNodeSpec], host: str) -> LabNodeSpec:
    return next(s for s in specs if s.hostname == host)
