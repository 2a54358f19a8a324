"""The verification checks as pure functions: real captured outputs (tests/fixtures) and synthetic parsed dicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from provisioner.fabric import baseline, cabling, gpudirect, links, nccl, versions
from provisioner.fabric.bandwidth import check_bandwidth, line_rates, rail_groups
from provisioner.fabric.findings import Verdict
from provisioner.fabric.perftest import PairRun, PerftestSettings, perftest_argv, read_result
from provisioner.lab import packages
from provisioner.parsers import parse
from provisioner.remote import Completed
from provisioner.spec import Cluster, load_text
from tests.unit._parser_fixtures import load

HERE = Path(__file__).resolve().parent


def cluster_from(text: str) -> Cluster:
    res = load_text(text, "cluster.yaml")
    assert res.cluster is not None, [str(d) for d in res.errors]
    return res.cluster


ROCE = """
cluster: {name: rc, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: mlnx_ofed, version: "23.07"}}
profiles:
  g: {gpu: {model: H100-SXM5-80GB, count: 2}, hcas: [{device: "mlx5_[0-1]", rate: 200, numa: 0}]}
nodes: [{name: "n[1-4]", address: "10.0.0.[1-4]", profile: g}]
fabric: {type: roce, rate: 200, roce: {pfc_priority: 3, ecn: true}}
"""

IB = """
cluster: {name: ib, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: doca, version: "2.9.1"}}
profiles:
  g: {gpu: {model: H100-SXM5-80GB, count: 2}, hcas: [{device: "mlx5_[0-1]", rate: NDR}]}
  s: {hcas: [{device: mlx5_0, rate: NDR}]}
nodes:
  - {name: "gpu[01-04]", address: "10.0.0.[1-4]", profile: g}
  - {name: sm1, address: 10.0.0.9, profile: s, roles: [subnet_manager]}
fabric:
  rate: NDR
  subnet_manager: {kind: opensm, nodes: [{node: sm1, priority: 15}]}
storage:
  nfs: {mounts: [{server: sm1, export: /export/shared, mount: /shared}]}
verify: {nccl: {min_busbw_gbps: 80}}
"""


def ib_port(state: str = "active", phys: str = "linkup", rate: float | None = 400.0, sm_lid: int | None = 1,
            layer: str = "infiniband", guid: str = "0xa088c20300000001") -> dict[str, Any]:
    return {"port": 1, "state": state, "physical_state": phys, "rate_gbps": rate, "base_lid": 5,
            "sm_lid": sm_lid, "port_guid": guid, "link_layer": layer}


def ibstat_of(**ports: dict[str, Any]) -> dict[str, Any]:
    return {"tool": "ibstat", "errors": [], "warnings": [], "devices": [
        {"name": dev, "firmware": "28.39.1002", "ports": [p]} for dev, p in ports.items()]}


# ---------------------------------------------------------------- links


def test_links_roce_fixture_passes_the_two_active_ports() -> None:
    c = cluster_from(ROCE)
    found = links.port_findings(c.node("n1"), parse("ibstat", load("ibstat", "mooncake_roce_and_down.txt")))
    assert found == []


def test_links_fixture_missing_device_is_named() -> None:
    c = cluster_from(ROCE.replace('"mlx5_[0-1]"', '"mlx5_[0-2]"'))
    found = links.port_findings(c.node("n1"), parse("ibstat", load("ibstat", "mooncake_roce_and_down.txt")))
    assert [(f.device, f.observed) for f in found] == [("mlx5_2", "missing")]
    assert "mlx5_0, mlx5_1, mlx5_10" in found[0].message


def test_links_fixture_init_port_points_at_the_subnet_manager() -> None:
    c = cluster_from(IB.replace('"mlx5_[0-1]", rate: NDR', 'mlx5_0, rate: EDR'))
    found = links.port_findings(c.node("gpu01"), parse("ibstat", load("ibstat", "mesa_cx4_initializing.txt")))
    assert len(found) == 1 and found[0].observed == "init/linkup"
    assert "subnet manager" in found[0].hint


def test_links_fixture_ibpanic_is_an_error() -> None:
    c = cluster_from(ROCE)
    found = links.port_findings(c.node("n1"), parse("ibstat", load("ibstat", "azhpc_ibpanic_only.txt")))
    assert any(f.message.startswith("ibstat: ibpanic") for f in found)
    assert {f.device for f in found if f.observed == "missing"} == {"mlx5_0", "mlx5_1"}


@pytest.mark.parametrize(
    ("rate", "phrase"),
    [(200.0, "width degraded to 2X"), (100.0, "width degraded to 1X"), (200.0 * 1, "2X")],
)
def test_degraded_width_is_named(rate: float, phrase: str) -> None:
    c = cluster_from(IB)
    found = links.port_findings(c.node("gpu01"), ibstat_of(mlx5_0=ib_port(), mlx5_1=ib_port(rate=rate)))
    assert len(found) == 1 and found[0].device == "mlx5_1" and found[0].severity == "error"
    assert phrase in found[0].message


def test_degraded_speed_is_named_apart_from_width() -> None:
    assert links.explain_rate(400, 200, "4X").startswith("width degraded to 2X")
    assert "or speed degraded to HDR" in links.explain_rate(400, 200, "4X")  # NDR 2X = HDR 4X = 200 Gb/s
    assert links.explain_rate(400, 100, "4X").startswith("width degraded to 1X")
    assert links.explain_rate(200, 100, "4X").startswith("width degraded to 2X")
    assert links.explain_rate(400, 56, "4X").startswith("speed degraded to FDR")
    assert links.explain_rate(200, 100 * 4 / 4, "4X") != links.explain_rate(400, 300, "4X")


def test_down_disabled_wrong_layer_and_missing_sm_lid() -> None:
    c = cluster_from(IB)
    obs = ibstat_of(mlx5_0=ib_port(state="down", phys="disabled", rate=None, sm_lid=None),
                    mlx5_1=ib_port(layer="ethernet", sm_lid=0))
    found = links.port_findings(c.node("gpu01"), obs)
    by = {(f.device, f.expected): f for f in found}
    assert by[("mlx5_0", "Active/LinkUp")].observed == "down/disabled"
    assert "disabled" in by[("mlx5_0", "Active/LinkUp")].hint
    assert by[("mlx5_1", "infiniband")].observed == "ethernet"
    assert by[("mlx5_1", "SM LID set")].severity == "error"


def test_sm_lid_must_agree_across_nodes() -> None:
    c = cluster_from(IB)
    obs = {n: ibstat_of(mlx5_0=ib_port(), mlx5_1=ib_port()) for n in ("gpu01", "gpu02", "gpu03")}
    obs["gpu04"] = ibstat_of(mlx5_0=ib_port(sm_lid=7), mlx5_1=ib_port())
    found = links.sm_lid_findings(c.nodes, obs)
    assert [(f.node, f.device, f.observed, f.expected) for f in found] == [("gpu04", "mlx5_0", 7, 1)]
    assert links.sm_lid_findings(c.nodes, {n: obs["gpu01"] for n in obs}) == []


def test_port_guids_and_firmware_inventory_from_fixture() -> None:
    parsed = parse("ibstat", load("ibstat", "mooncake_roce_and_down.txt"))
    guids = links.port_guids(parsed)
    assert guids["mlx5_0/1"] == "0x5aa2e1fffedae626" and "mlx5_10/1" not in guids
    assert links.firmware(parsed)["mlx5_10"] == "22.31.1014"


# ---------------------------------------------------------------- versions


def test_read_versions_from_fixtures_and_formats() -> None:
    assert versions.read_version("ofed", load("ofed_info", "daocloud_mlnx_23_07.txt")) == "23.07-0.5.1.2"
    assert versions.read_version("driver", "550.90.07\n550.90.07\n") == "550.90.07"
    assert versions.read_version("driver", "550.90.07\n535.1.2\n") == "535.1.2, 550.90.07"
    assert versions.read_version("driver", "NVIDIA-SMI has failed because it couldn't communicate") is None
    doc = json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.4.1"}}, indent=3)
    assert versions.read_version("cuda", doc) == "12.4.1"
    assert versions.read_version("cuda", "CUDA Version 10.2.89\n") == "10.2.89"
    libs = "/usr/lib/x86_64-linux-gnu/libnccl.so.2\n/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5\n"
    assert versions.read_version("nccl", libs) == "2.21.5"
    assert versions.read_version("nccl", "") is None
    assert versions.read_version("doca", "2.9.1-1") == "2.9.1-1"


def test_pins_match_more_precise_versions_only() -> None:
    assert versions.matches_pin("12.4.1", "12.4")
    assert versions.matches_pin("2.9.1-1", "2.9.1")
    assert not versions.matches_pin("12.40", "12.4")
    assert not versions.matches_pin("2.21.4", "2.21.5")


def test_version_findings_pin_missing_and_drift() -> None:
    c = cluster_from(ROCE)
    ok = {"driver": "550.90.07", "cuda": "12.4.1", "nccl": "2.21.5", "ofed": "23.07-0.5.1.2"}
    observed: dict[str, dict[str, str | None]] = {n: dict(ok) for n in ("n1", "n2", "n3")}
    observed["n4"] = {**ok, "nccl": "2.20.3", "cuda": None}
    found = versions.version_findings(c, observed)
    assert {(f.node, f.expected, f.observed) for f in found} == {("n4", "2.21.5", "2.20.3"), ("n4", "12.4.1", None)}
    fw = {"n1": {"mlx5_0": "28.39.1002"}, "n2": {"mlx5_0": "28.39.1002"}, "n3": {"mlx5_0": "28.38.1000"}}
    drift = versions.firmware_findings(fw)
    assert [(f.node, f.device, f.severity) for f in drift] == [("n3", "mlx5_0", "warning")]


def test_persistence_mode_off_is_an_error_finding() -> None:
    """What nvidia-smi --query-gpu=persistence_mode prints per GPU (Enabled/Disabled, docs.nvidia.com
    driver-persistence); a node where the packaged --no-persistence-mode unit won is named."""
    assert versions.read_version("persistence", "Enabled\nEnabled\n") == "Enabled"
    assert versions.read_version("persistence", "Enabled\nDisabled\n") == "Disabled, Enabled"
    assert versions.read_version("persistence", "No devices were found\n") is None
    c = cluster_from(ROCE)
    ok = {"driver": "550.90.07", "cuda": "12.4.1", "nccl": "2.21.5", "ofed": "23.07-0.5.1.2"}
    observed: dict[str, dict[str, str | None]] = {n: {**ok, "persistence": "Enabled"} for n in ("n1", "n2")}
    observed["n3"] = {**ok, "persistence": "Disabled"}
    observed["n4"] = {**ok, "persistence": None}  # nvidia-smi failed: the driver finding speaks for it
    found = versions.version_findings(c, observed)
    assert [(f.node, f.severity, f.expected, f.observed) for f in found] == [("n3", "error", "Enabled", "Disabled")]
    assert "persistence mode is Disabled on n3" in found[0].message and "--no-persistence-mode" in found[0].hint
    assert "persistence" in versions.components_for(c, node_has_gpu=True)
    assert "persistence" not in versions.components_for(c, node_has_gpu=False)


# ---------------------------------------------------------------- cabling (real iblinkinfo)

V100 = """
cluster: {name: v, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5"}
profiles: {g: {hcas: [{device: mlx5_0, rate: EDR}]}}
nodes: [{name: "gpu-v100-[0-3]", address: "10.0.0.[1-4]", profile: g}]
switches: [{name: ibswitch254, ports: 40}]
fabric: {rate: EDR, topology: {cabling: [{nodes: "gpu-v100-[0-3]", hca: mlx5_0, switch: ibswitch254, ports: 1-4}]}}
"""


def test_cabling_names_swapped_cables_as_technician_actions() -> None:
    c = cluster_from(V100)
    found = cabling.cabling_findings(c, parse("iblinkinfo", load("iblinkinfo", "nccltests71_hdr_edr_mix.txt")))
    msgs = sorted(f.message for f in found)
    assert msgs == [
        "gpu-v100-2 mlx5_0: expected ibswitch254 port 3, found ibswitch254 port 4",
        "gpu-v100-3 mlx5_0: expected ibswitch254 port 4, found ibswitch254 port 3",
    ]
    hint = next(f.hint for f in found if f.node == "gpu-v100-2")
    assert "gpu-v100-3 mlx5_0 is plugged into ibswitch254 port 3" in hint


def test_cabling_missing_port_and_switch_name_matching() -> None:
    c = cluster_from(V100.replace("gpu-v100-[0-3]", "gpu-v100-[0-4]").replace("10.0.0.[1-4]", "10.0.0.[1-5]")
                     .replace("ports: 1-4", "ports: 1-5"))
    found = cabling.cabling_findings(c, parse("iblinkinfo", load("iblinkinfo", "nccltests71_hdr_edr_mix.txt")))
    assert any(f.message == "gpu-v100-4 mlx5_0: expected ibswitch254 port 5, found not in the fabric" for f in found)
    assert cabling.switch_matches("leaf04", "MF0;leaf04:MQM9700/U1")
    assert not cabling.switch_matches("leaf0", "MF0;leaf04:MQM9700/U1")


# ---------------------------------------------------------------- gpudirect


def test_peermem_missing_from_real_lsmod_is_an_error_or_warning() -> None:
    mods = parse("lsmod", load("lsmod", "mesa_rdma_modules.txt"))
    assert gpudirect.peermem_findings("n1", mods, required=True)[0].severity == "error"
    assert gpudirect.peermem_findings("n1", mods, required=False)[0].severity == "warning"
    with_peermem = {"modules": {**mods["modules"], "nvidia_peermem": {}}}
    assert gpudirect.peermem_findings("n1", with_peermem, required=True) == []


def test_topology_from_real_topo_legend() -> None:
    topo = parse("nvidia-smi-topo", load("nvidia-smi-topo", "stelline_esc8000a_nic_legend.txt"))
    good = cluster_from(ROCE.replace("count: 2", "count: 4").replace('"mlx5_[0-1]"', '"mlx5_[0-3]"')
                        .replace("rate: 200, numa: 0}", "rate: 200, gpu: 0, numa: 0}"))
    # Spec: mlx5_0..3 serve GPU0..3; topo: GPU0/1 near mlx5_0/1, GPU2/3 near mlx5_2/3: all consistent.
    assert gpudirect.topology_findings(good.node("n1"), topo) == []
    crossed = cluster_from(ROCE.replace("count: 2", "count: 4").replace(
        'hcas: [{device: "mlx5_[0-1]", rate: 200, numa: 0}]',
        "hcas: [{device: mlx5_0, rate: 200, gpu: 2}, {device: mlx5_2, rate: 200, gpu: 0}]"))
    found = gpudirect.topology_findings(crossed.node("n1"), topo)
    assert {(f.device, f.expected) for f in found} == {("mlx5_0", "GPU2 nearest"), ("mlx5_2", "GPU0 nearest")}


def test_topology_without_legend_compares_nothing() -> None:
    topo = parse("nvidia-smi-topo", load("nvidia-smi-topo", "nccl933_8gpu_9nic_partial.txt"))
    assert gpudirect.topology_findings(cluster_from(ROCE).node("n1"), topo) == []


def _gdr_runner(bad: str | None, detail: str = "exit 1: Couldn't allocate MR") -> gpudirect.GdrRunner:
    """Every pair at 390 Gb/s except those touching ``bad`` (no result, the MR error)."""
    return lambda a, b, rail: PairRun(None, detail) if bad in (a, b) else PairRun(390.0, "")


def test_gdr_bandwidth_names_the_node_without_gpudirect_not_the_server() -> None:
    c = cluster_from(IB)
    for bad in ("gpu01", "gpu02", "gpu03", "gpu04"):
        res = gpudirect.gdr_bandwidth(c, _gdr_runner(bad))
        errors = [f for f in res.findings if f.severity == "error"]
        assert not res.passed and {(f.node, f.device) for f in errors} == {(bad, "mlx5_0"), (bad, "mlx5_1")}, bad
        assert all(f.check == "gpudirect_bandwidth" for f in res.findings)


def test_gdr_bandwidth_healthy_passes_and_optional_gdr_only_warns() -> None:
    c = cluster_from(IB)
    res = gpudirect.gdr_bandwidth(c, _gdr_runner(None))
    assert res.passed and not res.findings and res.measurements["pairs_passed"] == res.measurements["pairs_tested"]
    optional = cluster_from(IB.replace("verify: {", "verify: {gpudirect: {required: false}, "))
    res = gpudirect.gdr_bandwidth(optional, _gdr_runner("gpu03"))
    assert res.passed and {f.severity for f in res.findings} == {"warning", "info"}


def test_gpu_count_and_topology_pairing_from_nvidia_smi() -> None:
    c = cluster_from(IB)
    topo = parse("nvidia-smi-topo", load("nvidia-smi-topo", "nccl933_8gpu_9nic_partial.txt"))
    node = c.node("gpu01")
    one = {**topo, "gpus": topo["gpus"][:1]}
    found = gpudirect.gpu_count_findings(node, one)
    assert [(f.node, f.severity, f.observed) for f in found] == [("gpu01", "error", 1)]
    assert "GPU1 missing" in found[0].message
    assert gpudirect.gpu_count_findings(node, {**topo, "gpus": ["GPU0", "GPU1"]}) == []
    lab = {"gpus": ["GPU0", "GPU1"], "nic_names": {"NIC0": "mlx5_0", "NIC1": "mlx5_1"},
           "gpu_nic_affinity": {"GPU0": ["mlx5_1"], "GPU1": ["mlx5_0"]}}
    pairs = gpudirect.nic_gpus(c, {"gpu01": lab})
    assert pairs[("gpu01", "mlx5_0")] == 1 and pairs[("gpu01", "mlx5_1")] == 0  # topo wins over the spec


# The simulated perftest builds, run on this host exactly as the check runs them on a node.
SIMTOOLS = Path(__file__).resolve().parents[2] / "provisioner" / "lab" / "simtools"
PY = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


def _sim_script(tmp_path: Path, build: dict[str, object] | None) -> Path:
    """The stock stand-in (``build`` None) or the script the lab's perftest-cuda package installs."""
    if build is None:
        return SIMTOOLS / "ib_write_bw"
    path = tmp_path / f"ib_write_bw-{abs(hash(tuple(sorted(build.items()))))}"
    path.write_text(packages.perftest_tool_text(build))
    return path


def _sim(script: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    env["PYTHONPATH"] = str(SIMTOOLS)
    return subprocess.run([PY, str(script), *argv], env=env, capture_output=True, text=True, timeout=60)


def _probe(script: Path, where: str = "/usr/local/bin/ib_write_bw") -> Completed:
    """What verify's perftest probe prints: the binary's path, then its --help (perftest exits 1 after it)."""
    done = _sim(script, ["--help"])
    return Completed(done.returncode, f"{where}\n{done.stdout}", done.stderr)


def _client_runner(c: Cluster, script: Path, *, dmabuf: bool = False) -> gpudirect.GdrRunner:
    """The GPUDirect client command of the check, run against ``script`` (it fails before connecting)."""
    st = PerftestSettings(size=65536, duration=1)

    def run(server: str, client: str, rail: int) -> PairRun:
        port = next(p for p in c.node(client).rail_ports if p.rail == rail)
        argv = perftest_argv(port, st, 18515 + rail, numactl=False, server=c.node(server).address,
                             use_cuda=port.gpu or 0, cuda_dmabuf=dmabuf)
        done = _sim(script, argv[1:])
        return read_result(done.returncode, done.stdout, done.stderr)

    return run


OPTIONAL_GDR = IB.replace("verify: {", "verify: {gpudirect: {required: false}, ")


def test_gdr_bandwidth_against_stock_perftest_could_not_run_and_is_not_blamed_on_hardware(tmp_path: Path) -> None:
    # Debian's perftest has no --use_cuda ("unrecognized option"): nothing was measured, no node is at fault. With
    # GPUDirect required (the default) the test could not run (INCOMPLETE, never PASS); made optional, it is skipped.
    c = cluster_from(IB)
    res = gpudirect.gdr_bandwidth(c, _client_runner(c, _sim_script(tmp_path, None)))
    assert res.error is not None and not res.passed and res.skipped is None
    assert "unrecognized option '--use_cuda=0'" in res.error and "without CUDA" in res.error
    assert not [f for f in res.findings if f.severity == "error"]
    assert Verdict.of([res]).exit_code == 2
    newer = _sim_script(tmp_path, {"version": "24.10.0-0.66", "cuda": False})
    res = gpudirect.gdr_bandwidth(c, _client_runner(c, newer))
    assert res.error is not None and "Unsupported memory type" in res.error
    optional = cluster_from(OPTIONAL_GDR)
    res = gpudirect.gdr_bandwidth(optional, _client_runner(optional, _sim_script(tmp_path, None)))
    assert res.skipped is not None and res.error is None and "without CUDA" in res.skipped
    assert Verdict.of([res]).exit_code == 0


def test_gpudirect_probe_skips_with_the_nodes_whose_perftest_lacks_cuda(tmp_path: Path) -> None:
    c = cluster_from(IB)
    stock = _probe(_sim_script(tmp_path, None), "/usr/bin/ib_write_bw")
    cuda = _probe(_sim_script(tmp_path, {"version": "25.10.0-0.128", "cuda": True, "cuda_dmabuf": True}))
    support = {n: gpudirect.perftest_support(cuda if n != "gpu03" else stock) for n in ("gpu01", "gpu02", "gpu03",
                                                                                         "gpu04")}
    assert support["gpu01"] == gpudirect.PerftestCuda("/usr/local/bin/ib_write_bw", True, True)
    assert support["gpu03"] == gpudirect.PerftestCuda("/usr/bin/ib_write_bw", False, False)
    never: gpudirect.GdrRunner = lambda a, b, rail: pytest.fail("no pair may run without a CUDA perftest")  # noqa: E731
    res = gpudirect.gdr_bandwidth(c, never, perftest=support)
    assert res.error is not None and not res.passed
    assert "gpu03: /usr/bin/ib_write_bw was built without CUDA (its --help lists no --use_cuda)" in res.error
    assert [(f.node, f.severity) for f in res.findings] == [("gpu03", "warning")]
    assert "perftest_cuda" in res.findings[0].hint
    missing = {**support, "gpu02": gpudirect.perftest_support(Completed(127, "", ""))}
    assert "gpu02: no ib_write_bw on the PATH" in str(gpudirect.gdr_bandwidth(c, never, perftest=missing).error)
    assert gpudirect.gdr_bandwidth(cluster_from(OPTIONAL_GDR), never, perftest=support).skipped is not None
    ran = gpudirect.gdr_bandwidth(c, _gdr_runner(None), perftest={**support, "gpu03": support["gpu01"]})
    assert ran.passed and ran.skipped is None


DMABUF = IB.replace("verify: {", "gpudirect: {mode: dmabuf}\nverify: {")


def test_dmabuf_mode_needs_no_peermem_and_a_perftest_with_cuda_dmabuf(tmp_path: Path) -> None:
    c = cluster_from(DMABUF)
    mods = parse("lsmod", load("lsmod", "mesa_rdma_modules.txt"))  # no nvidia_peermem in it
    res = gpudirect.check_gpudirect(c, {n: mods for n in ("gpu01", "gpu02", "gpu03", "gpu04")}, {}, None)
    assert all(r.passed and not r.findings for r in res)
    peer = gpudirect.check_gpudirect(cluster_from(IB), {"gpu01": mods}, {}, None)
    assert [f.severity for f in peer[0].findings] == ["error"]  # peermem mode still requires the module
    old_cuda = _probe(_sim_script(tmp_path, {"version": "25.10.0-0.128", "cuda": True, "cuda_dmabuf": False}))
    support = {n: gpudirect.perftest_support(old_cuda) for n in ("gpu01", "gpu02", "gpu03", "gpu04")}
    res_bw = gpudirect.gdr_bandwidth(c, _gdr_runner(None), perftest=support)
    assert res_bw.error is not None and "--use_cuda_dmabuf" in res_bw.error
    assert gpudirect.gdr_bandwidth(cluster_from(IB), _gdr_runner(None), perftest=support).passed
    # the DMA-BUF run: --use_cuda first (perftest issue #336), then --use_cuda_dmabuf
    port = c.node("gpu01").rail_ports[0]
    argv = perftest_argv(port, PerftestSettings(size=65536, duration=1), 18515, numactl=False, server="10.0.0.2",
                         use_cuda=0, cuda_dmabuf=True)
    assert argv[-3:] == ["--use_cuda=0", "--use_cuda_dmabuf", "10.0.0.2"]


# ---------------------------------------------------------------- perftest


def test_perftest_argv_pins_numa_only_when_known_and_available() -> None:
    c = cluster_from(ROCE)
    port = c.node("n1").ports[0]
    st = PerftestSettings(size=1048576, duration=5)
    assert perftest_argv(port, st, 18515, numactl=True, server="10.0.0.2", use_cuda=0) == [
        "numactl", "--cpunodebind=0", "ib_write_bw", "-d", "mlx5_0", "-i", "1", "-s", "1048576", "-D", "5",
        "--report_gbits", "-F", "-p", "18515", "--use_cuda=0", "10.0.0.2"]
    assert perftest_argv(port, st, 18516, numactl=False)[0] == "ib_write_bw"
    no_numa = cluster_from(IB).node("gpu01").ports[0]
    assert perftest_argv(no_numa, st, 18515, numactl=True)[0] == "ib_write_bw"


def test_read_result_on_real_outputs() -> None:
    good = read_result(0, load("perftest", "alibaba_amd_ionic_bidir_client_gbits.txt"), "")
    assert good.gbps == pytest.approx(779.21)
    assert read_result(124, "", "").detail.startswith("timed out")
    bad = read_result(1, load("perftest", "perftest173_completion_error_cuda.txt"), "")
    assert bad.gbps is None and bad.detail.startswith("exit 1")
    assert read_result(255, "", "gpu02: cannot connect").detail.startswith("node unreachable")


# ---------------------------------------------------------------- bandwidth (scheduler + synthetic runner)


def runner_with(
    bad: set[str], slow_link: frozenset[str] | None = None, gbps: float = 392.0
) -> tuple[Callable[[str, str, int], PairRun], list[tuple[str, str, int]]]:
    calls: list[tuple[str, str, int]] = []

    def run(server: str, client: str, rail: int) -> PairRun:
        calls.append((server, client, rail))
        if rail == 1 and ({server, client} & bad or (slow_link and {server, client} == slow_link)):
            return PairRun(120.0, "")
        return PairRun(gbps, "")

    return run, calls


def test_bandwidth_healthy_quick_mode_one_round() -> None:
    c = cluster_from(IB)
    run, calls = runner_with(set())
    out = check_bandwidth(c, run)
    assert out.result.passed and out.result.findings == ()
    assert len(calls) == 4  # 2 pairs × 2 rails, sm1 (not compute) excluded
    assert set(out.matrix) == {0, 1} and line_rates(c.nodes) == {0: 400.0, 1: 400.0}


def test_bandwidth_bad_port_is_localised() -> None:
    c = cluster_from(IB)
    run, _ = runner_with({"gpu03"})
    out = check_bandwidth(c, run)
    errors = [f for f in out.result.findings if f.severity == "error"]
    assert [(f.node, f.rail, f.device) for f in errors] == [("gpu03", 1, "mlx5_1")]
    assert not out.result.passed
    assert any(f.severity == "info" and "120.0 Gb/s" in f.message for f in out.result.findings)


def test_bandwidth_full_mode_tests_every_pair_and_names_a_link() -> None:
    c = cluster_from(IB)
    run, calls = runner_with(set(), frozenset({"gpu01", "gpu04"}))
    out = check_bandwidth(c, run, mode="full")
    assert len({(frozenset((a, b)), r) for a, b, r in calls}) == 12
    errors = [f for f in out.result.findings if f.severity == "error"]
    assert [(f.node, f.peer, f.rail) for f in errors] == [("gpu01", "gpu04", 1)]


def test_bandwidth_dead_peer_timeout_becomes_a_finding() -> None:
    c = cluster_from(IB)

    def run(server: str, client: str, rail: int) -> PairRun:
        if "gpu02" in (server, client):
            return PairRun(None, "timed out: the peer hung or died")
        return PairRun(392.0, "")

    out = check_bandwidth(c, run)
    assert {(f.node, f.rail) for f in out.result.findings if f.severity == "error"} == {("gpu02", 0), ("gpu02", 1)}
    assert any("timed out" in f.message for f in out.result.findings)


def test_rail_groups_keep_service_nodes_out() -> None:
    c = cluster_from(IB)
    assert rail_groups([n for n in c.nodes if "compute" in n.roles]) == {("gpu01", "gpu02", "gpu03", "gpu04"): [0, 1]}


# ---------------------------------------------------------------- nccl


NCCL16 = IB.replace("count: 2}", "count: 8}").replace("gpu[01-04]", "gpu[01-02]").replace("0.[1-4]", "0.[1-2]")


def test_nccl_launches_through_mpirun_with_a_hostfile() -> None:
    argv = nccl.mpirun_argv("/tmp/h", 2, 8, "8G", as_root=True)
    assert argv[:4] == ["mpirun", "--allow-run-as-root", "--hostfile", "/tmp/h"]
    assert argv[argv.index("-np") + 1] == "16" and argv[argv.index("--map-by") + 1] == "ppr:8:node"
    assert "NCCL_DEBUG=INFO" in argv and "NCCL_DEBUG_SUBSYS=INIT,NET" in argv
    assert argv[-9:] == ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1"]
    assert "--allow-run-as-root" not in nccl.mpirun_argv("/tmp/h", 2, 8, "8G", as_root=False)
    assert "plm_rsh_args" not in argv and "-p 2222" in nccl.mpirun_argv("/h", 2, 8, "8G", as_root=False, ssh_port=2222)
    sh = nccl.launch(["10.0.0.1", "10.0.0.2"], 4, "1G", as_root=False)
    assert sh[:2] == ["sh", "-c"] and "'10.0.0.1 slots=4\n10.0.0.2 slots=4\n'" in sh[2]
    assert ' --hostfile "$f" ' in sh[2] and "rm -f" in sh[2] and "NCCL_TESTS" not in sh[2]


def test_nccl_busbw_is_read_at_the_largest_size_of_a_real_run() -> None:
    bw, why = nccl.read_busbw(Completed(0, load("nccl-tests", "a3mega_16rank_allreduce.txt"), ""))
    assert bw == pytest.approx(338.82) and why == ""


def test_nccl_counts_ranks_and_fails_when_they_are_not_nodes_times_gpus() -> None:
    real = load("nccl-tests", "a3mega_16rank_allreduce.txt")  # 2 nodes x 8 H100
    ok = nccl.check_nccl(cluster_from(NCCL16), lambda h, a, e: Completed(0, real, ""), has_tool=lambda h, t: True,
                         as_root=True)
    assert ok.passed and ok.measurements["nranks"] == 16
    # the same 16 ranks against 4 nodes x 2 GPUs: wrong job shape, even without a bandwidth floor
    loose = IB.replace("verify: {nccl: {min_busbw_gbps: 80}}", "")
    bad = nccl.check_nccl(cluster_from(loose), lambda h, a, e: Completed(0, real, ""), has_tool=lambda h, t: True,
                          as_root=True)
    assert not bad.passed and bad.measurements["nranks"] == 16
    assert any(f.expected == 8 and f.observed == 16 and "ranks" in f.message for f in bad.findings)
    # an nccl-tests built without MPI under mpirun: one table per process, each its own rank 0
    head, rest = real.split("#  Rank  0", 1)
    single = head + "#  Rank  0" + rest.split("\n", 1)[0] + "\n" + rest.split("#\n#  ", 1)[-1]
    assert nccl.observed_ranks(single * 16) == 1


def test_nccl_names_the_rails_nccl_selected_from_real_lines() -> None:
    lines = load("nccl-debug", "net_ib_selection_lines.txt")
    assert nccl.selected_rails(lines) == {
        "dgxh100-4": {("mlx5_10", 1), ("mlx5_11", 1)}, "dgxh100-3": {("mlx5_10", 1), ("mlx5_11", 1)},
        "master_node": {("mlx5_0", 1)}, "e05r3n09": {("mlx5_3", 1), ("mlx5_2", 1), ("mlx5_1", 1), ("mlx5_0", 1)},
        "ip-172-31-12-21": set()}
    spec = ROCE.replace('"mlx5_[0-1]"', '"mlx5_[10-13]"').replace("n[1-4]", "dgxh100-[3-4]").replace("[1-4]", "[3-4]")
    nodes = cluster_from(spec).nodes
    assert len(nodes) == 2
    found = nccl.rail_findings(nodes, lines)
    assert [f.node for f in found] == ["dgxh100-3", "dgxh100-4"]
    assert found[0].observed == "mlx5_10:1,mlx5_11:1" and found[0].expected == "mlx5_10:1,mlx5_11:1,mlx5_12:1,mlx5_13:1"
    assert "=mlx5_0:1,mlx5_1:1" in found[0].hint
    assert nccl.rail_findings(cluster_from(spec.replace("[10-13]", "[10-11]")).nodes, lines) == []


def test_nccl_pass_and_slow_node_follow_up() -> None:
    c = cluster_from(IB.replace("count: 2}", "count: 4}"))  # 4 nodes x 4 GPUs = the capture's 16 ranks
    real = load("nccl-tests", "a3mega_16rank_allreduce.txt")
    ok = nccl.check_nccl(c, lambda hosts, argv, env: Completed(0, real, ""), has_tool=lambda h, t: True, as_root=True)
    assert ok.passed and ok.measurements["busbw_gbps"] == pytest.approx(338.82)

    def runner(hosts: Any, argv: Any, env: dict[str, str]) -> Completed:
        if "10.0.0.2 slots=" in argv[-1]:
            return Completed(1, "", "gpu02: Test NCCL failure common.cu:1005 'remote process exited'")
        return Completed(0, real, "")

    bad = nccl.check_nccl(c, runner, has_tool=lambda h, t: True, as_root=True)
    errors = [f for f in bad.findings if f.severity == "error"]
    assert errors[0].node is None and "failed" in errors[0].message
    assert [f.node for f in errors[1:]] == ["gpu02"] and "slow in NCCL" in errors[1].message
    none = nccl.check_nccl(c, runner, has_tool=lambda h, t: t != "mpirun", as_root=True)
    assert not none.passed and none.error is not None and "mpirun" in none.error


# ---------------------------------------------------------------- baseline, NHC


def test_baseline_drop_and_median_warnings(tmp_path: Path) -> None:
    matrix = {0: {("a", "b"): 390.0, ("c", "d"): 392.0, ("e", "f"): 330.0}}
    doc = baseline.make_baseline(matrix, 1048576, {"a": {"nccl": "2.21.5"}}, 300.0, "2025-01-01T00:00:00")
    path = tmp_path / "baseline.json"
    assert baseline.store_if_first(path, doc, passed=True)
    assert not baseline.store_if_first(path, doc, passed=True)
    later = {0: {("a", "b"): 340.0, ("c", "d"): 392.0, ("g", "h"): 391.0, ("e", "f"): 300.0}}
    found = baseline.compare(baseline.load(path), later, 1048576, 250.0)
    msgs = [f.message for f in found]
    assert any("a ↔ b rail 0" in m and "below the baseline" in m for m in msgs)
    assert any("e → f rail 0" in m and "median" in m for m in msgs)
    assert any("NCCL" in m for m in msgs)
    assert all(f.severity == "warning" for f in found)
    other = baseline.compare(baseline.load(path), later, 65536, None)
    assert any(f.severity == "info" and "message size" in f.message for f in other)


def test_baseline_not_stored_for_a_failing_run(tmp_path: Path) -> None:
    assert not baseline.store_if_first(tmp_path / "b.json", {}, passed=False)
    assert not (tmp_path / "b.json").exists()


def test_bandwidth_rail_where_nothing_passes_still_fails() -> None:
    c = cluster_from(IB)
    out = check_bandwidth(c, lambda s, cl, rail: PairRun(50.0 if rail == 0 else 392.0, ""))
    assert not out.result.passed
    assert [f.rail for f in out.result.findings if f.severity == "error" and f.check == "bandwidth"] == [0]


def test_bandwidth_without_perftest_could_not_run() -> None:
    c = cluster_from(IB)
    out = check_bandwidth(c, lambda s, cl, rail: read_result(127, "", "timeout: failed to run command 'ib_write_bw'"))
    assert not out.result.ran and "not installed" in (out.result.error or "")


def _partitioned(parts: str) -> Any:
    return cluster_from(IB.replace("count: 2}", "count: 8}").replace(
        "  subnet_manager:", f"  partitions: [{parts}]\n  subnet_manager:"))


def test_nccl_runs_once_per_partition_because_a_job_cannot_span_two_p_keys() -> None:
    """NCCL_IB_PKEY differs between partitions (the nccl role points it at the node's first full partition), and
    queue pairs of different partitions do not connect: one run over all nodes would fail on a healthy fabric."""
    real = load("nccl-tests", "a3mega_16rank_allreduce.txt")  # 2 nodes x 8 H100: each group's shape
    hostfiles: list[str] = []

    def runner(hosts: Any, argv: Any, env: dict[str, str]) -> Completed:
        hostfiles.append(" ".join(line.split()[0] for line in argv[-1].split("printf %s '")[1].split("'")[0].split("\n")
                                  if line))
        return Completed(0, real, "")

    c = _partitioned('{name: tenant_a, pkey: 0x8001, members: "gpu[01-02]"}, '
                     '{name: tenant_b, pkey: 0x8002, members: "gpu[03-04]"}')
    assert [(label, [n.name for n in g]) for label, g in nccl.pkey_groups(c, c.nodes_with_role("compute"))] == [
        ("tenant_a (P_Key 0x8001)", ["gpu01", "gpu02"]), ("tenant_b (P_Key 0x8002)", ["gpu03", "gpu04"])]
    ok = nccl.check_nccl(c, runner, has_tool=lambda h, t: True, as_root=True)
    assert ok.passed, ok.findings
    assert hostfiles == ["10.0.0.1 10.0.0.2", "10.0.0.3 10.0.0.4"]
    assert ok.measurements["busbw_gbps"] == pytest.approx(338.82)
    assert ok.measurements["busbw_gbps tenant_b (P_Key 0x8002)"] == pytest.approx(338.82)

    def tenant_b_fails(hosts: Any, argv: Any, env: dict[str, str]) -> Completed:
        if "10.0.0.3 slots=" in argv[-1]:
            return Completed(1, "", "gpu03: Test NCCL failure common.cu:1005 'remote process exited'")
        return Completed(0, real, "")

    bad = nccl.check_nccl(c, tenant_b_fails, has_tool=lambda h, t: True, as_root=True)
    assert not bad.passed and bad.measurements["busbw_gbps"] is None
    errors = [f for f in bad.findings if f.severity == "error"]
    assert errors and all(f.message.startswith("tenant_b (P_Key 0x8002): ") for f in errors)


def test_nccl_a_node_alone_in_its_partition_is_said_and_the_rest_still_run() -> None:
    real = load("nccl-tests", "a3mega_16rank_allreduce.txt")
    runs: list[str] = []

    def runner(hosts: Any, argv: Any, env: dict[str, str]) -> Completed:
        runs.append(argv[-1])
        return Completed(0, real, "")

    # tenant_a for gpu[01-02]; gpu03 and gpu04 stay in the default partition: two groups of two
    two = nccl.check_nccl(_partitioned('{name: tenant_a, pkey: 0x8001, members: "gpu[01-02]"}'), runner,
                          has_tool=lambda h, t: True, as_root=True)
    assert two.passed and len(runs) == 2 and "busbw_gbps the default partition" in two.measurements
    runs.clear()
    c = _partitioned('{name: tenant_a, pkey: 0x8001, members: "gpu[01-02]"}, '
                     '{name: tenant_b, pkey: 0x8002, members: "gpu03"}')
    lone = nccl.check_nccl(c, runner, has_tool=lambda h, t: True, as_root=True)
    # gpu03 (tenant_b) and gpu04 (default) are each alone: said as info, only tenant_a runs
    assert len(runs) == 1 and "10.0.0.1 slots=8" in runs[0] and lone.passed
    assert sorted((f.severity, f.node) for f in lone.findings) == [("info", "gpu03"), ("info", "gpu04")]
    assert "the only GPU node whose NCCL traffic uses tenant_b (P_Key 0x8002)" in lone.findings[0].message
    apart = _partitioned('{name: a, pkey: 0x8001, members: gpu01}, {name: b, pkey: 0x8002, members: gpu02}, '
                         '{name: c, pkey: 0x8003, members: gpu03}')
    none = nccl.check_nccl(apart, runner, has_tool=lambda h, t: True, as_root=True)
    assert not none.ran and none.error is not None and "no two GPU compute nodes share a partition" in none.error
