"""The single-node all-reduce (provisioner/fabric/nccl_node.py): each GPU node's own GPUs, the network disabled,
judged against the NVLink figure of its GPU model, on real nccl-tests output."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

from provisioner.fabric import causes, nccl, nccl_node
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.remote import RC_TIMEOUT, RC_UNREACHABLE, Completed
from provisioner.spec.cluster import Node
from provisioner.spec.models import NcclCheck
from tests.unit._parser_fixtures import load
from tests.unit.test_nccl_expected import spec
from tests.unit.test_verify_checks import cluster_from

# oracle-japan/ocitutorials: one BM.GPU4.8, 8 x A100-SXM4-40GB, 235.14 GB/s at 8 GiB
A100X8 = load("nccl-tests", "oci_a100x8_single_node.txt")


def node(gpu: str = "A100-SXM4-80GB", verify: str = "") -> tuple[Node, NcclCheck]:
    cluster = cluster_from(spec(gpu, "HDR", verify))
    return next(n for n in cluster.nodes if n.gpu_count), cluster.spec.verify.nccl


def judge(output: str, gpu: str = "A100-SXM4-80GB", verify: str = "", rc: int = 0, err: str = "") -> CheckResult:
    n, cfg = node(gpu, verify)
    return nccl_node.node_result(n, cfg, Completed(rc, output, err))


def test_a_healthy_a100_node_passes_at_78_percent_of_nvlink() -> None:
    result = judge(A100X8)
    assert result.passed and not result.findings
    m = result.measurements
    assert m["busbw_gbps"] == 235.14 and m["expected_busbw_gbps"] == 300.0
    assert m["efficiency"] == 0.784 and m["floor_gbps"] == 210.0
    assert m["expected_from"] == "NVLink 300 GB/s per A100-SXM4-80GB"
    assert m["floor_from"] == "70% of the expected 300 GB/s"
    # the inter-node default (80 %) would have failed this healthy node: the single-node default is its own
    assert 235.14 < 0.8 * 300


def test_below_the_floor_is_an_error_on_the_node_naming_measured_and_expected_with_no_cable() -> None:
    result = judge(A100X8, gpu="H100-SXM5-80GB")  # the same 235 GB/s on an H100 node: 52 % of its 450
    (f,) = result.findings
    assert (f.severity, f.node, f.device, f.port, f.rail) == ("error", "dgx1", None, None, None)
    assert "235.1 GB/s at 8G is below the floor 315 GB/s (70% of the expected 450 GB/s)" in f.message
    assert "expected 450 GB/s from NVLink 450 GB/s per H100-SXM5-80GB, 52% of it" in f.message
    assert "network disabled" in f.message and "cable" not in f.hint.replace("not a cable", "")


def test_an_explicit_floor_in_the_spec_wins() -> None:
    result = judge(A100X8, verify="verify: {nccl: {min_single_node_busbw_gbps: 240}}\n")
    (f,) = result.findings
    assert "below the floor 240 GB/s (verify.nccl.min_single_node_busbw_gbps)" in f.message
    assert result.measurements["efficiency"] == 0.784  # efficiency is still reported against the expected figure
    lower = judge(A100X8, verify="verify: {nccl: {min_single_node_fraction: 0.8}}\n")
    assert "(80% of the expected 300 GB/s)" in lower.findings[0].message


def test_missing_binary_unparsable_output_timeout_and_unreachable_could_not_run() -> None:
    missing = judge("", rc=127, err="all_reduce_perf: not found on the PATH")
    assert missing.error and "no all_reduce_perf on dgx1's PATH" in missing.error and not missing.findings
    no_lib = judge("", rc=127, err="all_reduce_perf: error while loading shared libraries: libnccl.so.2: cannot "
                                   "open shared object file: No such file or directory")
    assert no_lib.error is not None and "PATH" not in no_lib.error  # the binary is there; NCCL is not
    assert no_lib.error.endswith("[exit 127]: 'all_reduce_perf: error while loading shared libraries: libnccl.so.2: "
                                 "cannot open shared object file: No such file or directory'")
    junk = judge("Segmentation fault (core dumped)\nmore\n", rc=139)
    assert junk.error == ("all_reduce_perf on dgx1 printed no nccl-tests output [exit 139]: "
                          "'Segmentation fault (core dumped)'")
    assert "timed out" in (judge("", rc=RC_TIMEOUT).error or "")
    assert judge("", rc=RC_UNREACHABLE, err="ssh: connect refused").error == "ssh: connect refused"


def test_a_run_nccl_itself_fails_is_an_error_on_the_node() -> None:
    failure = load("nccl-tests", "nccl_tests280_failure_lines_only.txt")
    result = judge(failure, rc=1)
    (f,) = result.findings
    assert f.severity == "error" and f.node == "dgx1" and f.message.startswith("single-node all-reduce on dgx1")


def test_the_probe_disables_the_network_and_takes_the_spec_values_as_arguments() -> None:
    n, cfg = node()
    argv = nccl_node.argv(n, cfg)
    assert argv[:3] == ["sh", "-c", nccl_node.PROBE] and argv[3:] == ["sh", "8G", "8"]
    assert "NCCL_IB_DISABLE=1" in nccl_node.PROBE and '-e "$1"' in nccl_node.PROBE and '-g "$2"' in nccl_node.PROBE


def test_one_gpu_nodes_are_not_run() -> None:
    cluster = cluster_from(spec().replace("count: 8", "count: 1"))
    assert nccl_node.node_nodes(cluster) == []


def test_a_slow_node_folds_its_multi_node_nccl_finding_under_nvlink_not_a_cable() -> None:
    slow = judge(A100X8, gpu="H100-SXM5-80GB")
    follow = Finding(nccl.CHECK, "error", "dgx1", None, None, 300, 120, "dgx1: node is slow in NCCL",
                     "reseat or swap the cable and transceiver")
    other = Finding(nccl.CHECK, "error", "dgx2", None, None, 300, 120, "dgx2: node is slow in NCCL",
                    "reseat or swap the cable and transceiver")
    folded = causes.fold([slow, CheckResult.from_findings(nccl.CHECK, None, [follow, other])])
    mine, theirs = folded[1].findings
    assert mine.message.startswith("NCCL on dgx1 fails because of a host-side cause, not a port or cable: "
                                   "single-node all-reduce on dgx1")
    assert "reseat or swap" not in mine.hint and mine.severity == "error"
    assert theirs == other


def test_the_probe_on_the_simulated_node_passes_healthy_and_fails_with_an_nvlink_down(tmp_path: Path) -> None:
    """The real probe (sh, PATH, NCCL_IB_DISABLE=1) runs the lab's all_reduce_perf on a 2 x H100 node: 82 % of the
    catalog's 450 GB/s passes; with GPU 0's NVLink down (what the lab fault nvlink_down writes) it fails there."""
    from provisioner.lab.simtools import labstate
    from tests.unit.test_simtools_fabric import build_lab, env_for

    lab = build_lab(tmp_path)
    n, cfg = node("H100-SXM5-80GB")
    n = replace(n, gpu_count=2) if n.gpu_count != 2 else n

    def probe() -> CheckResult:
        done = subprocess.run(nccl_node.argv(n, cfg), env=env_for(lab, "gpu01"), capture_output=True, text=True,
                              timeout=120, check=False)
        return nccl_node.node_result(n, cfg, Completed(done.returncode, done.stdout, done.stderr))

    healthy = probe()
    assert healthy.passed, (healthy.error, healthy.findings)
    assert 0.8 < float(healthy.measurements["efficiency"] or 0) < 0.85, healthy.measurements
    state = labstate.load_node(str(lab), "gpu01")
    labstate.save_node(str(lab), {**state, "nvlink_down": [0]})
    (f,) = probe().findings
    assert f.node == "dgx1" and "below the floor 315 GB/s (70% of the expected 450 GB/s)" in f.message
