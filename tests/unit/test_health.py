"""The watch's health checks: GPU count, ECC, Xid, ports and peermem judged from one probe per node.

GPU readings come from the lab's simulated nvidia-smi and dmesg run on the host against a temp lab root (with
the gpu_missing and ecc_error faults applied by the lab's own fault code); ports and modules from real captures
(tests/fixtures/ibstat, tests/fixtures/lsmod); Xid lines from real kernel logs (tests/fixtures/dmesg).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from provisioner.health import CRITICAL_XIDS, check_nodes, judge, parse_gpu_query, parse_xids, split_probe
from provisioner.lab import faults
from provisioner.remote import Completed
from provisioner.spec.cluster import Cluster
from provisioner.spec.load import load_text
from tests.unit.test_simtools_host import lab as _lab_fixture
from tests.unit.test_simtools_host import run

FIX = Path(__file__).resolve().parents[1] / "fixtures"
lab = pytest.fixture(_lab_fixture.__wrapped__, name="lab")  # type: ignore[attr-defined]
"""The simulated tools' temp lab root of test_simtools_host.py (one 8-GPU node, gpu01)."""
SPEC = """\
cluster: {name: h, os: debian-12}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: doca, version: "2.9.1"}}
profiles:
  g8:
    gpu: {model: H100-SXM5-80GB, count: 8, nvswitch: true}
    hcas: [{device: mlx5_0, rate: NDR}, {device: mlx5_3, rate: NDR}]
  g8down:
    gpu: {model: H100-SXM5-80GB, count: 8, nvswitch: true}
    hcas: [{device: mlx5_0, rate: NDR}, {device: mlx5_2, rate: NDR}]
nodes:
  - {name: gpu01, address: 10.0.0.1, profile: g8}
  - {name: gpu02, address: 10.0.0.2, profile: g8down}
fabric: {rate: NDR, subnet_manager: {kind: switch, switch: leaf1}}
switches: [{name: leaf1, embedded_sm: true}]
"""


def _fixture(path: str) -> str:
    return "".join(ln for ln in (FIX / path).read_text().splitlines(keepends=True) if not ln.startswith("#"))


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    res = load_text(SPEC, "c.yaml")
    assert res.cluster is not None, [d.format() for d in res.errors]
    return res.cluster


def _sections(lab: Path, ibstat: str = "ibstat/gpud_testdata_h100_some_down.txt") -> dict[str, str]:
    q = run(lab, "nvidia-smi", "--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total",
            "--format=csv,noheader")
    xid = "".join(ln + "\n" for ln in run(lab, "dmesg").stdout.splitlines() if "NVRM: Xid" in ln)
    return {"gpus": q.stdout + f"rc={q.returncode}\n", "xid": xid, "ibstat": _fixture(ibstat),
            "lsmod": _fixture("lsmod/gpud39_peermem_yaml_indented.txt")}


def _inject(lab: Path, kind: str, **params: object) -> None:
    path = lab / "root/nodes/gpu01/node.json"
    node = json.loads(path.read_text())
    faults.apply_fault(node, kind, dict(params))
    path.write_text(json.dumps(node))


def test_a_healthy_node_passes(cluster: Cluster, lab: Path) -> None:
    assert judge(cluster, cluster.node("gpu01"), _sections(lab)) == []


def test_a_gpu_off_the_bus_is_missing_from_nvidia_smi_and_logs_xid_79(cluster: Cluster, lab: Path) -> None:
    _inject(lab, "gpu_missing", index=3)
    problems = judge(cluster, cluster.node("gpu01"), _sections(lab))
    assert problems == ["gpu_count: 7 of 8 GPUs",
                        "xid: Xid 79 (GPU has fallen off the bus) on PCI 0000:48:00"]


def test_an_uncorrectable_ecc_error_is_counted_and_logged(cluster: Cluster, lab: Path) -> None:
    _inject(lab, "ecc_error", index=0, count=2)
    problems = judge(cluster, cluster.node("gpu01"), _sections(lab))
    assert problems == ["ecc: uncorrectable ECC errors on 00000000:18:00.0 (2)",
                        "xid: Xid 48 (double bit ECC error) on PCI 0000:18:00"]


def test_no_driver_and_a_port_down_and_no_peermem(cluster: Cluster, lab: Path) -> None:
    (lab / "sys/usr/lib/provisioner-lab/nvidia-driver.version").unlink()
    sections = _sections(lab) | {"lsmod": _fixture("lsmod/mesa_rdma_modules.txt")}
    problems = judge(cluster, cluster.node("gpu02"), sections)
    assert problems[0].startswith("gpu_count: nvidia-smi failed: NVIDIA-SMI has failed because it couldn't "
                                  "communicate with the NVIDIA driver")
    assert "ports: gpu02 mlx5_2/1 rail 1: mlx5_2/1 is down/disabled" in problems
    assert problems[-1] == "peermem: nvidia_peermem is not loaded"


def test_peermem_is_judged_as_the_spec_says(lab: Path) -> None:
    """DMA-BUF registers GPU memory without nvidia_peermem: a healthy DMA-BUF node without the module is healthy
    (watch used to fail it, and would have failed it over); with GPUDirect optional it is no failover reason either."""
    sections = _sections(lab) | {"lsmod": _fixture("lsmod/mesa_rdma_modules.txt")}
    for extra, problem in (("", True), ("gpudirect: {mode: dmabuf}\n", False),
                           ("verify: {gpudirect: {required: false}}\n", False)):
        res = load_text(SPEC + extra, "c.yaml")
        assert res.cluster is not None, [d.format() for d in res.errors]
        found = judge(res.cluster, res.cluster.node("gpu01"), sections)
        assert ("peermem: nvidia_peermem is not loaded" in found) is problem, (extra, found)


def test_application_xids_are_not_hardware_faults() -> None:
    xids = parse_xids(_fixture("dmesg/gpud_xid_readme.txt"))
    assert [x.code for x in xids] == [13, 13, 13, 109]
    assert xids[-1].pci == "0000:cb:00" and xids[-1].text.startswith("pid=1797828, name=pt_main_thread")
    assert not {x.code for x in xids} & set(CRITICAL_XIDS)


def test_ecc_not_applicable_is_no_error() -> None:
    assert parse_gpu_query("0, 00000000:18:00.0, [N/A]\nrc=0\n") == (0, [("00000000:18:00.0", None)], None)
    assert parse_gpu_query("No devices were found\nrc=6\n") == (6, [], "No devices were found")


class _Remote:
    def __init__(self, results: Mapping[str, Completed]) -> None:
        self.results = results

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        assert all(argv[:2] == ["sh", "-c"] for argv in commands.values())
        return {h: self.results[h] for h in commands}


def test_an_unreachable_node_is_unhealthy(cluster: Cluster, lab: Path) -> None:
    probe = "".join(f"### provisioner health: {k}\n{v.rstrip()}\n" for k, v in _sections(lab).items())
    assert split_probe(probe)["gpus"].startswith("0, 00000000:18:00.0, 0")
    got = check_nodes(cluster, _Remote({"gpu01": Completed(0, probe, ""),  # type: ignore[arg-type]
                                        "gpu02": Completed(255, "", "ssh: connect to host: No route to host")}),
                      ["gpu01", "gpu02"])
    assert got["gpu01"].ok and got["gpu01"].summary() == "healthy"
    assert not got["gpu02"].ok and got["gpu02"].summary() == "unreachable: ssh: connect to host: No route to host"
