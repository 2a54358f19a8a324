"""The expanded cluster: every node, port, switch and cable spelled out, derived once from the Spec.

Downstream code (rendering, the lab, verification) reads this, never the raw hostlist expressions.
Each entity keeps `path`, the place in the YAML it came from, so rules can point at the right line.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import NamedTuple

from provisioner.safetext import escaped
from provisioner.spec.models import Spec
from provisioner.spec.yamlload import Path


@dataclass(frozen=True)
class Port:
    device: str
    port: int
    rate_gbps: float
    width: str
    link_layer: str
    rail: int | None
    gpu: int | None
    numa: int | None
    netdev: str | None
    pci: str | None
    purpose: str
    path: Path = ()


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    profile: str
    roles: tuple[str, ...]
    ports: tuple[Port, ...]
    gpu_model: str | None
    gpu_count: int
    nvswitch: bool
    guids: dict[str, str]
    path: Path = ()

    @functools.cached_property
    def rail_ports(self) -> tuple[Port, ...]:
        return tuple(p for p in self.ports if p.purpose == "rail")

    @functools.cached_property
    def rail_set(self) -> frozenset[int]:
        """The rails its rail ports are on."""
        return frozenset(p.rail for p in self.rail_ports if p.rail is not None)

    @property
    def gpu_compute(self) -> bool:
        """A compute node with GPUs: the nodes pairwise checks (bandwidth, NCCL, GPUDirect) run between."""
        return bool(self.gpu_count) and "compute" in self.roles


@dataclass(frozen=True)
class SwitchX:
    name: str
    address: str | None
    tier: str
    ports: int
    uplinks: int
    uplink_rate_gbps: float
    device_type: str | None
    embedded_sm: bool
    path: Path = ()


class CableX(NamedTuple):
    """One node port's cable (a NamedTuple: a 16,384-node spec has 131,072 of them, and a frozen dataclass costs
    several times as much to build)."""

    node: str
    device: str
    switch: str
    switch_port: int
    path: Path = ()


@dataclass(frozen=True)
class IpoibIf:
    """One planned IPoIB interface of one node: a port's netdev (parent) or a P_Key child of it."""

    node: str
    network: str
    netdev: str
    device: str
    port: int
    address: str
    prefix: int
    subnet: str
    mode: str
    mtu: int
    parent: str | None = None       # children: the parent netdev
    pkey: int | None = None         # children: the P_Key with the full-member bit (0x8001)
    partition: str | None = None    # children: the partition's name
    path: Path = ()

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefix}"


@dataclass
class Cluster:
    """The spec expanded. Built by `provisioner.spec.load.load_spec`; never from node observations."""

    spec: Spec
    file: str
    nodes: list[Node] = field(default_factory=list)
    switches: list[SwitchX] = field(default_factory=list)
    cables: list[CableX] = field(default_factory=list)
    fabric_rate_gbps: float = 0.0
    ipoib: list[IpoibIf] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.cluster.name

    @property
    def source(self) -> str:
        """The spec file's name as the comments of generated files show it: a file name may hold a newline, which
        would end the comment and make the rest of the name a line of YAML or configuration."""
        return escaped(os.path.basename(self.file))

    def control_path(self, p: str) -> str:
        """A control-node path given in the spec (a key, known_hosts), resolved relative to the spec file."""
        expanded = os.path.expanduser(p)
        if os.path.isabs(expanded):
            return expanded
        return str(FsPath(self.file).resolve().parent / expanded)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def nodes_with_role(self, role: str) -> list[Node]:
        return [n for n in self.nodes if role in n.roles]

    def gpu_compute_nodes(self) -> list[Node]:
        """The GPU compute nodes (:attr:`Node.gpu_compute`), in spec order."""
        return [n for n in self.nodes if n.gpu_compute]

    def sm_nodes(self) -> list[str]:
        """The nodes the fabric phase configures an SM on (none when the SM runs on a switch or UFM)."""
        sm = self.spec.fabric.subnet_manager
        if sm is None or sm.kind != "opensm":
            return []
        return [n.name for n in self.nodes_with_role("subnet_manager")]

    def subset(self, names: Collection[str]) -> Cluster:
        """The cluster narrowed to ``names`` (their nodes and cables): every check then runs on those only."""
        keep = set(names)
        return dataclasses.replace(self, nodes=[n for n in self.nodes if n.name in keep],
                                   cables=[c for c in self.cables if c.node in keep],
                                   ipoib=[i for i in self.ipoib if i.node in keep])

    def ipoib_of(self, node: str) -> list[IpoibIf]:
        return [i for i in self.ipoib if i.node == node]

    def rails(self) -> list[int]:
        return sorted({p.rail for n in self.nodes for p in n.rail_ports if p.rail is not None})
