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
kernel packages and are documented as patterns in docs/lab.md ("The vendor repository").
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

SIMTOOLS_DIR = Path(__file__).resolve().parent.parent / "simtools"
FILES_DIR = Path(__file__).resolve().parent / "files"
LAB_LIB = "/usr/lib/provisioner-lab"
MAINTAINER = "provisioner lab <lab@provisioner.invalid>"
PERSISTENCED_USER = "nvidia-persistenced"

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
    kernel_packages: bool = False
    """Also stand-ins of the running kernel's image/headers packages and metapackages, plus a newer kernel
    the metapackages' second version pulls in (what an unattended upgrade would install): see
    :func:`kernel_recipes`. Off by default: an installed linux-headers stand-in would satisfy roles that
    install the headers when the lab hides them."""
    perftest_cuda: str = "25.10.0-0.128"
    dcgm: str = "3.3.9"
    """DCGM 3.x: ``datacenter-gpu-manager`` ``1:<dcgm>`` (:func:`dcgm_recipe`)."""
    containers: bool = False
    """Also the container stack (:func:`container_recipes`): nvidia-container-toolkit, enroot's release .debs and a
    site-built pyxis package. Off by default: only the containers scenario needs them."""
    container_toolkit: str = "1.17.3"
    enroot: str = "3.5.0"
    pyxis: str = "0.20.0"

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
    release_dir: str = ""
    """Not in the apt index: the .deb goes to this directory of the repository under its release file name, the
    way a vendor publishes it outside any apt repository (enroot's GitHub release, mirrored by the site)."""

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


def dkms_conf(name: str, version: str, modules: tuple[str, ...], make: str) -> str:
    """A dkms.conf in the real format (the lab's simulated dkms reads it like dkms does)."""
    lines = [f'PACKAGE_NAME="{name}"', f'PACKAGE_VERSION="{version}"', f'MAKE="{make}"', 'AUTOINSTALL="yes"']
    for i, module in enumerate(modules):
        lines += [f'BUILT_MODULE_NAME[{i}]="{module}"', f'DEST_MODULE_LOCATION[{i}]="/updates/dkms"']
    return "\n".join(lines) + "\n"


def _dkms_scripts(name: str, version: str) -> tuple[str, str]:
    """postinst/prerm of a ``*-dkms`` package, as dh_dkms writes them (dkms_common.postinst's logic).

    postinst adds the source to DKMS and builds and installs it for the running kernel when its headers are
    there (``/lib/modules/<kernel>/build/include``); without them it says so and builds nothing, like
    dkms_common.postinst ("Module build for kernel ... was skipped since the kernel headers for this kernel
    do not seem to be installed.").  prerm removes every build (``dkms remove --all``).  ``dkms`` is the
    lab's simulated one in /usr/local/sbin (the image's lab layer), where the real package depends on dkms.
    """
    postinst = f"""#!/bin/sh
set -e
PATH=/usr/local/sbin:$PATH
if [ "$1" = configure ]; then
    dkms add -m {name} -v {version}
    KERNEL=$(uname -r)
    if [ -e "/lib/modules/$KERNEL/build/include" ]; then
        echo "Building for $KERNEL"
        dkms build -m {name} -v {version} -k "$KERNEL"
        dkms install -m {name} -v {version} -k "$KERNEL"
    else
        echo "Module build for kernel $KERNEL was skipped since the"
        echo "kernel headers for this kernel do not seem to be installed."
    fi
fi
exit 0
"""
    prerm = f"""#!/bin/sh
set -e
PATH=/usr/local/sbin:$PATH
case "$1" in
    remove|upgrade|deconfigure)
        if [ -n "$(dkms status -m {name} -v {version})" ]; then
            dkms remove -m {name} -v {version} --all
        fi
        ;;
esac
exit 0
"""
    return postinst, prerm


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
    postinst, prerm = _dkms_scripts("nvidia", ver)
    make = "'make' -j$(nproc) KERNEL_UNAME=${kernelver} modules"
    kernel = PackageRecipe(
        name=f"nvidia-dkms-{br}{suffix}",
        version=deb_ver,
        description=f"NVIDIA DKMS package ({'open' if suffix else 'proprietary'} modules), lab stand-in",
        section="kernel",
        conflicts=(f"nvidia-dkms-{br}{other}",),
        provides=("nvidia-dkms-kernel",),
        files=(
            _text(f"/usr/src/nvidia-{ver}/dkms.conf", dkms_conf("nvidia", ver, NVIDIA_MODULES, make)),
            _placeholder(f"/usr/src/nvidia-{ver}/nvidia-peermem/nvidia-peermem.c", "the nvidia-peermem source"),
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
    # Ubuntu's unit (nvidia-compute-utils-<branch>) starts the daemon with persistence mode OFF; see
    # docs/lab-hardware-model.md for the sources. The lab adds [Install] (Ubuntu's is static and started when
    # the driver appears, and the lab has no udev to do that).
    persistenced_unit = f"""[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user {PERSISTENCED_USER} --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

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
        # The daemon's --user, made by the package like Ubuntu's postinst does.
        postinst=(
            "#!/bin/sh\nset -e\n"
            f"if [ \"$1\" = configure ] && ! getent passwd {PERSISTENCED_USER} >/dev/null; then\n"
            "    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \\\n"
            f"        --comment 'NVIDIA Persistence Daemon,,,' {PERSISTENCED_USER}\nfi\nexit 0\n"
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
            # the marker tells the simulated nccl-tests which NCCL it loaded ("NCCL version X+cudaY.Z")
            files=(lib, _text(f"{LAB_LIB}/nccl.version",
                              json.dumps({"version": v.nccl, "cuda": v.cuda_short}, sort_keys=True) + "\n")),
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


OPENMPI_DEB = "4.1.4-3+b1"
"""Debian bookworm's Open MPI (openmpi-bin, libopenmpi-dev, libopenmpi3)."""


def mpi_recipes() -> list[PackageRecipe]:
    """Stand-ins for the OS's Open MPI: ``mpirun``/``orted`` (simulated, fabsim_mpi.py) and the headers.

    On real sites these come from the OS repository; the lab's nodes are offline and reach only the lab's
    repository, so it carries them under Debian's names and version.
    """
    libdir = "/usr/lib/x86_64-linux-gnu"
    home = f"{libdir}/openmpi"
    header = "/* provisioner lab stand-in for Open MPI 4.1's mpi.h */\n#define OMPI_MAJOR_VERSION 4\n" \
             "#define OMPI_MINOR_VERSION 1\n#define OMPI_RELEASE_VERSION 4\n"
    runtime = PackageRecipe(
        name="libopenmpi3", version=OPENMPI_DEB, description="high performance message passing library, lab stand-in",
        section="libs", files=(_placeholder(f"{libdir}/libmpi.so.40.30.4", "libmpi"),),
        links=((f"{libdir}/libmpi.so.40", "libmpi.so.40.30.4"),))
    return [
        runtime,
        PackageRecipe(
            name="openmpi-bin", version=OPENMPI_DEB,
            description="high performance message passing library -- binaries (mpirun, orted), lab stand-in",
            section="net", depends=(f"libopenmpi3 (= {OPENMPI_DEB})",),
            files=_present(_tool("mpirun", "/usr/bin/mpirun.openmpi"), _tool("orted", "/usr/bin/orted")),
            links=(("/usr/bin/mpirun", "mpirun.openmpi"), ("/usr/bin/mpiexec", "mpirun.openmpi"),
                   ("/usr/bin/orterun", "mpirun.openmpi"))),
        PackageRecipe(
            name="libopenmpi-dev", version=OPENMPI_DEB,
            description="high performance message passing library -- header files, lab stand-in",
            section="libdevel", depends=(f"libopenmpi3 (= {OPENMPI_DEB})",),
            files=(_text(f"{home}/include/mpi.h", header),),
            links=((f"{home}/lib/libmpi.so", "../../libmpi.so.40"),)),
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


DCGM_USER = "nvidia-dcgm"
DCGM_UNIT = f"""[Unit]
Description=NVIDIA DCGM service
Conflicts=dcgm.service

[Service]
ExecStart=/usr/bin/nv-hostengine -n --service-account {DCGM_USER}
Restart=on-abort

[Install]
WantedBy=multi-user.target
"""
"""The unit DCGM 3.x ships as /usr/lib/systemd/system/nvidia-dcgm.service (the command line every public
``systemctl status nvidia-dcgm`` shows); the package enables nothing: NVIDIA's guide says ``systemctl --now enable
nvidia-dcgm``, which the dcgm role does."""


def dcgm_recipe(v: VendorVersions) -> PackageRecipe:
    """``datacenter-gpu-manager`` ``1:<dcgm>`` (epoch 1, as the CUDA repository publishes DCGM 3.x): ``dcgmi`` (the
    simulated diagnostic), the stand-in ``nv-hostengine`` and the ``nvidia-dcgm`` unit where DCGM 3.x installs them
    (NVIDIA/DCGM scripts/verify_package_contents/datacenter-gpu-manager_VERSION_amd64.deb.txt); its postinst makes
    the ``nvidia-dcgm`` service account and /var/log/nvidia-dcgm as the real one does (scripts/deb/postinst)."""
    return PackageRecipe(
        name="datacenter-gpu-manager",
        version=f"1:{v.dcgm}",
        description="NVIDIA Datacenter GPU Manager (dcgmi, nv-hostengine), lab stand-in",
        section="utils",
        files=_present(
            _tool("dcgmi", "/usr/bin/dcgmi"),
            _data_file("nv-hostengine", "/usr/bin/nv-hostengine"),
            _text("/usr/lib/systemd/system/nvidia-dcgm.service", DCGM_UNIT),
            _text(f"{LAB_LIB}/dcgm.version", json.dumps({"version": v.dcgm}) + "\n"),
        ),
        postinst=(
            "#!/bin/sh\nset -e\n"
            f"if [ \"$1\" = configure ] && ! getent passwd {DCGM_USER} >/dev/null; then\n"
            f"    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin {DCGM_USER}\nfi\n"
            f"mkdir -p /var/log/nvidia-dcgm\nchown {DCGM_USER}:{DCGM_USER} /var/log/nvidia-dcgm\nexit 0\n"
        ),
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
TimeoutSec=180
RemainAfterExit=yes
ExecStart=/etc/init.d/openibd start bootid=%b
ExecStop=/etc/init.d/openibd stop
ExecReload=/etc/init.d/openibd restart bootid=%b

[Install]
WantedBy=sysinit.target
"""
"""The real unit's Service section (mlnx-ofa_kernel ofed_scripts/openibd.service)."""


def ofed_recipes(v: VendorVersions) -> list[PackageRecipe]:
    """DOCA-OFED (``doca-ofed``) or MLNX_OFED (``mlnx-ofed-basic``/``-all``) stand-ins."""
    comp = _ofed_component_version(v)
    compact = v.ofed.replace("-", "").replace(".", "")
    tool_ver = f"{v.ofed.split('-', 1)[0]}.0-1.{compact}"
    dkms_version = comp.rsplit("-", 1)[0]
    kmod_postinst, kmod_prerm = _dkms_scripts("mlnx-ofed-kernel", dkms_version)
    ofed_make = f"./ofed_scripts/pre_build.sh $kernelver $kernel_source_dir mlnx-ofed-kernel {dkms_version}"
    nfs_postinst, nfs_prerm = _dkms_scripts("mlnx-nfsrdma", dkms_version)
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
            # openibd swaps the kernel's RDMA stack for the OFED build (the stand-in: simtools/openibd)
            files=_present(
                _text("/lib/systemd/system/openibd.service", OPENIBD_UNIT),
                _tool("openibd", "/etc/init.d/openibd"),
            ),
        ),
        PackageRecipe(
            "mlnx-ofed-kernel-dkms",
            comp,
            "DKMS support for mlnx-ofed kernel modules, lab stand-in",
            "kernel",
            files=(
                _text(f"/usr/src/mlnx-ofed-kernel-{dkms_version}/dkms.conf",
                      dkms_conf("mlnx-ofed-kernel", dkms_version, OFED_MODULES, ofed_make)),
                _placeholder(f"/usr/src/mlnx-ofed-kernel-{dkms_version}/ofed_scripts/dkms_ofed_post_build.sh",
                             "dkms_ofed_post_build.sh (the simulated dkms writes Module.symvers)"),
            ),
            postinst=kmod_postinst,
            prerm=kmod_prerm,
        ),
        PackageRecipe(
            # DOCA-Host's NFS/RDMA modules, rebuilt against its ib_core (not in doca-ofed: installed by name, as
            # the DOCA-Host installation guide's "Storage Installation" says); a stand-in rpcrdma module here
            "mlnx-nfsrdma-dkms",
            comp,
            "DKMS support for NFS RDMA kernel module, lab stand-in",
            "kernel",
            depends=(f"mlnx-ofed-kernel-dkms (= {comp})",),
            files=(_text(f"/usr/src/mlnx-nfsrdma-{dkms_version}/dkms.conf",
                         dkms_conf("mlnx-nfsrdma", dkms_version, ("rpcrdma",), "make -j$(nproc)")),),
            postinst=nfs_postinst,
            prerm=nfs_prerm,
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
        PackageRecipe(
            # NVIDIA Firmware Tools (a separate download beside DOCA-Host; 4.30.1 LTS): flint burns the pinned
            # image, mlxconfig sets the pinned parameters (doca_ofed tasks/firmware_pins.yml)
            "mft",
            "4.30.1-113",
            "NVIDIA Firmware Tools (flint, mlxconfig), lab stand-in",
            "utils",
            files=_present(_tool("flint", "/usr/bin/flint"), _tool("mlxconfig", "/usr/bin/mlxconfig")),
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


def kernel_package_name(release: str) -> str:
    """A kernel release as Debian package names carry it (lower case, only ``a-z0-9.+-``)."""
    return re.sub(r"[^a-z0-9.+-]", "-", release.lower())


def next_kernel(release: str) -> str:
    """A newer kernel of the same flavour: the ABI number after the first ``-`` plus one (6.1.0-21-amd64 ->
    6.1.0-22-amd64), else the release with ``+lab1``."""
    bumped, n = re.subn(r"-(\d+)", lambda m: f"-{int(m.group(1)) + 1}", release, count=1)
    return bumped if n else release + "+lab1"


def kernel_recipes(release: str) -> list[PackageRecipe]:
    """Stand-ins of Debian's kernel packages for the running kernel ``release`` and a newer one.

    ``linux-image-<release>``/``linux-headers-<release>`` carry no files (the containers run the host's
    kernel; the lab makes /lib/modules/<release>/build itself); the metapackages ``linux-image-amd64`` and
    ``linux-headers-amd64`` come in version 1 (pulling the running kernel) and 2 (pulling the newer one), so an
    ``apt-get upgrade`` that is not stopped by a hold installs a new kernel, as on a real node. The version
    strings are the lab's own (Debian's carry the kernel's: 6.1.90-1).
    """
    current, newer = kernel_package_name(release), kernel_package_name(next_kernel(release))
    out: list[PackageRecipe] = []
    for meta_version, kernel in (("1", current), ("2", newer)):
        for kind in ("image", "headers"):
            out.append(PackageRecipe(
                f"linux-{kind}-{kernel}", "1", f"Linux kernel {kind} for {kernel}, lab stand-in (no files)",
                "kernel", files=(_placeholder(f"/usr/share/doc/linux-{kind}-{kernel}/lab-stand-in", f"linux-{kind}"),)))
            out.append(PackageRecipe(
                f"linux-{kind}-amd64", meta_version, f"Linux kernel {kind} metapackage (amd64), lab stand-in",
                "kernel", depends=(f"linux-{kind}-{kernel}",)))
    return out


def recipes_for(v: VendorVersions) -> list[PackageRecipe]:
    """Every stand-in package of one pinned software set."""
    kernel = kernel_recipes(os.uname().release) if v.kernel_packages else []
    containers = container_recipes(v) if v.containers else []
    return [*driver_recipes(v), *cuda_recipes(v), *nccl_recipes(v), *mpi_recipes(), *ofed_recipes(v),
            perftest_cuda_recipe(v), dcgm_recipe(v), *kernel, *containers]


ENROOT_RELEASE_DIR = "github/NVIDIA/enroot"
"""Where the lab's repository holds enroot's release .debs: the site mirror directory the containers role fetches
``<dir>/v<enroot>/enroot_<enroot>-1_amd64.deb`` from."""
MULTIARCH_LIB = "/usr/lib/x86_64-linux-gnu"


def _stand_in_tool(path: str, what: str, body: str) -> FileEntry:
    """An executable stand-in script: a header naming what it stands in for, then its few lines."""
    return _text(path, f"#!/bin/sh\n# provisioner lab stand-in for {what}\n{body}", 0o755)


def container_toolkit_recipes(v: VendorVersions) -> list[PackageRecipe]:
    """nvidia-container-toolkit ``<release>-1`` and its three companions, one release (NVIDIA's apt repository
    nvidia.github.io/libnvidia-container). Layout: NVIDIA/nvidia-container-toolkit packaging/debian/
    nvidia-container-toolkit{,-base}.install (the runtime hook and config.toml; nvidia-ctk, nvidia-container-runtime,
    nvidia-cdi-hook), NVIDIA/libnvidia-container pkg/deb (nvidia-container-cli; libnvidia-container.so.<major> and
    -go in /usr/lib/<multiarch>). ``nvidia-container-cli --version`` answers with the release, the rest says it is
    not simulated (there is no GPU to give a container)."""
    ver = f"{v.container_toolkit}-1"
    cli = _stand_in_tool("/usr/bin/nvidia-container-cli", f"nvidia-container-cli {v.container_toolkit}", (
        "case \"$1\" in\n"
        f"    --version|-V) printf 'cli-version: %s\\nlib-version: %s\\n' {v.container_toolkit} "
        f"{v.container_toolkit} ;;\n"
        "    *) echo \"nvidia-container-cli: lab stand-in: $1 is not simulated\" >&2; exit 1 ;;\nesac\n"))
    lib, lib_link = _library(MULTIARCH_LIB, "libnvidia-container.so.1", v.container_toolkit, "libnvidia-container")
    go, go_link = _library(MULTIARCH_LIB, "libnvidia-container-go.so.1", v.container_toolkit, "libnvidia-container-go")
    unsimulated = "echo \"$0: lab stand-in: not simulated\" >&2\nexit 1\n"
    return [
        PackageRecipe("libnvidia-container1", ver, "NVIDIA container runtime library, lab stand-in", "libs",
                      files=(lib, go), links=(lib_link, go_link)),
        PackageRecipe("libnvidia-container-tools", ver, "NVIDIA container runtime library (command-line tools), "
                      "lab stand-in", "utils", depends=(f"libnvidia-container1 (= {ver})",), files=(cli,)),
        PackageRecipe("nvidia-container-toolkit-base", ver, "NVIDIA Container Toolkit Base, lab stand-in", "utils",
                      files=tuple(_stand_in_tool(f"/usr/bin/{t}", t, unsimulated)
                                  for t in ("nvidia-ctk", "nvidia-container-runtime", "nvidia-cdi-hook"))),
        PackageRecipe("nvidia-container-toolkit", ver, "NVIDIA Container toolkit, lab stand-in", "utils",
                      depends=(f"nvidia-container-toolkit-base (= {ver})", f"libnvidia-container-tools (>= {ver})"),
                      files=(_stand_in_tool("/usr/bin/nvidia-container-runtime-hook", "nvidia-container-runtime-hook",
                                            unsimulated),
                             _text("/etc/nvidia-container-runtime/config.toml",
                                   "# provisioner lab stand-in for the toolkit's config.toml\n"))),
    ]


ENROOT_HOOKS = ("10-aptfix.sh", "10-cgroups.sh", "10-devices.sh", "10-home.sh", "10-localtime.sh", "10-shadow.sh",
                "98-nvidia.sh", "99-mellanox.sh")
ENROOT_EXTRA_HOOKS = ("50-slurm-pmi.sh", "50-slurm-pytorch.sh", "50-mig-config.sh", "50-sharp.sh")
ENROOT_HELPERS = ("enroot-aufs2ovlfs", "enroot-mksquashovlfs", "enroot-mount", "enroot-switchroot", "enroot-nsenter",
                  "enroot-makeself")
NVIDIA_HOOK = (
    "# The real hook gives the container the GPUs of NVIDIA_VISIBLE_DEVICES through `nvidia-container-cli --user\n"
    "# configure ... $ENROOT_ROOTFS`; the stand-in checks the same command is there and asks it its version.\n"
    "if [ \"${NVIDIA_VISIBLE_DEVICES:-void}\" = void ]; then exit 0; fi\n"
    "if ! command -v nvidia-container-cli > /dev/null; then\n"
    "    echo \"[ERROR] Command not found: nvidia-container-cli, see \"\\\n"
    "\"https://github.com/NVIDIA/libnvidia-container\" >&2\n"
    "    exit 1\nfi\nexec nvidia-container-cli --version\n")


def enroot_recipes(v: VendorVersions) -> list[PackageRecipe]:
    """enroot and enroot+caps ``<enroot>-1``, the .debs of NVIDIA/enroot's GitHub release (outside the apt index, in
    :data:`ENROOT_RELEASE_DIR`). Layout: its Makefile's install target with pkg/deb/rules' ``prefix=
    exec_prefix=/usr datarootdir=/usr/share`` (/usr/bin/enroot and its helpers, /usr/lib/enroot/*.sh,
    /etc/enroot/{enroot.conf,enroot.conf.d,hooks.d,mounts.d,environ.d}, /usr/share/enroot/{hooks.d,mounts.d},
    the AppArmor profile in /etc/apparmor.d/enroot). ``enroot version`` prints the release as the real one
    (``enroot::version``); other commands are not simulated. The real enroot+caps postinst setcaps two helpers;
    the stand-in's placeholders get no capabilities. The real package's Depends (curl, jq, parallel,
    squashfs-tools, zstd, ...) are left out: the lab node is offline and runs no image."""
    ver = f"{v.enroot}-1"
    release = f"{ENROOT_RELEASE_DIR}/v{v.enroot}"
    enroot = _text("/usr/bin/enroot", (
        f"#!/bin/bash\n# provisioner lab stand-in for enroot {v.enroot}\nENROOT_VERSION=\"{v.enroot}\"\n"
        "case \"${1-}\" in\n    version) printf \"%s\\n\" \"${ENROOT_VERSION}\" ;;\n"
        "    *) echo \"enroot: lab stand-in: '${1-}' is not simulated\" >&2; exit 1 ;;\nesac\n"), 0o755)
    hooks = [_stand_in_tool(f"/etc/enroot/hooks.d/{h}", f"enroot's {h} hook",
                            NVIDIA_HOOK if h == "98-nvidia.sh" else "exit 0\n") for h in ENROOT_HOOKS]
    files = (
        enroot,
        *(_stand_in_tool(f"/usr/bin/{h}", h, "echo \"$0: lab stand-in: not simulated\" >&2\nexit 1\n")
          for h in ENROOT_HELPERS),
        *(_placeholder(f"/usr/lib/enroot/{src}", f"enroot's {src}")
          for src in ("common.sh", "bundle.sh", "docker.sh", "runtime.sh")),
        _text("/etc/enroot/enroot.conf", "# provisioner lab stand-in for enroot.conf (every setting commented, as "
              "the real one)\n#ENROOT_RUNTIME_PATH        ${XDG_RUNTIME_DIR}/enroot\n"),
        _placeholder("/etc/enroot/enroot.conf.d/README", "enroot.conf.d/README (drop-ins: *.conf)"),
        _placeholder("/etc/enroot/environ.d/10-terminal.env", "enroot's 10-terminal.env"),
        *(_placeholder(f"/etc/enroot/mounts.d/{m}", f"enroot's {m}") for m in ("10-system.fstab", "20-config.fstab")),
        *hooks,
        *(_stand_in_tool(f"/usr/share/enroot/hooks.d/{h}", f"enroot's {h} hook", "exit 0\n")
          for h in ENROOT_EXTRA_HOOKS),
        _placeholder("/usr/share/enroot/mounts.d/30-lxcfs.fstab", "enroot's 30-lxcfs.fstab"),
        _placeholder("/usr/share/enroot/bash_completion", "enroot's bash completion"),
        _placeholder("/etc/apparmor.d/enroot", "enroot's AppArmor profile"),
    )
    return [
        PackageRecipe("enroot", ver, "Unprivileged container sandboxing utility, lab stand-in", "utils",
                      files=files, release_dir=release),
        PackageRecipe("enroot+caps", ver, "Unprivileged container sandboxing utility (extra capabilities), lab "
                      "stand-in", "utils", depends=(f"enroot (= {ver})",), release_dir=release),
    ]


def pyxis_recipe(v: VendorVersions) -> PackageRecipe:
    """``nvslurm-plugin-pyxis`` ``<pyxis>-1``, the package pyxis's own ``make deb`` builds (NVIDIA/pyxis
    debian/control: Depends enroot; debian/rules: ``libdir=/usr/lib/$(DEB_HOST_MULTIARCH) datarootdir=/usr/share``):
    the plugin (a placeholder: the lab has no Slurm to load it) and share/pyxis/pyxis.conf with its plugstack line."""
    plugin = f"{MULTIARCH_LIB}/slurm/spank_pyxis.so"
    return PackageRecipe(
        "nvslurm-plugin-pyxis", f"{v.pyxis}-1", "Slurm plugin for launching containerized tasks, lab stand-in",
        "admin", depends=("enroot (>= 1.1.0)",),
        files=(_placeholder(plugin, f"pyxis {v.pyxis}'s SPANK plugin"),
               _text("/usr/share/pyxis/pyxis.conf", f"required {plugin}\n")))


def container_recipes(v: VendorVersions) -> list[PackageRecipe]:
    """The container stack of one set: the toolkit, enroot's release .debs and the site-built pyxis package."""
    return [*container_toolkit_recipes(v), *enroot_recipes(v), pyxis_recipe(v)]
