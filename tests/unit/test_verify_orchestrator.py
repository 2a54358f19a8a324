"""run_verify end to end with a fake remote that answers with real captured tool outputs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from provisioner.errors import UsageError
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
verify: {tests: [links, bandwidth, nccl], nccl: {min_busbw_gbps: 80}, bandwidth: {duration: 1}}
"""

IBSTAT = load("ibstat", "mooncake_roce_and_down.txt")
FAST = load("perftest", "alibaba_amd_ionic_bidir_client_gbits.txt")  # 779 Gb/s: above 90 % of 200
SLOW = load("perftest", "perftest273_postlist_gbits.txt")  # 0.48 Gb/s
NCCL = load("nccl-tests", "a3mega_16rank_allreduce.txt")
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
    """Implements provisioner.remote.Remote; answers each command with a captured real output."""

    def __init__(self, slow: set[str] = frozenset(), dead: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.slow, self.dead = slow, dead
        self.calls: list[tuple[str, tuple[str, ...], dict[str, str]]] = []
        self.servers: list[_Done] = []

    def _answer(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None) -> Completed:
        self.calls.append((host, tuple(argv), dict(env or {})))
        if host in self.dead:
            return Completed(RC_UNREACHABLE, "", f"{host}: cannot connect: timed out")
        tool = argv[0]
        if tool == "ibstat" or argv[-1].startswith("ibstat;"):  # links probe: ibstat (+ ibstatus, counters)
            return Completed(0, IBSTAT, "")
        if tool == "ib_write_bw":
            peer_host = next(h for h, a in ((n, f"10.0.0.{n[1:]}") for n in ("n1", "n2", "n3", "n4")) if a == argv[-1])
            return Completed(0, SLOW if {host, peer_host} & self.slow else FAST, "")
        if tool == "sh" and "mpirun " in argv[-1] and " all_reduce_perf " in argv[-1]:
            if any(f"10.0.0.{h[1:]} slots=" in argv[-1] for h in self.slow):
                return Completed(1, "", "Test NCCL failure common.cu:1005 'remote process exited'")
            return Completed(0, NCCL, "")  # 16 ranks: 4 nodes x 4 GPUs
        if argv[-1] == "command -v mpirun":
            return Completed(0, "/usr/bin/mpirun\n", "")
        if tool == "ofed_info":
            return Completed(0, OFED, "")
        if tool == "nvidia-smi":
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
        bg = _Done(Completed(0, "", ""))
        self.servers.append(bg)
        return bg

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        return {h: self._answer(h, a, env) for h, a in sorted(commands.items())}


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
    assert [(c.name, c.node) for c in cnr] == [("links", "n2")]
    assert report.verdict.exit_code == 2 and report.verdict.label == "INCOMPLETE"


def test_only_selects_tests_and_rejects_unknown() -> None:
    c = cluster()
    assert select_tests(c, None) == ["links", "versions", "sm", "bandwidth", "nccl"]
    assert select_tests(c, ["bandwidth", "links"]) == ["links", "bandwidth"]
    with pytest.raises(UsageError, match="unknown test"):
        select_tests(c, ["linkz"])


def test_write_false_leaves_no_files(tmp_path: Path) -> None:
    run = verify(cluster(), tests=["links"], remote=FakeRemote(), state_dir=tmp_path, write=False)
    assert run.directory is None and not (tmp_path / "verify").exists()
    assert run.exit_code == 0
