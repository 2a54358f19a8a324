"""Recipes of the lab's stand-in vendor packages, as data.

The lab has no vendor repository, so it builds one.  Each recipe names a package the
way NVIDIA's apt repositories do (CUDA network repo for Ubuntu 22.04/24.04 and Debian 12,
DOCA host repo, MLNX_OFED) and lists the files it installs where the Ansible roles look
for them: version files, libraries with their real sonames, kernel-module stand-ins, the
simulated tools.  Nothing here builds anything: :mod:`provisioner.lab.vendor_repo` turns
the recipes into ``.deb`` files and an apt repository.

Version strings follow the real repositories where they are known (``nvidia-driver-550``
``550.90.07-0ubuntu1``, ``cuda-drivers-550`` and ``nvidia-fabricmanager-550``
``550.90.07-1``, ``cuda-toolkit-12-4`` ``12.4.1-1``, ``libnccl2`` ``2.21.5-1+cuda12.4``);
the OFED component versions follow the ``<ver>.OFED.<full ver>`` pattern of the MLNX_OFED
kernel packages and are documented as patterns in docs/notes/vendor-repo.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

SIMTOOLS_DIR = Path(__file__).resolve().parent.parent / "simtools"
FILES_DIR = Path(__file__).resolve().parent / "files"
LAB_LIB = "/usr/lib/provisioner-lab"
MODULE_STORE = f"{LAB_LIB}/modules"
MAINTAINER = "provisioner lab <lab@provisioner.invalid>"

# Highest CUDA version each driver branch supports (what nvidia-smi prints as "CUDA Version").
DRIVER_CUDA = {
    "535": "12.2",
    "545": "12.3",
    "550": "12.4",
    "555": "12.5",
    "560": "12.6",
    "565": "12.7",
    "570": "12.8",
    "575": "12.9",
    "580": "13.0",
}
# CUDA toolkit release -> cudart component version, as in the toolkit's version.json.
CUDART_VERSION = {"12.4.1": "12.4.127"}

NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")
OFED_MODULES = (
    "mlx_compat",
    "ib_core",
    "ib_uverbs",
    "ib_umad",
    "ib_ipoib",
    "mlx5_core",
    "mlx5_ib",
    "rdma_cm",
)


@dataclass(frozen=True)
class VendorVersions:
    """One pinned software set, as a cluster spec pins it.

    Several sets may go into one repository (a pinned one next to a newer "drift" one) so
    that apt pinning in the roles is tested against a real choice.
    """

    driver: str = "550.90.07"
    driver_flavor: Literal["open", "proprietary"] = "open"
    cuda: str = "12.4.1"
    nccl: str = "2.21.5"
    ofed_kind: Literal["doca", "mlnx"] = "doca"
    ofed: str = "24.10-1.1.4.0"
    doca: str = "2.9.1"
    fabric_manager: bool = True
    nccl_tests: str = "2.13.10"
    perftest_cuda: str = "25.10.0-0.128"

    @property
    def driver_branch(self) -> str:
        return self.driver.split(".", 1)[0]

    @property
    def cuda_short(self) -> str:
        """``12.4.1`` -> ``12.4`` (the toolkit directory and the NCCL build tag)."""
        return ".".join(self.cuda.split(".")[:2])


@dataclass(frozen=True)
class FileEntry:
    """One file a package installs: absolute path, content, permission bits."""

    path: str
    content: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class PackageRecipe:
    """What one .deb holds: control fields, files, symlinks and maintainer scripts."""

    name: str
    version: str
    description: str
    section: str = "misc"
    depends: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    files: tuple[FileEntry, ...] = ()
    links: tuple[tuple[str, str], ...] = ()  # (path, target)
    postinst: str = ""
    prerm: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.version)


def _text(path: str, text: str, mode: int = 0o644) -> FileEntry:
    return FileEntry(path, text.encode(), mode)


def _placeholder(path: str, what: str) -> FileEntry:
    return _text(path, f"provisioner lab stand-in for {what}; no real code inside\n")


def _tool(name: str, dest: str) -> FileEntry | None:
    """A simulated tool from provisioner/lab/simtools, or None while nobody has written it yet."""
    source = SIMTOOLS_DIR / name
    return FileEntry(dest, source.read_bytes(), 0o755) if source.is_file() else None


PERFTEST_BUILD_LINE = "BUILD: dict[str, object] = {}"
"""The line of simtools/ib_write_bw that says how the copy was compiled (fabsim_perftest.Build)."""


def perftest_tool_text(build: dict[str, object]) -> str:
    """The simulated ib_write_bw as one perftest build: the stock script with its BUILD line filled in."""
    text = (SIMTOOLS_DIR / "ib_write_bw").read_text()
    if PERFTEST_BUILD_LINE not in text:
        raise ValueError(f"simtools/ib_write_bw lost its '{PERFTEST_BUILD_LINE}' line")
    literal = "{" + ", ".join(f"{k!r}: {build[k]!r}" for k in sorted(build)) + "}"
    return text.replace(PERFTEST_BUILD_LINE, f"BUILD: dict[str, object] = {literal}")


def _data_file(name: str, dest: str, mode: int = 0o755) -> FileEntry:
    return FileEntry(dest, (FILES_DIR / name).read_bytes(), mode)


def _present(*entries: FileEntry | None) -> tuple[FileEntry, ...]:
    return tuple(e for e in entries if e is not None)


def _library(directory: str, soname: str, full_version: str, what: str) -> tuple[FileEntry, tuple[str, str]]:
    """``libfoo.so.<full>`` placeholder plus the ``libfoo.so.<major>`` soname link."""
    real = f"{soname.rsplit('.so.', 1)[0]}.so.{full_version}"
    return _placeholder(f"{directory}/{real}", what), (f"{directory}/{soname}", real)


def _module_scripts(store: str) -> tuple[str, str]:
    """postinst/prerm that put ``*.ko`` stand-ins under every kernel's updates/dkms.

    The containers share the host kernel, so the modules go to every directory under
    /lib/modules and to ``uname -r`` (the lab's simulated modprobe looks there).  Removal
    runs in prerm, while the store the names come from still exists.
    """
    postinst = f"""#!/bin/sh
set -e
if [ "$1" = configure ]; then
    for kver in $(ls /lib/modules 2>/dev/null) $(uname -r); do
        mkdir -p "/lib/modules/$kver/updates/dkms"
        cp -f {store}/*.ko "/lib/modules/$kver/updates/dkms/"
    done
fi
exit 0
"""
    prerm = f"""#!/bin/sh
set -e
if [ "$1" = remove ] || [ "$1" = upgrade ] || [ "$1" = deconfigure ]; then
    for kver in $(ls /lib/modules 2>/dev/null); do
        for ko in {store}/*.ko; do
            rm -f "/lib/modules/$kver/updates/dkms/$(basename "$ko")"
        done
    done
fi
exit 0
"""
    return postinst, prerm


def _module_files(store: str, names: tuple[str, ...], what: str) -> tuple[FileEntry, ...]:
    return tuple(_placeholder(f"{store}/{m}.ko", f"{what} kernel module {m}") for m in names)


def driver_recipes(v: VendorVersions) -> list[PackageRecipe]:
    """NVIDIA driver packages of one branch, as in the CUDA repo (Ubuntu names)."""
    br, ver = v.driver_branch, v.driver
    deb_ver = f"{ver}-0ubuntu1"
    suffix = "-open" if v.driver_flavor == "open" else ""
    other = "" if suffix else "-open"
    libdir = "/usr/lib/x86_64-linux-gnu"
    cuda_lib, cuda_link = _library(libdir, "libcuda.so.1", ver, "libcuda")
    nvml_lib, nvml_link = _library(libdir, "libnvidia-ml.so.1", ver, "NVML")
    version_file = json.dumps(
        {"version": ver, "cuda": DRIVER_CUDA.get(br, "12.4"), "flavor": v.driver_flavor}, sort_keys=True
    )
    store = f"{MODULE_STORE}/nvidia-{ver}{suffix}"
    postinst, prerm = _module_scripts(store)
    kernel = PackageRecipe(
        name=f"nvidia-dkms-{br}{suffix}",
        version=deb_ver,
        description=f"NVIDIA DKMS package ({'open' if suffix else 'proprietary'} modules), lab stand-in",
        section="kernel",
        conflicts=(f"nvidia-dkms-{br}{other}",),
        provides=("nvidia-dkms-kernel",),
        files=(
            *_module_files(store, NVIDIA_MODULES, f"NVIDIA {ver}"),
            _text(f"{LAB_LIB}/nvidia-driver.version", version_file + "\n"),
        ),
        postinst=postinst,
        prerm=prerm,
    )
    compute = PackageRecipe(
        name=f"libnvidia-compute-{br}",
        version=deb_ver,
        description="NVIDIA libcompute package (libcuda, NVML), lab stand-in",
        section="libs",
        files=(cuda_lib, nvml_lib),
        links=(cuda_link, nvml_link),
    )
    utils = PackageRecipe(
        name=f"nvidia-utils-{br}",
        version=deb_ver,
        description="NVIDIA driver support binaries (nvidia-smi), lab stand-in",
        section="utils",
        depends=(f"libnvidia-compute-{br} (= {deb_ver})",),
        files=_present(_tool("nvidia-smi", "/usr/bin/nvidia-smi")),
    )
    persistenced_unit = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=simple
ExecStart=/usr/bin/nvidia-persistenced
Restart=no

[Install]
WantedBy=multi-user.target
"""
    compute_utils = PackageRecipe(
        name=f"nvidia-compute-utils-{br}",
        version=deb_ver,
        description="NVIDIA compute utilities (nvidia-persistenced), lab stand-in",
        section="utils",
        files=(
            _data_file("nvidia-persistenced", "/usr/bin/nvidia-persistenced"),
            _text("/lib/systemd/system/nvidia-persistenced.service", persistenced_unit),
        ),
    )
    meta = PackageRecipe(
        name=f"nvidia-driver-{br}{suffix}",
        version=deb_ver,
        description=f"NVIDIA driver metapackage ({br}{suffix}), lab stand-in",
        depends=tuple(f"{p.name} (= {deb_ver})" for p in (kernel, compute, utils, compute_utils)),
        conflicts=(f"nvidia-driver-{br}{other}",),
    )
    cuda_drivers = PackageRecipe(
        name=f"cuda-drivers-{br}",
        version=f"{ver}-1",
        description=f"CUDA drivers metapackage for branch {br}, lab stand-in",
        depends=(f"nvidia-driver-{br}-open (>= {ver}) | nvidia-driver-{br} (>= {ver})",),
    )
    recipes = [kernel, compute, utils, compute_utils, meta, cuda_drivers]
    if v.fabric_manager:
        recipes.append(fabric_manager_recipe(v))
    return recipes


def fabric_manager_recipe(v: VendorVersions) -> PackageRecipe:
    br, ver = v.driver_branch, v.driver
    unit = """[Unit]
Description=NVIDIA fabric manager service

[Service]
User=root
PrivateTmp=false
Type=simple
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""
    cfg = (
        "LOG_LEVEL=4\nLOG_FILE_NAME=/var/log/fabricmanager.log\n"
        "FABRIC_MODE=0\nFM_STAY_RESIDENT_ON_FAILURES=0\n"
    )
    return PackageRecipe(
        name=f"nvidia-fabricmanager-{br}",
        version=f"{ver}-1",
        description="NVIDIA Fabric Manager, lab stand-in (fails without NVSwitch, like the real one)",
        section="utils",
        files=_present(
            _data_file("nv-fabricmanager", "/usr/bin/nv-fabricmanager"),
            _text("/lib/systemd/system/nvidia-fabricmanager.service", unit),
            _text("/usr/share/nvidia/nvswitch/fabricmanager.cfg", cfg),
            _text(f"/usr/share/doc/nvidia-fabricmanager-{br}/version", ver + "\n"),
        ),
    )


def cuda_recipes(v: VendorVersions) -> list[PackageRecipe]:
    """``cuda-toolkit-X-Y`` with the toolkit's version.json and the /usr/local/cuda alternative."""
    short = v.cuda_short
    dashed = short.replace(".", "-")
    home = f"/usr/local/cuda-{short}"
    manifest: dict[str, dict[str, str]] = {"cuda": {"name": "CUDA SDK", "version": v.cuda}}
    if v.cuda in CUDART_VERSION:
        manifest["cuda_cudart"] = {"name": "CUDA Runtime (cudart)", "version": CUDART_VERSION[v.cuda]}
    # The real file is pretty-printed with three-space indents and " : " separators.
    version_json = json.dumps(manifest, indent=3, separators=(",", " : ")) + "\n"
    priority = short.replace(".", "")
    major = short.split(".")[0]
    return [
        PackageRecipe(
            name=f"cuda-toolkit-{dashed}",
            version=f"{v.cuda}-1",
            description=f"CUDA Toolkit {short} meta-package, lab stand-in",
            section="devel",
            files=(
                _text(f"{home}/version.json", version_json),
                _placeholder(f"{home}/bin/nvcc", "nvcc"),
                _placeholder(
                    f"{home}/targets/x86_64-linux/lib/libcudart.so.{CUDART_VERSION.get(v.cuda, v.cuda)}",
                    "libcudart",
                ),
            ),
            postinst=(
                "#!/bin/sh\nset -e\n"
                f"update-alternatives --install /usr/local/cuda cuda {home} {priority}\n"
                f"update-alternatives --install /usr/local/cuda-{major} cuda-{major} {home} {priority}\n"
                "exit 0\n"
            ),
            prerm=(
                '#!/bin/sh\nset -e\nif [ "$1" = remove ]; then\n'
                f"    update-alternatives --remove cuda {home}\n"
                f"    update-alternatives --remove cuda-{major} {home}\nfi\nexit 0\n"
            ),
        )
    ]


def nccl_recipes(v: VendorVersions) -> list[PackageRecipe]:
    """``libnccl2``/``libnccl-dev`` ``<nccl>-1+cuda<X.Y>`` and the site-built ``nccl-tests``."""
    deb_ver = f"{v.nccl}-1+cuda{v.cuda_short}"
    libdir = "/usr/lib/x86_64-linux-gnu"
    lib, link = _library(libdir, "libnccl.so.2", v.nccl, "NCCL")
    major, minor, patch = [*v.nccl.split("."), "0", "0"][:3]
    header = (
        "/* provisioner lab stand-in for nccl.h */\n"
        f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
        '#define NCCL_SUFFIX ""\n'
        f"#define NCCL_VERSION_CODE {int(major) * 10000 + int(minor) * 100 + int(patch)}\n"
    )
    tests = [
        _tool(name, f"/usr/local/bin/{name}")
        for name in (
            "all_reduce_perf",
            "all_gather_perf",
            "reduce_scatter_perf",
            "alltoall_perf",
            "sendrecv_perf",
        )
    ]
    return [
        PackageRecipe(
            name="libnccl2",
            version=deb_ver,
            description="NVIDIA Collective Communication Library (NCCL) Runtime, lab stand-in",
            section="libs",
            files=(lib,),
            links=(link,),
        ),
        PackageRecipe(
            name="libnccl-dev",
            version=deb_ver,
            description="NVIDIA Collective Communication Library (NCCL) Development Files, lab stand-in",
            section="libdevel",
            depends=(f"libnccl2 (= {deb_ver})",),
            files=(_text("/usr/include/nccl.h", header),),
            links=((f"{libdir}/libnccl.so", "libnccl.so.2"),),
        ),
        PackageRecipe(
            name="nccl-tests",
            version=f"{v.nccl_tests}-1+nccl{v.nccl}+cuda{v.cuda_short}",
            description="NCCL tests (site build), lab stand-in",
            section="utils",
            depends=(f"libnccl2 (= {deb_ver})",),
            files=_present(*tests),
        ),
    ]


def perftest_cuda_recipe(v: VendorVersions) -> PackageRecipe:
    """``perftest-cuda``: a site build of perftest with CUDA, as the perftest_cuda role's package mode installs it.

    The real build is ``./configure CUDA_H_PATH=<toolkit>/include/cuda.h`` (linux-rdma/perftest README,
    "GPUDirect usage"); ``--use_cuda_dmabuf`` is compiled in when configure finds CUDA >= 11.7 headers
    (``CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD``) and rdma-core's ``ibv_reg_dmabuf_mr``, which Debian 12's
    rdma-core 44 has. Version ``<perftest>-1+cuda<X.Y>``, after the nccl-tests site-build pattern.
    """
    major_minor = tuple(int(x) for x in v.cuda_short.split("."))
    build = {"version": v.perftest_cuda, "cuda": True, "cuda_dmabuf": major_minor >= (11, 7)}
    bindir = "/usr/local/bin"
    return PackageRecipe(
        name="perftest-cuda",
        version=f"{v.perftest_cuda}-1+cuda{v.cuda_short}",
        description=f"perftest {v.perftest_cuda} built with CUDA {v.cuda_short} (site build), lab stand-in",
        section="net",
        files=(FileEntry(f"{bindir}/ib_write_bw", perftest_tool_text(build).encode(), 0o755),),
        links=((f"{bindir}/ib_read_bw", "ib_write_bw"), (f"{bindir}/ib_send_bw", "ib_write_bw")),
    )


def _ofed_component_version(v: VendorVersions) -> str:
    """``24.10-1.1.4.0`` -> ``24.10.OFED.24.10.1.1.4.0-1`` (MLNX kernel-package pattern)."""
    short = v.ofed.split("-", 1)[0]
    return f"{short}.OFED.{v.ofed.replace('-', '.')}-1"


OPENIBD_UNIT = """[Unit]
Description=openibd - configure Mellanox devices (lab stand-in)
DefaultDependencies=false
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/true

[Install]
WantedBy=sysinit.target
"""


def ofed_recipes(v: VendorVersions) -> list[PackageRecipe]:
    """DOCA-OFED (``doca-ofed``) or MLNX_OFED (``mlnx-ofed-basic``/``-all``) stand-ins."""
    comp = _ofed_component_version(v)
    compact = v.ofed.replace("-", "").replace(".", "")
    tool_ver = f"{v.ofed.split('-', 1)[0]}.0-1.{compact}"
    store = f"{MODULE_STORE}/mlnx-ofed-{v.ofed}"
    kmod_postinst, kmod_prerm = _module_scripts(store)
    components = {
        "ofed-scripts": comp,
        "mlnx-tools": tool_ver,
        "mlnx-ofed-kernel-utils": comp,
        "mlnx-ofed-kernel-dkms": comp,
        "perftest": tool_ver,
        "opensm": tool_ver,
        "infiniband-diags": tool_ver,
    }
    info = json.dumps({"kind": v.ofed_kind, "version": v.ofed, "packages": components}, sort_keys=True)
    opensmd_unit = """[Unit]
Description=OpenSM
After=network.target

[Service]
Type=simple
ExecStart=/usr/sbin/opensm
Restart=no

[Install]
WantedBy=multi-user.target
"""
    recipes = [
        PackageRecipe(
            "ofed-scripts",
            comp,
            "MLNX_OFED utilities (ofed_info), lab stand-in",
            "utils",
            files=_present(
                _tool("ofed_info", "/usr/bin/ofed_info"),
                _text(f"{LAB_LIB}/ofed.version", info + "\n"),
                _text("/usr/share/doc/ofed-scripts/version", v.ofed + "\n"),
            ),
        ),
        PackageRecipe(
            "mlnx-tools",
            tool_ver,
            "Mellanox userland tools (ibdev2netdev, mlnx_qos, cma_roce_*), lab stand-in",
            "utils",
            files=_present(
                _tool("ibdev2netdev", "/usr/bin/ibdev2netdev"),
                _tool("mlnx_qos", "/usr/bin/mlnx_qos"),  # setup.py script of mlnx-tools
                _tool("cma_roce_tos", "/usr/sbin/cma_roce_tos"),  # SBIN_PROGRAMS of its Makefile
                _tool("cma_roce_mode", "/usr/sbin/cma_roce_mode"),
            ),
        ),
        PackageRecipe(
            "mlnx-ofed-kernel-utils",
            comp,
            "Userspace tools to restart OFED kernel modules, lab stand-in",
            "utils",
            depends=(f"mlnx-ofed-kernel-dkms (= {comp})",),
            # the real package ships openibd (loads the OFED stack at boot); the stand-in loads nothing
            files=(_text("/lib/systemd/system/openibd.service", OPENIBD_UNIT),),
        ),
        PackageRecipe(
            "mlnx-ofed-kernel-dkms",
            comp,
            "DKMS support for mlnx-ofed kernel modules, lab stand-in",
            "kernel",
            files=_module_files(store, OFED_MODULES, f"OFED {v.ofed}"),
            postinst=kmod_postinst,
            prerm=kmod_prerm,
        ),
        PackageRecipe(
            "perftest",
            tool_ver,
            "InfiniBand performance tests (NVIDIA build), lab stand-in",
            "net",
            files=_present(*(_tool(t, f"/usr/bin/{t}") for t in ("ib_write_bw", "ib_read_bw", "ib_send_bw"))),
        ),
        PackageRecipe(
            "opensm",
            tool_ver,
            "InfiniBand subnet manager (NVIDIA build), lab stand-in",
            "net",
            files=_present(
                _tool("opensm", "/usr/sbin/opensm"),
                _text("/lib/systemd/system/opensmd.service", opensmd_unit),
            ),
        ),
    ]
    # infiniband-diags is Debian's real package (in the node image: its ibstat reads the
    # simulated sysfs).  A stand-in would need a version above Debian's 44.0-2 and would
    # replace the real ibstat; the MAD tools that cannot work without an HCA (sminfo,
    # iblinkinfo, saquery, ibnetdiscover) are simulated by the image's lab layer in /usr/local/sbin.
    everything = tuple(
        f"{name} (= {ver})" if name != "infiniband-diags" else name for name, ver in components.items()
    )
    if v.ofed_kind == "doca":
        recipes.append(
            PackageRecipe(
                "doca-ofed", f"{v.doca}-1", "DOCA-OFED meta package, lab stand-in", depends=everything
            )
        )
    else:
        recipes.append(
            PackageRecipe(
                "mlnx-ofed-basic", comp, "MLNX_OFED basic installation, lab stand-in", depends=everything
            )
        )
        recipes.append(
            PackageRecipe(
                "mlnx-ofed-all",
                comp,
                "MLNX_OFED all installation, lab stand-in",
                depends=(f"mlnx-ofed-basic (= {comp})",),
            )
        )
    return recipes


def recipes_for(v: VendorVersions) -> list[PackageRecipe]:
    """Every stand-in package of one pinned software set."""
    return [*driver_recipes(v), *cuda_recipes(v), *nccl_recipes(v), *ofed_recipes(v), perftest_cuda_recipe(v)]
