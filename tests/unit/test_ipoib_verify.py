"""verify's ipoib check and the storage check's IPoIB side, on real captured outputs.

``ip addr show`` of an IPoIB interface (Red Hat's RHEL 9 InfiniBand guide) and ``mount`` lines of NFS/RDMA over
IPoIB (NVIDIA's GPUDirect Storage configuration guide) are parsed by the product's parsers and judged against
specs built to match them; every variant that must fail is derived in the test from the real record, the fixture
files stay verbatim.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping, Sequence

from provisioner.fabric import ipoib as check
from provisioner.fabric import storage
from provisioner.remote import Completed
from provisioner.spec import load_text
from provisioner.spec.cluster import Cluster, IpoibIf
from tests.unit._parser_fixtures import load

RHEL_IB0 = load("ip-addr", "redhat-rhel9-ib0-connected.txt")
GDS_MOUNTS = load("mount", "nvidia-gds-nfs-rdma-ipoib.txt")


def test_ip_addr_parser_reads_the_real_ipoib_interface() -> None:
    links = check.parse_ip_addr(RHEL_IB0)
    ib0 = links["ib0"]
    assert ib0 == check.Link("ib0", ("BROADCAST", "MULTICAST", "UP", "LOWER_UP"), 65520, "UP", "infiniband",
                             ("172.31.0.181/24",))
    assert ib0.up


PLANNED = IpoibIf("n1", "storage", "ib0", "mlx5_0", 1, "172.31.0.181", 24, "172.31.0.0/24", "connected", 65520)


def test_the_real_interface_matches_its_plan() -> None:
    link = check.parse_ip_addr(RHEL_IB0)["ib0"]
    assert check.interface_findings(PLANNED, link, "connected", simulated=False) == []


def test_each_difference_from_the_plan_is_an_error_naming_the_port() -> None:
    link = check.parse_ip_addr(RHEL_IB0)["ib0"]
    wrong_addr = check.interface_findings(dataclasses.replace(PLANNED, address="172.31.0.99"), link, "connected",
                                          False)
    assert [(f.severity, f.device, f.port, f.observed) for f in wrong_addr] == [
        ("error", "mlx5_0", 1, "172.31.0.181/24")]
    small = check.interface_findings(dataclasses.replace(PLANNED, mtu=2044, mode="datagram"), link, "connected",
                                     False)
    assert {f.message.split(",")[0] for f in small} == {"ib0: MTU 65520", "ib0: runs in connected mode"}
    down = dataclasses.replace(link, flags=("NO-CARRIER", "BROADCAST", "MULTICAST", "UP"), state="DOWN")
    (f,) = check.interface_findings(PLANNED, down, "connected", False)
    assert f.severity == "error" and "is down" in f.message and "ibstat" in f.hint
    (missing,) = check.interface_findings(PLANNED, None, None, False)
    assert "missing" in missing.message and missing.expected == "172.31.0.181/24"


def test_an_ethernet_link_is_not_ipoib_unless_the_site_says_simulated() -> None:
    eth = dataclasses.replace(check.parse_ip_addr(RHEL_IB0)["ib0"], link_type="ether")
    (real,) = check.interface_findings(PLANNED, eth, None, simulated=False)
    assert real.severity == "error" and "not an IPoIB interface" in real.message
    (sim,) = check.interface_findings(PLANNED, eth, None, simulated=True)
    assert sim.severity == "info" and "not checked" in sim.message


# ---------------------------------------------------------------- the whole check over a fake remote
SPEC = textwrap.dedent("""\
    cluster: {name: t, os: debian-12}
    software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: doca, version: "2.9.1"}}
    repositories:
      cuda: {url: "http://m/cuda", key: k.gpg}
      doca: {url: "http://m/doca", key: k.gpg}
    profiles:
      svc: {hcas: [{device: mlx5_0, rate: NDR, netdev: ib0}]}
    nodes:
      - {name: "n[1-3]", address: "10.0.0.[11-13]", profile: svc}
    fabric:
      rate: NDR
      topology: {kind: single_switch}
      subnet_manager: {kind: ufm}
      ipoib:
        - {name: storage, rail: 0, address: "172.31.0.[181-183]", subnet: 172.31.0.0/24, mode: datagram}
    """)


def _cluster(extra: str = "") -> Cluster:
    res = load_text(SPEC + extra, "c.yaml")
    assert res.cluster is not None, [d.format() for d in res.errors]
    return res.cluster


def _ip_addr(address: str, flags: str = "BROADCAST,MULTICAST,UP,LOWER_UP", mtu: int = 2044) -> str:
    """The real capture's ib0 with this node's address, flags and MTU (everything else as captured)."""
    return (RHEL_IB0.replace("172.31.0.181/24", f"{address}/24").replace("BROADCAST,MULTICAST,UP,LOWER_UP", flags)
            .replace("mtu 65520", f"mtu {mtu}") + f"{check.MODE_MARKER} ib0 datagram\n")


class FakeRemote:
    def __init__(self, tables: Mapping[str, str], answering: set[str]) -> None:
        self.tables = tables
        self.answering = answering
        self.pings: dict[str, list[str]] = {}

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        script = argv[-1]
        if script.startswith("ip addr show"):
            return Completed(0, self.tables[host], "")
        out = []
        for part in script.split("; for a in ")[1:] if "; for a in " in script else [script.split("for a in ", 1)[1]]:
            addrs = part.split(";")[0].split()
            iface = part.split("-I ")[1].split()[0]
            for a in addrs:
                self.pings.setdefault(host, []).append(a)
                ok = a in self.answering
                out.append(f"ping {iface} {a} {'ok' if ok else 'fail'}")
                if ok:
                    break
        return Completed(0, "\n".join(out) + "\n", "")

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        return {h: self.run(h, argv, timeout) for h, argv in commands.items()}


def test_healthy_network_passes_with_a_peer_answering() -> None:
    c = _cluster()
    tables = {f"n{i}": _ip_addr(f"172.31.0.18{i}") for i in (1, 2, 3)}
    remote = FakeRemote(tables, {"172.31.0.181", "172.31.0.182", "172.31.0.183"})
    results = check.check_ipoib(c, remote)  # type: ignore[arg-type]
    assert [(r.node, r.passed, r.measurements["healthy"]) for r in results] == [
        ("n1", True, 1), ("n2", True, 1), ("n3", True, 1)]
    assert remote.pings["n1"] == ["172.31.0.182"]  # the next member first, one answer is enough


def test_a_down_interface_is_blamed_on_its_node_not_on_the_peers() -> None:
    c = _cluster()
    tables = {"n1": _ip_addr("172.31.0.181"), "n2": _ip_addr("172.31.0.182", "NO-CARRIER,BROADCAST,MULTICAST,UP"),
              "n3": _ip_addr("172.31.0.183")}
    remote = FakeRemote(tables, {"172.31.0.181", "172.31.0.183"})
    results = {r.node: r for r in check.check_ipoib(c, remote)}  # type: ignore[arg-type]
    assert not results["n2"].passed and "is down" in results["n2"].findings[0].message
    assert results["n1"].passed and results["n3"].passed
    assert "172.31.0.182" not in remote.pings["n1"]  # the down peer is not tried


def test_a_wrong_address_and_a_silent_network_are_errors() -> None:
    c = _cluster()
    tables = {"n1": _ip_addr("172.31.0.181"), "n2": _ip_addr("172.31.0.99"), "n3": _ip_addr("172.31.0.183")}
    remote = FakeRemote(tables, set())  # nobody answers (e.g. this port is not in the partition)
    results = {r.node: r for r in check.check_ipoib(c, remote)}  # type: ignore[arg-type]
    (wrong,) = results["n2"].findings
    assert wrong.observed == "172.31.0.99/24" and wrong.expected == "172.31.0.182/24"
    (silent,) = results["n1"].findings
    assert silent.severity == "error" and "no peer on storage answers" in silent.message and silent.peer == "n3"


def test_an_unreachable_node_could_not_run() -> None:
    c = _cluster()

    class Dead(FakeRemote):
        def run(self, host: str, argv: Sequence[str], timeout: float,
                env: Mapping[str, str] | None = None) -> Completed:
            if host == "n3":
                return Completed(255, "", "ssh: connect to host n3: No route to host")
            return super().run(host, argv, timeout, env)

    remote = Dead({f"n{i}": _ip_addr(f"172.31.0.18{i}") for i in (1, 2)}, {"172.31.0.181", "172.31.0.182"})
    results = {r.node: r for r in check.check_ipoib(c, remote)}  # type: ignore[arg-type]
    assert results["n3"].error is not None and not results["n3"].passed
    assert results["n1"].passed


# ---------------------------------------------------------------- storage: NFS/RDMA over IPoIB, real mount lines
GDS_SPEC = textwrap.dedent("""\
    cluster: {name: t, os: debian-12}
    software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: doca, version: "2.9.1"}}
    repositories:
      cuda: {url: "http://m/cuda", key: k.gpg}
      doca: {url: "http://m/doca", key: k.gpg}
    profiles:
      svc: {hcas: [{device: mlx5_0, rate: NDR, netdev: ib9}]}
    nodes:
      - {name: server, address: 10.0.0.2, profile: svc, roles: [nfs_server]}
      - {name: client, address: 10.0.0.11, profile: svc}
    fabric:
      rate: NDR
      topology: {kind: single_switch}
      subnet_manager: {kind: ufm}
      ipoib:
        - {name: ib9net, rail: 0, address: "192.168.0.[10,20]", subnet: 192.168.0.0/24}
    storage:
      nfs:
        exports: [{server: server, path: /mnt/nfs_10/10, clients: 192.168.0.0/24}]
        mounts: [{server: server, export: /mnt/nfs_10/10, mount: /mnt/nfs/ib9/data/0, on: client, transport: rdma,
                  version: "3"}]
    """)


def test_real_mount_lines_parse() -> None:
    entries = storage.parse_mounts(GDS_MOUNTS)
    assert [(e.source, e.target, e.fstype) for e in entries][:2] == [
        ("192.168.0.10:/mnt/nfs_10/10", "/mnt/nfs/ib9/data/0", "nfs"),
        ("192.168.0.11:/mnt/nfs_11/11", "/mnt/nfs/ib9/data/1", "nfs")]
    assert {(e.option("proto"), e.option("port")) for e in entries} == {("rdma", "20049")}


def test_rdma_mount_over_the_servers_ipoib_address_passes() -> None:
    res = load_text(GDS_SPEC, "c.yaml")
    assert res.cluster is not None, [d.format() for d in res.errors]
    (exp,) = storage.expected_mounts(res.cluster)["client"]
    assert exp.address == "192.168.0.10" and exp.network == "ib9net" and exp.transport == "rdma"
    assert storage.mount_findings("client", [exp], storage.parse_mounts(GDS_MOUNTS)) == []


def test_rdma_mount_from_another_address_or_over_tcp_fails() -> None:
    moved = load_text(GDS_SPEC.replace('"192.168.0.[10,20]"', '"192.168.0.[12,20]"'), "c.yaml").cluster
    assert moved is not None
    (exp,) = storage.expected_mounts(moved)["client"]
    found = storage.mount_findings("client", [exp], storage.parse_mounts(GDS_MOUNTS))
    assert [f.message for f in found] == [
        "/mnt/nfs/ib9/data/0: mounted from 192.168.0.10:/mnt/nfs_10/10, the spec says 192.168.0.12:/mnt/nfs_10/10",
        "/mnt/nfs/ib9/data/0: the kernel talks to addr=192.168.0.10, not server's IPoIB address 192.168.0.12 on "
        "ib9net"]
    cluster = load_text(GDS_SPEC, "c.yaml").cluster
    assert cluster is not None
    (exp,) = storage.expected_mounts(cluster)["client"]
    fallback = GDS_MOUNTS.replace("proto=rdma,port=20049", "proto=tcp")  # what a TCP fallback shows
    (f,) = storage.mount_findings("client", [exp], storage.parse_mounts(fallback))
    assert (f.expected, f.observed) == ("rdma", "tcp") and "20049" in f.hint
