"""The inventory as data: groups, host variables and group variables derived from the expanded Cluster.

One function builds it; the file renderer and the Ansible inventory plugin both consume it, so
`provision render` and `ansible-inventory -i cluster.yaml` can never disagree.
Role variables are named after the role that reads them (nvidia_driver_version, opensm_priority, ...).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, overload

from provisioner import hcafw
from provisioner.render import ipoib as ipoib_render
from provisioner.render.ssh import Hop, ssh_common_args
from provisioner.spec.cluster import Cluster, Node
from provisioner.spec.ipoib import nfs_server_address
from provisioner.spec.models import Repo
from provisioner.spec.rules import members, nccl_pkey

OS_CODENAMES = {"ubuntu-22.04": "jammy", "ubuntu-24.04": "noble", "debian-12": "bookworm"}
OS_REPO_PATHS = {"ubuntu-22.04": "ubuntu2204", "ubuntu-24.04": "ubuntu2404", "debian-12": "debian12"}


@dataclass
class Inventory:
    groups: dict[str, list[str]] = field(default_factory=dict)  # group -> hosts (sorted)
    children: dict[str, list[str]] = field(default_factory=dict)  # parent group -> child groups
    hostvars: dict[str, dict[str, Any]] = field(default_factory=dict)
    groupvars: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, group: str, host: str) -> None:
        self.groups.setdefault(group, []).append(host)


@functools.lru_cache(maxsize=65536)
def _group_name(raw: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in raw)


@overload
def _spec_relative(cluster: Cluster, p: str) -> str: ...
@overload
def _spec_relative(cluster: Cluster, p: str | None) -> str | None: ...
def _spec_relative(cluster: Cluster, p: str | None) -> str | None:
    """Resolve a control-node path given in the spec relative to the spec file."""
    return None if p is None else cluster.control_path(p)


def _baseline_vars(cluster: Cluster) -> dict[str, Any]:
    """The node baseline the spec asks for: the MOK DKMS signs with (preflight), the NTP servers (host_tuning)."""
    sb, time = cluster.spec.secure_boot, cluster.spec.time
    out: dict[str, Any] = {}
    if sb is not None:
        out["preflight_mok_key"] = cluster.control_path(sb.mok_key)
        out["preflight_mok_cert"] = cluster.control_path(sb.mok_cert)
    if time is not None:
        out["host_tuning_ntp_servers"] = list(time.servers)
    return out


def _nccl_env(cluster: Cluster, node: Node) -> dict[str, str]:
    """The /etc/nccl.conf settings the spec implies for this node (sites may override per key).

    NCCL_IB_HCA: NCCL strips one leading ``^`` then one ``=`` for the *whole* list and splits ``dev:port``
    entries on commas (net_ib.cc), so the list is ``=mlx5_0:1,mlx5_1:1`` (exact names, all rails).
    NCCL_NET_GDR_LEVEL only when the profile asks, or PHB on a GPU board without NVSwitch (LOC without GPUs).
    NCCL_TOPO_FILE and NCCL_IB_PKEY are set by the nccl role (the file it installs, the P_Key index it reads
    on the node), not here.
    """
    env: dict[str, str] = {}
    rails = sorted((p for p in node.rail_ports), key=lambda p: (p.rail if p.rail is not None else 99, p.device))
    prof = cluster.spec.profiles[node.profile]
    if rails:
        env["NCCL_IB_HCA"] = "=" + ",".join(f"{p.device}:{p.port}" for p in rails)
        if prof.nccl_net_gdr_level:
            env["NCCL_NET_GDR_LEVEL"] = prof.nccl_net_gdr_level
        elif not node.nvswitch:
            env["NCCL_NET_GDR_LEVEL"] = "PHB" if node.gpu_count else "LOC"
    if prof.management_interface:
        env["NCCL_SOCKET_IFNAME"] = prof.management_interface
    roce = cluster.spec.fabric.roce
    if cluster.spec.fabric.type == "roce" and roce is not None:
        env["NCCL_IB_GID_INDEX"] = str(roce.gid_index)
        env["NCCL_IB_TC"] = str(roce.traffic_class)
    if rails and node.gpu_count and cluster.spec.gpudirect.mode == "dmabuf":
        env["NCCL_DMABUF_ENABLE"] = "1"  # the default, said explicitly: dmabuf mode loads no nvidia_peermem
    if node.gpu_count:
        env.update(cluster.spec.software.nccl_env)  # the site's own (e.g. `provision tune`'s), over the derived
    return env


def _roce_profile_vars(cluster: Cluster, node: Node) -> dict[str, Any]:
    """roce_qos_ports of a profile: its Ethernet ports, on a RoCE fabric only (nothing otherwise)."""
    if cluster.spec.fabric.type != "roce":
        return {}
    return {"roce_qos_ports": [{"device": p.device, "port": p.port, "netdev": p.netdev}
                               for p in node.ports if p.link_layer == "ethernet"]}


def _roce_tos(dscp: int, ecn: bool) -> int:
    """RDMA-CM ToS byte: DSCP in the top six bits, ECT(0) in the low two when ECN is on (26 -> 106, the value
    NVIDIA's RoCE configuration guides use with ``cma_roce_tos``)."""
    return (dscp << 2) | (0b10 if ecn else 0)


def _roce_vars(cluster: Cluster) -> dict[str, Any]:
    """The roce_qos role's settings from fabric.roce; empty off RoCE so InfiniBand inventories stay as they were."""
    roce = cluster.spec.fabric.roce
    if cluster.spec.fabric.type != "roce" or roce is None:
        return {}
    return {"roce_qos_enabled": True, "roce_qos_trust": roce.trust, "roce_qos_pfc_priority": roce.pfc_priority,
            "roce_qos_ecn": bool(roce.ecn), "roce_qos_dscp": roce.dscp,
            "roce_qos_tos": _roce_tos(roce.dscp, bool(roce.ecn)), "roce_qos_mtu": roce.mtu}


def _slurm_vars(cluster: Cluster, inv: Inventory) -> dict[str, Any]:
    """The slurm role's settings and groups (slurm_controller, slurm_nodes, spares); nothing without ``slurm:``.

    slurm_partitions here are the spec's; a run after a failover passes the swapped ones as extra vars
    (:func:`provisioner.slurm.membership.run_vars`)."""
    slurm = cluster.spec.slurm
    if slurm is None:
        return {}
    from provisioner.slurm.membership import spec_membership

    now = spec_membership(cluster)
    nodes = now.in_partitions + [n for n in now.spares if n not in now.in_partitions]
    by_name = {n.name: n for n in cluster.nodes}
    inv.groups["slurm_controller"] = [slurm.controller]
    inv.groups["slurm_nodes"] = [n for n in nodes if n in by_name]
    if now.spares:
        inv.groups["spares"] = list(now.spares)
    if slurm.accounting is not None:
        inv.groups["slurm_accounting"] = [slurm.accounting.host]
    ctl = by_name.get(slurm.controller)
    return {
        "slurm_enabled": True,
        "slurm_controller": slurm.controller,
        "slurm_controller_address": ctl.address if ctl else None,
        "slurm_nodes": [{"name": n, "address": by_name[n].address, "gpus": by_name[n].gpu_count}
                        for n in nodes if n in by_name],
        "slurm_partitions": [{"name": p.name, "nodes": now.partitions.get(p.name, []), "default": p.default,
                              "max_time": p.max_time} for p in slurm.partitions],
        "slurm_spares": now.spares,
        "slurm_failed": [],
        "slurm_gres": slurm.gres,
        **_slurm_os_vars(cluster),
    }


def _repo_vars(cluster: Cluster, repo: Repo | None) -> dict[str, Any] | None:
    if repo is None:
        return None
    return {"url": repo.url, "key": _spec_relative(cluster, repo.key),
            "suite": repo.suite or OS_CODENAMES[cluster.spec.cluster.os], "components": list(repo.components)}


def _containers_vars(cluster: Cluster) -> dict[str, Any]:
    """The containers role's pins and paths (software.containers) and its toolkit repository for vendor_repos;
    nothing without it, so inventories of specs without containers stay as they were."""
    ct = cluster.spec.software.containers
    if ct is None:
        return {}
    return {
        "vendor_repos_containers": _repo_vars(cluster, ct.repository),
        "containers_toolkit_version": ct.toolkit,
        "containers_enroot_version": ct.enroot,
        "containers_enroot_mirror": ct.enroot_mirror,
        "containers_pyxis_version": ct.pyxis,
        "containers_pyxis_source": ct.pyxis_source,
        "containers_scratch": ct.scratch,
    }


def _slurm_os_vars(cluster: Cluster) -> dict[str, Any]:
    """What the slurm role writes per OS and Slurm release (provisioner.spec.slurm_os), the topology.conf of
    `provision export slurm`, slurmdbd and NHC."""
    from provisioner.export.slurm import export_topology
    from provisioner.fabric.nhc import export_nhc
    from provisioner.spec import slurm_os

    slurm = cluster.spec.slurm
    assert slurm is not None
    by_name = {n.name: n for n in cluster.nodes}
    acct = slurm.accounting
    nhc = slurm.nhc
    return {
        "slurm_min_version": slurm_os.fmt(slurm_os.slurm_release(cluster)),
        "slurm_cgroup_conf": slurm_os.cgroup_conf(cluster),
        "slurm_boot_parameters": slurm_os.boot_parameters(cluster),
        "vendor_repos_slurm": _repo_vars(cluster, slurm.repository),
        "slurm_topology_conf": export_topology(cluster) if cluster.cables else "",
        "slurm_accounting_host": acct.host if acct else "",
        "slurm_accounting_address": by_name[acct.host].address if acct and acct.host in by_name else "",
        "vendor_repos_nhc": _repo_vars(cluster, nhc.repository if nhc else None),
        "slurm_nhc": ({"package": nhc.package, "interval": nhc.interval, "node_state": list(nhc.node_state)}
                      if nhc else None),
        "slurm_nhc_conf": export_nhc(cluster) if nhc else "",
    }


def play_vars(cluster: Cluster) -> dict[str, Any]:
    """Variables a play needs before Ansible knows any host: play keywords such as ``serial`` are templated
    without inventory variables, so the run engine also passes these as extra vars (they are in group_vars/all
    too, for tasks and for whoever reads the inventory)."""
    return {"provisioner_reboot_serial": cluster.spec.reboot.serial}


def build_inventory(cluster: Cluster) -> Inventory:
    spec = cluster.spec
    inv = Inventory()
    _node_groups(cluster, inv)
    nfs_by_host = _nfs_mounts_by_host(cluster, inv)
    exports_by_host: dict[str, list[dict[str, Any]]] = {}
    for e in spec.storage.nfs.exports:
        exports_by_host.setdefault(e.server, []).append({
            "path": e.path, "clients": e.clients, "options": list(e.options), "implementation": e.implementation})
    lustre_by_host = _lustre_mounts_by_host(cluster, inv)
    group_mtus = ipoib_render.ipoib_group_mtus(cluster)
    partitions = _partitions(cluster, group_mtus)
    _profile_group_vars(cluster, inv)
    storage = {"nfs_client_mounts": nfs_by_host, "nfs_server_exports": exports_by_host,
               "lustre_client_mounts": lustre_by_host}
    _host_vars(cluster, inv, storage, partitions)
    for part_vars in partitions:
        del part_vars["member_set"]
    inv.groupvars["all"] = _all_vars(cluster, inv, partitions, group_mtus)

    order = {h: i for i, h in enumerate(n.name for n in cluster.nodes)}
    for g in inv.groups:
        inv.groups[g] = sorted(set(inv.groups[g]), key=order.__getitem__)
    inv.groups = dict(sorted(inv.groups.items()))
    return inv


def _node_groups(cluster: Cluster, inv: Inventory) -> None:
    """The groups a node is in by its spec entry: roles, profile, rails, GPUs, NVSwitch, InfiniBand, leaf switch."""
    for n in cluster.nodes:
        for role in n.roles:
            inv.add(role, n.name)
        inv.add(f"profile_{_group_name(n.profile)}", n.name)
        for p in n.rail_ports:
            if p.rail is not None:
                inv.add(f"rail_{p.rail}", n.name)
        if n.gpu_count:
            inv.add("gpu_nodes", n.name)
        if n.nvswitch:
            inv.add("nvswitch_nodes", n.name)
        if any(p.link_layer == "infiniband" for p in n.ports):
            inv.add("ib_nodes", n.name)
    tiers = {s.name: s.tier for s in cluster.switches}
    for cab in cluster.cables:
        if tiers.get(cab.switch) == "leaf":
            inv.add(f"leaf_{_group_name(cab.switch)}", cab.node)


def _nfs_mounts_by_host(cluster: Cluster, inv: Inventory) -> dict[str, list[dict[str, Any]]]:
    """Each NFS client's mounts (the nfs_clients group)."""
    nfs_by_host: dict[str, list[dict[str, Any]]] = {}
    for m in cluster.spec.storage.nfs.mounts:
        clients = members(m.on, cluster)
        server = nfs_server_address(cluster, m, clients)  # IPoIB for RDMA: RDMA-CM resolves it
        for h in clients:
            nfs_by_host.setdefault(h, []).append({
                "server": server, "server_name": m.server, "export": m.export,
                "path": m.mount, "transport": m.transport, "version": m.version, "nconnect": m.nconnect,
                "options": list(m.options), "automount": m.automount, "owner": m.owner, "mode": m.mode})
            inv.add("nfs_clients", h)
    return nfs_by_host


def _lustre_mounts_by_host(cluster: Cluster, inv: Inventory) -> dict[str, list[dict[str, Any]]]:
    """Each Lustre client's mounts (the lustre_clients group)."""
    lustre_by_host: dict[str, list[dict[str, Any]]] = {}
    for lm in cluster.spec.storage.lustre:
        for h in members(lm.on, cluster):
            lustre_by_host.setdefault(h, []).append({
                "fsname": lm.fsname, "mgs": list(lm.mgs), "path": lm.mount,
                "lnet": ipoib_render.lustre_lnet(cluster, lm, h),
                "options": list(lm.options)})
            inv.add("lustre_clients", h)
    return lustre_by_host


def _partitions(cluster: Cluster, group_mtus: dict[str | None, int]) -> list[dict[str, Any]]:
    """opensm's partitions; each keeps its member_set for the host vars until build_inventory drops it."""
    partitions: list[dict[str, Any]] = []
    for part in cluster.spec.fabric.partitions:
        full = part.membership == "full" if part.membership else bool(part.pkey & 0x8000)
        partitions.append({
            "name": part.name, "pkey": f"{part.pkey & 0x7FFF:#06x}", "membership": "full" if full else "limited",
            "members": members(part.members, cluster), "ipoib": part.ipoib,
            "member_set": set(members(part.members, cluster))})
        if part.name in group_mtus:  # datagram IPoIB above 2044 bytes needs a 4096-byte IPoIB group
            partitions[-1]["ipoib_mtu"] = group_mtus[part.name]
    return partitions


def _profile_group_vars(cluster: Cluster, inv: Inventory) -> None:
    """What every node of a profile shares goes to group_vars/profile_<name>.yml (small host_vars, fast renders)."""
    spec = cluster.spec
    for pname in sorted({n.profile for n in cluster.nodes}):
        n = next(x for x in cluster.nodes if x.profile == pname)
        inv.groupvars[f"profile_{_group_name(pname)}"] = {
            "provisioner_expected_ports": [
                {"device": p.device, "port": p.port, "rate_gbps": p.rate_gbps, "width": p.width,
                 "link_layer": p.link_layer, "rail": p.rail, "gpu": p.gpu, "numa": p.numa, "netdev": p.netdev,
                 "pci": p.pci, "purpose": p.purpose}
                for p in n.ports],
            "preflight_gpu_count": n.gpu_count,
            "preflight_gpu_model": n.gpu_model,
            "preflight_hca_devices": [p.device for p in n.ports],
            "nvidia_driver_enabled": n.gpu_count > 0,
            "nvidia_driver_fabric_manager": (spec.software.fabric_manager
                                             if spec.software.fabric_manager is not None else n.nvswitch),
            "nvidia_peermem_enabled": n.gpu_count > 0 and bool(n.rail_ports),
            "perftest_cuda_enabled": (n.gpu_count > 0 and bool(n.rail_ports) and "compute" in n.roles
                                      and "gpudirect" in spec.verify.tests),
            "nccl_conf": _nccl_env(cluster, n),
            **({"nccl_topo_file": _spec_relative(cluster, spec.profiles[pname].nccl_topology_file)}
               if spec.profiles[pname].nccl_topology_file else {}),
            **_roce_profile_vars(cluster, n),
        }


def _host_vars(cluster: Cluster, inv: Inventory, storage: dict[str, dict[str, list[dict[str, Any]]]],
               partitions: list[dict[str, Any]]) -> None:
    """Each node's own variables (the empty optional ones left out), its ipoib_nodes and opensm groups."""
    sm = cluster.spec.fabric.subnet_manager
    sm_nodes = {s.node: s for s in (sm.nodes if sm else [])}
    ipoib_ifs = ipoib_render.ipoib_interfaces(cluster)
    rdma_servers = ipoib_render.nfs_rdma_servers(cluster)
    for n in cluster.nodes:
        if n.name in ipoib_ifs:
            inv.add("ipoib_nodes", n.name)
        hv: dict[str, Any] = {"ansible_host": n.address, "provisioner_profile": n.profile,
                              "provisioner_roles": list(n.roles)}
        optional: dict[str, Any] = {
            "provisioner_known_guids": dict(sorted(n.guids.items())),
            **{name: by_host.get(n.name, []) for name, by_host in storage.items()},
            "opensm_partition_memberships": [p["name"] for p in partitions if n.name in p["member_set"]],
            "nccl_ib_pkey": nccl_pkey(cluster, n),
            "ipoib_interfaces": ipoib_ifs.get(n.name, []),
            "nfs_server_rdma": n.name in rdma_servers,
        }
        hv.update({k: v for k, v in optional.items() if v})
        if n.name in sm_nodes:
            s = sm_nodes[n.name]
            ib = [p for p in n.ports if p.link_layer == "infiniband"]
            hv["opensm_priority"] = s.priority
            hv["opensm_device"] = s.device or (ib[0].device if ib else None)
            hv["opensm_port"] = next((p.port for p in ib if p.device == hv["opensm_device"]), 1)
            inv.add("opensm", n.name)
        inv.hostvars[n.name] = hv


def _all_vars(cluster: Cluster, inv: Inventory, partitions: list[dict[str, Any]],
              group_mtus: dict[str | None, int]) -> dict[str, Any]:
    """group_vars/all: connection, cluster, repositories, software pins, opensm, verify, RoCE, Slurm, baseline,
    then the spec's site_vars."""
    spec = cluster.spec
    key_file = _spec_relative(cluster, spec.ssh.key)
    allv: dict[str, Any] = {
        **_connection_vars(cluster, key_file),
        "provisioner_cluster": spec.cluster.name,
        "provisioner_os": spec.cluster.os,
        "provisioner_os_codename": OS_CODENAMES[spec.cluster.os],
        "provisioner_fabric_type": spec.fabric.type,
        "provisioner_fabric_rate_gbps": cluster.fabric_rate_gbps,
        **_repository_vars(cluster),
        "nvidia_driver_version": spec.software.driver.version,
        "nvidia_driver_branch": spec.software.driver.branch,
        "nvidia_driver_kernel_modules": spec.software.driver.kernel_modules,
        "nvidia_driver_allow_reboot": spec.reboot.allowed,
        **play_vars(cluster),
        "cuda_version": spec.software.cuda,
        "nccl_version": spec.software.nccl,
        "nccl_tests_version": spec.software.nccl_tests,
        "provisioner_gpudirect_mode": spec.gpudirect.mode,
        "perftest_cuda_version": spec.software.perftest,
        "doca_ofed_flavor": spec.software.ofed.flavor,
        "doca_ofed_version": spec.software.ofed.version,
        **hcafw.role_vars(spec.software.hca_firmware),
        "lustre_client_version": spec.software.lustre_client,
        "dcgm_version": spec.software.dcgm,
        **_containers_vars(cluster),
        "lustre_client_built_against_ofed": ipoib_render.built_against_ofed(spec),
        "nfs_server_rdma_packages": ipoib_render.nfs_rdma_packages(spec),
        "nfs_client_rdma_packages": ipoib_render.nfs_rdma_packages(spec),
        **_opensm_vars(cluster, partitions, group_mtus),
        "provisioner_roce": spec.fabric.roce.model_dump() if spec.fabric.roce else None,
        "provisioner_verify": spec.verify.model_dump(),
        **_roce_vars(cluster),
        **_slurm_vars(cluster, inv),
    }
    if key_file:
        allv["ansible_ssh_private_key_file"] = key_file
    allv.update(_baseline_vars(cluster))
    for name, value in spec.site_vars.items():
        allv[name] = value
    return allv


def _connection_vars(cluster: Cluster, key_file: str | None) -> dict[str, Any]:
    """How Ansible reaches the nodes: user, port, the SSH options (known_hosts, key, jump host), the interpreter."""
    spec = cluster.spec
    known_hosts = _spec_relative(cluster, spec.ssh.known_hosts)
    jump = spec.ssh.jump
    ssh_args = ssh_common_args(known_hosts=known_hosts, key=key_file,
                               jump=Hop(jump.host, jump.user or spec.ssh.user, jump.port) if jump else None)
    return {
        "ansible_user": spec.ssh.user,
        "ansible_port": spec.ssh.port,
        "ansible_ssh_common_args": ssh_args,
        "provisioner_known_hosts": known_hosts,
        "ansible_python_interpreter": "/usr/bin/python3",
    }


def _repository_vars(cluster: Cluster) -> dict[str, Any]:
    """vendor_repos' settings: offline, and the CUDA, DOCA and OS repositories the spec names (None otherwise)."""
    spec = cluster.spec
    repos = spec.repositories
    return {
        "vendor_repos_offline": repos.offline,
        "vendor_repos_cuda": ({"url": repos.cuda.url, "key": _spec_relative(cluster, repos.cuda.key),
                               "suite": repos.cuda.suite or "/", "components": list(repos.cuda.components)}
                              if repos.cuda else None),
        "vendor_repos_doca": ({"url": repos.doca.url, "key": _spec_relative(cluster, repos.doca.key),
                               "suite": repos.doca.suite or "/", "components": list(repos.doca.components)}
                              if repos.doca else None),
        "vendor_repos_os": ({"url": repos.os.url, "key": _spec_relative(cluster, repos.os.key),
                             "suite": repos.os.suite or OS_CODENAMES[spec.cluster.os],
                             "components": list(repos.os.components)} if repos.os else None),
    }


def _opensm_vars(cluster: Cluster, partitions: list[dict[str, Any]],
                 group_mtus: dict[str | None, int]) -> dict[str, Any]:
    """The opensm role's cluster-wide settings: kind, build, routing, handover, partitions."""
    spec = cluster.spec
    sm = spec.fabric.subnet_manager
    # Only what the spec asks for: no engines and no AR leaves the build's default (NVIDIA's opensm: ar_updn).
    engines = (sm.routing_engines if sm and sm.routing_engines else
               (["ar_updn"] if sm and sm.adaptive_routing else []))
    return {
        "opensm_kind": sm.kind if sm else None,
        "opensm_build": sm.build if sm else None,
        "opensm_routing_engines": engines,
        "opensm_adaptive_routing": bool(sm and sm.adaptive_routing),
        "opensm_handover": bool(sm and sm.handover),
        "opensm_partitions": partitions,
        "opensm_default_partition_ipoib_mtu": group_mtus.get(None, 0),
        "opensm_default_partition": spec.fabric.default_partition,
    }

