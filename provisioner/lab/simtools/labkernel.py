"""The lab's simulated kernel: what each DKMS module was built against, and whether it may load (stdlib only).

SHARED like ``labstate`` (host-side code imports ``provisioner.lab.simtools.labkernel``; the node image
carries a copy in ``/usr/lib/provisioner-lab/``).  The simulated ``dkms`` (``nodetools/dkms_sim.py``)
writes one record per built module into ``nodes/<host>/dkms.json``; the simulated ``modprobe``
(``nodetools/kmod_sim.py``) reads the record of the ``.ko`` it is asked to insert and refuses it the way the
kernel does (docs/lab-hardware-model.md, "dkms.json", has the sources):

* built for another kernel: ``version magic '<built> ...' should be '<running> ...'`` and ENOEXEC
  (modprobe: ``Exec format error``);
* a symbol it was linked against is exported by no loaded module: ``Unknown symbol <s> (err -2)`` and
  ENOENT (``Unknown symbol in module, or unknown parameter (see dmesg)``);
* exported with another CRC (another OFED build): ``disagrees about version of symbol <s>`` then
  ``Unknown symbol <s> (err -22)`` and EINVAL (``Invalid argument``);
* nvidia_peermem built while no OFED ``Module.symvers`` offered the peer-memory API: its init returns
  -EINVAL without a kernel message (``Invalid argument``).

A loaded module without a record is the kernel's own (inbox) build; ``modules.json`` keeps, per loaded DKMS
module, what the kernel keeps of it (``"builds"``: its DKMS name/version, kernel and exported symbols), so a
later rebuild of the file on disk does not change what is loaded.
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

try:
    from provisioner.lab.simtools import labstate
except ImportError:  # inside a node: /usr/lib/provisioner-lab is on sys.path
    import labstate  # type: ignore[import-not-found,no-redef]

DKMS_FILE = "dkms.json"
DMESG_FILE = "dmesg"
DMESG_KEEP = 400
ARCH = "x86_64"

PEER_MEMORY_SYMBOLS = ("ib_register_peer_memory_client", "ib_unregister_peer_memory_client")
"""The PeerDirect API MLNX_OFED/DOCA-OFED adds (drivers/infiniband/core/peer_mem.c, linked into ib_uverbs);
the upstream kernel's ib_uverbs does not export it."""

EXPORTS: dict[str, tuple[str, ...]] = {
    "mlx_compat": ("backport_dependency_symbol",),
    "ib_core": ("ib_register_client",),
    "ib_uverbs": ("ib_uverbs_get_ucontext_file", *PEER_MEMORY_SYMBOLS),
    "mlx5_core": ("mlx5_core_create_cq",),
    "nvidia": ("nvidia_p2p_get_pages",),
}
"""A few real exported symbols per module: enough to tell one build of a module from another."""

DEPENDS: dict[str, tuple[str, ...]] = {
    "mlx5_ib": ("mlx5_core", "ib_core"),
    "ib_uverbs": ("ib_core",),
    "ib_umad": ("ib_core",),
    "ib_ipoib": ("ib_core",),
    "rdma_ucm": ("ib_core", "ib_uverbs"),
    # MLNX_OFED/DOCA links the PeerDirect API into ib_uverbs (mlnx-ofa_kernel drivers/infiniband/core/Makefile:
    # ib_uverbs-$(CONFIG_INFINIBAND_USER_MEM) += ... peer_mem.o), so an OFED-built nvidia_peermem holds ib_uverbs.
    "nvidia_peermem": ("nvidia", "ib_uverbs"),
    "nvidia_uvm": ("nvidia",),
    "nvidia_modeset": ("nvidia",),
    "nvidia_drm": ("nvidia_modeset",),
    "nv_peer_mem": ("nvidia", "ib_core"),
}
"""What each module needs loaded first, as modules.dep would say for these drivers."""

VERMAGIC_TAIL = " SMP preempt mod_unload modversions "
"""What follows the release in a Debian/Ubuntu x86_64 kernel's vermagic string."""

KMOD_ERRORS = {
    "ENOEXEC": "Exec format error",
    "ENOENT": "Unknown symbol in module, or unknown parameter (see dmesg)",
    "EINVAL": "Invalid argument",
}
"""kmod's modprobe text per errno of init_module (strerror, and its own text for ENOENT)."""


def running_kernel() -> str:
    """The kernel release the simulated tools run under (``PROVISIONER_LAB_KERNEL`` in tests)."""
    return os.environ.get("PROVISIONER_LAB_KERNEL") or os.uname().release


def sysroot() -> str:
    """Prefix of /lib/modules, /usr/src and /var/lib/dkms (``PROVISIONER_LAB_SYSROOT`` in tests)."""
    return os.environ.get("PROVISIONER_LAB_SYSROOT") or "/"


def crc(symbol: str, build: str) -> str:
    """The CRC modversions gives ``symbol`` in one build (deterministic; differs between builds)."""
    return f"0x{zlib.crc32(f'{build}:{symbol}'.encode()):08x}"


def inbox_exports(module: str, kernel: str) -> dict[str, str]:
    """What the kernel's own build of ``module`` exports: no peer-memory API, the kernel's CRCs."""
    return {s: crc(s, f"linux-{kernel}") for s in EXPORTS.get(module, ()) if s not in PEER_MEMORY_SYMBOLS}


# ---------------------------------------------------------------- dkms.json


def dkms_path(root: str, host: str) -> str:
    return os.path.join(labstate.node_dir(root, host), DKMS_FILE)


def load_dkms(root: str, host: str) -> dict[str, Any]:
    """``{"builds": {"<name>/<version>/<kernel>": build}}``; empty when DKMS never built anything here."""
    try:
        with open(dkms_path(root, host), encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {"builds": {}}
    builds = data.get("builds") if isinstance(data, dict) else None
    return {"builds": dict(builds) if isinstance(builds, dict) else {}}


def save_dkms(root: str, host: str, data: Mapping[str, Any]) -> None:
    labstate.atomic_write(dkms_path(root, host), json.dumps(data, indent=2, sort_keys=True) + "\n")


def installed_records(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Installed module file path -> its module record (with the build's ``dkms`` and ``kernel``)."""
    out: dict[str, dict[str, Any]] = {}
    for build in data.get("builds", {}).values():
        if build.get("state") != "installed":
            continue
        for record in build.get("modules", {}).values():
            path = record.get("installed")
            if path:
                out[str(path)] = {**record, "dkms": build.get("dkms"), "kernel": build.get("kernel")}
    return out


# ---------------------------------------------------------------- what may load (pure)


def loaded_build(record: Mapping[str, Any]) -> dict[str, Any]:
    """What ``modules.json`` keeps of a DKMS module once it is inserted."""
    return {"dkms": record.get("dkms"), "kernel": record.get("kernel"), "exports": dict(record.get("exports", {}))}


def loaded_exports(loaded: Iterable[str], builds: Mapping[str, Mapping[str, Any]], kernel: str) -> dict[str, str]:
    """Symbol -> CRC exported by the loaded modules (their DKMS build, else the kernel's own build)."""
    out: dict[str, str] = {}
    for name in loaded:
        build = builds.get(name)
        out.update(dict(build.get("exports", {})) if build is not None else inbox_exports(name, kernel))
    return out


def insert_failure(name: str, record: Mapping[str, Any], kernel: str,
                   exported: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """(errno name, kernel log lines) when the kernel refuses to insert this build of ``name``, else None."""
    built_for = str(record.get("kernel", ""))
    if built_for != kernel:
        return "ENOEXEC", [f"{name}: version magic '{built_for}{VERMAGIC_TAIL}' should be '{kernel}{VERMAGIC_TAIL}'"]
    lines: list[str] = []
    errno = ""
    for symbol, want in sorted(dict(record.get("needs", {})).items()):
        have = exported.get(symbol)
        if have is None:
            lines.append(f"{name}: Unknown symbol {symbol} (err -2)")
            errno = errno or "ENOENT"
        elif have != want:
            lines += [f"{name}: disagrees about version of symbol {symbol}",
                      f"{name}: Unknown symbol {symbol} (err -22)"]
            errno = "EINVAL"
    if lines:
        return errno, lines
    if record.get("init") == "einval":
        return "EINVAL", []
    return None


# ---------------------------------------------------------------- kernel log


def append_dmesg(root: str, host: str, lines: Iterable[str]) -> None:
    """Add ``lines`` to the node's simulated kernel log with the kernel's ``[seconds since boot]`` stamp."""
    new = [f"[{time.monotonic():12.6f}] {line}" for line in lines]
    if not new:
        return
    path = os.path.join(labstate.node_dir(root, host), DMESG_FILE)
    with labstate.node_lock(root, host):
        try:
            with open(path, encoding="utf-8") as handle:
                old = handle.read().splitlines()
        except FileNotFoundError:
            old = []
        labstate.atomic_write(path, "\n".join([*old, *new][-DMESG_KEEP:]) + "\n")


def read_dmesg(root: str, host: str) -> str:
    """The node's one simulated kernel log, as dmesg prints it (``[<seconds since boot, 12.6f>] <message>``): the
    module loader's lines (:func:`append_dmesg`) and the fault injector's (node.json ``kernel_log``: the Xid lines
    of gpu_missing and ecc_error), in time order."""
    stamped: list[tuple[float, str]] = []
    try:
        with open(os.path.join(labstate.node_dir(root, host), DMESG_FILE), encoding="utf-8") as handle:
            for line in handle.read().splitlines():
                m = _STAMP.match(line)
                stamped.append((float(m.group(1)) if m else (stamped[-1][0] if stamped else 0.0), line))
    except FileNotFoundError:
        pass
    try:
        entries = labstate.load_node(root, host).get("kernel_log", [])
    except FileNotFoundError:
        entries = []
    stamped += [(float(e.get("t", 0)), f"[{float(e.get('t', 0)):12.6f}] {e.get('msg', '')}") for e in entries]
    return "".join(line + "\n" for _, line in sorted(stamped, key=lambda s: s[0]))


_STAMP = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]")
