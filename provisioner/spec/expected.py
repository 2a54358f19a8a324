"""What the spec's hardware should deliver to NCCL: the all-reduce bus bandwidth its links allow.

nccl-tests reports *bus bandwidth* so that one figure compares with the hardware whatever the rank count (nccl-tests
doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n for all-reduce, "the speed of the slowest link"). Across nodes every
byte of a ring all-reduce crosses each node's network once, so the ceiling is what a node's rails carry: the sum of
its rail rates / 8 (GB/s), the same bound as the NCCL-FLOOR-UNREACHABLE rule. Inside a node the ring's hops between
GPUs cap it too: NVLink per GPU (the catalog's figure, one direction) where the model has NVLink, else a PCIe x16
link of the model's generation. The expected figure is the lower of the two, for the slowest node of the run.

It is a line-rate ceiling, not a promise: healthy runs reach 92-96 % of it at the largest sizes (a DGX A100 with
8 x HDR measures 192 GB/s of 200, NVIDIA/nccl issue #1576; one NDR NIC 46-48 GB/s of 50, nccl-tests issues
#267/#290), while the failure buyers fear sits at 54-65 % with every link healthy (2 x 8 H100 over 8 x 400G:
perftest at line rate, all-reduce 216-231 GB/s of 400, NVIDIA/nccl issue #2409; ~65 % with PCIe ACS on, NVIDIA/nccl
issue #700). :data:`DEFAULT_FLOOR_FRACTION` sits between the two. A 2-node tree all-reduce, or in-network reduction
(SHARP), can read above 100 % (NVIDIA/nccl issue #1576): that is not a fault.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from provisioner.spec.catalog import GPU_MODELS
from provisioner.spec.cluster import Node
from provisioner.spec.models import NcclCheck

DEFAULT_FLOOR_FRACTION: float = NcclCheck.model_fields["min_fraction"].default
"""With no ``verify.nccl.min_busbw_gbps``, a run fails below this fraction of the expected figure (see above):
12 or more points under healthy runs, 15 or more over the slow-NCCL failure."""

PCIE_X16_GBPS = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}
"""One direction of a x16 link per PCIe generation (GB/s, after line encoding)."""


@dataclass(frozen=True)
class Expected:
    """The all-reduce bus bandwidth the links allow, and which link sets it."""

    busbw_gbps: float
    why: str
    """e.g. ``2 x 400 Gb/s rails per node`` or ``NVLink 450 GB/s per H100-SXM5-80GB``."""


def _rails(node: Node) -> Expected | None:
    rails = node.rail_ports
    if not rails:
        return None
    rates = sorted({p.rate_gbps for p in rails})
    text = (f"{len(rails)} x {rates[0]:g} Gb/s rails" if len(rates) == 1
            else f"{len(rails)} rails ({' + '.join(f'{p.rate_gbps:g}' for p in rails)} Gb/s)")
    return Expected(sum(p.rate_gbps for p in rails) / 8, f"{text} per node")


def intra_node(node: Node) -> Expected | None:
    """What the hops between a node's GPUs allow (None: one GPU, or a model the catalog does not know)."""
    model = GPU_MODELS.get(node.gpu_model or "")
    if model is None or node.gpu_count < 2:
        return None
    if model.nvlink_gbps:
        return Expected(float(model.nvlink_gbps), f"NVLink {model.nvlink_gbps:g} GB/s per {model.key}")
    pcie = PCIE_X16_GBPS.get(model.pcie_gen)
    return Expected(pcie, f"PCIe Gen{model.pcie_gen} x16 between {model.key} GPUs") if pcie else None


def inter_node(nodes: Sequence[Node]) -> Expected | None:
    """The expected bus bandwidth of an all-reduce over ``nodes`` (None when no node has a rail)."""
    bounds = [b for n in nodes for b in (_rails(n), intra_node(n)) if b is not None]
    if not any(n.rail_ports for n in nodes):
        return None
    return min(bounds, key=lambda b: b.busbw_gbps)


def floor(explicit: float | None, expected: Expected | None, fraction: float,
          explicit_from: str = "verify.nccl.min_busbw_gbps") -> tuple[float | None, str]:
    """The run's floor and where it comes from: the spec's figure (named ``explicit_from``) wins; else ``fraction``
    of the expected one."""
    if explicit is not None:
        return explicit, explicit_from
    if expected is None:
        return None, "no floor: nothing in the spec to derive one from"
    return round(expected.busbw_gbps * fraction, 1), f"{fraction:.0%} of the expected {expected.busbw_gbps:g} GB/s"
