"""Host-side causes fold the traffic findings they explain (provisioner/fabric/causes.py): with nvidia_peermem
missing on gpu03 the GPUDirect verdicts on its rails said "port is bad ... reseat or swap the cable"."""

from __future__ import annotations

from dataclasses import replace

from provisioner.fabric import causes, gpudirect
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.schedule import Localisation, NodeVerdict, verdict_findings


def peermem_missing_run() -> list[CheckResult]:
    module = gpudirect.peermem_findings("gpu03", {"modules": {"nvidia": {}}}, True)
    loc = Localisation(verdicts={("gpu03", r): NodeVerdict("gpu03", r, "bad", "failed with every peer",
                                                           ("gpu01", "gpu02")) for r in (0, 1)}, links=(), notes=())
    gdr = [replace(f, check=gpudirect.BW_CHECK)
           for f in verdict_findings(loc, device_by_rail={0: "mlx5_0", 1: "mlx5_1"})]
    slow = Finding("nccl", "error", "gpu03", None, None, 80.0, 40.0, "gpu03 node is slow in NCCL (2 of 2 pairs)", "")
    pairwise = Finding("pairwise_bandwidth", "error", "gpu01", "mlx5_0", None, 400, 100, "gpu01 rail 0: port is bad",
                       "reseat or swap the cable and transceiver", rail=0)
    return [CheckResult.from_findings(gpudirect.CHECK, "gpu03", module),
            CheckResult.from_findings(gpudirect.BW_CHECK, None, gdr),
            CheckResult.from_findings("nccl", None, [slow]),
            CheckResult.from_findings("pairwise_bandwidth", None, [pairwise])]


def test_the_verdicts_blamed_the_cable_before_folding() -> None:
    gdr = peermem_missing_run()[1].findings
    assert len(gdr) == 2 and all("cable" in f.hint and "port is bad" in f.message for f in gdr)


def test_a_missing_peermem_is_named_on_every_traffic_finding_of_its_node_and_no_cable_is() -> None:
    folded = causes.fold(peermem_missing_run())
    module, gdr, nccl, pairwise = folded
    assert module == peermem_missing_run()[0]  # the cause itself is unchanged
    for f in [*gdr.findings, *nccl.findings]:
        assert f.severity == "error" and f.node == "gpu03"
        assert "host-side cause, not a port or cable: gpu03: nvidia_peermem is not loaded" in f.message, f.message
        assert "reseat" not in f.hint and "modprobe nvidia_peermem" in f.hint
    assert [(f.device, f.rail) for f in gdr.findings] == [("mlx5_0", 0), ("mlx5_1", 1)]
    assert not gdr.passed and not nccl.passed  # still failed: the measurement did
    assert pairwise == peermem_missing_run()[3]  # host-memory bandwidth is not the GPU path: untouched


def test_a_gpu_off_the_bus_is_a_host_side_cause_too_and_a_topology_warning_is_not() -> None:
    node = "gpu02"
    lost = Finding(gpudirect.CHECK, "error", node, None, None, 2, 1, f"{node}: nvidia-smi shows 1 of 2 GPUs", "reseat")
    pairing = Finding(gpudirect.CHECK, "warning", "gpu01", "mlx5_0", 1, "GPU0 nearest", "mlx5_1", "pairing", "spec")
    checks = [CheckResult.from_findings(gpudirect.CHECK, node, [lost]),
              CheckResult.from_findings(gpudirect.CHECK, "gpu01", [pairing])]
    assert causes.host_causes(checks) == {node: lost}


def test_a_pcie_error_of_a_node_folds_its_gpudirect_and_nccl_findings_but_not_host_bandwidth() -> None:
    from provisioner.fabric import pcie

    down = Finding(pcie.CHECK, "error", "gpu03", "mlx5_1", None, "x16 32GT/s", "x8 32GT/s",
                   "gpu03: mlx5_1 (0000:2a:00.0, ...) trained at PCIe x8 32GT/s, capable of x16 32GT/s",
                   pcie.DOWNTRAINED_HINT)
    run = peermem_missing_run()
    checks = [CheckResult.from_findings(pcie.CHECK, "gpu03", [down]), *run[1:]]
    assert causes.host_causes(checks) == {"gpu03": down}
    _, gdr, nccl, pairwise = causes.fold(checks)
    for f in [*gdr.findings, *nccl.findings]:
        assert "host-side cause, not a port or cable: gpu03: mlx5_1" in f.message, f.message
        assert "reseat the card" in f.hint and "cable and transceiver" not in f.hint
    assert pairwise == run[3]
    could_not = CheckResult.could_not_run(pcie.CHECK, "gpu03", "lspci: command not found")
    assert causes.host_causes([could_not, *run[1:]]) == {}  # no measurement, no cause


def test_an_hca_trained_below_its_pcie_link_explains_its_plain_bandwidth_too() -> None:
    """ib_write_bw from host memory crosses the HCA's own PCIe link: trained at x8 it halves, and the verdict read
    "port is bad ... reseat or swap the cable" for that rail. Only that HCA's rail is folded, not the node's other
    rail, and a GPU's slow link (which host memory does not cross) folds no plain bandwidth finding."""
    from provisioner.fabric import pcie

    slow = Finding(pcie.CHECK, "error", "gpu02", "mlx5_1", None, "x16 32GT/s", "x8 32GT/s",
                   "gpu02: mlx5_1 (0000:41:00.0, ConnectX-7) trained at PCIe x8, capable of x16", "reseat the card")
    loc = Localisation(verdicts={("gpu02", r): NodeVerdict("gpu02", r, "bad", "failed with every peer",
                                                           ("gpu01", "gpu03")) for r in (0, 1)}, links=(), notes=())
    plain = verdict_findings(loc, device_by_rail={0: "mlx5_0", 1: "mlx5_1"})
    checks = [CheckResult.from_findings(pcie.CHECK, "gpu02", [slow]),
              CheckResult.from_findings("pairwise_bandwidth", None, plain)]
    _, folded = causes.fold(checks)
    by_rail = {f.rail: f for f in folded.findings}
    assert "host-side cause, not a port or cable: gpu02: mlx5_1" in by_rail[1].message and "reseat the card" in (
        by_rail[1].hint)
    assert by_rail[0] == plain[0] and "cable" in by_rail[0].hint  # mlx5_0's own link is fine: still its port
    gpu = replace(slow, device="gpu1", message="gpu02: gpu1 trained at PCIe x8, capable of x16")
    assert causes.fold([CheckResult.from_findings(pcie.CHECK, "gpu02", [gpu]), checks[1]])[1] == checks[1]
