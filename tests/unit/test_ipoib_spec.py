"""IPoIB in the spec: expansion into planned interfaces, and every IPOIB-*/NFS-IPOIB/LUSTRE-IPOIB rule at its line.

The base is a small IB cluster whose NFS/RDMA mount and Lustre o2ib network are correct only because of the IPoIB
network; each test breaks one thing and expects exactly the rule (and line) that names it.
"""

from __future__ import annotations

import textwrap

from provisioner.render import build_inventory
from provisioner.spec import load_text

BASE = textwrap.dedent("""\
    cluster: {name: t, os: debian-12}
    software:
      driver: {version: "550.90.07"}
      cuda: "12.4.1"
      nccl: "2.21.5"
      ofed: {flavor: doca, version: "2.9.1"}
      lustre_client: "2.15.5"
    repositories:
      cuda: {url: "http://m/cuda", key: k.gpg}
      doca: {url: "http://m/doca", key: k.gpg}
    profiles:
      gpu2:
        gpu: {model: H100-SXM5-80GB, count: 2, nvswitch: true}
        hcas: [{device: "mlx5_[0-1]", rate: NDR, netdev: "ibp[23,41]s0"}]
      svc:
        hcas: [{device: mlx5_0, rate: NDR, netdev: ibp12s0}]
    nodes:
      - {name: "gpu[01-03]", address: "10.0.0.[11-13]", profile: gpu2}
      - {name: sm1, address: 10.0.0.2, profile: svc, roles: [subnet_manager, nfs_server]}
    switches:
      - {name: leaf1, ports: 64, uplinks: 0}
    fabric:
      rate: NDR
      topology: {kind: single_switch}
      subnet_manager:
        nodes: [{node: sm1, priority: 15}]
      partitions:
        - {name: tenant_a, pkey: 0x8001, members: "gpu[01-02]"}
      ipoib:
        - name: rail0
          rail: 0
          address: "10.30.0.[11-14]"
          subnet: 10.30.0.0/24
          children:
            - {partition: tenant_a, subnet: 10.31.0.0/24, address: "10.31.0.[11-12]"}
        - {name: rail1, rail: 1, address: "10.30.1.[11-13]", subnet: 10.30.1.0/24}
    storage:
      nfs:
        exports:
          - {server: sm1, path: /export/home, clients: 10.30.0.0/24}
        mounts:
          - {server: sm1, export: /export/home, mount: /home, transport: rdma}
      lustre:
        - {fsname: scratch, mgs: [10.30.0.201@o2ib], mount: /scratch, lnet: [o2ib0]}
    """)


def diags(text: str) -> list[tuple[str, int, str]]:
    return [(d.rule, d.line, d.severity) for d in load_text(text, "c.yaml").diagnostics if d.rule != "SM-SINGLE"]


def rules(text: str) -> set[str]:
    return {rule for rule, _, _ in diags(text)}


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_base_is_clean_and_expands_every_interface() -> None:
    assert diags(BASE) == []
    cluster = load_text(BASE, "c.yaml").cluster
    assert cluster is not None
    got = [(i.node, i.netdev, i.cidr, i.parent, i.pkey, i.mtu) for i in cluster.ipoib]
    assert got == [
        ("gpu01", "ibp23s0", "10.30.0.11/24", None, None, 2044),
        ("gpu02", "ibp23s0", "10.30.0.12/24", None, None, 2044),
        ("gpu03", "ibp23s0", "10.30.0.13/24", None, None, 2044),
        ("sm1", "ibp12s0", "10.30.0.14/24", None, None, 2044),
        ("gpu01", "ibp23s0.8001", "10.31.0.11/24", "ibp23s0", 0x8001, 2044),
        ("gpu02", "ibp23s0.8001", "10.31.0.12/24", "ibp23s0", 0x8001, 2044),
        ("gpu01", "ibp41s0", "10.30.1.11/24", None, None, 2044),
        ("gpu02", "ibp41s0", "10.30.1.12/24", None, None, 2044),
        ("gpu03", "ibp41s0", "10.30.1.13/24", None, None, 2044),
    ]


def test_render_mounts_over_ipoib_and_binds_lnet_to_the_netdev() -> None:
    """The bug of issue 13: NFS/RDMA named the server's management address and LNet an interface without one."""
    cluster = load_text(BASE, "c.yaml").cluster
    assert cluster is not None
    inv = build_inventory(cluster)
    gpu01 = inv.hostvars["gpu01"]
    assert gpu01["nfs_client_mounts"][0]["server"] == "10.30.0.14"      # sm1's IPoIB address, not 10.0.0.2
    assert gpu01["lustre_client_mounts"][0]["lnet"] == ["o2ib0(ibp23s0)"]
    assert inv.hostvars["sm1"]["nfs_server_rdma"] is True and "nfs_server_rdma" not in gpu01
    assert [(i["name"], i["pkey"], [p["host"] for p in i["peers"]]) for i in gpu01["ipoib_interfaces"]] == [
        ("ibp23s0", None, ["gpu02", "gpu03", "sm1"]), ("ibp23s0.8001", "0x8001", ["gpu02"]),
        ("ibp41s0", None, ["gpu02", "gpu03"])]
    assert inv.groups["ipoib_nodes"] == ["gpu01", "gpu02", "gpu03", "sm1"]
    assert inv.groupvars["all"]["lustre_client_built_against_ofed"] == "24.10-1.1.4.0"
    assert inv.groupvars["all"]["opensm_default_partition_ipoib_mtu"] == 0   # 2044: opensm's default group


def test_datagram_4092_tells_opensm_to_make_a_4k_group() -> None:
    text = BASE.replace("subnet: 10.30.0.0/24\n", "subnet: 10.30.0.0/24\n      mtu: 4092\n", 1)
    assert diags(text) == []
    cluster = load_text(text, "c.yaml").cluster
    assert cluster is not None
    inv = build_inventory(cluster)
    assert inv.groupvars["all"]["opensm_default_partition_ipoib_mtu"] == 5
    assert [p.get("ipoib_mtu") for p in inv.groupvars["all"]["opensm_partitions"]] == [5]  # the child inherits


def test_management_mounts_stay_on_management_addresses() -> None:
    text = BASE.replace("mount: /home, transport: rdma}", "mount: /home, transport: tcp}")
    cluster = load_text(text, "c.yaml").cluster
    assert cluster is not None
    assert build_inventory(cluster).hostvars["gpu01"]["nfs_client_mounts"][0]["server"] == "10.0.0.2"


def test_rdma_mount_without_ipoib_is_an_error() -> None:
    text = BASE.replace("rail: 0\n", "rail: 0\n      nodes: \"gpu[01-03]\"\n").replace(
        '"10.30.0.[11-13,2]"', '"10.30.0.[11-13]"')
    assert ("NFS-IPOIB", line_of(text, "transport: rdma"), "error") in diags(text)


def test_export_clients_must_cover_the_ipoib_addresses() -> None:
    text = BASE.replace("clients: 10.30.0.0/24", "clients: 10.0.0.0/24")
    assert diags(text) == [("NFS-IPOIB", line_of(text, "clients: 10.0.0.0/24"), "error")]


def test_address_outside_subnet_duplicate_and_count() -> None:
    outside = BASE.replace('"10.30.1.[11-13]"', '"10.30.1.[11-12],10.99.0.1"')
    assert ("IPOIB-ADDRESS", line_of(outside, "10.99.0.1"), "error") in diags(outside)
    dup = BASE.replace('"10.30.1.[11-13]"', '"10.30.1.[11-12],10.0.0.2"')
    assert "IPOIB-ADDRESS" in rules(dup)
    short = BASE.replace('"10.30.1.[11-13]"', '"10.30.1.[11-12]"')
    assert rules(short) == {"SPEC-RANGE-LENGTH"}
    bcast = BASE.replace('"10.30.1.[11-13]"', '"10.30.1.[11-12,255]"')
    assert rules(bcast) == {"IPOIB-ADDRESS"}


def test_one_subnet_per_rail_and_partition() -> None:
    same = BASE.replace("subnet: 10.30.1.0/24", "subnet: 10.30.0.0/25").replace('"10.30.1.[11-13]"',
                                                                                 '"10.30.0.[21-23]"')
    assert ("IPOIB-SUBNET", line_of(same, "10.30.0.0/25"), "error") in diags(same)
    host_bits = BASE.replace("subnet: 10.30.1.0/24", "subnet: 10.30.1.1/24")
    assert "IPOIB-SUBNET" in rules(host_bits)
    mgmt = BASE.replace("subnet: 10.31.0.0/24", "subnet: 10.0.0.0/24").replace('"10.31.0.[11-12]"',
                                                                                '"10.0.0.[111-112]"')
    assert "IPOIB-SUBNET" in rules(mgmt)


def test_ports_must_exist_be_named_and_be_infiniband() -> None:
    no_rail = BASE.replace("{name: rail1, rail: 1", "{name: rail1, rail: 5")
    assert "IPOIB-PORT" in rules(no_rail)
    unnamed = BASE.replace('netdev: "ibp[23,41]s0"', "rate: NDR")
    assert ("IPOIB-PORT", line_of(unnamed, "- name: rail0"), "error") in diags(unnamed)
    sm_only = BASE.replace("rail: 0\n", "rail: 0\n      nodes: \"gpu[01-03],sm1,gpu01\"\n")
    assert "SPEC-HOSTLIST" in rules(sm_only)  # gpu01 twice: the list would not pair with the addresses as written
    bad_netdevs = BASE.replace('netdev: "ibp[23,41]s0"', 'netdev: "ibp23s0"')
    assert ("SPEC-RANGE-LENGTH", line_of(bad_netdevs, 'netdev: "ibp23s0"'), "error") in diags(bad_netdevs)


def test_children_need_a_defined_ipoib_partition_with_the_nodes() -> None:
    unknown = BASE.replace("{partition: tenant_a,", "{partition: tenant_b,")
    assert ("IPOIB-PKEY", line_of(unknown, "partition: tenant_b"), "error") in diags(unknown)
    no_group = BASE.replace('members: "gpu[01-02]"}', 'members: "gpu[01-02]", ipoib: false}')
    assert "IPOIB-PKEY" in rules(no_group)
    outsider = BASE.replace('address: "10.31.0.[11-12]"}', 'address: "10.31.0.[11-13]", nodes: "gpu[01-03]"}')
    assert ("IPOIB-PKEY", line_of(outsider, "nodes: \"gpu[01-03]\"}"), "error") in diags(outsider)


def test_mtu_the_mode_cannot_carry_and_connected_mode_on_mlx5() -> None:
    big = BASE.replace("subnet: 10.30.1.0/24}", "subnet: 10.30.1.0/24, mtu: 9000}")
    assert ("IPOIB-MTU", line_of(big, "mtu: 9000"), "error") in diags(big)
    connected = BASE.replace("subnet: 10.30.1.0/24}", "subnet: 10.30.1.0/24, mode: connected, mtu: 9000}")
    assert diags(connected) == [("IPOIB-MODE", line_of(connected, "mode: connected"), "warning")]
    ufm = BASE.replace("subnet_manager:\n    nodes: [{node: sm1, priority: 15}]", "subnet_manager:\n    kind: ufm")
    ufm = ufm.replace("subnet: 10.30.1.0/24}", "subnet: 10.30.1.0/24, mtu: 4092}")
    assert ("IPOIB-MTU", line_of(ufm, "mtu: 4092"), "warning") in diags(ufm)


def test_lustre_interface_without_address_and_mgs_off_subnet() -> None:
    """The other bug of issue 13: LNet named an ibp* interface that had no address."""
    named = BASE.replace("lnet: [o2ib0]", 'lnet: ["o2ib0(ibp0s0)"]')
    assert ("LUSTRE-IPOIB", line_of(named, "o2ib0(ibp0s0)"), "error") in diags(named)
    off = BASE.replace("10.30.0.201@o2ib", "10.20.0.1@o2ib")
    assert diags(off) == [("LUSTRE-IPOIB", line_of(off, "10.20.0.1@o2ib"), "warning")]
    unknown = BASE.replace("lnet: [o2ib0]}", "lnet: [o2ib0], network: nope}")
    assert "LUSTRE-IPOIB" in rules(unknown)


def test_port_or_rail_exactly_one_and_per_profile_devices() -> None:
    both = BASE.replace("{name: rail1, rail: 1,", "{name: rail1, rail: 1, device: mlx5_1,")
    assert "SPEC-SCHEMA" in rules(both)
    per_profile = BASE.replace("{name: rail1, rail: 1, address: \"10.30.1.[11-13]\"",
                               "{name: rail1, device: {gpu2: mlx5_1, svc: mlx5_0}, address: \"10.30.1.[11-14]\"")
    per_profile = per_profile.replace("name: rail0\n      rail: 0\n", "name: rail0\n      rail: 0\n"
                                      "      nodes: \"gpu[01-03]\"\n").replace('"10.30.0.[11-14]"',
                                                                                  '"10.30.0.[11-13]"')
    per_profile = per_profile.replace("mount: /home, transport: rdma}", "mount: /home, transport: rdma, "
                                      "network: rail1}").replace("clients: 10.30.0.0/24", "clients: 10.30.1.0/24")
    assert diags(per_profile) == []
    cluster = load_text(per_profile, "c.yaml").cluster
    assert cluster is not None
    assert build_inventory(cluster).hostvars["gpu01"]["nfs_client_mounts"][0]["server"] == "10.30.1.14"
    assert [(i.node, i.netdev) for i in cluster.ipoib if i.network == "rail1"][-1] == ("sm1", "ibp12s0")
    bad_profile = per_profile.replace("svc: mlx5_0}", "svx: mlx5_0}")
    assert "IPOIB-PORT" in rules(bad_profile)
