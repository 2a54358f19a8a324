"""The filters and templates of the ipoib role and the nfs_server role's NFS/RDMA filters, on real outputs.

The ipoib role decides whether an interface drifted from its plan from ``ip addr show`` (a real IPoIB capture in
tests/fixtures/ip-addr); the nfs_server role picks the nfs.conf form of the RDMA listener by the installed nfs-utils
version (the change is nfs-utils commit 0240df0e, first released in 2.4.2) and proves it from
/proc/fs/nfsd/portlist (a real capture in tests/fixtures/nfsd-portlist).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pytest
import yaml

from tests.unit._parser_fixtures import load

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


IPOIB = _module(ROOT / "roles" / "ipoib" / "filter_plugins" / "ipoib_filters.py")
NFSD = _module(ROOT / "roles" / "nfs_server" / "filter_plugins" / "nfs_server_filters.py")
RHEL_IB0 = load("ip-addr", "redhat-rhel9-ib0-connected.txt")


def _plan(**over: Any) -> dict[str, Any]:
    plan = {"name": "ib0", "device": "mlx5_0", "port": 1, "address": "172.31.0.181", "prefix": 24,
            "mode": "connected", "mtu": 65520, "network": "n", "parent": None, "pkey": None, "peers": []}
    plan.update(over)
    return plan


def test_role_reads_the_real_interface_and_finds_it_as_planned() -> None:
    state = IPOIB.ip_addr_state(RHEL_IB0)
    assert state["ib0"]["link_type"] == "infiniband" and state["ib0"]["up"]
    assert IPOIB.problems([_plan()], state) == []
    assert IPOIB.not_infiniband(state, ["ib0", "ib1"]) == []


def test_role_names_every_drift() -> None:
    state = IPOIB.ip_addr_state(RHEL_IB0)
    got = IPOIB.problems([_plan(address="172.31.0.99", mtu=2044), _plan(name="ib0.8001")], state)
    assert got == [{"name": "ib0", "problem": "has 172.31.0.181/24, planned 172.31.0.99/24"},
                   {"name": "ib0", "problem": "has MTU 65520, planned 2044"},
                   {"name": "ib0.8001", "problem": "does not exist"}]
    state["ib0"]["up"] = False
    assert IPOIB.problems([_plan()], state)[0]["problem"].startswith("is down")
    with pytest.raises(IPOIB.IpoibParseError):
        IPOIB.ip_addr_state("garbage\n")


@pytest.mark.parametrize(("version", "want"), [
    ("1:2.6.2-4+deb12u1", {"rdma": "y", "rdma-port": "20049"}),     # Debian 12
    ("1:2.6.1-1ubuntu1.2", {"rdma": "y", "rdma-port": "20049"}),    # Ubuntu 22.04
    ("2.4.2", {"rdma": "y", "rdma-port": "20049"}),                 # the first release with rdma-port
    ("1:2.4.1-1", {"rdma": "20049", "rdma-port": None}),            # before: rdma= held the port
    ("2.3.3-57.el8", {"rdma": "20049", "rdma-port": None}),
])
def test_nfs_conf_form_follows_the_installed_nfs_utils(version: str, want: dict[str, Any]) -> None:
    assert NFSD.rdma_settings(version, 20049) == want


def test_portlist_of_a_server_listening_on_rdma() -> None:
    ports = NFSD.portlist(load("nfsd-portlist", "linux-nfs-rdma-y.txt"))
    assert ports == [["rdma", 20049], ["rdma", 20049]] and ["rdma", 20049] in ports
    assert ["rdma", 20049] not in NFSD.portlist("tcp 2049\ntcp 2049\n")
    with pytest.raises(NFSD.NfsServerFilterError):
        NFSD.portlist("not a portlist\n")
    with pytest.raises(NFSD.NfsServerFilterError):
        NFSD.upstream_version("unknown")


# ---------------------------------------------------------------- templates (Ansible renders with trim_blocks)
ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "roles" / "ipoib" / "templates"), trim_blocks=True,
                         keep_trailing_newline=True,
                         undefined=jinja2.StrictUndefined)
PARENT = _plan(name="ibp23s0", address="10.30.0.11", mode="datagram", mtu=2044)
CHILD = _plan(name="ibp23s0.8001", address="10.31.0.11", mode="datagram", mtu=2044, parent="ibp23s0",
              pkey="0x8001")


def _render(name: str, simulated: bool = False, **context: Any) -> str:
    return ENV.get_template(name).render(ansible_managed="managed", ipoib_parents=[PARENT],
                                         ipoib_children=[CHILD], ipoib_simulated=simulated, **context)


def test_networkd_files_carry_address_mtu_and_the_child() -> None:
    parent = _render("ipoib.network.j2", item=PARENT)
    assert "Name=ibp23s0\n" in parent and "MTUBytes=2044\n" in parent and "Address=10.30.0.11/24\n" in parent
    assert "IPoIB=ibp23s0.8001\n" in parent
    # networkd 252 (Debian 12) rejects [IPoIB] in .network files ("Unknown section 'IPoIB'"): the mode goes via udev
    assert "[IPoIB]" not in parent
    assert "IPoIB=" not in _render("ipoib.network.j2", simulated=True, item=PARENT)  # no Kind=ipoib child to list
    child = _render("ipoib.network.j2", item=CHILD)
    assert "Address=10.31.0.11/24\n" in child and "IPoIB=" not in child
    netdev = _render("ipoib-child.netdev.j2", item=CHILD)
    assert "Kind=ipoib\n" in netdev and "PartitionKey=0x8001\n" in netdev and "Mode=datagram\n" in netdev
    rules = _render("ipoib-mode.rules.j2")
    assert 'KERNEL=="ibp23s0", ATTR{mode}="datagram"\n' in rules and "ibp23s0.8001" not in rules


def test_netplan_file_is_valid_yaml_with_infiniband_mode() -> None:
    data = yaml.safe_load(_render("netplan.yaml.j2"))
    eth = data["network"]["ethernets"]["ibp23s0"]
    assert data["network"]["renderer"] == "networkd"
    assert eth == {"addresses": ["10.30.0.11/24"], "mtu": 2044, "infiniband-mode": "datagram", "link-local": [],
                   "accept-ra": False, "optional": True}
    dropin = _render("netplan-children.conf.j2", item="ibp23s0")
    assert "[Network]\nIPoIB=ibp23s0.8001\n" in dropin
    # simulated links (veth in the lab) get no IPoIB mode, as on the networkd backend; the rest is the same
    simulated = yaml.safe_load(_render("netplan.yaml.j2", simulated=True))["network"]["ethernets"]["ibp23s0"]
    assert "infiniband-mode" not in simulated
    assert simulated == {k: v for k, v in eth.items() if k != "infiniband-mode"}


# ---------------------------------------------------------------- the files the role owns, and its stale ones
NET = "/etc/systemd/network"
NETPLAN = "/etc/netplan/60-provisioner-ipoib.yaml"
UDEV = "/etc/udev/rules.d/60-provisioner-ipoib-mode.rules"
PREFIX = "60-provisioner-ipoib"
DROPIN = f"{NET}/10-netplan-ibp23s0.network.d/{PREFIX}.conf"


def _owned(plan: list[dict[str, Any]], backend: str, simulated: bool = False) -> list[str]:
    return list(IPOIB.owned_files(plan, backend, simulated, PREFIX, NET, NETPLAN, UDEV))


def _stale(found: list[str], owned: list[str]) -> list[str]:
    return list(IPOIB.stale_files(found, owned, PREFIX, NET, NETPLAN, UDEV))


def test_owned_files_are_what_each_backend_writes() -> None:
    assert _owned([PARENT, CHILD], "networkd") == [
        f"{NET}/{PREFIX}-ibp23s0.network", f"{NET}/{PREFIX}-ibp23s0.8001.network",
        f"{NET}/{PREFIX}-ibp23s0.8001.netdev", UDEV]
    assert _owned([PARENT, CHILD], "netplan") == [
        NETPLAN, f"{NET}/{PREFIX}-ibp23s0.8001.network", f"{NET}/{PREFIX}-ibp23s0.8001.netdev", DROPIN, UDEV]
    # a parent without children gets no drop-in; simulated links get no .netdev, drop-in or mode rule
    assert _owned([PARENT], "netplan") == [NETPLAN, UDEV]
    assert _owned([PARENT, CHILD], "netplan", simulated=True) == [NETPLAN, f"{NET}/{PREFIX}-ibp23s0.8001.network"]
    assert _owned([], "netplan") == [] and _owned([], "networkd") == []


def test_nothing_planned_makes_every_file_of_the_role_stale() -> None:
    written = [*_owned([PARENT, CHILD], "netplan"), f"{NET}/{PREFIX}-ibp23s0.network"]
    assert _stale(written, _owned([], "networkd")) == written


def test_a_backend_switch_leaves_the_other_backends_files_stale() -> None:
    netplan = _owned([PARENT, CHILD], "netplan")
    networkd = _owned([PARENT, CHILD], "networkd")
    assert _stale(netplan, networkd) == [NETPLAN, DROPIN]
    assert _stale(networkd, netplan) == [f"{NET}/{PREFIX}-ibp23s0.network"]


def test_drop_ins_of_parents_without_children_are_stale() -> None:
    other = f"{NET}/10-netplan-ibp41s0.network.d/{PREFIX}.conf"
    assert _stale([DROPIN, other], _owned([PARENT, CHILD], "netplan")) == [other]
    assert _stale([DROPIN, other], _owned([PARENT], "netplan")) == [DROPIN, other]


def test_files_that_are_not_the_roles_are_never_stale() -> None:
    foreign = [
        f"{NET}/70-site.network.d/{PREFIX}.conf",              # the role's drop-in name on another file
        f"{NET}/10-netplan-ibp23s0.network.d/50-site.conf",    # another drop-in beside the role's
        f"{NET}/site/{PREFIX}-ibp23s0.network",                # the role's name in a subdirectory
        f"{NET}/{PREFIX}.network", f"{NET}/{PREFIX}-ibp23s0.link",
        "/etc/netplan/50-cloud-init.yaml", f"{NET}/10-netplan-ibp23s0.network",
    ]
    assert _stale(foreign, []) == []
    # trailing slashes and duplicates from find do not change the answer
    assert IPOIB.stale_files([DROPIN, DROPIN], [], PREFIX, NET + "/", NETPLAN, UDEV) == [DROPIN]
