"""The NCCL check's expected figure, efficiency and default floor (provisioner/spec/expected.py), judged on real
nccl-tests output: a spec without min_busbw_gbps no longer passes at any speed."""

from __future__ import annotations

import pytest

from provisioner.fabric import nccl
from provisioner.remote import Completed
from provisioner.spec import expected
from tests.unit._parser_fixtures import load
from tests.unit.test_verify_checks import cluster_from

DGX = """
cluster: {name: dgx, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: doca, version: "2.9.1"}}
profiles:
  g: {gpu: {model: GPU, count: 8, nvswitch: true}, hcas: [{device: "mlx5_[0-7]", rate: RATE}]}
  s: {hcas: [{device: mlx5_0, rate: RATE}]}
nodes:
  - {name: "dgx[1-2]", address: "10.0.0.[1-2]", profile: g}
  - {name: sm1, address: 10.0.0.9, profile: s, roles: [subnet_manager]}
fabric:
  rate: RATE
  subnet_manager: {kind: opensm, nodes: [{node: sm1, priority: 15}]}
"""


def spec(gpu: str = "A100-SXM4-80GB", rate: str = "HDR", verify: str = "") -> str:
    return DGX.replace("GPU", gpu).replace("RATE", rate) + verify


# NVIDIA/deepops docs: two DGX A100 with 8 x HDR each, 188.53 GB/s at 4 GiB
DEEPOPS = load("nccl-tests", "deepops_network_operator_dgx_a100_hdr.txt")


def run(text: str, output: str = DEEPOPS) -> nccl.CheckResult:
    return nccl.check_nccl(cluster_from(text), lambda hosts, argv, env: Completed(0, output, ""),
                           has_tool=lambda h, t: True, as_root=True)


def gpu_nodes(text: str) -> list[nccl.Node]:
    return [n for n in cluster_from(text).nodes if n.gpu_count]


@pytest.mark.parametrize(("gpu", "rate", "gbps", "why"), [
    ("A100-SXM4-80GB", "HDR", 200.0, "8 x 200 Gb/s rails per node"),      # rails below NVLink's 300
    ("H100-SXM5-80GB", "NDR", 400.0, "8 x 400 Gb/s rails per node"),      # rails below NVLink's 450
    ("H100-SXM5-80GB", "XDR", 450.0, "NVLink 450 GB/s per H100-SXM5-80GB"),  # 800 GB/s of rails: NVLink binds
    ("L40S", "NDR", 31.5, "PCIe Gen4 x16 between L40S GPUs"),             # no NVLink: the PCIe hop binds
])
def test_expected_is_the_slower_of_the_rails_and_the_gpu_links(gpu: str, rate: str, gbps: float, why: str) -> None:
    text = spec(gpu, rate).replace("nvswitch: true", "nvswitch: false") if gpu == "L40S" else spec(gpu, rate)
    want = expected.inter_node(gpu_nodes(text))
    assert want == expected.Expected(gbps, why)


def test_one_gpu_per_node_or_an_unknown_model_leaves_only_the_rails() -> None:
    one = spec().replace("count: 8", "count: 1")
    assert expected.inter_node(gpu_nodes(one)) == expected.Expected(200.0, "8 x 200 Gb/s rails per node")
    assert expected.intra_node(gpu_nodes(one)[0]) is None


def test_a_healthy_real_run_passes_with_its_efficiency_reported() -> None:
    result = run(spec())
    assert result.passed, result.findings
    m = result.measurements
    assert m["busbw_gbps"] == pytest.approx(188.53)
    assert m["expected_busbw_gbps"] == 200.0 and m["efficiency"] == pytest.approx(0.943)
    assert m["floor_gbps"] == 160.0 and m["floor_from"] == "80% of the expected 200 GB/s"


def test_without_a_floor_in_the_spec_a_slow_run_fails_naming_measured_and_expected() -> None:
    """The same real 188.53 GB/s on nodes whose 8 x NDR rails carry 400 GB/s: 47 % of the links."""
    result = run(spec("H100-SXM5-80GB", "NDR"))
    assert not result.passed
    [error] = [f for f in result.findings if f.severity == "error"]
    assert error.node is None and error.expected == 320.0 and error.observed == pytest.approx(188.53)
    assert error.message == (
        "the default partition: all-reduce bus bandwidth 188.5 GB/s at 8G over 2 nodes is below the floor 320 GB/s "
        "(80% of the expected 400 GB/s); expected 400 GB/s from 8 x 400 Gb/s rails per node, 47% of it")
    assert result.measurements["efficiency"] == pytest.approx(0.471)


def test_an_explicit_floor_wins_and_a_fraction_moves_the_default() -> None:
    slow = spec("H100-SXM5-80GB", "NDR")
    explicit = run(slow + "verify: {nccl: {min_busbw_gbps: 150}}\n")
    assert explicit.passed and explicit.measurements["floor_from"] == "verify.nccl.min_busbw_gbps"
    assert explicit.measurements["efficiency"] == pytest.approx(0.471)  # still reported
    looser = run(slow + "verify: {nccl: {min_fraction: 0.45}}\n")
    assert looser.passed and looser.measurements["floor_gbps"] == 180.0
