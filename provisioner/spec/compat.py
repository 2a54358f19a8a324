"""Version compatibility facts, checked at `provision validate` time (see the COMPAT-* rules).

Each entry cites where it comes from. Only combinations known to be wrong are rejected; everything else passes.
"""

from __future__ import annotations

# Minimum Linux x86_64 driver per CUDA toolkit release: NVIDIA CUDA Toolkit Release Notes, table "CUDA Toolkit
# and Corresponding Driver Versions" (docs.nvidia.com/cuda/cuda-toolkit-release-notes). Keys: (major, minor, update).
CUDA_MIN_DRIVER: dict[tuple[int, int, int], str] = {
    (11, 8, 0): "520.61.05",
    (12, 0, 0): "525.60.13", (12, 0, 1): "525.85.12",
    (12, 1, 0): "530.30.02", (12, 1, 1): "530.30.02",
    (12, 2, 0): "535.54.03", (12, 2, 1): "535.86.09", (12, 2, 2): "535.104.05",
    (12, 3, 0): "545.23.06", (12, 3, 1): "545.23.08", (12, 3, 2): "545.23.08",
    (12, 4, 0): "550.54.14", (12, 4, 1): "550.54.15",
    (12, 5, 0): "555.42.02", (12, 5, 1): "555.42.06",
    (12, 6, 0): "560.28.03", (12, 6, 1): "560.35.03", (12, 6, 2): "560.35.03", (12, 6, 3): "560.35.05",
    (12, 8, 0): "570.26", (12, 8, 1): "570.124.06",
}
# Minor version compatibility floor per CUDA major (same release notes, "CUDA Minor Version Compatibility"):
# a 12.x toolkit runs on any driver >= 525.60.13, without the features that need the newer driver (e.g. PTX JIT).
CUDA_MAJOR_FLOOR: dict[int, str] = {11: "450.80.02", 12: "525.60.13"}

# The first CUDA toolkit NVIDIA's apt repository carries for each OS (repository indexes
# developer.download.nvidia.com/compute/cuda/repos/<os>/x86_64: debian12 starts with cuda-12-3; ubuntu2404 has
# no 12.4.x, its first toolkit is 12.5 (Jimver/cuda-toolkit issue 365: 12.4.1 is a 404 on ubuntu2404).
OS_FIRST_CUDA: dict[str, tuple[int, int]] = {"debian-12": (12, 3), "ubuntu-24.04": (12, 5), "ubuntu-22.04": (11, 7)}

# GPU architectures that require the open kernel modules: NVIDIA driver README, "NVIDIA Open GPU Kernel Modules"
# (Grace Hopper and Blackwell are supported only by the open modules).
OPEN_MODULES_REQUIRED = {"B200-SXM-180GB"}
# Architectures the open kernel modules do not support: NVIDIA driver installation guide, "Kernel Modules"
# (docs.nvidia.com/datacenter/tesla/driver-installation-guide/kernel-modules.html): from R515 there are two
# flavours; the proprietary one "is required for older GPUs from the Maxwell, Pascal, or Volta architectures",
# the open one is "only for Turing and newer architectures".
OPEN_MODULES_UNSUPPORTED_ARCHS = {"maxwell", "pascal", "volta"}
# GPUDirect RDMA through Linux DMA-BUF instead of nvidia_peermem (spec gpudirect.mode: dmabuf):
#  - open kernel modules, R515 or later: linux-rdma/perftest README "CUDA DMA-BUF requierments" ("NVIDIA
#    Open-Source GPU Kernel Modules version 515 or later", "CUDA Toolkit 11.7 or later");
#  - CUDA 11.7: NCCL src/init.cc dmaBufSupported() needs cudaDriverVersion >= 11070 and the GPU's
#    CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED; perftest's configure tests CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
#  - NCCL 2.13: NCCL_DMABUF_ENABLE "(since 2.13)", default 1 (NVIDIA/nccl docs/userguide env.rst); an older NCCL
#    has no DMA-BUF path and, without nvidia_peermem, no GPUDirect RDMA at all;
#  - Linux 5.12 added dma-buf memory registration to the RDMA core (ibv_reg_dmabuf_mr; oneCCL's dmabuf guide
#    lists "Linux kernel version >= 5.12"). Every OS the spec allows ships a newer kernel (22.04: 5.15, 24.04:
#    6.8, Debian 12: 6.1), so this one is checked on the node by the nvidia_peermem role, not here.
DMABUF_MIN_DRIVER_BRANCH = 515
DMABUF_MIN_CUDA = (11, 7)
DMABUF_MIN_NCCL = (2, 13)
DMABUF_MIN_KERNEL = "5.12"
# First driver branch that supports a GPU model (driver release notes, "supported products").
GPU_MIN_BRANCH: dict[str, int] = {"H200-SXM-141GB": 550, "B200-SXM-180GB": 570, "H100-SXM5-80GB": 525,
                                  "H100-PCIE-80GB": 525, "H100-NVL-94GB": 535, "L40S": 525}


# The CUDA releases NVIDIA builds an NCCL release for (package suffix "+cudaX.Y"). A build for X.Y runs on any
# X.z toolkit (minor-version compatibility), never on another major. Sources: NCCL release notes, section
# "Compatibility" (docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-10-3.html: "supports CUDA 10.2, CUDA
# 11.0, and CUDA 11.4"; rel_2-12-10.html: "CUDA 10.2, CUDA 11.0, and CUDA 11.6"), and the redistributable index
# developer.nvidia.com/compute/redist/nccl/v2.30.7/ (nccl_2.30.7-1+cuda12.9, nccl_2.30.7-1+cuda13.3).
# Releases not listed are not checked (no source read for them here).
NCCL_CUDA_BUILDS: dict[str, tuple[str, ...]] = {
    "2.10.3": ("10.2", "11.0", "11.4"),
    "2.12.10": ("10.2", "11.0", "11.6"),
    "2.30.7": ("12.9", "13.3"),
}

# DOCA release -> the OFED version `ofed_info -s` reports (the doca_ofed role's doca_ofed_doca_releases holds the
# same map; the sources are cited there). DOCA 2.7.0, which the examples pin, is NOT listed: no public page read
# here names its OFED version (docs.nvidia.com/doca/archive/2-7-0 is not in the reference set; the network
# operator's doca-driver 24.04-0.6.6.0 and `ofed_info -s` = OFED-internal-24.04-0.6.6 from DOCA-era guides are
# consistent with it but never state the DOCA release), so a DOCA 2.7.0 run needs doca_ofed_ofed_version set.
DOCA_OFED: dict[str, str] = {"2.9.1": "24.10-1.1.4.0", "3.2.2": "25.10-2.4.1", "3.3.0": "26.01-1.0.0.0"}

# First release of a DOCA-Host / MLNX_OFED line that supports an OS (the spec's cluster.os values). A release of
# that line older than the one listed does not support the OS; lines and OSes not listed are not checked.
# Sources, both "added support for" statements in NVIDIA's release notes:
#  - docs.nvidia.com/networking/display/mlnxofedv23103211lts/Changes+and+New+Features: MLNX_OFED 23.10-3.2.1.1
#    "Added support for the following OSes: ... Debian 12.5" (so 23.10-0.5.5.0 .. 23.10-2.1.3.1 lack it).
#  - docs.nvidia.com/doca/archive/2-5-2/NVIDIA+DOCA+Release+Notes: DOCA 2.5.2 "DOCA-Host operating systems
#    updated in this release: ... Debian 12.5" (so DOCA 2.5.0 and 2.5.1 lack it).
# Keys: (flavor, release line) with the line = the version's first two numbers ("23.10", "2.5").
OFED_OS_FIRST: dict[tuple[str, str], dict[str, str]] = {
    ("mlnx_ofed", "23.10"): {"debian-12": "23.10-3.2.1.1"},
    ("doca", "2.5"): {"debian-12": "2.5.2"},
}

# Lustre client releases that do not build against an OFED release: (Lustre client version, OFED flavor, OFED
# version prefix, reason). Source: Azure/az-hop issue 130 (github.com/Azure/az-hop/issues/130): the Lustre 2.12.6
# client "will not build" after MLNX_OFED was upgraded to 5.2-1.0.4 ("configure: error: no OFED nor kernel OpenIB
# gen2 headers present", ib_fmr_pool.h missing), tracked as LU-14297 ("Can't compile lustre client against MLNX
# OFED-5.2-1.0.4"). No known-unsupported Lustre client / OS pair is listed: the Lustre ChangeLog
# (lustre/lustre-release lustre/ChangeLog) names the kernels each release was built and tested on and says
# "others may also work", which is not a statement that any OS fails.
LUSTRE_OFED_BAD: tuple[tuple[str, str, str, str], ...] = (
    ("2.12.6", "mlnx_ofed", "5.2-1.0.4",
     "the o2iblnd build finds no ib_fmr_pool.h there (LU-14297)"),
)
# Lustre client releases and the OSes of this spec whose kernel the Lustre ChangeLog lists under "Client primary
# kernels built and tested during release cycle" (lustre/lustre-release and microsoft/amlFilesystem-lustre
# lustre/ChangeLog: 2.15.0-2.15.2 list Ubuntu 20.04 only; the 2.17.0 entry, still dated "TBD" in the stored
# copies, lists 5.15.0-88 (Ubuntu 22.04) and 6.8.0-35 (Ubuntu 24.04)). Informational (docs/rules.md table): a release or
# OS missing here is untested upstream, not known-bad, so no rule reads it.
LUSTRE_CLIENT_TESTED: dict[str, tuple[str, ...]] = {"2.17.0": ("ubuntu-22.04", "ubuntu-24.04")}


def version_tuple(v: str) -> tuple[int, ...]:
    """'550.54.15' → (550, 54, 15); non-numeric parts end the tuple."""
    out: list[int] = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def cuda_key(cuda: str) -> tuple[int, int, int] | None:
    t = version_tuple(cuda)
    if len(t) < 2:
        return None
    return (t[0], t[1], t[2] if len(t) > 2 else 0)


def min_driver_for(cuda: str) -> str | None:
    """The driver the CUDA release notes require for this toolkit release, if the table knows it."""
    key = cuda_key(cuda)
    if key is None:
        return None
    if key in CUDA_MIN_DRIVER:
        return CUDA_MIN_DRIVER[key]
    # an update newer than the table knows: the newest known update of that minor is a lower bound
    known = sorted(k for k in CUDA_MIN_DRIVER if k[:2] == key[:2] and k <= key)
    return CUDA_MIN_DRIVER[known[-1]] if known else None


def nccl_cuda_mismatch(nccl: str, cuda: str) -> tuple[str, ...] | None:
    """The CUDA builds of ``nccl`` when none is of ``cuda``'s major (a known-bad pair); None when fine or unknown."""
    builds = NCCL_CUDA_BUILDS.get(nccl)
    major = version_tuple(cuda)[:1]
    if builds is None or not major:
        return None
    if any(version_tuple(b)[:1] == major for b in builds):
        return None
    return builds


def ofed_release_line(version: str) -> str | None:
    """'23.10-2.1.3.1' → '23.10', '2.5.2' → '2.5': the release line OFED_OS_FIRST is keyed by."""
    t = version_tuple(version.split("-", 1)[0])
    return f"{t[0]}.{t[1]}" if len(t) >= 2 else None


def ofed_version_key(version: str) -> tuple[int, ...]:
    """'23.10-3.2.1.1' → (23, 10, 3, 2, 1, 1): MLNX_OFED versions compare on all their numbers."""
    out: list[int] = []
    for part in version.split("-"):
        out.extend(version_tuple(part))
    return tuple(out)


def ofed_os_unsupported(flavor: str, version: str, os_name: str) -> str | None:
    """The first release of ``version``'s line that supports ``os_name`` when ``version`` is older; else None."""
    line = ofed_release_line(version)
    first = OFED_OS_FIRST.get((flavor, line or ""), {}).get(os_name)
    if first is None or ofed_version_key(version) >= ofed_version_key(first):
        return None
    return first


def lustre_ofed_conflict(lustre: str, flavor: str, ofed: str) -> str | None:
    """Why the Lustre client ``lustre`` does not build against this OFED release; None when fine or unknown."""
    for bad_lustre, bad_flavor, prefix, reason in LUSTRE_OFED_BAD:
        if lustre == bad_lustre and flavor == bad_flavor and (ofed == prefix or ofed.startswith(prefix + ".")):
            return reason
    return None


def compat_table() -> list[tuple[str, str, str]]:
    """(component, versions, requirement) rows for the generated compatibility table in docs/rules.md."""
    rows: list[tuple[str, str, str]] = []
    for (maj, minor, upd), drv in sorted(CUDA_MIN_DRIVER.items()):
        rows.append(("CUDA", f"{maj}.{minor}.{upd}", f"driver >= {drv}"))
    for major, floor in sorted(CUDA_MAJOR_FLOOR.items()):
        rows.append(("CUDA", f"{major}.x (minor-version compatibility)", f"driver >= {floor}"))
    for os_name, (maj, minor) in sorted(OS_FIRST_CUDA.items()):
        rows.append(("CUDA", f"apt repository of {os_name}", f"CUDA >= {maj}.{minor}"))
    for gpu, branch in sorted(GPU_MIN_BRANCH.items()):
        extra = ", open kernel modules only" if gpu in OPEN_MODULES_REQUIRED else ""
        rows.append(("driver", gpu, f"branch >= {branch}{extra}"))
    rows.append(("driver", "Maxwell, Pascal, Volta GPUs", "proprietary kernel modules only"))
    rows.append(("GPUDirect DMA-BUF", "gpudirect.mode: dmabuf",
                 f"open kernel modules (Turing or newer), driver branch >= {DMABUF_MIN_DRIVER_BRANCH}, "
                 f"CUDA >= {DMABUF_MIN_CUDA[0]}.{DMABUF_MIN_CUDA[1]}, "
                 f"NCCL >= {DMABUF_MIN_NCCL[0]}.{DMABUF_MIN_NCCL[1]}, "
                 f"kernel >= {DMABUF_MIN_KERNEL}; no nvidia_peermem"))
    for nccl, builds in sorted(NCCL_CUDA_BUILDS.items(), key=lambda kv: version_tuple(kv[0])):
        rows.append(("NCCL", nccl, "built for CUDA " + ", ".join(builds) + " (same CUDA major)"))
    for doca, ofed in sorted(DOCA_OFED.items(), key=lambda kv: version_tuple(kv[0])):
        rows.append(("DOCA-OFED", doca, f"ofed_info -s = OFED-internal-{ofed}"))
    names = {"doca": "DOCA", "mlnx_ofed": "MLNX_OFED"}
    for (flavor, line), firsts in sorted(OFED_OS_FIRST.items()):
        for os_name, first in sorted(firsts.items()):
            rows.append(("DOCA-OFED", f"{names[flavor]} {line}.x on {os_name}", f"{names[flavor]} >= {first}"))
    for lustre, flavor, prefix, reason in LUSTRE_OFED_BAD:
        rows.append(("Lustre client", lustre, f"does not build against {names[flavor]} {prefix}: {reason}"))
    for lustre, oses in sorted(LUSTRE_CLIENT_TESTED.items(), key=lambda kv: version_tuple(kv[0])):
        rows.append(("Lustre client", lustre, "client kernels tested upstream: " + ", ".join(oses)))
    return rows
