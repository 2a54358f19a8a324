"""Drift: manifests against the spec's pins and against each other (pure), fetching with a fake remote,
storage, and the run engine's after-converge hook.

The manifests here are the manifest role's own JSON format (not a tool's output), built by a helper from the
lab spec's pins; each test changes one thing and checks the finding that names it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from provisioner.drift import (
    ABSENT,
    DriftReport,
    ManifestError,
    check_cluster,
    compare,
    fetch_manifests,
    load_latest,
    parse_manifest,
    peer_findings,
    summary_lines,
)
from provisioner.errors import RemoteError
from provisioner.phases import Engine, RunOptions, StepContext, StepOutcome, plan_run
from provisioner.remote import Completed
from provisioner.runner import FakeRun, PlaybookResult, fake_result
from provisioner.spec import load_cluster
from provisioner.spec.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
GPU_NODES = ["gpu01", "gpu02", "gpu03"]
SVC_NODES = ["sm1", "sm2"]


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    c, _ = load_cluster(ROOT / "examples" / "lab" / "cluster.yaml")
    return c


def manifest(gpu: bool, **packages: str) -> dict[str, Any]:
    """What the role writes on a converged lab node of examples/lab/cluster.yaml (pins: 550.90.07, 12.4.1,
    2.21.5, DOCA 2.9.1), with package versions overridden by keyword (name with _ for -; '' drops it)."""
    pkgs = {"doca-ofed": "2.9.1-1", "ofed-scripts": "24.10.OFED.24.10.1.1.4.0-1", "perftest": "24.10.0-1"}
    mods: dict[str, str | None] = {"ib_core": None, "mlx5_core": None, "mlx5_ib": None}
    if gpu:
        pkgs |= {"nvidia-driver-550-open": "550.90.07-0ubuntu1", "nvidia-fabricmanager-550": "550.90.07-1",
                 "cuda-toolkit-12-4": "12.4.1-1", "libnccl2": "2.21.5-1+cuda12.4",
                 "nccl-tests": "2.13.10-1+nccl2.21.5+cuda12.4"}
        mods |= {"nvidia": "550.90.07", "nvidia_peermem": None}
    for name, version in packages.items():
        key = name.replace("_", "-")
        if version:
            pkgs[key] = version
        else:
            pkgs.pop(key, None)
    return {"schema": 1, "hostname": "x", "os": {"id": "debian", "version_id": "12"}, "kernel": "6.1.0-28-amd64",
            "packages": dict(sorted(pkgs.items())), "holds": sorted(k for k in pkgs if k.startswith(("libnccl",))),
            "ofed": "OFED-internal-24.10-1.1.4.0", "modules": mods,
            "hcas": {"mlx5_0": {"fw_ver": "28.39.1002", "board_id": "MT_0000000838", "node_guid": "0x0002c90300000001",
                                "ports": {"1": {"port_guid": "0x0002c90300000001", "link_layer": "InfiniBand"}}}}}


def fleet() -> dict[str, dict[str, Any]]:
    return {**{n: manifest(True) for n in GPU_NODES}, **{n: manifest(False) for n in SVC_NODES}}


def test_converged_fleet_has_no_drift(cluster: Cluster) -> None:
    assert compare(cluster, fleet()) == []


def test_newer_nccl_on_one_node_is_off_the_spec_and_off_its_peers(cluster: Cluster) -> None:
    m = fleet()
    m["gpu02"] = manifest(True, libnccl2="2.23.4-1+cuda12.4")
    found = compare(cluster, m)
    spec = [f for f in found if f.kind == "spec"]
    assert [(f.node, f.item, f.expected, f.observed) for f in spec] == [("gpu02", "nccl", "2.21.5",
                                                                         "2.23.4-1+cuda12.4")]
    assert spec[0].severity == "error"
    peers = [f for f in found if f.kind == "peers"]
    assert [(f.node, f.item, f.expected, f.observed) for f in peers] == [
        ("gpu02", "package:libnccl2", "2.21.5-1+cuda12.4", "2.23.4-1+cuda12.4")]
    assert "2 of 3 nodes of profile gpu2" in peers[0].message and peers[0].severity == "warning"


def test_missing_pinned_package_is_named(cluster: Cluster) -> None:
    m = fleet()
    m["gpu03"] = manifest(True, nccl_tests="")
    spec = [f for f in compare(cluster, m) if f.kind == "spec"]
    assert [(f.node, f.item, f.expected, f.observed) for f in spec] == [("gpu03", "nccl_tests", "2.13.10", None)]
    assert "not installed on gpu03" in spec[0].message


def test_nccl_built_for_another_cuda(cluster: Cluster) -> None:
    m = fleet()
    for n in GPU_NODES:
        m[n] = manifest(True, libnccl2="2.21.5-1+cuda12.6")
    spec = [f for f in compare(cluster, m) if f.kind == "spec"]
    assert {(f.node, f.item, f.expected, f.observed) for f in spec} == {
        (n, "nccl_cuda_build", "12.4", "12.6") for n in GPU_NODES}
    assert not [f for f in compare(cluster, m) if f.kind == "peers"]  # all alike: no peer drift


def test_driver_of_the_other_flavour_counts_as_missing(cluster: Cluster) -> None:
    m = fleet()
    m["gpu01"] = manifest(True, nvidia_driver_550_open="", nvidia_driver_550="550.90.07-0ubuntu1")
    spec = [f for f in compare(cluster, m) if f.kind == "spec"]
    assert [(f.node, f.item, f.observed) for f in spec] == [("gpu01", "driver", None)]


def test_service_nodes_are_not_held_to_gpu_pins(cluster: Cluster) -> None:
    m = fleet()
    assert "libnccl2" not in m["sm1"]["packages"]
    assert not [f for f in compare(cluster, m) if f.node in SVC_NODES]


def test_module_missing_on_one_node_names_the_majority(cluster: Cluster) -> None:
    m = fleet()
    del m["gpu01"]["modules"]["nvidia_peermem"]
    peers = [f for f in compare(cluster, m) if f.kind == "peers"]
    assert [(f.node, f.item, f.expected, f.observed) for f in peers] == [
        ("gpu01", "module:nvidia_peermem", "loaded", ABSENT)]


def test_two_nodes_that_disagree_have_no_majority(tmp_path: Path) -> None:
    # sm1 and sm2 as peers (same profile and roles: both subnet managers only)
    text = (ROOT / "examples" / "lab" / "cluster.yaml").read_text()
    old = "roles: [subnet_manager, nfs_server]}   # serves the exports"
    assert old in text
    spec = tmp_path / "peers.yaml"
    spec.write_text(text.replace(old, "roles: [subnet_manager]}"))
    m = fleet()
    m["sm2"]["kernel"] = "6.1.0-31-amd64"
    peers = [f for f in compare(load_cluster(spec)[0], m) if f.kind == "peers"]
    assert sorted((f.node, f.item, f.expected, f.observed) for f in peers) == [
        ("sm1", "kernel", None, "6.1.0-28-amd64"), ("sm2", "kernel", None, "6.1.0-31-amd64")]
    assert "6.1.0-28-amd64 on sm1; 6.1.0-31-amd64 on sm2" in peers[0].message


def test_firmware_and_holds_are_compared_but_guids_are_not() -> None:
    a, b, c = manifest(True), manifest(True), manifest(True)
    c["hcas"]["mlx5_0"]["fw_ver"] = "28.41.1000"
    c["holds"] = []
    for i, m in enumerate((a, b, c)):
        m["hcas"]["mlx5_0"]["ports"]["1"]["port_guid"] = f"0x0002c9030000000{i}"
    found = peer_findings({"g": ["a", "b", "c"]}, {"a": a, "b": b, "c": c})
    assert sorted((f.node, f.item, f.expected, f.observed) for f in found) == [
        ("c", "firmware:mlx5_0", "28.39.1002", "28.41.1000"), ("c", "holds", "libnccl2", "(none)")]


def test_parse_manifest_errors_are_one_line_with_the_node() -> None:
    with pytest.raises(ManifestError, match=r"^gpu01: /var/lib/provisioner/manifest.json is not JSON"):
        parse_manifest("{not json", "gpu01")
    with pytest.raises(ManifestError, match="schema 7"):
        parse_manifest(json.dumps({**manifest(True), "schema": 7}), "gpu01")
    bad = manifest(True)
    del bad["packages"]
    with pytest.raises(ManifestError, match="lacks 'packages'"):
        parse_manifest(json.dumps(bad), "gpu01")
    assert parse_manifest(json.dumps(manifest(True)), "gpu01")["packages"]["libnccl2"] == "2.21.5-1+cuda12.4"


class FakeRemote:
    """run_many over canned results, recording the commands (what SshRemote would run)."""

    def __init__(self, results: Mapping[str, Completed]) -> None:
        self.results = results
        self.commands: dict[str, list[str]] = {}

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        self.commands = {h: list(c) for h, c in commands.items()}
        return {h: self.results[h] for h in commands}


def test_fetch_sorts_manifests_from_nodes_without_one() -> None:
    remote = FakeRemote({
        "gpu01": Completed(0, json.dumps(manifest(True)), ""),
        "gpu02": Completed(1, "", "cat: /var/lib/provisioner/manifest.json: No such file or directory\n"),
        "gpu03": Completed(255, "", "gpu03 (10.0.0.3:22): cannot connect: timed out"),
        "sm1": Completed(0, "garbage", ""),
    })
    manifests, missing = fetch_manifests(remote, ["gpu01", "gpu02", "gpu03", "sm1"])
    assert remote.commands["gpu01"] == ["cat", "/var/lib/provisioner/manifest.json"]
    assert list(manifests) == ["gpu01"]
    assert missing["gpu02"].endswith("No such file or directory")
    assert missing["gpu03"].startswith("unreachable: gpu03")
    assert "is not JSON" in missing["sm1"]


def test_check_cluster_stores_report_and_manifests(cluster: Cluster, tmp_path: Path) -> None:
    m = fleet()
    m["gpu02"] = manifest(True, libnccl2="2.23.4-1+cuda12.4")
    results = {n: Completed(0, json.dumps(v), "") for n, v in m.items()}
    results["sm2"] = Completed(255, "", "sm2: cannot connect")
    report = check_cluster(cluster, tmp_path, run_id="20260101T000000.000000Z-abc123",
                           remote=FakeRemote(results))
    assert report.missing == {"sm2": "unreachable: sm2: cannot connect"}
    assert report.note() == "4 manifest(s): 1 off the spec, 1 peer drift, 1 without manifest"
    latest = load_latest(tmp_path)
    assert latest is not None and latest.to_json() == report.to_json()
    run_copy = json.loads((tmp_path / "runs" / "20260101T000000.000000Z-abc123" / "drift.json").read_text())
    assert run_copy["findings"][0]["node"] == "gpu02" and run_copy["findings"][0]["severity"] == "error"
    stored = json.loads((tmp_path / "manifests" / "gpu02.json").read_text())
    assert stored["packages"]["libnccl2"] == "2.23.4-1+cuda12.4"
    lines = summary_lines(latest)
    assert any(line.startswith("  ERROR   gpu02 nccl:") for line in lines)
    assert lines[-1] == "  WARNING sm2: no manifest (unreachable: sm2: cannot connect)"


def test_no_report_yet(tmp_path: Path) -> None:
    assert load_latest(tmp_path) is None
    assert DriftReport("t", []).note() == "0 manifest(s): 0 off the spec, 0 peer drift"


# --- the run engine's hook -------------------------------------------------------------------------------------
PLAYBOOKS = ["preflight.yml", "repos.yml", "ofed.yml", "gpu_stack.yml", "fabric.yml", "storage.yml", "slurm.yml"]
HOSTS = ["gpu01", "gpu02", "gpu03", "sm1"]


def _runner(script: Mapping[str, FakeRun]) -> Any:
    def run(playbook: Path, inventory_dir: Path, *, limit: Sequence[str], **kw: Any) -> PlaybookResult:
        return fake_result(playbook.name, list(limit), script.get(playbook.name, FakeRun()))
    return run


def _engine(tmp_path: Path, hook: Any, options: RunOptions, script: Mapping[str, FakeRun] | None = None) -> Engine:
    d = tmp_path / "playbooks"
    d.mkdir(parents=True, exist_ok=True)
    for name in PLAYBOOKS:
        (d / name).write_text("---\n")
    steps = {p: (lambda c: StepOutcome()) for p in ("validate", "render", "verify", "report")}
    return Engine("c1", "cluster.yaml", tmp_path / "state", tmp_path / "inv", {}, options, playbooks_dir=d,
                  runner=_runner(script or {}), steps=steps, after_converge=hook)


def test_hook_runs_once_after_the_last_converge_phase_on_the_hosts_left(tmp_path: Path) -> None:
    calls: list[StepContext] = []

    def hook(ctx: StepContext) -> str:
        calls.append(ctx)
        return "drift: 3 manifest(s): 0 off the spec, 0 peer drift"

    opts = RunOptions(max_fail=50)
    j = _engine(tmp_path, hook, opts, {"ofed.yml": FakeRun(failed={"gpu02": "boom"})}).execute(plan_run(HOSTS, opts))
    # the last converge phase is slurm (after storage): the manifests are all written by then
    assert [(c.phase, c.hosts) for c in calls] == [("slurm", ["gpu01", "gpu03", "sm1"])]
    assert calls[0].run_dir.name == j.run_id
    last = j.phase("slurm")
    assert last is not None and last.note == "drift: 3 manifest(s): 0 off the spec, 0 peer drift"


def test_hook_follows_only_and_skips_check_mode(tmp_path: Path) -> None:
    calls: list[str] = []

    def hook(ctx: StepContext) -> None:
        calls.append(ctx.phase)

    opts = RunOptions(only=["gpu_stack"])
    _engine(tmp_path, hook, opts).execute(plan_run(HOSTS, opts))
    assert calls == ["gpu_stack"]
    check = RunOptions(check=True)
    _engine(tmp_path / "c", hook, check).execute(plan_run(HOSTS, check))
    assert calls == ["gpu_stack"]


def test_hook_failure_is_a_note_not_a_failed_run(tmp_path: Path) -> None:
    def hook(ctx: StepContext) -> str:
        raise RemoteError("known_hosts file /x does not exist")

    opts = RunOptions()
    j = _engine(tmp_path, hook, opts).execute(plan_run(HOSTS, opts))
    assert j.status == "passed"
    last = j.phase("slurm")
    assert last is not None and last.note == "drift check could not run: known_hosts file /x does not exist"


def test_peers_are_grouped_by_profile_and_roles(tmp_path: Path) -> None:
    from provisioner.drift import peer_groups

    # the lab example: sm1 and sm2 share the svc profile, only sm1 has the nfs_server role
    groups = peer_groups(load_cluster(Path(__file__).parents[2] / "examples" / "lab" / "cluster.yaml")[0])
    assert groups["profile svc with roles nfs_server, subnet_manager"] == ["sm1"]
    assert groups["profile svc with roles subnet_manager"] == ["sm2"]
