"""What the field knows about the hardware a spec names: GPU models, link rates, widths.

Kept as data so that rules and the lab read the same facts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    """A GPU model as `nvidia-smi` names it, and what its form factor allows."""

    key: str
    smi_name: str
    memory_mib: int
    form: str  # "sxm" or "pcie"
    nvlink_gbps: float  # per-GPU NVLink bandwidth (one direction, GB/s), 0 for none
    pcie_gen: int
    arch: str = ""  # GPU architecture (volta, ampere, ada, hopper, blackwell): what the open kernel modules support


GPU_MODELS: dict[str, GpuModel] = {
    g.key: g
    for g in (
        # Volta: nvidia-smi name and 32768 MiB as nvidia-smi prints them (captured outputs, e.g. in public issue
        # threads); NVLink 2.0: 6 links x 25 GB/s per direction; PCIe gen 3.
        GpuModel("V100-SXM2-32GB", "Tesla V100-SXM2-32GB", 32768, "sxm", 150, 3, "volta"),
        GpuModel("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", 40960, "sxm", 300, 4, "ampere"),
        GpuModel("A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", 81920, "sxm", 300, 4, "ampere"),
        GpuModel("A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", 40960, "pcie", 0, 4, "ampere"),
        GpuModel("A100-PCIE-80GB", "NVIDIA A100 80GB PCIe", 81920, "pcie", 0, 4, "ampere"),
        GpuModel("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 81559, "sxm", 450, 5, "hopper"),
        GpuModel("H100-PCIE-80GB", "NVIDIA H100 PCIe", 81559, "pcie", 0, 5, "hopper"),
        GpuModel("H100-NVL-94GB", "NVIDIA H100 NVL", 95830, "pcie", 0, 5, "hopper"),
        GpuModel("H200-SXM-141GB", "NVIDIA H200", 143771, "sxm", 450, 5, "hopper"),
        GpuModel("B200-SXM-180GB", "NVIDIA B200", 183359, "sxm", 900, 6, "blackwell"),
        GpuModel("L40S", "NVIDIA L40S", 46068, "pcie", 0, 4, "ada"),
        GpuModel("L4", "NVIDIA L4", 23034, "pcie", 0, 4, "ada"),
    )
}

STACK_GAPS: dict[str, str] = {
    # NVIDIA Fabric Manager user guide (release 2.3), "Systems Using Fourth Generation NVSwitches" and "What is
    # NVLink Subnet Manager?": on HGX B200/B100 baseboards fabric manager needs NVLSM to train the NVSwitch fabric
    "B200-SXM-180GB": "NVIDIA's NVLink Subnet Manager (nvlsm), which fabric manager needs on the fourth-generation "
                      "NVSwitch baseboards of HGX B200 (Fabric Manager user guide 2.3)",
}
"""GPU models in the catalog whose NVSwitch boards need software no role installs yet: what is missing, and where
that is documented. A spec naming one with ``nvswitch: true`` is refused (rule GPU-STACK-MISSING)."""

# InfiniBand generation names to the per-lane data rate in Gb/s, as ibstat's Rate is computed (4X FDR = 56).
IB_SPEEDS: dict[str, float] = {
    "SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0,
    "HDR": 50.0, "NDR": 100.0, "XDR": 200.0,
}
# Usual 4X port rates by name, as operators say them (HDR100 is a 2X HDR port).
RATE_NAMES: dict[str, int] = {
    "SDR": 10, "DDR": 20, "QDR": 40, "FDR": 56, "EDR": 100, "HDR100": 100, "HDR": 200, "NDR200": 200,
    "NDR": 400, "XDR": 800,
}
WIDTHS: dict[str, int] = {"1X": 1, "2X": 2, "4X": 4, "8X": 8, "12X": 12}
ETHERNET_RATES = (10, 25, 40, 50, 100, 200, 400, 800)

