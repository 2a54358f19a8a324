"""Design rules: what the field knows about GPU/InfiniBand clusters, checked before any node is touched.

Each rule has an ID, a severity and one sentence of why; docs/rules.md's rule list is generated from RULES.
Rules read the expanded Cluster and point at the YAML line the problem comes from.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from provisioner.spec import hostlist
from provisioner.spec.catalog import GPU_MODELS, STACK_GAPS
from provisioner.spec.cluster import Cluster, Node
from provisioner.spec.diagnostics import Severity
from provisioner.spec.yamlload import Path


class Reporter(Protocol):
    def add(self, path: Path, rule: str, message: str, hint: str = "", *,
            severity: Severity = "error", key: bool = False) -> None: ...


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    why: str
    check: Callable[[Cluster, Reporter, Rule], None]

    def report(self, rep: Reporter, path: Path, message: str, hint: str = "") -> None:
        rep.add(path, self.id, message, hint, severity=self.severity)


RULES: list[Rule] = []


def rule(rule_id: str, severity: Severity, why: str) -> Callable[[Callable[[Cluster, Reporter, Rule], None]],
                                                                    Callable[[Cluster, Reporter, Rule], None]]:
    def deco(fn: Callable[[Cluster, Reporter, Rule], None]) -> Callable[[Cluster, Reporter, Rule], None]:
        RULES.append(Rule(rule_id, severity, why, fn))
        return fn
    return deco


def run_rules(cluster: Cluster, rep: Reporter) -> None:
    for r in RULES:
        r.check(cluster, rep, r)


def members(expr: str, cluster: Cluster, *, ordered: bool = False) -> list[str]:
    """Nodes named by a role name or a hostlist expression (unknown names are kept for the caller to report);
    ``ordered`` when they pair item by item with another list (see :func:`hostlist.expand`)."""
    roles = {role for n in cluster.nodes for role in n.roles} | {
        "compute", "login", "subnet_manager", "nfs_server", "storage", "management"}
    if expr in roles:
        return [n.name for n in cluster.nodes if expr in n.roles]
    if expr == "all":
        return [n.name for n in cluster.nodes]
    return hostlist.expand(expr, ordered=ordered)


# --- node design -----------------------------------------------------------------------------------------------
@rule("RAIL-PER-GPU", "warning",
      "Multi-node training is bound by the per-GPU share of network bandwidth: an 8-GPU node wants one rail "
      "HCA per GPU (2x400G for 8xH100 leaves 100 Gb/s per GPU instead of 400).")
def _rail_per_gpu(c: Cluster, rep: Reporter, r: Rule) -> None:
    for pname, prof in c.spec.profiles.items():
        if not prof.gpu or prof.gpu.count < 4:
            continue
        used = any(n.profile == pname and "compute" in n.roles for n in c.nodes)
        node = next((n for n in c.nodes if n.profile == pname), None)
        if not used or node is None:
            continue
        rails = list(node.rail_ports)
        if 0 < len(rails) < prof.gpu.count:
            per_gpu = sum(p.rate_gbps for p in rails) / prof.gpu.count
            r.report(rep, ("profiles", pname, "hcas"),
                     f"profile '{pname}': {len(rails)} rail HCAs for {prof.gpu.count} GPUs leaves "
                     f"{per_gpu:g} Gb/s per GPU", "one rail HCA per GPU is the norm for training nodes")
        elif not rails and prof.gpu.count >= 8 and len({n.name for n in c.nodes}) > 1:
            r.report(rep, ("profiles", pname), f"profile '{pname}': {prof.gpu.count} GPUs and no rail HCA",
                     "inter-node traffic goes over the management network")


@rule("GPU-PCIE-NVSWITCH", "error",
      "Only SXM boards (HGX/DGX) have NVSwitch; a PCIe GPU model in an NVSwitch profile means the profile or "
      "the model is wrong, and fabric manager would be installed for nothing and fail to start.")
def _pcie_nvswitch(c: Cluster, rep: Reporter, r: Rule) -> None:
    for pname, prof in c.spec.profiles.items():
        if prof.gpu and prof.gpu.nvswitch:
            model = GPU_MODELS.get(prof.gpu.model)
            if model and model.form == "pcie":
                r.report(rep, ("profiles", pname, "gpu", "nvswitch"),
                         f"{prof.gpu.model} is a PCIe card but profile '{pname}' claims NVSwitch",
                         "set nvswitch: false or use the SXM model")


@rule("GPU-STACK-MISSING", "error",
      "A GPU model the catalog knows whose NVSwitch board needs software no role installs yet would converge "
      "without it and fail at the first NCCL run; the spec is refused, naming what is missing.")
def _stack_missing(c: Cluster, rep: Reporter, r: Rule) -> None:
    for pname, prof in c.spec.profiles.items():
        gap = STACK_GAPS.get(prof.gpu.model) if prof.gpu and prof.gpu.nvswitch else None
        if prof.gpu and gap:
            r.report(rep, ("profiles", pname, "gpu", "model"),
                     f"{prof.gpu.model} with NVSwitch (profile '{pname}') needs {gap}: no role installs it yet",
                     "install and start it yourself before `provision` (and say so here), or wait for a release "
                     "whose roles do; docs/spec-reference.md lists the catalog")


@rule("RAIL-MIXED-RATE", "warning",
      "A rail runs at the speed of its slowest port; mixed rates in one rail waste the faster HCAs and make "
      "per-rail bandwidth checks ambiguous.")
def _mixed_rate(c: Cluster, rep: Reporter, r: Rule) -> None:
    rates: dict[int, dict[float, str]] = defaultdict(dict)
    first: dict[str, Node] = {}
    for n in c.nodes:
        first.setdefault(n.profile, n)
    for n in first.values():  # a profile's first node stands for all of its nodes: they share its ports
        for p in n.rail_ports:
            if p.rail is not None:
                rates[p.rail].setdefault(p.rate_gbps, n.profile)
    for rail, by_rate in sorted(rates.items()):
        if len(by_rate) > 1:
            desc = ", ".join(f"{rate:g} Gb/s ({prof})" for rate, prof in sorted(by_rate.items()))
            prof = sorted(by_rate.items())[0][1]
            r.report(rep, ("profiles", prof, "hcas"), f"rail {rail} mixes rates: {desc}",
                     "use the same HCA rate on every node of a rail")


@rule("HCA-FABRIC-RATE", "warning",
      "An HCA faster than the fabric trains down to the switch's rate; a slower one caps its rail.")
def _hca_fabric_rate(c: Cluster, rep: Reporter, r: Rule) -> None:
    for pname, prof in c.spec.profiles.items():
        for hi, hca in enumerate(prof.hcas):
            if hca.rate is None or hca.purpose != "rail":
                continue
            from provisioner.spec.load import rate_gbps

            if rate_gbps(hca.rate) != c.fabric_rate_gbps:
                r.report(rep, ("profiles", pname, "hcas", hi, "rate"),
                         f"{hca.device} expects {rate_gbps(hca.rate):g} Gb/s on a "
                         f"{c.fabric_rate_gbps:g} Gb/s fabric",
                         "match the HCA rate to fabric.rate or say why in a comment and accept the warning")


def _nccl_floor_inputs(c: Cluster) -> tuple[float, list[Node], float] | None:
    """The spec's NCCL floor, the GPU compute nodes and what the slowest one's rails carry (GB/s); None when there
    is no floor or fewer than two such nodes (no multi-node all-reduce to judge)."""
    floor = c.spec.verify.nccl.min_busbw_gbps
    compute = [n for n in c.nodes if "compute" in n.roles and n.gpu_count]
    if floor is None or len(compute) < 2:
        return None
    return floor, compute, min(sum(p.rate_gbps for p in n.rail_ports) / 8 for n in compute)


@rule("NCCL-FLOOR-UNREACHABLE", "error",
      "Across nodes, ring all-reduce bus bandwidth cannot exceed what a node's rails carry (sum of rail rates "
      "/ 8 in GB/s); a floor above it can never pass and hides the real target.")
def _nccl_floor(c: Cluster, rep: Reporter, r: Rule) -> None:
    inputs = _nccl_floor_inputs(c)
    if inputs is None:
        return
    floor, _, cap = inputs
    if floor > cap:
        r.report(rep, ("verify", "nccl", "min_busbw_gbps"),
                 f"NCCL floor {floor:g} GB/s is above what the rails carry ({cap:g} GB/s per node)",
                 f"set min_busbw_gbps at or below {cap * 0.92:.0f} (about 92 % of the rails)")


@rule("NCCL-FLOOR-ABOVE-EXPECTED", "warning",
      "A floor above the all-reduce bus bandwidth the rails and GPU links allow together (NVLink, or PCIe between "
      "GPUs without it: docs/verification.md) fails healthy runs unless something in the fabric reduces in-network "
      "(SHARP); below what the rails carry alone, so not impossible, but likely a wrong target.")
def _nccl_floor_expected(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec.expected import inter_node

    inputs = _nccl_floor_inputs(c)
    if inputs is None:
        return
    floor, compute, cap = inputs
    want = inter_node(compute)
    if want is None or floor <= want.busbw_gbps or floor > cap:
        return  # above the rails: NCCL-FLOOR-UNREACHABLE says so
    r.report(rep, ("verify", "nccl", "min_busbw_gbps"),
             f"NCCL floor {floor:g} GB/s is above the expected {want.busbw_gbps:g} GB/s ({want.why})",
             f"leave min_busbw_gbps out (the floor is then verify.nccl.min_fraction of the expected figure) or set "
             f"it at or below {want.busbw_gbps:g}")


@rule("NCCL-NODE-FLOOR-ABOVE-EXPECTED", "warning",
      "A single-node floor above what a node's GPU links allow (the NVLink figure of its GPU model, else PCIe x16: "
      "docs/verification.md) fails healthy nodes unless NVLink SHARP reduces in the switch; likely a wrong target.")
def _nccl_node_floor(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.fabric.nccl_node import node_nodes
    from provisioner.spec.expected import intra_node

    floor = c.spec.verify.nccl.min_single_node_busbw_gbps
    bounds = [(want, n) for n in node_nodes(c) if (want := intra_node(n)) is not None]
    if floor is None or not bounds:
        return
    want, node = min(bounds, key=lambda b: b[0].busbw_gbps)
    if floor > want.busbw_gbps:
        r.report(rep, ("verify", "nccl", "min_single_node_busbw_gbps"),
                 f"single-node NCCL floor {floor:g} GB/s is above the expected {want.busbw_gbps:g} GB/s of "
                 f"{node.name} ({want.why})",
                 f"leave min_single_node_busbw_gbps out (the floor is then verify.nccl.min_single_node_fraction of "
                 f"the expected figure) or set it at or below {want.busbw_gbps:g}")


# --- fabric design ---------------------------------------------------------------------------------------------
@rule("FAT-TREE-OVERSUB", "warning",
      "A leaf with more bandwidth down than up blocks when traffic crosses leaves; training all-reduce does, so "
      "anything above 1:1 shows up as slower steps at scale.")
def _oversub(c: Cluster, rep: Reporter, r: Rule) -> None:
    if c.spec.fabric.topology.kind not in ("fat_tree", "rail_optimized"):
        return
    down: dict[str, float] = defaultdict(float)
    profile_of = {n.name: n.profile for n in c.nodes}
    one_per_profile = {n.profile: n for n in c.nodes}.values()  # every node of a profile has its ports
    rate_of = {(n.profile, p.device): p.rate_gbps for n in one_per_profile for p in n.ports}
    for cab in c.cables:
        down[cab.switch] += rate_of.get((profile_of.get(cab.node, ""), cab.device), c.fabric_rate_gbps)
    for sw in c.switches:
        if sw.tier != "leaf" or sw.name not in down:
            continue
        up = sw.uplinks * sw.uplink_rate_gbps
        if up <= 0:
            if len(c.switches) > 1:
                r.report(rep, sw.path, f"leaf {sw.name} has nodes but no uplinks",
                         "set uplinks: on the leaf (ports going to spines)")
            continue
        ratio = down[sw.name] / up
        if ratio > 1.0 + 1e-9:
            r.report(rep, sw.path, f"leaf {sw.name} is oversubscribed {ratio:.2f}:1 "
                     f"({down[sw.name]:g} Gb/s down, {up:g} Gb/s up)",
                     "add uplinks or move nodes to another leaf for 1:1")


@rule("LEAF-PORTS-EXCEEDED", "error",
      "A leaf cannot take more node cables than it has ports left after its uplinks.")
def _leaf_ports(c: Cluster, rep: Reporter, r: Rule) -> None:
    count: dict[str, int] = defaultdict(int)
    for cab in c.cables:
        count[cab.switch] += 1
    for sw in c.switches:
        free = sw.ports - sw.uplinks
        if count[sw.name] > free:
            r.report(rep, sw.path, f"{sw.name}: {count[sw.name]} node ports cabled but only {free} free "
                     f"({sw.ports} ports, {sw.uplinks} uplinks)", "add a leaf or reduce uplinks")


@rule("TIER-PORTS-EXCEEDED", "error",
      "Every uplink of a tier lands on a down port of the tier above; more uplinks than those ports means some "
      "switch is planned with cables that have nowhere to go, and its nodes reach the rest of the fabric through "
      "fewer links than the design assumes.")
def _tier_ports(c: Cluster, rep: Reporter, r: Rule) -> None:
    order = ("leaf", "spine", "core")
    present = [t for t in order if any(sw.tier == t for sw in c.switches)]
    for lower, upper in itertools.pairwise(present):
        below = [sw for sw in c.switches if sw.tier == lower]
        above = [sw for sw in c.switches if sw.tier == upper]
        uplinks = sum(sw.uplinks for sw in below)
        down_ports = sum(max(sw.ports - sw.uplinks, 0) for sw in above)
        if uplinks > down_ports:
            r.report(rep, above[0].path, f"the {lower} switches have {uplinks} uplinks but the {upper} switches "
                     f"only {down_ports} ports for them ({len(above)} {upper}s, ports minus their own uplinks)",
                     f"add {upper} switches, reduce {lower} uplinks, or use fewer {upper} uplinks")


@rule("CABLE-UNCABLED-RAIL", "warning",
      "Without the wiring of every rail port the cabling check cannot tell a swapped cable from a good one.")
def _uncabled(c: Cluster, rep: Reporter, r: Rule) -> None:
    if not c.cables:
        return
    cabled = {(cab.node, cab.device) for cab in c.cables}
    missing = [f"{n.name}:{p.device}" for n in c.nodes for p in n.rail_ports if (n.name, p.device) not in cabled
               and p.link_layer == "infiniband"]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        r.report(rep, ("fabric", "topology", "cabling"), f"no cabling given for {shown}",
                 "list every rail port under fabric.topology.cabling")


# --- subnet manager --------------------------------------------------------------------------------------------
@rule("SM-MISSING", "error", "An InfiniBand fabric without a subnet manager never brings a port to Active.")
def _sm_missing(c: Cluster, rep: Reporter, r: Rule) -> None:
    if c.spec.fabric.type == "infiniband" and c.spec.fabric.subnet_manager is None:
        r.report(rep, ("fabric",), "no subnet_manager on an InfiniBand fabric",
                 "add fabric.subnet_manager with opensm nodes, the switch's SM or UFM")


@rule("SM-SINGLE", "warning",
      "With one subnet manager, its node's reboot freezes the fabric's routing; a standby takes over in seconds.")
def _sm_single(c: Cluster, rep: Reporter, r: Rule) -> None:
    sm = c.spec.fabric.subnet_manager
    if sm and sm.kind == "opensm" and len(sm.nodes) == 1:
        r.report(rep, ("fabric", "subnet_manager", "nodes"), "only one subnet manager: no failover",
                 "add a second SM node with a lower priority")
    elif sm and sm.kind == "switch":
        r.report(rep, ("fabric", "subnet_manager"), f"only the SM of switch {sm.switch}: no failover",
                 "enable the SM on a second switch or run standby opensm on a host")


@rule("SM-PRIORITY-TIE", "error",
      "Two SMs of equal priority elect by GUID, so which one is master is an accident of hardware, and a "
      "replaced HCA silently moves mastership.")
def _sm_tie(c: Cluster, rep: Reporter, r: Rule) -> None:
    sm = c.spec.fabric.subnet_manager
    if not sm:
        return
    seen: dict[int, str] = {}
    for i, s in enumerate(sm.nodes):
        if s.priority in seen:
            r.report(rep, ("fabric", "subnet_manager", "nodes", i, "priority"),
                     f"{s.node} and {seen[s.priority]} both have sm_priority {s.priority}",
                     "give the master the highest priority and each standby a distinct lower one")
        seen.setdefault(s.priority, s.node)


@rule("SM-NODE", "error", "A subnet manager must run on a defined node that has an InfiniBand port to bind to.")
def _sm_nodes(c: Cluster, rep: Reporter, r: Rule) -> None:
    sm = c.spec.fabric.subnet_manager
    if not sm:
        return
    names = {n.name: n for n in c.nodes}
    for i, s in enumerate(sm.nodes):
        node = names.get(s.node)
        if node is None:
            r.report(rep, ("fabric", "subnet_manager", "nodes", i, "node"), f"SM node '{s.node}' is not defined",
                     "name a node from nodes:")
            continue
        ib = [p for p in node.ports if p.link_layer == "infiniband"]
        if not ib:
            r.report(rep, ("fabric", "subnet_manager", "nodes", i, "node"), f"SM node {s.node} has no InfiniBand port",
                     "run the SM on a node with an HCA")
        elif s.device and s.device not in {p.device for p in ib}:
            r.report(rep, ("fabric", "subnet_manager", "nodes", i, "device"), f"{s.node} has no IB device {s.device}",
                     "use one of " + ", ".join(p.device for p in ib))
    if sm.kind == "opensm" and not sm.nodes and c.spec.fabric.type == "infiniband":
        r.report(rep, ("fabric", "subnet_manager"), "opensm chosen but no SM nodes listed",
                 "list nodes: [{node: NAME, priority: 15}]")
    if sm.kind == "switch":
        sw = {s.name: s for s in c.switches}
        if not sm.switch or sm.switch not in sw:
            r.report(rep, ("fabric", "subnet_manager"), f"switch SM on undefined switch '{sm.switch}'",
                     "name a switch from switches:")


@rule("SM-AR-UNSUPPORTED", "error",
      "Adaptive routing needs an SM with the ar_* routing engines (NVIDIA's opensm or UFM); the MLNX-OS "
      "switch-embedded SM and upstream opensm would silently route without it.")
def _sm_ar(c: Cluster, rep: Reporter, r: Rule) -> None:
    sm = c.spec.fabric.subnet_manager
    if not sm:
        return
    engines = sm.routing_engines or []
    wants_ar = sm.adaptive_routing or any(e.startswith("ar_") for e in engines)
    if not wants_ar:
        return
    if sm.kind == "switch":
        r.report(rep, ("fabric", "subnet_manager", "adaptive_routing"),
                 "adaptive routing asked of the switch-embedded SM, which cannot do it",
                 "run NVIDIA opensm on hosts (kind: opensm) or UFM")
    elif sm.kind == "opensm" and sm.build == "upstream":
        r.report(rep, ("fabric", "subnet_manager", "build"),
                 "adaptive routing asked of upstream opensm, which has no ar_* engines",
                 "use build: nvidia (opensm from DOCA-OFED/MLNX_OFED)")


@rule("SM-ROUTING-ENGINE", "error", "opensm refuses to start on a routing engine it does not know.")
def _sm_engines(c: Cluster, rep: Reporter, r: Rule) -> None:
    sm = c.spec.fabric.subnet_manager
    known = {"minhop", "updn", "dnup", "file", "ftree", "lash", "dor", "torus-2QoS", "nue", "dfsssp", "sssp",
             "chain", "pqft", "ar_updn", "ar_ftree", "ar_torus", "ar_dor", "ar_pqft"}
    if sm and sm.routing_engines:
        for i, e in enumerate(sm.routing_engines):
            if e not in known:
                r.report(rep, ("fabric", "subnet_manager", "routing_engines", i), f"unknown routing engine '{e}'",
                         "one of " + ", ".join(sorted(known)))


@rule("SM-EMBEDDED-CONFLICT", "error",
      "A switch-embedded SM left enabled beside host SMs fights them for mastership.")
def _sm_embedded(c: Cluster, rep: Reporter, r: Rule) -> None:
    sm = c.spec.fabric.subnet_manager
    if sm and sm.kind == "opensm" and sm.nodes:
        for sw in c.switches:
            if sw.embedded_sm:
                r.report(rep, sw.path, f"{sw.name} has its embedded SM enabled while host opensm runs",
                         "set embedded_sm: false (provision switches will disable it)")


# --- partitions ------------------------------------------------------------------------------------------------
@rule("PKEY", "error",
      "P_Keys identify partitions fabric-wide: 0x7fff/0xffff is the default partition, and two partitions "
      "with one P_Key merge tenants that were meant to be isolated.")
def _pkeys(c: Cluster, rep: Reporter, r: Rule) -> None:
    seen: dict[int, str] = {}
    names = {n.name for n in c.nodes}
    for i, part in enumerate(c.spec.fabric.partitions):
        base = part.pkey & 0x7FFF
        path: Path = ("fabric", "partitions", i)
        if base == 0x7FFF:
            r.report(rep, (*path, "pkey"), f"partition {part.name} uses the default P_Key 0x7fff",
                     "pick another P_Key, e.g. 0x8001; the default partition is set by default_partition")
        if base in seen:
            r.report(rep, (*path, "pkey"), f"partitions {seen[base]} and {part.name} share P_Key {base:#06x}",
                     "each partition needs its own P_Key")
        seen.setdefault(base, part.name)
        try:
            mem = members(part.members, c)
        except hostlist.HostlistError as exc:
            rep.add((*path, "members"), "SPEC-HOSTLIST", str(exc), "write e.g. gpu[01-04]")
            continue
        for m in mem:
            if m not in names:
                rep.add((*path, "members"), "SPEC-UNDEFINED-NODE", f"partition member '{m}' is not defined",
                        "list nodes from nodes:")
                break


# --- RoCE ------------------------------------------------------------------------------------------------------
@rule("ROCE-NO-PFC-ECN", "error",
      "RoCE on a lossy Ethernet drops packets under incast and RDMA collapses (go-back-N); it needs PFC on the "
      "RoCE priority and ECN (DCQCN) on the nodes and the switches.")
def _roce(c: Cluster, rep: Reporter, r: Rule) -> None:
    if c.spec.fabric.type != "roce":
        return
    roce = c.spec.fabric.roce
    if roce is None or roce.pfc_priority is None or not roce.ecn:
        r.report(rep, ("fabric", "roce") if roce else ("fabric", "type"), "RoCE fabric without PFC and ECN settings",
                 "set fabric.roce: {pfc_priority: 3, ecn: true}")


@rule("IB-LINK-LAYER", "error", "An InfiniBand fabric needs InfiniBand ports; an Ethernet-mode port never joins it.")
def _link_layer(c: Cluster, rep: Reporter, r: Rule) -> None:
    want = "infiniband" if c.spec.fabric.type == "infiniband" else "ethernet"
    for pname, prof in c.spec.profiles.items():
        for hi, hca in enumerate(prof.hcas):
            if hca.purpose == "rail" and hca.link_layer and hca.link_layer != want:
                r.report(rep, ("profiles", pname, "hcas", hi, "link_layer"),
                         f"{hca.device} is {hca.link_layer} on a {c.spec.fabric.type} fabric",
                         f"set link_layer: {want} (mlxconfig LINK_TYPE on VPI cards)")


# --- switches --------------------------------------------------------------------------------------------------
@rule("SWITCH-CREDENTIALS", "error",
      "A managed switch (device_type set) is configured over SSH; without a credentials source it cannot be.")
def _switch_creds(c: Cluster, rep: Reporter, r: Rule) -> None:
    for i, sw in enumerate(c.spec.switches):
        if sw.device_type and sw.credentials is None:
            r.report(rep, ("switches", i), f"switch {sw.name} has a device_type but no credentials",
                     "add credentials: {file: secrets/switches.yml} or {vault: ...}")
        if sw.device_type and not sw.address:
            r.report(rep, ("switches", i), f"managed switch {sw.name} has no address", "add address:")


# --- software --------------------------------------------------------------------------------------------------
@rule("FABRIC-MANAGER", "error",
      "NVSwitch systems do not run CUDA work until nvidia-fabricmanager of the driver's exact version runs.")
def _fabric_manager(c: Cluster, rep: Reporter, r: Rule) -> None:
    if c.spec.software.fabric_manager is False and any(n.nvswitch for n in c.nodes):
        r.report(rep, ("software", "fabric_manager"), "fabric_manager is off but NVSwitch nodes are defined",
                 "remove fabric_manager: false")


@rule("OFED-VERSION", "error",
      "A pinned stack needs the OFED version pinned too; `ofed_info -s` is checked against it.")
def _ofed(c: Cluster, rep: Reporter, r: Rule) -> None:
    o = c.spec.software.ofed
    if o.flavor != "inbox" and not o.version:
        r.report(rep, ("software", "ofed"), f"{o.flavor} without a version", "add version: (e.g. 2.9.1)")


@rule("REPO-OFFLINE", "error",
      "An air-gapped site must name a mirror for every vendor repository, or the run tries the internet.")
def _repos(c: Cluster, rep: Reporter, r: Rule) -> None:
    repos = c.spec.repositories
    if not repos.offline:
        return
    if repos.cuda is None:
        r.report(rep, ("repositories",), "offline but no cuda repository mirror",
                 "add repositories.cuda: {url: ..., key: ...} or set offline: false")
    if c.spec.software.ofed.flavor != "inbox" and repos.doca is None:
        r.report(rep, ("repositories",), "offline but no doca repository mirror for the OFED stack",
                 "add repositories.doca: {url: ..., key: ...}")


CONTAINER_PUBLIC_HOSTS = ("github.com", "codeload.github.com", "objects.githubusercontent.com", "nvidia.github.io")
"""Where enroot's .debs, pyxis's tarball and the toolkit's apt repository are published: an offline site names its
own mirror of them instead."""


@rule("CONTAINERS", "error",
      "pyxis is a Slurm SPANK plugin built against the Slurm it runs in, so containers need the slurm: section; an "
      "air-gapped site must fetch enroot, pyxis and the toolkit from its own mirror, never from GitHub.")
def _containers(c: Cluster, rep: Reporter, r: Rule) -> None:
    ct = c.spec.software.containers
    if ct is None:
        return
    if c.spec.slurm is None:
        r.report(rep, ("software", "containers"), "software.containers without slurm: pyxis is a Slurm plugin",
                 "add a slurm: section (controller, partitions) or leave software.containers out")
    if not c.spec.repositories.offline:
        return
    for field, url in (("enroot_mirror", ct.enroot_mirror), ("pyxis_source", ct.pyxis_source),
                       ("repository", ct.repository.url)):
        host = url.split("://", 1)[1].split("/", 1)[0].split(":", 1)[0]
        if host in CONTAINER_PUBLIC_HOSTS:
            path = ("software", "containers", field, *(("url",) if field == "repository" else ()))
            r.report(rep, path, f"offline but software.containers.{field} is the public {host}",
                     "name the site mirror that holds a copy, or set repositories.offline: false")


@rule("SECURE-BOOT-FILES", "error",
      "DKMS signs the kernel modules with secure_boot's key and preflight checks its certificate is enrolled: "
      "both files must exist on the control node, or the run stops at the first node.")
def _secure_boot_files(c: Cluster, rep: Reporter, r: Rule) -> None:
    sb = c.spec.secure_boot
    if sb is None:
        return
    for name in ("mok_key", "mok_cert"):
        given = getattr(sb, name)
        path = c.control_path(given)
        if not os.path.isfile(path):
            r.report(rep, ("secure_boot", name), f"secure_boot.{name} {given} is not a file on the control node "
                     f"({path})", "give the path of the MOK key and its DER certificate, relative to the spec")


@rule("REBOOT-BATCH", "error",
      "Rebooting every GPU node in one batch takes the whole cluster down at once; batches must leave nodes up.")
def _reboot_batch(c: Cluster, rep: Reporter, r: Rule) -> None:
    reboot = c.spec.reboot
    gpu_nodes = sum(1 for n in c.nodes if n.gpu_count)
    if not reboot.allowed or not isinstance(reboot.serial, int) or gpu_nodes < 2:
        return
    if reboot.serial >= gpu_nodes:
        r.report(rep, ("reboot", "serial"), f"serial {reboot.serial} reboots all {gpu_nodes} GPU nodes at once",
                 f"use a smaller batch (at most {gpu_nodes - 1}) or a share such as \"25%\"")


# --- storage ---------------------------------------------------------------------------------------------------
@rule("STORAGE-REFS", "error", "Mounts and exports must name servers and clients that exist in the spec.")
def _storage_refs(c: Cluster, rep: Reporter, r: Rule) -> None:
    names = {n.name for n in c.nodes}
    exports = {(e.server, e.path) for e in c.spec.storage.nfs.exports}
    for i, e in enumerate(c.spec.storage.nfs.exports):
        if e.server not in names:
            r.report(rep, ("storage", "nfs", "exports", i, "server"), f"NFS server '{e.server}' is not defined",
                     "name a node from nodes:")
    for i, m in enumerate(c.spec.storage.nfs.mounts):
        path: Path = ("storage", "nfs", "mounts", i)
        if m.server not in names:
            r.report(rep, (*path, "server"), f"NFS server '{m.server}' is not defined", "name a node from nodes:")
        elif (m.server, m.export) not in exports:
            r.report(rep, (*path, "export"), f"{m.server} does not export {m.export}",
                     "add it under storage.nfs.exports")
        try:
            for who in members(m.on, c):
                if who not in names:
                    r.report(rep, (*path, "on"), f"client '{who}' is not defined", "a role name or a hostlist")
                    break
        except hostlist.HostlistError as exc:
            rep.add((*path, "on"), "SPEC-HOSTLIST", str(exc), "a role name or a hostlist")


@rule("NFS-SERVER-EXPORTS", "warning",
      "The nfs_server role serves the spec's exports: a node with the role and no export gets no NFS server, and its "
      "packages then differ from the peers of its profile and roles that do serve one (drift on every run).")
def _nfs_server_exports(c: Cluster, rep: Reporter, r: Rule) -> None:
    serving = {e.server for e in c.spec.storage.nfs.exports}
    idle = [n for n in c.nodes if "nfs_server" in n.roles and n.name not in serving]
    by_entry: dict[Path, list[str]] = {}
    for n in idle:
        by_entry.setdefault(n.path, []).append(n.name)
    for path, names in by_entry.items():  # one diagnostic per nodes: entry, its idle servers folded
        r.report(rep, (*path, "roles"), f"{hostlist.compress(names)} has the nfs_server role but serves no export",
                 "drop the role there, or give it exports under storage.nfs.exports")


@rule("NFS-RDMA-FABRIC", "warning", "NFS over RDMA needs an RDMA port on the clients and the server.")
def _nfs_rdma(c: Cluster, rep: Reporter, r: Rule) -> None:
    by_name = {n.name: n for n in c.nodes}
    for i, m in enumerate(c.spec.storage.nfs.mounts):
        if m.transport == "rdma":
            srv = by_name.get(m.server)
            if srv is not None and not srv.ports:
                r.report(rep, ("storage", "nfs", "mounts", i, "transport"),
                         f"NFS over RDMA from {m.server}, which has no RDMA port", "use transport: tcp")


@rule("LUSTRE-VERSION", "error", "Lustre client modules are built per kernel and OFED; the version must be pinned.")
def _lustre(c: Cluster, rep: Reporter, r: Rule) -> None:
    if c.spec.storage.lustre and not c.spec.software.lustre_client:
        r.report(rep, ("storage", "lustre"), "Lustre mounts without software.lustre_client",
                 "pin software.lustre_client (e.g. \"2.15.5\")")


# --- version compatibility (facts and sources in provisioner/spec/compat.py) -----------------------------------
@rule("COMPAT-CUDA-DRIVER", "error",
      "A CUDA toolkit needs a minimum driver (release notes table); below the major's floor nothing runs, above "
      "it but below the toolkit's own minimum only minor-version compatibility applies (a warning).")
def _cuda_driver(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import compat

    sw = c.spec.software
    need = compat.min_driver_for(sw.cuda)
    have = compat.version_tuple(sw.driver.version)
    key = compat.cuda_key(sw.cuda)
    if need is None or key is None:
        return
    if have >= compat.version_tuple(need):
        return
    floor = compat.CUDA_MAJOR_FLOOR.get(key[0])
    if floor and have >= compat.version_tuple(floor):
        rep.add(("software", "driver", "version"), r.id,
                f"driver {sw.driver.version} is older than CUDA {sw.cuda} needs ({need}); it runs only under "
                "minor-version compatibility (no PTX JIT of newer code)",
                f"pin driver >= {need}", severity="warning")
    else:
        r.report(rep, ("software", "driver", "version"),
                 f"driver {sw.driver.version} cannot run CUDA {sw.cuda} (needs >= {need})", f"pin driver >= {need}")


@rule("COMPAT-OS-CUDA", "error",
      "NVIDIA's apt repository for an OS starts at a given CUDA release; an older toolkit has no package there.")
def _os_cuda(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import compat

    first = compat.OS_FIRST_CUDA.get(c.spec.cluster.os)
    key = compat.cuda_key(c.spec.software.cuda)
    if first and key and key[:2] < first:
        r.report(rep, ("software", "cuda"), f"CUDA {c.spec.software.cuda} is not packaged for {c.spec.cluster.os} "
                 f"(its repository starts at {first[0]}.{first[1]})", f"pin CUDA >= {first[0]}.{first[1]}")


@rule("COMPAT-GPU-DRIVER", "error",
      "New GPU generations need a minimum driver branch, and Blackwell runs only on the open kernel modules.")
def _gpu_driver(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import compat

    drv = c.spec.software.driver
    branch = compat.version_tuple(drv.version)[:1]
    for pname, prof in c.spec.profiles.items():
        if not prof.gpu:
            continue
        need = compat.GPU_MIN_BRANCH.get(prof.gpu.model)
        if need and branch and branch[0] < need:
            r.report(rep, ("software", "driver", "version"),
                     f"{prof.gpu.model} (profile '{pname}') needs driver branch {need} or newer, not {branch[0]}",
                     f"pin a driver from branch >= {need}")
        if prof.gpu.model in compat.OPEN_MODULES_REQUIRED and drv.kernel_modules != "open":
            r.report(rep, ("software", "driver", "kernel_modules"),
                     f"{prof.gpu.model} (profile '{pname}') is supported only by the open kernel modules",
                     "set kernel_modules: open")
        model = GPU_MODELS.get(prof.gpu.model)
        if model and model.arch in compat.OPEN_MODULES_UNSUPPORTED_ARCHS and drv.kernel_modules == "open":
            r.report(rep, ("software", "driver", "kernel_modules"),
                     f"{prof.gpu.model} (profile '{pname}') is {model.arch.capitalize()}: the open kernel modules "
                     "support Turing and newer only", "set kernel_modules: proprietary")


@rule("GPUDIRECT-DMABUF", "error",
      "GPUDirect RDMA through DMA-BUF (gpudirect.mode: dmabuf) needs the open kernel modules (R515+, Turing or "
      "newer GPUs), CUDA 11.7+ and NCCL 2.13+; without them nvidia_peermem, which dmabuf mode does not load, was "
      "the only path and NCCL silently stages through host memory.")
def _gpudirect_dmabuf(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import compat

    if c.spec.gpudirect.mode != "dmabuf" or not any(n.gpu_count for n in c.nodes):
        return
    sw = c.spec.software
    where = ("gpudirect", "mode")
    if sw.driver.kernel_modules != "open":
        r.report(rep, where, "DMA-BUF needs the open kernel modules, but software.driver.kernel_modules is "
                 f"{sw.driver.kernel_modules}", "set software.driver.kernel_modules: open, or gpudirect.mode: peermem")
    branch = compat.version_tuple(sw.driver.version)[:1]
    if branch and branch[0] < compat.DMABUF_MIN_DRIVER_BRANCH:
        r.report(rep, where, f"DMA-BUF needs driver branch {compat.DMABUF_MIN_DRIVER_BRANCH} or newer, not "
                 f"driver branch {branch[0]}", f"pin a driver from branch >= {compat.DMABUF_MIN_DRIVER_BRANCH}")
    cuda = compat.version_tuple(sw.cuda)[:2]
    if cuda and cuda < compat.DMABUF_MIN_CUDA:
        need = ".".join(map(str, compat.DMABUF_MIN_CUDA))
        r.report(rep, where, f"DMA-BUF needs CUDA {need} or newer, not CUDA {sw.cuda}", f"pin CUDA >= {need}")
    nccl = compat.version_tuple(sw.nccl)[:2]
    if nccl and nccl < compat.DMABUF_MIN_NCCL:
        need = ".".join(map(str, compat.DMABUF_MIN_NCCL))
        r.report(rep, where, f"NCCL {sw.nccl} has no DMA-BUF support (NCCL_DMABUF_ENABLE came in {need}): "
                 "without nvidia_peermem it has no GPUDirect RDMA at all", f"pin NCCL >= {need}")
    for pname, prof in c.spec.profiles.items():
        model = GPU_MODELS.get(prof.gpu.model) if prof.gpu else None
        if model and model.arch in compat.OPEN_MODULES_UNSUPPORTED_ARCHS:
            r.report(rep, where, f"{model.key} (profile '{pname}') is {model.arch.capitalize()}: the open kernel "
                     "modules, which DMA-BUF needs, support Turing and newer only", "set gpudirect.mode: peermem")


@rule("COMPAT-NCCL-CUDA", "error",
      "NCCL is built per CUDA major (libnccl2 ...+cudaX.Y); a release with no build for the pinned CUDA major "
      "cannot be installed beside that toolkit.")
def _nccl_cuda(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import compat

    sw = c.spec.software
    builds = compat.nccl_cuda_mismatch(sw.nccl, sw.cuda)
    if builds:
        r.report(rep, ("software", "nccl"), f"NCCL {sw.nccl} has builds for CUDA {', '.join(builds)} only, none "
                 f"for CUDA {sw.cuda}", "pin an NCCL release built for this CUDA major")


@rule("COMPAT-DOCA-UNKNOWN", "warning",
      "The doca_ofed role proves the install by comparing `ofed_info -s` with the OFED release the DOCA version "
      "ships; for a DOCA release outside its table it cannot, and stops at converge time instead of now.")
def _doca_unknown(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import compat

    ofed = c.spec.software.ofed
    if ofed.flavor != "doca" or ofed.version is None or ofed.version in compat.DOCA_OFED:
        return
    if "doca_ofed_ofed_version" in c.spec.site_vars:
        return
    known = ", ".join(sorted(compat.DOCA_OFED, key=compat.version_tuple))
    r.report(rep, ("software", "ofed", "version"), f"DOCA {ofed.version} is not in the DOCA -> OFED table "
             f"(known: {known})", "set site_vars.doca_ofed_ofed_version to the version `ofed_info -s` prints for it, "
             "or pin a listed DOCA release")


@rule("COMPAT-OS-OFED", "error",
      "DOCA-OFED and MLNX_OFED ship kernel modules for the OSes their release notes list; a release older than "
      "the first one of its line that supports the cluster's OS has no packages for it.")
def _os_ofed(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import compat

    ofed = c.spec.software.ofed
    if ofed.flavor == "inbox" or ofed.version is None:
        return
    first = compat.ofed_os_unsupported(ofed.flavor, ofed.version, c.spec.cluster.os)
    if first:
        name = "DOCA" if ofed.flavor == "doca" else "MLNX_OFED"
        r.report(rep, ("software", "ofed", "version"), f"{name} {ofed.version} does not support "
                 f"{c.spec.cluster.os} (its release line supports it from {first})", f"pin {name} >= {first}")


@rule("COMPAT-LUSTRE-OS", "error",
      "The Lustre client's kernel modules (o2iblnd) are built against the running kernel and RDMA stack; a "
      "client release known not to build against the pinned OFED release never mounts.")
def _lustre_os(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import compat

    sw = c.spec.software
    if not sw.lustre_client or sw.ofed.flavor == "inbox" or sw.ofed.version is None:
        return
    reason = compat.lustre_ofed_conflict(sw.lustre_client, sw.ofed.flavor, sw.ofed.version)
    if reason:
        name = "DOCA" if sw.ofed.flavor == "doca" else "MLNX_OFED"
        r.report(rep, ("software", "lustre_client"), f"Lustre client {sw.lustre_client} does not build against "
                 f"{name} {sw.ofed.version}: {reason}",
                 "pin a Lustre client release that builds against this OFED, or another OFED release")


# --- IP over InfiniBand (expansion and facts in provisioner/spec/ipoib.py) ---------------------------------------
def _ipoib_members(c: Cluster, rep: Reporter, ni: int) -> list[str] | None:
    from provisioner.spec import ipoib

    net = c.spec.fabric.ipoib[ni]
    try:
        return ipoib.network_members(net, c)
    except hostlist.HostlistError as exc:
        rep.add(("fabric", "ipoib", ni, "nodes"), "SPEC-HOSTLIST", str(exc), "a role name or a hostlist")
        return None


@rule("IPOIB-PORT", "error",
      "IPoIB runs on an InfiniBand port's netdev: a network must name a port every member has, in InfiniBand mode, "
      "with its netdev named in the profile (the role, LNet and verify need the name), and a port carries one "
      "network.")
def _ipoib_port(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import ipoib

    by_name = {n.name: n for n in c.nodes}
    owner: dict[tuple[str, str], str] = {}
    for ni, net in enumerate(c.spec.fabric.ipoib):
        path: Path = ("fabric", "ipoib", ni)
        where = f"rail {net.rail}" if net.rail is not None else f"device {net.device}"
        if isinstance(net.device, dict):
            for prof in net.device:
                if prof not in c.spec.profiles:
                    r.report(rep, (*path, "device", prof), f"IPoIB network {net.name}: profile '{prof}' is not "
                             "defined", "key device: by profile names")
            where = "the device its profile names"
        if c.spec.fabric.type != "infiniband":
            r.report(rep, path, f"IPoIB network {net.name} on a {c.spec.fabric.type} fabric",
                     "IPoIB needs InfiniBand ports; address RoCE/Ethernet ports on the Ethernet side")
            continue
        names = _ipoib_members(c, rep, ni)
        if names is None:
            continue
        if not names:
            r.report(rep, path, f"IPoIB network {net.name}: no node has {where}", "check rail:/device: and nodes:")
        for name in names:
            node = by_name.get(name)
            if node is None:
                rep.add((*path, "nodes"), "SPEC-UNDEFINED-NODE", f"IPoIB member '{name}' is not defined",
                        "list nodes from nodes:")
                continue
            port = ipoib.network_port(net, node)
            if port is None:
                r.report(rep, (*path, "nodes") if net.nodes else path,
                         f"{name} (profile '{node.profile}') has no {where} for IPoIB network {net.name}",
                         "take the node out of nodes: or give its profile that port")
                continue
            if port.link_layer != "infiniband":
                r.report(rep, path, f"{name}:{port.device} is {port.link_layer}, IPoIB needs InfiniBand",
                         "IPoIB runs on InfiniBand ports only")
            if port.netdev is None:
                r.report(rep, path, f"IPoIB network {net.name}: the netdev of {port.device} in profile "
                         f"'{node.profile}' is not named", "add netdev: to that HCA (ibdev2netdev shows it, "
                         "e.g. ibp24s0)")
                continue
            key = (name, port.device)
            if key in owner and owner[key] != net.name:
                r.report(rep, path, f"{name}:{port.device} is in IPoIB networks {owner[key]} and {net.name}",
                         "one network per port; partitions go under children:")
            owner.setdefault(key, net.name)
            for ci, child in enumerate(net.children):
                part = next((p for p in c.spec.fabric.partitions if p.name == child.partition), None)
                if part is not None and len(ipoib.child_name(port.netdev, part.pkey)) > ipoib.IFNAMSIZ:
                    r.report(rep, (*path, "children", ci), f"child interface name "
                             f"{ipoib.child_name(port.netdev, part.pkey)} is longer than 15 characters",
                             "Linux refuses longer interface names; rename the parent netdev (udev)")


def nccl_pkey(cluster: Cluster, node: Node) -> str | None:
    """P_Key NCCL should use on a GPU node: the first partition (spec order) it is a full member of.

    NCCL_IB_PKEY takes the *index* in the port's P_Key table (net_ib.cc: ``qpAttr.pkey_index``), which the
    SM decides; the nccl role looks the key up in /sys/class/infiniband/<dev>/ports/<n>/pkeys/ on the node.
    """
    if not node.gpu_count or not node.rail_ports or cluster.spec.fabric.type != "infiniband":
        return None
    for part in cluster.spec.fabric.partitions:
        full = part.membership == "full" if part.membership else bool(part.pkey & 0x8000)
        if full and node.name in members(part.members, cluster):
            return full_pkey(part.pkey)
    return None


def full_pkey(pkey: int) -> str:
    """A partition's P_Key with the full-member bit set, as text (``0x8001``): what a full member's table holds."""
    return f"{pkey & 0x7FFF | 0x8000:#06x}"


def _addresses(c: Cluster, rep: Reporter, expr: str, count: int, path: Path) -> list[str] | None:
    try:
        addrs = hostlist.expand(expr)
    except hostlist.HostlistError as exc:
        rep.add(path, "SPEC-HOSTLIST", str(exc), "write e.g. 10.30.0.[11-18]")
        return None
    if len(addrs) != count:
        rep.add(path, "SPEC-RANGE-LENGTH", f"{count} member node(s) but {len(addrs)} address(es)",
                "addresses expand in step with the member nodes (spec order, or nodes:)")
        return None
    return addrs


@rule("IPOIB-ADDRESS", "error",
      "Every IPoIB address must be unique and a host address inside its network's subnet, or ARP answers for the "
      "wrong node and RDMA-CM (NFS/RDMA, Lustre o2ib) connects to it.")
def _ipoib_address(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import ipoib

    seen: dict[str, str] = {n.address: f"{n.name} (management)" for n in c.nodes}
    seen.update({s.address: f"switch {s.name}" for s in c.switches if s.address})
    parts = {p.name: p for p in c.spec.fabric.partitions}
    for ni, net in enumerate(c.spec.fabric.ipoib):
        names = _ipoib_members(c, rep, ni)
        if names is None:
            continue
        groups: list[tuple[str, str, list[str], Path]] = [(net.name, net.subnet, names, ("fabric", "ipoib", ni))]
        for ci, child in enumerate(net.children):
            part = parts.get(child.partition)
            if part is None:
                continue
            try:
                cnames = ipoib.child_members(net, ci, c, part)
            except hostlist.HostlistError as exc:
                rep.add(("fabric", "ipoib", ni, "children", ci, "nodes"), "SPEC-HOSTLIST", str(exc),
                        "a role name or a hostlist")
                continue
            groups.append((f"{net.name}.{part.name}", child.subnet, cnames, ("fabric", "ipoib", ni, "children", ci)))
        for label, cidr, members_, path in groups:
            expr = net.address if len(path) == 3 else net.children[int(path[-1])].address
            addrs = _addresses(c, rep, expr, len(members_), (*path, "address"))
            subnet = ipoib.subnet_of(cidr)
            if addrs is None:
                continue
            for name, addr in zip(members_, addrs, strict=True):
                if not ipoib.is_ipv4(addr):
                    rep.add((*path, "address"), "SPEC-ADDRESS", f"'{addr}' is not an IPv4 address",
                            "write a dotted quad such as 10.30.0.11")
                    continue
                ip = ipaddress.IPv4Address(addr)
                if subnet is not None and ip not in subnet:
                    r.report(rep, (*path, "address"), f"{name}'s IPoIB address {addr} on {label} is outside its "
                             f"subnet {subnet}", "pick an address inside the subnet, or fix subnet:")
                elif subnet is not None and subnet.prefixlen < 31 and ip in (subnet.network_address,
                                                                              subnet.broadcast_address):
                    r.report(rep, (*path, "address"), f"{name}'s IPoIB address {addr} is the "
                             f"{'network' if ip == subnet.network_address else 'broadcast'} address of {subnet}",
                             "use a host address")
                if addr in seen:
                    r.report(rep, (*path, "address"), f"address {addr} of {name} on {label} is already used by "
                             f"{seen[addr]}", "every address once")
                seen.setdefault(addr, f"{name} on {label}")


@rule("IPOIB-SUBNET", "error",
      "One IP subnet per rail, port or partition: two IPoIB interfaces of a node in one subnet answer ARP and "
      "route replies on either (ARP flux), so one rail's traffic leaves through another; a subnet that holds "
      "management addresses takes their routes.")
def _ipoib_subnet(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import ipoib

    nets: list[tuple[str, ipaddress.IPv4Network, Path]] = []
    for ni, net in enumerate(c.spec.fabric.ipoib):
        entries: list[tuple[str, str, Path]] = [(net.name, net.subnet, ("fabric", "ipoib", ni, "subnet"))]
        entries += [(f"{net.name}.{ch.partition}", ch.subnet, ("fabric", "ipoib", ni, "children", ci, "subnet"))
                    for ci, ch in enumerate(net.children)]
        for label, cidr, path in entries:
            subnet = ipoib.subnet_of(cidr)
            if subnet is None:
                try:
                    fixed = ipaddress.IPv4Network(cidr, strict=False)
                    hint = f"write {fixed} (the network address of that prefix)"
                except ValueError:
                    hint = "write e.g. 10.30.0.0/24"
                r.report(rep, path, f"'{cidr}' is not an IPv4 subnet", hint)
                continue
            for other, osub, _ in nets:
                if subnet.overlaps(osub):
                    r.report(rep, path, f"subnet {subnet} of {label} overlaps {osub} of {other}",
                             "give every rail, port and partition its own subnet")
                    break
            for n in c.nodes:
                if ipoib.is_ipv4(n.address) and ipaddress.IPv4Address(n.address) in subnet:
                    r.report(rep, path, f"subnet {subnet} of {label} holds {n.name}'s management address "
                             f"{n.address}", "keep IPoIB subnets apart from the management network")
                    break
            nets.append((label, subnet, path))


@rule("IPOIB-PKEY", "error",
      "A P_Key child interface works only in a partition the SM defines with an IPoIB broadcast group, on ports "
      "that are its members; otherwise the child never comes up.")
def _ipoib_pkey(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import ipoib

    parts = {p.name: p for p in c.spec.fabric.partitions}
    for ni, net in enumerate(c.spec.fabric.ipoib):
        names = _ipoib_members(c, rep, ni)
        seen: set[str] = set()
        for ci, child in enumerate(net.children):
            path: Path = ("fabric", "ipoib", ni, "children", ci)
            part = parts.get(child.partition)
            if part is None:
                known = ", ".join(parts) or "none"
                r.report(rep, (*path, "partition"), f"partition '{child.partition}' is not defined",
                         f"name one of fabric.partitions ({known})")
                continue
            if child.partition in seen:
                r.report(rep, (*path, "partition"), f"IPoIB network {net.name} lists partition {part.name} twice",
                         "one child interface per partition and port")
            seen.add(child.partition)
            if not part.ipoib:
                r.report(rep, (*path, "partition"), f"partition {part.name} has ipoib: false: the SM creates no "
                         "IPoIB broadcast group for it", "set ipoib: true on the partition")
            if names is None or child.nodes is None:
                continue
            try:
                cnames = ipoib.child_members(net, ci, c, part)
                in_part = set(members(part.members, c))
            except hostlist.HostlistError:
                continue
            for name in cnames:
                if name not in in_part:
                    r.report(rep, (*path, "nodes"), f"{name} is not a member of partition {part.name} "
                             f"(P_Key {part.pkey:#06x})", "add it to the partition's members or drop it here")
                elif name not in names:
                    r.report(rep, (*path, "nodes"), f"{name} is not on IPoIB network {net.name}, the child's parent",
                             "children live on the network's members")


@rule("IPOIB-MTU", "error",
      "Datagram mode carries at most the IB MTU minus the 4-byte IPoIB header (4092 on a 4096-byte IB MTU) and "
      "above 2044 only when the SM's IPoIB group is 4096 bytes (opensm: mtu=5); an MTU the mode cannot carry is "
      "refused or silently lowered by the kernel.")
def _ipoib_mtu(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import ipoib

    sm = c.spec.fabric.subnet_manager
    for ni, net in enumerate(c.spec.fabric.ipoib):
        entries: list[tuple[str, str, int | None, Path]] = [(net.name, net.mode, net.mtu, ("fabric", "ipoib", ni))]
        entries += [(f"{net.name}.{ch.partition}", ch.mode or net.mode, ch.mtu or (net.mtu if (ch.mode or net.mode)
                     == net.mode else None), ("fabric", "ipoib", ni, "children", ci))
                    for ci, ch in enumerate(net.children)]
        for label, mode, mtu, path in entries:
            if mtu is None:
                continue
            if mtu > ipoib.max_mtu(mode):
                r.report(rep, (*path, "mtu"), f"MTU {mtu} on {label} is more than {mode} mode carries "
                         f"({ipoib.max_mtu(mode)})", f"set mtu <= {ipoib.max_mtu(mode)}" +
                         (" or mode: connected" if mode == "datagram" else ""))
            elif mode == "datagram" and mtu > ipoib.DATAGRAM_DEFAULT_MTU and (sm is None or sm.kind != "opensm"):
                rep.add((*path, "mtu"), r.id, f"MTU {mtu} on {label} needs a 4096-byte IPoIB group, which this "
                        f"spec's SM ({sm.kind if sm else 'none'}) is not configured by provisioner to create",
                        "set the partition's IPoIB group to MTU 4096 (mtu=5) on the SM, or the interface "
                        "stays at 2044", severity="warning")


@rule("IPOIB-MODE", "warning",
      "ConnectX-4 and later (mlx5 devices) run enhanced IPoIB, which supports datagram mode only (RHEL "
      "networking guide, Configuring IPoIB); connected mode there is refused and the interface keeps datagram.")
def _ipoib_mode(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import ipoib

    by_name = {n.name: n for n in c.nodes}
    for ni, net in enumerate(c.spec.fabric.ipoib):
        modes: list[tuple[str | None, Path]] = [(net.mode, ("fabric", "ipoib", ni, "mode"))]
        modes += [(ch.mode, ("fabric", "ipoib", ni, "children", ci, "mode")) for ci, ch in enumerate(net.children)
                  if ch.mode]
        try:
            names = ipoib.network_members(net, c)
        except hostlist.HostlistError:
            continue
        ports = [ipoib.network_port(net, by_name[n]) for n in names if n in by_name]
        mlx5 = sorted({p.device for p in ports if p is not None and p.device.startswith("mlx5_")})
        for mode, path in modes:
            if mode == "connected" and mlx5:
                r.report(rep, path, f"connected mode on {', '.join(mlx5)} (mlx5: enhanced IPoIB, datagram only)",
                         "use mode: datagram (or load ib_ipoib with ipoib_enhanced=0 and say why)")


@rule("NFS-IPOIB", "error",
      "NFS over RDMA connects with RDMA-CM, which resolves the server's address through IPoIB: the mount must use "
      "the server's IPoIB address on a network every client is on (a management address resolves to Ethernet and "
      "the mount fails).")
def _nfs_ipoib(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import ipoib

    nets = {n.name for n in c.spec.fabric.ipoib}
    names = {n.name for n in c.nodes}
    for i, m in enumerate(c.spec.storage.nfs.mounts):
        path: Path = ("storage", "nfs", "mounts", i)
        try:
            clients = [h for h in members(m.on, c) if h in names]
        except hostlist.HostlistError:
            continue
        if m.network is not None and m.network not in nets:
            r.report(rep, (*path, "network"), f"IPoIB network '{m.network}' is not defined",
                     "name one of fabric.ipoib (" + (", ".join(sorted(nets)) or "none") + ")")
            continue
        net = ipoib.mount_network(c, m, clients)
        if net is None:
            if m.transport == "rdma" and m.server in names:
                r.report(rep, (*path, "transport"), f"NFS over RDMA from {m.server}: no IPoIB network has the "
                         "server and every client on it", "add a fabric.ipoib network with their addresses, or "
                         "name it with network:")
            continue
        missing = [h for h in [m.server, *clients] if ipoib.address_on(c, h, net) is None]
        if missing:
            r.report(rep, (*path, "network"), f"{', '.join(missing[:5])} ha{'s' if len(missing) == 1 else 've'} no "
                     f"address on IPoIB network {net}", "add them to the network, or mount over another one")
            continue
        ei, export = next(((k, e) for k, e in enumerate(c.spec.storage.nfs.exports)
                           if (e.server, e.path) == (m.server, m.export)), (-1, None))
        allowed = _cidrs(export.clients) if export is not None else None
        if export is not None and allowed:  # the export names its clients by address: the IPoIB ones must be in
            for h in clients:
                mine = ipoib.address_on(c, h, net)
                if mine is not None and not any(ipaddress.IPv4Address(mine.address) in n for n in allowed):
                    r.report(rep, ("storage", "nfs", "exports", ei, "clients"), f"{m.server}:{m.export} is exported "
                             f"to {export.clients} (by address), but {h} mounts it from its IPoIB address "
                             f"{mine.address}",
                             f"add {mine.subnet} to the export's clients")
                    break


def _cidrs(clients: str) -> list[ipaddress.IPv4Network] | None:
    """The networks an export's client list names when every entry is an address or CIDR; None otherwise (host
    names and wildcards resolve on the server, which the spec cannot see)."""
    out = []
    for entry in clients.split(","):
        try:
            out.append(ipaddress.IPv4Network(entry, strict=False))
        except ValueError:
            return None
    return out


@rule("LUSTRE-IPOIB", "error",
      "LNet's o2ib network binds to an IPoIB interface (o2ib0(ib0)): an interface without an address, or none, "
      "leaves LNet down, and an MGS NID outside that interface's subnet cannot be resolved by RDMA-CM.")
def _lustre_ipoib(c: Cluster, rep: Reporter, r: Rule) -> None:
    from provisioner.spec import ipoib

    names = {n.name for n in c.nodes}
    nets = {n.name for n in c.spec.fabric.ipoib}
    for i, fs in enumerate(c.spec.storage.lustre):
        path: Path = ("storage", "lustre", i)
        o2ib = [n for n in fs.lnet if n.startswith("o2ib")]
        if not o2ib:
            continue
        try:
            clients = [h for h in members(fs.on, c) if h in names]
        except hostlist.HostlistError:
            continue
        if fs.network is not None and fs.network not in nets:
            r.report(rep, (*path, "network"), f"IPoIB network '{fs.network}' is not defined",
                     "name one of fabric.ipoib (" + (", ".join(sorted(nets)) or "none") + ")")
            continue
        net = fs.network or next((n.name for n in c.spec.fabric.ipoib
                                  if all(ipoib.address_on(c, h, n.name) for h in clients)), None)
        for lnet in o2ib:
            iface = lnet.partition("(")[2].rstrip(")") or None
            for h in clients:
                mine = c.ipoib_of(h)
                if iface is not None:
                    if not any(x.netdev == iface for x in mine):
                        have = ", ".join(x.netdev for x in mine) or "none"
                        r.report(rep, (*path, "lnet"), f"LNet {lnet} on {h}: {iface} is not an IPoIB interface "
                                 f"of {h} (its IPoIB interfaces: {have})", "write o2ib0 and let the spec's IPoIB "
                                 "network name the interface, or name one of those")
                        break
                elif net is None or ipoib.address_on(c, h, net) is None:
                    r.report(rep, (*path, "lnet"), f"LNet {lnet} on {h}: no IPoIB interface to bind to",
                             "give the clients an IPoIB network (fabric.ipoib) and name it with network:")
                    break
        if net is None:
            continue
        subnets = {x.subnet for h in clients for x in c.ipoib_of(h) if x.network == net}
        for nid in fs.mgs:
            addr, _, lnd = nid.partition("@")
            if not lnd.startswith("o2ib") or not subnets:
                continue
            if not any(ipaddress.IPv4Address(addr) in ipaddress.IPv4Network(s) for s in subnets):
                rep.add((*path, "mgs"), r.id, f"MGS NID {nid} is outside the clients' IPoIB subnet "
                        f"{', '.join(sorted(subnets))} on {net}", "RDMA-CM resolves o2ib NIDs through IPoIB ARP: "
                        "the MGS needs an address on that subnet (or an LNet router)", severity="warning")


# --- Slurm and spares -------------------------------------------------------------------------------------------
def _names_of(expr: str, c: Cluster) -> list[str] | None:
    """The nodes a partition or spares expression names; None when the hostlist does not parse."""
    try:
        return members(expr, c)
    except hostlist.HostlistError:
        return None


@rule("SLURM-REFS", "error",
      "slurm.conf is rendered from these names: a controller or a partition member that is no node of the spec "
      "leaves slurmctld without the node it is told to schedule on.")
def _slurm_refs(c: Cluster, rep: Reporter, r: Rule) -> None:
    slurm = c.spec.slurm
    if slurm is None:
        return
    names = {n.name for n in c.nodes}
    if slurm.controller not in names:
        r.report(rep, ("slurm", "controller"), f"Slurm controller '{slurm.controller}' is not defined",
                 "name a node from nodes:")
    seen: set[str] = set()
    defaults = [p.name for p in slurm.partitions if p.default]
    for i, part in enumerate(slurm.partitions):
        if part.name in seen:
            r.report(rep, ("slurm", "partitions", i, "name"), f"partition {part.name} is defined twice",
                     "give each partition its own name")
        seen.add(part.name)
        got = _names_of(part.nodes, c)
        if got is None:
            rep.add(("slurm", "partitions", i, "nodes"), "SPEC-HOSTLIST", f"'{part.nodes}' is not a hostlist",
                    "a role name or a hostlist such as gpu[01-08]")
            continue
        unknown = [n for n in got if n not in names]
        if unknown:
            r.report(rep, ("slurm", "partitions", i, "nodes"),
                     f"partition {part.name} names undefined node(s) {hostlist.compress(unknown)}",
                     "name nodes from nodes:")
        elif not got:
            r.report(rep, ("slurm", "partitions", i, "nodes"), f"partition {part.name} has no node",
                     "name at least one node")
    if len(defaults) > 1:
        r.report(rep, ("slurm", "partitions"), f"{len(defaults)} default partitions ({', '.join(defaults)})",
                 "mark one partition default: true")


@rule("SPARES", "error",
      "A spare stands by outside every partition so that `provision failover` can put it in a failed node's "
      "place: it must be a defined node, in no partition, of the profile of the nodes it stands in for, on a "
      "cluster whose Slurm can take it in, and a member of the InfiniBand partitions those nodes are in (their jobs "
      "send with that P_Key, NCCL_IB_PKEY: a spare outside it cannot talk to them, and admitting it at failover "
      "would mean changing the SM's partitions under pressure).")
def _spares(c: Cluster, rep: Reporter, r: Rule) -> None:
    spares = c.spec.spares
    if spares is None:
        return
    got = _names_of(spares.nodes, c)
    if got is None:
        rep.add(("spares", "nodes"), "SPEC-HOSTLIST", f"'{spares.nodes}' is not a hostlist",
                "a hostlist such as spare[01-02]")
        return
    by_name = {n.name: n for n in c.nodes}
    unknown = [n for n in got if n not in by_name]
    if unknown:
        r.report(rep, ("spares", "nodes"), f"spare node(s) {hostlist.compress(unknown)} not defined",
                 "name nodes from nodes:")
        return
    if c.spec.slurm is None:
        r.report(rep, ("spares",), "spares without slurm: failover puts a spare into a Slurm partition",
                 "add a slurm: section (controller, partitions)")
        return
    in_parts: dict[str, str] = {}
    profiles: set[str] = set()
    for part in c.spec.slurm.partitions:
        for n in _names_of(part.nodes, c) or []:
            in_parts.setdefault(n, part.name)
            if n in by_name:
                profiles.add(by_name[n].profile)
    ib_members = [(ib, set(_names_of(ib.members, c) or [])) for ib in c.spec.fabric.partitions]
    for n in got:
        if n in in_parts:
            r.report(rep, ("spares", "nodes"), f"spare {n} is in partition {in_parts[n]}",
                     "a spare stays out of every partition until failover puts it in")
        elif n == c.spec.slurm.controller:
            r.report(rep, ("spares", "nodes"), f"spare {n} is the Slurm controller", "spares are compute nodes")
        elif by_name[n].profile not in profiles:
            r.report(rep, ("spares", "nodes"), f"spare {n} (profile {by_name[n].profile}) can stand in for no "
                     f"partition node (profiles: {', '.join(sorted(profiles)) or 'none'})",
                     "a spare must have the hardware profile of the nodes it replaces")
        else:
            peers = {m for m in in_parts if m in by_name and by_name[m].profile == by_name[n].profile}
            for ib, members in ib_members:
                served = sorted(peers & members)
                if served and n not in members:
                    r.report(rep, ("spares", "nodes"), f"spare {n} is not in InfiniBand partition {ib.name} "
                             f"(P_Key {ib.pkey:#06x}) of {hostlist.compress(served)}: in their place it could not "
                             "reach their peers", f"add {n} to {ib.name}'s members; standing by there is harmless")

from provisioner.spec import slurm_os as _slurm_os  # noqa: E402,F401  (registers SLURM-CGROUP)
