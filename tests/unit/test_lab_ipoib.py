"""The lab's simulated IPoIB: which links each node gets, the podman arguments, and the two IPoIB fault kinds."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import LabError
from provisioner.lab import cluster as lab
from provisioner.lab import faults, hardware, ipoib
from provisioner.lab.fromspec import lab_nodes
from provisioner.spec import load_cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab" / "cluster.yaml"


def test_every_planned_port_interface_becomes_a_named_link_on_its_network() -> None:
    cluster, _ = load_cluster(EXAMPLE)
    assert any(i.node == "gpu01" and i.netdev == "ibp23s0.8001" for i in cluster.ipoib)  # gpu01 is in tenant_a
    links = ipoib.lab_ipoib_links(cluster)
    # the P_Key child is no link of lab up: the node makes it when the role configures it (ipoib_child_sim)
    assert links["gpu01"] == [("plab-lab-ib-rail0", "ibp23s0"), ("plab-lab-ib-rail1", "ibp41s0")]
    assert links["gpu03"] == [("plab-lab-ib-rail0", "ibp23s0"), ("plab-lab-ib-rail1", "ibp41s0")]
    assert links["sm2"] == [("plab-lab-ib-rail0", "ibp12s0")]
    # node.json carries the spec's netdev names, so ibdev2netdev prints what the roles configure
    gpu01 = next(n for n in lab_nodes(cluster) if n.hostname == "gpu01")
    record = hardware.hca_record("lab", "gpu01", gpu01.hcas[1], 1, 0, hardware._GuidPool())
    assert record["netdev"] == "ibp41s0"


def test_run_args_attach_the_ipoib_networks_and_keep_the_lab_address(tmp_path: Path) -> None:
    plain = lab.run_args("lab", "gpu01", "10.213.38.11", tmp_path)
    assert plain[plain.index("--network"):plain.index("--network") + 4] == ["--network", "provisioner-lab", "--ip",
                                                                           "10.213.38.11"]
    links = [("plab-lab-ib-rail0", "ibp23s0"), ("plab-lab-ib-rail0-tenant-a", "ibp23s0.8001")]
    args = lab.run_args("lab", "gpu01", "10.213.38.11", tmp_path, ipoib_links=links)
    assert "--ip" not in args and "provisioner-lab:ip=10.213.38.11" in args
    assert "plab-lab-ib-rail0:interface_name=ibp23s0" in args and "--cap-add=NET_ADMIN" in args
    assert "plab-lab-ib-rail0-tenant-a:interface_name=ibp23s0.8001" in args
    # a child shares its parent's link in the lab: only the interface holding an address answers ARP for it
    assert {"net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2"} <= {
        args[i + 1] for i, a in enumerate(args) if a == "--sysctl"}
    assert "--sysctl" not in plain  # a node without IPoIB links keeps the defaults
    with pytest.raises(LabError):
        ipoib.network_args([("plab-lab-ib-x", "bad name;reboot")])


def test_ipoib_networks_have_no_ipam_and_stay_on_the_host() -> None:
    assert ipoib.create_args("plab-lab-ib-rail0") == ["network", "create", "--internal", "--ipam-driver", "none",
                                                      "--opt", "mtu=65520", "plab-lab-ib-rail0"]
    assert lab.LAB_SITE_VARS["ipoib_require_infiniband"] is False


def _node() -> dict[str, object]:
    return {"hostname": "gpu01", "cluster": "lab", "hcas": [], "gpus": [], "faults": []}


def test_ipoib_down_sets_the_link_down_and_clear_brings_it_up() -> None:
    node = _node()
    record, commands = faults.apply_fault(node, "ipoib_down", {"netdev": "ibp23s0"})
    assert record == {"kind": "ipoib_down", "netdev": "ibp23s0"}
    assert commands == [["exec", "plab-lab-gpu01", "ip", "link", "set", "dev", "ibp23s0", "down"]]
    assert faults.revert_fault(node, record) == [["exec", "plab-lab-gpu01", "ip", "link", "set", "dev", "ibp23s0",
                                                  "up"]]
    assert node["faults"] == []


def test_ipoib_wrong_address_saves_and_restores_the_planned_addresses() -> None:
    node = _node()
    record, (cmd,) = faults.apply_fault(node, "ipoib_wrong_address", {"netdev": "ibp41s0", "address": "10.30.1.99/24"})
    script = cmd[-1]
    assert "ip -o -4 addr show dev ibp41s0 scope global" in script and "> /run/provisioner-lab-fault-ibp41s0" in script
    assert script.endswith("ip addr add 10.30.1.99/24 dev ibp41s0")
    (undo,) = faults.revert_fault(node, record)
    assert "ip addr add \"$a\" dev ibp41s0" in undo[-1] and "< /run/provisioner-lab-fault-ibp41s0.addresses" in undo[-1]


@pytest.mark.parametrize(("kind", "params", "words"), [
    ("ipoib_down", {}, "needs netdev"),
    ("ipoib_down", {"netdev": "ib0;reboot"}, "is not a name"),
    ("ipoib_wrong_address", {"netdev": "ibp23s0"}, "needs address"),
    ("ipoib_wrong_address", {"netdev": "ibp23s0", "address": "10.0.0.1"}, "is not a name"),
])
def test_ipoib_fault_parameters_are_checked_before_anything_runs(kind: str, params: dict[str, str],
                                                                 words: str) -> None:
    with pytest.raises(LabError, match=words):
        faults.check_params(kind, params)
