"""Map the expanded spec onto the lab's simulated hardware: one LabNodeSpec per node, the switches and cables.

The lab rehearses exactly the cluster the operator wrote: same host names, GPUs, HCAs, rails, rates, cabling.
"""

from __future__ import annotations

from provisioner.lab.hardware import LabCable, LabHca, LabNodeSpec, LabSwitch
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
                   numa=p.numa if p.numa is not None else (0 if (p.gpu or 0) < max(1, n.gpu_count) // 2 else 1))
            for p in n.ports)
        out.append(LabNodeSpec(
            hostname=n.name, gpu_model=model.smi_name if model else "NVIDIA GPU",
            gpu_count=n.gpu_count, gpu_memory_mib=model.memory_mib if model else 0, nvswitch=n.nvswitch, hcas=hcas))
    return out


def lab_switches(cluster: Cluster) -> list[LabSwitch]:
    return [LabSwitch(name=s.name, ports=s.ports) for s in cluster.switches]


def lab_cables(cluster: Cluster) -> list[LabCable]:
    ports = {(n.name, p.device): p.port for n in cluster.nodes for p in n.ports}
    return [LabCable(node=c.node, device=c.device, port=ports.get((c.node, c.device), 1), switch=c.switch,
                     switch_port=c.switch_port) for c in cluster.cables]
