"""The pcie check (provisioner/fabric/pcie.py): GPUs and HCAs at their capable PCIe link, no ACS redirect between
them. The real captures under tests/fixtures/lspci are judged as they are; a whole GPU node (GPU and HCA under one
PCIe switch, as on HGX boards) is built from lines in the format of those captures: the A100 -nn device line
(hwloc #653), the LnkCap/LnkSta lines (geerlingguy #692, sbc-reviews #50) and the PLX switch port with its Bus and
ACSCtl lines (HeyMeco #6)."""

from __future__ import annotations

from provisioner.fabric import pcie
from provisioner.parsers.lspci import below_capable
from provisioner.remote import Completed
from tests.unit._parser_fixtures import load

ACS_ON = "ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
ACS_OFF = "ACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"


def _bridge(bdf: str, sec: int, sub: int, acs: str = ACS_OFF) -> str:
    return (f"{bdf} PCI bridge [0604]: PLX Technology, Inc. PEX 89144 [1000:c010] (rev b0) "
            "(prog-if 00 [Normal decode])\n"
            f"\tBus: primary={int(bdf.split(':')[1], 16):02x}, secondary={sec:02x}, subordinate={sub:02x}, "
            "sec-latency=0\n"
            "\tCapabilities: [68] Express (v2) Downstream Port (Slot+), MSI 00\n"
            "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported\n"
            "\t\tLnkSta:\tSpeed 32GT/s (ok), Width x16 (ok)\n"
            "\tCapabilities: [200 v1] Access Control Services\n"
            "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+\n"
            f"\t\t{acs}\n\tKernel driver in use: pcieport\n\n")


def _endpoint(bdf: str, header: str, sta: str = "Speed 32GT/s (ok), Width x16 (ok)") -> str:
    return (f"{bdf} {header}\n\tCapabilities: [60] Express (v2) Endpoint, MSI 00\n"
            "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported\n"
            f"\t\tLnkSta:\t{sta}\n\n")


GPU = "3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)"
HCA = "Infiniband controller [0207]: Mellanox Technologies MT2910 Family [ConnectX-7] [15b3:1021]"
NAMES = (f"{pcie.NAMES_MARK}\n0, 00000000:1B:00.0\n"
         "0000:1a:00.0 mlx5_1 (MT4129 - MCX75310AAS-NEAT) ConnectX-7 fw 28.39.1002 port 1 (ACTIVE) ==> ibp26s0 (Up)\n")


def node(*, hca_sta: str = "Speed 32GT/s (ok), Width x16 (ok)", downstream_acs: str = ACS_OFF,
         root_acs: str = ACS_ON) -> str:
    """Root port 0000:00:01.0 (ACS on, as root ports ship) -> switch upstream 0000:18:00.0 -> downstream ports
    0000:19:00.0 (bus 1a, the HCA) and 0000:19:01.0 (bus 1b, the GPU)."""
    return (_bridge("0000:00:01.0", 0x18, 0x1b, root_acs) + _bridge("0000:18:00.0", 0x19, 0x1b)
            + _bridge("0000:19:00.0", 0x1a, 0x1a, downstream_acs) + _bridge("0000:19:01.0", 0x1b, 0x1b, downstream_acs)
            + _endpoint("0000:1a:00.0", HCA, hca_sta) + _endpoint("0000:1b:00.0", GPU) + NAMES)


def _done(stdout: str, rc: int = 0, stderr: str = "") -> Completed:
    return Completed(rc=rc, stdout=stdout, stderr=stderr)


def test_healthy_node_passes_with_acs_on_above_the_switch_only() -> None:
    result = pcie.check_node("gpu01", _done(node()))
    assert result.passed and not result.findings, result.findings
    assert result.measurements == {"gpus": 1, "hcas": 1, "bridges": 4}


def test_a_downtrained_hca_fails_naming_node_device_and_both_links_never_a_cable() -> None:
    result = pcie.check_node("gpu02", _done(node(hca_sta="Speed 32GT/s (ok), Width x8 (downgraded)")))
    (f,) = result.findings
    assert not result.passed and f.severity == "error"
    assert (f.node, f.device, f.expected, f.observed) == ("gpu02", "mlx5_1", "x16 32GT/s", "x8 32GT/s")
    assert "gpu02: mlx5_1 (0000:1a:00.0" in f.message
    assert "reseat the card" in f.hint and "riser" in f.hint and "BIOS" in f.hint and "not a cable" in f.hint


def test_acs_redirect_on_the_switch_ports_between_gpu_and_hca_fails_naming_each_bridge() -> None:
    result = pcie.check_node("gpu03", _done(node(downstream_acs=ACS_ON)))
    assert not result.passed
    assert [f.device for f in result.findings] == ["0000:19:00.0", "0000:19:01.0"]
    f = result.findings[0]
    assert f.node == "gpu03" and "gpu0–mlx5_1" in f.message and "ReqRedir+ CmpltRedir+" in f.message
    assert "setpci -s 0000:19:00.0 ECAP_ACS+0x6.w=0000" in f.hint and "BIOS" in f.hint


def test_a_gpu_without_names_is_named_by_its_address() -> None:
    text = node(hca_sta="Speed 16GT/s (downgraded), Width x16 (ok)").split(pcie.NAMES_MARK)[0]
    (f,) = pcie.check_node("gpu02", _done(text)).findings
    assert f.device == "0000:1a:00.0" and f.observed == "x16 16GT/s"


def test_real_capture_of_a_riser_downgraded_gpu_is_below_capable_and_a_plx_port_redirects() -> None:
    from provisioner.parsers import parse

    (gpu,) = parse("lspci", load("lspci", "jan183_rtx4090_riser_grep.txt"))["devices"]
    assert below_capable(gpu)
    port, _ = parse("lspci", load("lspci", "heymeco6_plx_pex8725_acs.txt"))["devices"]
    assert pcie.redirects(port)
    quiet = [d for d in parse("lspci", load("lspci", "nccl523_grep_acsctl.txt"))["devices"] if not pcie.redirects(d)]
    assert len(quiet) == 6  # SrcValid+ alone does not redirect peer traffic


def test_real_a100_capture_without_link_lines_could_not_run_rather_than_pass() -> None:
    result = pcie.check_node("gpu01", _done(load("lspci", "hwloc653_a100_sxm4_nn.txt")))
    assert result.error is not None and "no LnkCap/LnkSta for 0000:da:00.0" in result.error


def test_unparsable_output_and_a_missing_lspci_could_not_run() -> None:
    bad = pcie.check_node("gpu01", _done("pcilib: Cannot open /proc/bus/pci\nlspci: Cannot find any working access "
                                         "method.\n", rc=1))
    assert bad.error is not None and "'pcilib: Cannot open /proc/bus/pci'" in bad.error
    missing = pcie.check_node("gpu01", _done("", rc=127, stderr="lspci: command not found (install pciutils)\n"))
    assert missing.error == "lspci: command not found (install pciutils)"
    only_bridges = pcie.check_node("gpu01", _done(load("lspci", "heymeco6_plx_pex8725_acs.txt")))
    assert only_bridges.error is not None and "lists no NVIDIA GPU" in only_bridges.error
