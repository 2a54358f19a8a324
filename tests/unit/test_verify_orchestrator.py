"""run_verify end to end with a fake remote that answers with real captured tool outputs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from provisioner.errors import RemoteError, UsageError
from provisioner.fabric import nccl_node
from provisioner.remote import RC_UNREACHABLE, Completed
from provisioner.spec import Cluster, load_text
from provisioner.verify import run_verify, select_tests, verify
from tests.unit._parser_fixtures import load

SPEC = """
cluster: {name: rc, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: mlnx_ofed, version: "23.07"}}
profiles:
  g: {gpu: {model: H100-SXM5-80GB, count: 4}, hcas: [{device: "mlx5_[0-1]", rate: 200, numa: 0}]}
nodes: [{name: "n[1-4]", address: "10.0.0.[1-4]", profile: g}]
fabric: {type: roce, rate: 200, roce: {pfc_priority: 3, ecn: true}}
verify: {tests: [links, bandwidth, nccl], nccl: {min_busbw_gbps: 80, min_single_node_busbw_gbps: 200},
         bandwidth: {duration: 1}}
"""

IBSTAT = load("ibstat", "mooncake_roce_and_down.txt")
FAST = load("perftest", "alibaba_amd_ionic_bidir_client_gbits.txt")  # 779 Gb/s: above 90 % of 200
SLOW = load("perftest", "perftest273_postlist_gbits.txt")  # 0.48 Gb/s
NCCL = load("nccl-tests", "a3mega_16rank_allreduce.txt")
NODE_NCCL = load("nccl-tests", "oci_a100x8_single_node.txt")  # one node's GPUs alone: 235 GB/s
OFED = load("ofed_info", "daocloud_mlnx_23_07.txt")


class _Done:
    def __init__(self, done: Completed) -> None:
        self.done = done
        self.killed = False

    def wait(self, timeout: float) -> Completed:
        return self.done

    def kill(self) -> None:
        self.killed = True


class FakeRemote:
    """Implements provisioner.remote.Remote; answers each command with a captured real output.

    A ``dead`` node fails as SshRemote fails on a node it cannot reach: ``run``/``start`` raise RemoteError,
    ``run_many`` gives rc 255 with the reason. ``dies_at`` = {node: tool}: the node stops answering from the
    first time that tool is started on it (reachable before).
    """

    def __init__(self, slow: set[str] = frozenset(), dead: Mapping[str, str] | set[str] = frozenset(),  # type: ignore[assignment]
                 dies_at: Mapping[str, str] | None = None) -> None:
        self.slow = slow
        self.dead = dict(dead) if isinstance(dead, Mapping) else {h: f"{h}: cannot connect: timed out" for h in dead}
        self.dies_at = dict(dies_at or {})
        self.calls: list[tuple[str, tuple[str, ...], dict[str, str]]] = []
        self.servers: list[_Done] = []

    def _check_alive(self, host: str, argv: Sequence[str]) -> None:
        if self.dies_at.get(host) == argv[0]:
            self.dead[host] = f"{host} (10.0.0.{host[1:]}:22): cannot connect: [Errno 111] Connection refused"
        if host in self.dead:
            raise RemoteError(self.dead[host])

    def _answer(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None) -> Completed:
        self.calls.append((host, tuple(argv), dict(env or {})))
        self._check_alive(host, argv)
        tool = argv[0]
        if tool == "ibstat" or argv[-1].startswith("ibstat;"):  # links probe: ibstat (+ ibstatus, counters)
            return Completed(0, IBSTAT, "")
        if tool == "ib_write_bw":
            peer_host = next(h for h, a in ((n, f"10.0.0.{n[1:]}") for n in ("n1", "n2", "n3", "n4")) if a == argv[-1])
            return Completed(0, SLOW if {host, peer_host} & self.slow else FAST, "")
        if list(argv[:3]) == ["sh", "-c", nccl_node.PROBE]:
            return Completed(0, NODE_NCCL, "")
        if tool == "sh" and "mpirun " in argv[-1] and " all_reduce_perf " in argv[-1]:
            if any(f"10.0.0.{h[1:]} slots=" in argv[-1] for h in self.slow):
                return Completed(1, "", "Test NCCL failure common.cu:1005 'remote process exited'")
            return Completed(0, NCCL, "")  # 16 ranks: 4 nodes x 4 GPUs
        if argv[-1] == "command -v mpirun":
            return Completed(0, "/usr/bin/mpirun\n", "")
        if tool == "ofed_info":
            return Completed(0, OFED, "")
        if tool == "nvidia-smi":
            if "--query-gpu=persistence_mode" in argv:
                return Completed(0, "Enabled\nEnabled\n", "")
            return Completed(0, "550.90.07\n550.90.07\n", "")
        if argv[-1].startswith("cat /usr/local/cuda"):
            return Completed(0, json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}), "")
        if "libnccl" in argv[-1]:
            return Completed(0, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5\n", "")
        return Completed(1, "", "")  # command -v numactl: absent

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        return self._answer(host, argv, env)

    def start(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> _Done:
        self.calls.append((host, tuple(argv), dict(env or {})))
        self._check_alive(host, argv)
        bg = _Done(Completed(0, "", ""))
        self.servers.append(bg)
        return bg

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        out = {}
        for h, a in sorted(commands.items()):
            try:
                out[h] = self._answer(h, a, env)
            except RemoteError as exc:
                out[h] = Completed(RC_UNREACHABLE, "", str(exc))
        return out


def cluster() -> Cluster:
    res = load_text(SPEC, "cluster.yaml")
    assert res.cluster is not None
    return res.cluster


def clock() -> object:
    ticks = iter([datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC), datetime(2025, 1, 2, 3, 5, 0, tzinfo=UTC)] * 4)
    return lambda: next(ticks)


def test_healthy_run_passes_writes_reports_and_stores_a_baseline(tmp_path: Path) -> None:
    remote = FakeRemote()
    run = verify(cluster(), remote=remote, state_dir=tmp_path, now=clock(), server_grace_s=0)  # type: ignore[arg-type]
    assert run.exit_code == 0, [f.message for f in run.report.findings()]
    out = tmp_path / "verify" / "20250102T030405Z"
    assert run.directory == out
    assert (tmp_path / "verify" / "latest").resolve() == out.resolve()
    data = json.loads((out / "report.json").read_text())
    assert data["verdict"]["label"] == "PASS"
    assert {c["name"] for c in data["checks"]} >= {"links", "versions", "bandwidth", "nccl", "sm_lid"}
    ET.fromstring((out / "junit.xml").read_text())
    assert "<html" in (out / "report.html").read_text()
    assert json.loads((out / "inventory.json").read_text())["n1"]["mlx5_0/1"] == "0x5aa2e1fffedae626"
    assert (tmp_path / "verify" / "baseline.json").is_file()
    assert all(bg.killed for bg in remote.servers) and len(remote.servers) == 4  # 2 pairs × 2 rails
    nccl_call = next(c for c in remote.calls if "all_reduce_perf" in c[1][-1])
    assert nccl_call[0] == "n1" and nccl_call[2] == {} and nccl_call[1][:2] == ("sh", "-c")
    assert "10.0.0.1 slots=4\n10.0.0.2 slots=4\n10.0.0.3 slots=4\n10.0.0.4 slots=4\n" in nccl_call[1][2]
    assert data["checks"][[c["name"] for c in data["checks"]].index("nccl")]["measurements"]["nranks"] == 16
    single = {c["node"]: c for c in data["checks"] if c["name"] == "nccl_node"}  # each node's GPUs alone first
    assert sorted(single) == ["n1", "n2", "n3", "n4"] and all(c["passed"] for c in single.values())
    assert single["n1"]["measurements"]["busbw_gbps"] == 235.14 and single["n1"]["measurements"]["floor_gbps"] == 200
    probes = [c for c in remote.calls if c[1][:3] == ("sh", "-c", nccl_node.PROBE)]
    assert [c[1][3:] for c in probes] == [("sh", "8G", "4")] * 4


def test_slow_node_fails_with_the_node_named(tmp_path: Path) -> None:
    report = run_verify(cluster(), remote=FakeRemote(slow={"n3"}), state_dir=tmp_path, server_grace_s=0)
    assert report.verdict.exit_code == 1
    errors = [f for f in report.findings() if f.severity == "error"]
    bw_errors = {(f.node, f.rail) for f in errors if f.check == "pairwise_bandwidth"}
    assert bw_errors == {("n3", 0), ("n3", 1)}
    assert any(f.check == "nccl" and f.node == "n3" and f.severity == "error" for f in report.findings())
    assert not (tmp_path / "verify" / "baseline.json").exists()  # a failing run is never the baseline


def test_unreachable_node_is_could_not_run_not_a_crash(tmp_path: Path) -> None:
    report = run_verify(cluster(), tests=["links"], remote=FakeRemote(dead={"n2"}), state_dir=tmp_path)
    cnr = [c for c in report.checks if not c.ran]
    assert [(c.name, c.node, c.error) for c in cnr] == [("ssh", "n2", "n2: cannot connect: timed out")]
    assert report.verdict.exit_code == 2 and report.verdict.label == "INCOMPLETE"


HOST_KEY_CHANGED = ("n2 (10.0.0.2): host key CHANGED: offered ssh-ed25519 SHA256:KNZ4wZ0nC3eUj1Vf3m6CkTjQ9JbqvYhWm2bx"
                    "d0yFq9s, known_hosts has SHA256:3oNn0v0gk3p6GmZ5vY2kqkQ0bY5lq7Zl1wq3tqkq9aA; refusing to connect "
                    "(if the node was reinstalled or swapped, confirm the new fingerprint on its console)")


def _mentions(report: object, node: str) -> list[str]:
    """Every finding (any severity) that names ``node`` as where it is or as the peer."""
    return [f"{f.check} {f.location()}: {f.message}" for f in report.findings()  # type: ignore[attr-defined]
            if node in (f.node, f.peer) or node in f.message]


def test_node_with_a_changed_host_key_is_one_could_not_run_and_no_port_is_blamed(tmp_path: Path) -> None:
    """n2 refuses us (its host key changed): one "could not run" with the reason; its pairs are skipped, not
    failed; the other nodes are measured among themselves and pass; nobody's port is localised as bad."""
    remote = FakeRemote(dead={"n2": HOST_KEY_CHANGED})
    run = verify(cluster(), tests=["links", "versions", "bandwidth", "nccl"], remote=remote, state_dir=tmp_path,
                 server_grace_s=0)
    report = run.report
    cnr = [(c.name, c.node, c.error) for c in report.checks if not c.ran]
    assert cnr == [("ssh", "n2", HOST_KEY_CHANGED)], cnr
    assert _mentions(report, "n2") == []
    # The job ran on the 3 reachable nodes (12 ranks expected); the fake answers with its one real capture, a
    # 16-rank table, so the only finding is the rank count, and it names no node.
    [odd] = [f for f in report.findings() if f.severity != "info"]
    assert (odd.check, odd.node, odd.expected, odd.observed) == ("nccl", None, 12, 16)
    skipped = {(c.name, c.node): c.skipped or "" for c in report.checks if c.skipped is not None}
    assert set(skipped) == {("bandwidth", "n2"), ("nccl", "n2")}, skipped
    assert all("n2 could not be reached" in why and "host key" not in why for why in skipped.values()), skipped
    bw = next(c for c in report.checks if c.name == "bandwidth" and c.node is None)
    assert bw.passed and bw.measurements["pairs_tested"] == 4  # n1,n3,n4: round 1 + the odd node out, 2 rails
    assert all("n2" not in pair for m in report.bandwidth.values() for pair in m)
    nccl_call = next(c for c in remote.calls if "all_reduce_perf" in c[1][-1])
    assert "10.0.0.1 slots=4\n10.0.0.3 slots=4\n10.0.0.4 slots=4\n'" in nccl_call[1][-1]
    assert " -np 12 " in nccl_call[1][-1]
    assert sum(1 for c in remote.calls if c[0] == "n2") == 1  # asked once, then left alone
    assert report.verdict.could_not_run == 1 and report.verdict.exit_code == 1  # the rank-count finding wins


def test_node_lost_during_bandwidth_is_dropped_and_the_rest_measured_again(tmp_path: Path) -> None:
    """n3 answered the first probes, then refuses connections when its first ib_write_bw starts: its pairs'
    failures are not evidence against anyone's port; bandwidth is measured again without it."""
    remote = FakeRemote(dies_at={"n3": "ib_write_bw"})
    report = run_verify(cluster(), tests=["links", "bandwidth"], remote=remote, state_dir=tmp_path, server_grace_s=0)
    cnr = [(c.name, c.node) for c in report.checks if not c.ran]
    assert cnr == [("ssh", "n3")], cnr
    assert "Connection refused" in (next(c for c in report.checks if not c.ran).error or "")
    assert _mentions(report, "n3") == []
    assert [f for f in report.findings() if f.severity != "info"] == []
    assert {(c.name, c.node) for c in report.checks if c.skipped is not None} == {("bandwidth", "n3")}
    bw = next(c for c in report.checks if c.name == "bandwidth" and c.node is None)
    assert bw.passed and all("n3" not in pair for m in report.bandwidth.values() for pair in m)
    assert report.verdict.exit_code == 2


def test_only_selects_tests_and_rejects_unknown() -> None:
    c = cluster()
    assert select_tests(c, None) == ["links", "versions", "bandwidth", "nccl"]  # RoCE: no SM goes with links
    assert select_tests(c, ["bandwidth", "links"]) == ["links", "bandwidth"]
    with pytest.raises(UsageError, match="unknown test"):
        select_tests(c, ["linkz"])


def test_write_false_leaves_no_files(tmp_path: Path) -> None:
    run = verify(cluster(), tests=["links"], remote=FakeRemote(), state_dir=tmp_path, write=False)
    assert run.directory is None and not (tmp_path / "verify").exists()
    assert run.exit_code == 0


PEER_SPEC = """
cluster: {name: peers, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: mlnx_ofed, version: "23.07"}}
profiles:
  g: {gpu: {model: H100-SXM5-80GB, count: 2}, hcas: [{device: "mlx5_[0-1]", rate: 200, numa: 0}]}
  svc: {hcas: [{device: mlx5_0, rate: 200, purpose: storage}]}
nodes:
  - {name: "n[1-3]", address: "10.0.0.[1-3]", profile: g}
  - {name: s1, address: 10.0.0.21, profile: svc, roles: [login, nfs_server]}
  - {name: s2, address: 10.0.0.22, profile: svc, roles: [login]}
fabric: {type: roce, rate: 200, roce: {pfc_priority: 3, ecn: true}}
verify: {tests: [links]}
"""


class FirmwareRemote(FakeRemote):
    """Each node's HCAs report the firmware given for it (else the capture's 28.39.1002)."""

    def __init__(self, firmware: Mapping[str, str]) -> None:
        super().__init__()
        self.firmware = firmware

    def _answer(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None) -> Completed:
        done = super()._answer(host, argv, env)
        if host in self.firmware and done.stdout.startswith(IBSTAT[:20]):
            return done._replace(stdout=done.stdout.replace("28.39.1002", self.firmware[host]))
        return done


def test_versions_drift_only_between_peers_of_one_profile_and_roles(tmp_path: Path) -> None:
    """s2 (login) is no peer of s1 (login + nfs_server) nor of the GPU nodes: its firmware and its lack of a
    GPU driver are not drift. n3's firmware differs from n1's and n2's (same profile, same roles): drift."""
    res = load_text(PEER_SPEC, "cluster.yaml")
    assert res.cluster is not None, [d.format() for d in res.diagnostics]
    remote = FirmwareRemote({"s2": "28.40.1000", "n3": "28.41.2000"})
    run = verify(res.cluster, tests=["versions"], remote=remote, state_dir=tmp_path)  # type: ignore[arg-type]
    drift = [(f.node, f.device, f.observed) for f in run.report.findings() if f.check == "versions"]
    assert drift == [("n3", "mlx5_0", "28.41.2000"), ("n3", "mlx5_1", "28.41.2000")], drift
    data = json.loads((run.directory / "report.json").read_text())  # type: ignore[operator]
    mismatched = {(m["node"], m["component"]) for m in data["version_mismatches"]}
    assert mismatched == {("n3", "firmware mlx5_0"), ("n3", "firmware mlx5_1")}, mismatched


def test_too_few_reachable_nodes_is_the_lost_nodes_cause_not_another(tmp_path: Path) -> None:
    """Three of four nodes cannot be reached: bandwidth and NCCL have no pair left. That is the same cause as
    the three ssh results, so they are skipped (with the count), not a could-not-run of their own."""
    remote = FakeRemote(dead={"n2", "n3", "n4"})
    report = run_verify(cluster(), tests=["links", "bandwidth", "nccl"], remote=remote, state_dir=tmp_path)
    assert [(c.name, c.node) for c in report.checks if not c.ran] == [("ssh", "n2"), ("ssh", "n3"), ("ssh", "n4")]
    cluster_wide = {c.name: c.skipped for c in report.checks if c.node is None and c.skipped is not None}
    assert cluster_wide == {
        "bandwidth": "needs two compute nodes with rails, found 1: 3 of 4 nodes could not be reached (see the ssh "
                     "results)",
        "nccl": "needs two GPU compute nodes, found 1: 3 of 4 nodes could not be reached (see the ssh results)"}
    assert report.verdict.exit_code == 2
