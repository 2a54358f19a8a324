"""Shared state access for the lab's simulated hardware (stdlib only).

This module is SHARED: the host-side lab code imports it as
``provisioner.lab.simtools.labstate`` and the node image carries a copy at
``/usr/lib/provisioner-lab/labstate.py`` next to the simulated tools (``modprobe``,
``lsmod``, ``nvidia-smi``, ...), which are plain ``python3`` scripts.  It must therefore
use the standard library only and stay importable on Debian 12's Python 3.11.

The contract it implements is ``docs/lab-hardware-model.md``: one directory per lab
(``/run/lab`` inside a node, ``.lab/<cluster>/`` on the host) holding ``fabric.json``,
``sm/`` and ``nodes/<hostname>/{node.json,modules.json,sys/class/...}``.  ``node.json``
is the single source of a node's simulated hardware; the sysfs tree that Debian's real
``ibstat``/``ibstatus`` read is *derived* from it by :func:`render_sysfs` and rewritten
by :func:`save_node`, so a fault is one edit of ``node.json`` and shows inside the
container at once (the ``sys/class`` directory is bind-mounted, so files are replaced
inside it and the directory itself is never swapped).

Every write is atomic: a dot-named temporary file in the same directory, then
``os.replace``, so a reader inside a container never sees half a file.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

LAB_ROOT = "/run/lab"
"""Where the lab state is mounted inside every node container."""

NODE_FILE = "node.json"
MODULES_FILE = "modules.json"
FABRIC_FILE = "fabric.json"
SYSFS_PREFIX = "sys/class"

# The kernel's strings, as drivers/infiniband/core/sysfs.c prints them.
PORT_STATES: dict[str, str] = {
    "nop": "0: NOP",
    "down": "1: DOWN",
    "init": "2: INIT",
    "armed": "3: ARMED",
    "active": "4: ACTIVE",
    "active_defer": "5: ACTIVE_DEFER",
}
"""node.json ``state`` -> sysfs ``ports/N/state``."""

PHYS_STATES: dict[str, str] = {
    "sleep": "1: Sleep",
    "polling": "2: Polling",
    "disabled": "3: Disabled",
    "training": "4: PortConfigurationTraining",
    "linkup": "5: LinkUp",
    "error_recovery": "6: LinkErrorRecovery",
    "phy_test": "7: Phy Test",
}
"""node.json ``phys_state`` -> sysfs ``ports/N/phys_state``."""

LANE_GBPS: dict[str, float] = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}
"""Per-lane data rate by IB speed name, as the kernel rounds it for the ``rate`` file."""

WIDTH_LANES: dict[str, int] = {"1X": 1, "2X": 2, "4X": 4, "8X": 8, "12X": 12}

NODE_TYPE_CA = "1: CA"
UMAD_ABI_VERSION = "5"
DEFAULT_CAP_MASK = 0x2651E848
"""Capability mask of a plain CA port (no IsSM bit), as ConnectX HCAs report it."""
IS_SM_CAP_BIT = 0x2
DEFAULT_PKEY = "0xffff"
GID_PREFIX = "fe80:0000:0000:0000"

PORT_COUNTERS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_data": 64,
    "port_rcv_data": 64,
    "port_xmit_packets": 64,
    "port_rcv_packets": 64,
    "port_xmit_wait": 32,
    "unicast_rcv_packets": 64,
    "unicast_xmit_packets": 64,
    "multicast_rcv_packets": 64,
    "multicast_xmit_packets": 64,
}
"""``ports/N/counters/<name>`` -> the counter's width in bits: the kernel's PMA attribute table with the
extended (64-bit data) set and ``port_xmit_wait`` (drivers/infiniband/core/sysfs.c). PMA error counters
stop at their maximum instead of wrapping, so :func:`add_counters` saturates at ``2**bits - 1``."""

DEFAULT_MODULES: list[str] = ["mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "ib_umad", "ib_ipoib"]
"""Kernel modules a freshly racked node with an inbox HCA driver has loaded."""


# ---------------------------------------------------------------- paths and atomic I/O


def lab_root() -> str:
    """The lab directory as a simulated tool sees it; ``PROVISIONER_LAB_ROOT`` lets tests point elsewhere."""
    return os.environ.get("PROVISIONER_LAB_ROOT") or LAB_ROOT


def this_host() -> str:
    """The node a simulated tool runs on: the container hostname (``PROVISIONER_LAB_HOST`` in tests)."""
    return os.environ.get("PROVISIONER_LAB_HOST") or socket.gethostname()


def node_dir(root: str, host: str) -> str:
    """Directory of one node's state: ``<root>/nodes/<host>``."""
    if not host or "/" in host or host in (".", ".."):
        raise ValueError(f"not a usable hostname: {host!r}")
    return os.path.join(root, "nodes", host)


def sysfs_dir(root: str, host: str) -> str:
    """The node's ``sys/class`` directory (the one bind-mounted over ``/sys/class``)."""
    return os.path.join(node_dir(root, host), SYSFS_PREFIX)


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never a mix."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _write_json(path: str, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------- node, fabric, modules


def load_node(root: str, host: str) -> dict[str, Any]:
    """Read ``nodes/<host>/node.json``; FileNotFoundError when the node is not in the lab."""
    data = _read_json(os.path.join(node_dir(root, host), NODE_FILE))
    if not isinstance(data, dict):
        raise ValueError(f"{host}: node.json is not an object")
    return data


def save_node(root: str, node: dict[str, Any]) -> None:
    """Write node.json atomically and regenerate that node's sysfs tree from it.

    Files that the new rendering no longer contains (a removed HCA) are deleted; the
    ``sys/class`` directory itself is kept because a container has it bind-mounted.
    """
    host = str(node["hostname"])
    directory = node_dir(root, host)
    _write_json(os.path.join(directory, NODE_FILE), node)
    write_sysfs(directory, render_sysfs(node))


def write_sysfs(directory: str, files: dict[str, str]) -> None:
    """Make the tree under ``directory`` hold exactly ``files`` below ``sys/class``.

    Unchanged files are left alone (no needless inode churn under a reader).
    """
    for rel, text in files.items():
        path = os.path.join(directory, rel)
        try:
            with open(path, encoding="utf-8") as handle:
                if handle.read() == text:
                    continue
        except FileNotFoundError:
            pass
        atomic_write(path, text)
    base = os.path.join(directory, SYSFS_PREFIX)
    wanted = {os.path.normpath(os.path.join(directory, rel)) for rel in files}
    for current, dirs, names in os.walk(base, topdown=False):
        for name in names:
            path = os.path.join(current, name)
            if path not in wanted:
                os.unlink(path)
        for name in dirs:
            path = os.path.join(current, name)
            if not os.listdir(path):
                os.rmdir(path)
    os.makedirs(base, exist_ok=True)


def load_fabric(root: str) -> dict[str, Any]:
    """Read the cluster-wide ``fabric.json``."""
    data = _read_json(os.path.join(root, FABRIC_FILE))
    if not isinstance(data, dict):
        raise ValueError("fabric.json is not an object")
    return data


def save_fabric(root: str, fabric: dict[str, Any]) -> None:
    """Write ``fabric.json`` atomically."""
    _write_json(os.path.join(root, FABRIC_FILE), fabric)


def _modules_data(root: str, host: str) -> dict[str, Any]:
    try:
        data = _read_json(os.path.join(node_dir(root, host), MODULES_FILE))
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


def load_modules(root: str, host: str) -> list[str]:
    """Loaded kernel modules of ``host`` (most recently loaded first, like lsmod); [] if none."""
    return [str(name) for name in _modules_data(root, host).get("loaded", [])]


def load_module_builds(root: str, host: str) -> dict[str, dict[str, Any]]:
    """Loaded module -> the DKMS build it was inserted from (``dkms``, ``kernel``, ``exports``: what the kernel
    keeps of a loaded module); a loaded module not listed is the kernel's own build."""
    builds = _modules_data(root, host).get("builds", {})
    if not isinstance(builds, dict):
        return {}
    return {str(k): dict(v) for k, v in builds.items() if isinstance(v, dict)}


def save_modules(root: str, host: str, loaded: list[str], builds: Mapping[str, Mapping[str, Any]] | None = None
                 ) -> None:
    """Write ``modules.json`` atomically, dropping duplicates but keeping order.

    ``builds`` (module -> its DKMS build) replaces the recorded builds; without it the previous ones are kept
    for the modules still loaded, so a writer that only drops a module (a fault) keeps the others' origin.
    """
    unique = list(dict.fromkeys(loaded))
    known = dict(builds) if builds is not None else load_module_builds(root, host)
    kept = {name: dict(build) for name, build in sorted(known.items()) if name in unique}
    data: dict[str, Any] = {"loaded": unique}
    if kept:
        data["builds"] = kept
    _write_json(os.path.join(node_dir(root, host), MODULES_FILE), data)


# ---------------------------------------------------------------- sysfs rendering (pure)


def guid_colon(guid: str) -> str:
    """``0xa088c20300123456`` -> ``a088:c203:0012:3456`` (the sysfs node_guid form)."""
    digits = guid.lower().removeprefix("0x").rjust(16, "0")
    if len(digits) != 16 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"not a 64-bit GUID: {guid!r}")
    return ":".join(digits[i : i + 4] for i in range(0, 16, 4))


def gid_from_guid(guid: str) -> str:
    """Link-local GID 0 of a port: the fe80 prefix and the port GUID."""
    return GID_PREFIX + ":" + guid_colon(guid)


def rate_gbps(speed: str, width: str) -> float:
    """Data rate a port trains at for a speed (``NDR``) and width (``4X``)."""
    try:
        value = LANE_GBPS[speed] * WIDTH_LANES[width]
    except KeyError as exc:
        raise ValueError(f"unknown speed/width {speed!r}/{width!r}") from exc
    return int(value) if value.is_integer() else value  # node.json keeps 400, not 400.0


def rate_string(gbps: float, width: str, speed: str) -> str:
    """The sysfs ``rate`` text, e.g. ``400 Gb/sec (4X NDR)`` or ``2.5 Gb/sec (1X SDR)``."""
    number = f"{int(gbps)}" if float(gbps).is_integer() else f"{gbps:g}"
    return f"{number} Gb/sec ({width} {speed})"


def _kernel_state(table: dict[str, str], value: str, what: str) -> str:
    try:
        return table[value]
    except KeyError as exc:
        raise ValueError(f"unknown {what} {value!r}; one of {', '.join(table)}") from exc


def _hw_rev(value: Any) -> str:
    """The kernel prints hw_rev as bare hex (``0``); node.json may hold ``0x0``."""
    if isinstance(value, int):
        return f"{value:x}"
    text = str(value).strip().lower()
    return f"{int(text, 16):x}" if text else "0"


def render_port(hca: dict[str, Any]) -> dict[str, str]:
    """sysfs files of one port, relative to ``infiniband/<dev>/ports/<n>/``."""
    cap_mask = int(hca.get("cap_mask", DEFAULT_CAP_MASK))
    if hca.get("is_sm"):
        cap_mask |= IS_SM_CAP_BIT
    return {
        "state": _kernel_state(PORT_STATES, str(hca.get("state", "down")), "port state") + "\n",
        "phys_state": _kernel_state(PHYS_STATES, str(hca.get("phys_state", "polling")), "phys_state")
        + "\n",
        "rate": rate_string(float(hca["rate_gbps"]), str(hca["width"]), str(hca["speed"])) + "\n",
        "lid": f"0x{int(hca.get('lid', 0)):x}\n",
        "sm_lid": f"0x{int(hca.get('sm_lid', 0)):x}\n",
        "sm_sl": f"{int(hca.get('sm_sl', 0))}\n",
        "lid_mask_count": f"{int(hca.get('lid_mask_count', 0))}\n",
        "cap_mask": f"0x{cap_mask:08x}\n",
        "link_layer": str(hca.get("link_layer", "InfiniBand")) + "\n",
        "gids/0": gid_from_guid(str(hca["port_guid"])) + "\n",
        **{f"pkeys/{i}": f"{key}\n" for i, key in enumerate(pkey_entries(hca))},
        **{f"counters/{name}": f"{value}\n" for name, value in port_counters(hca).items()},
    }


def pkey_entries(hca: Mapping[str, Any]) -> list[str]:
    """The port's P_Key table: ``pkeys`` (what the SM programmed) or the single ``pkey`` at index 0."""
    raw = hca.get("pkeys")
    if isinstance(raw, list) and raw:
        return [str(k) for k in raw]
    return [str(hca.get("pkey", DEFAULT_PKEY))]


def port_counters(hca: Mapping[str, Any]) -> dict[str, int]:
    """Every counter of a port: node.json's ``counters`` over zeros (a healthy, freshly cleared port)."""
    stored = hca.get("counters") or {}
    return {name: int(stored.get(name, 0)) for name in PORT_COUNTERS}


def add_counters(hca: dict[str, Any], deltas: Mapping[str, int]) -> None:
    """Raise counters of one node.json port entry in place, saturating like the PMA does."""
    counters = port_counters(hca)
    for name, delta in deltas.items():
        if name not in PORT_COUNTERS:
            raise ValueError(f"unknown port counter {name!r}")
        counters[name] = min(counters[name] + int(delta), 2 ** PORT_COUNTERS[name] - 1)
    hca["counters"] = counters


@contextmanager
def node_lock(root: str, host: str) -> Iterator[None]:
    """Hold the node's lock file while reading, editing and saving its node.json.

    Two simulated tools of one run (both ends of an ``ib_write_bw``, NCCL's launcher) may raise
    counters at the same moment; without the lock one update would be lost.
    """
    path = os.path.join(node_dir(root, host), ".node.lock")
    with open(path, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def bump_counters(root: str, host: str, device: str, port: int, deltas: Mapping[str, int]) -> None:
    """Raise counters of ``host``'s ``device``/``port`` in node.json and its sysfs files (under the node lock)."""
    with node_lock(root, host):
        node = load_node(root, host)
        add_counters(find_hca(node, device, port), deltas)
        save_node(root, node)


def render_sysfs(node: dict[str, Any]) -> dict[str, str]:
    """All sysfs files of a node, keyed by path relative to the node directory.

    Keys start with ``sys/class/``.  Several ports of one device share the device
    files (taken from the first entry); umad devices are numbered in device/port order,
    as the kernel does when it probes the HCAs.
    """
    files: dict[str, str] = {}
    ib = SYSFS_PREFIX + "/infiniband"
    mad = SYSFS_PREFIX + "/infiniband_mad"
    hostname = str(node.get("hostname", ""))
    hcas = sorted(node.get("hcas", []), key=lambda h: (_dev_key(str(h["device"])), int(h["port"])))
    seen: set[str] = set()
    for umad, hca in enumerate(hcas):
        dev = str(hca["device"])
        base = f"{ib}/{dev}"
        if dev not in seen:
            seen.add(dev)
            files[f"{base}/node_type"] = NODE_TYPE_CA + "\n"
            files[f"{base}/node_guid"] = guid_colon(str(hca["node_guid"])) + "\n"
            image_guid = str(hca.get("sys_image_guid", hca["node_guid"]))
            files[f"{base}/sys_image_guid"] = guid_colon(image_guid) + "\n"
            files[f"{base}/fw_ver"] = str(hca.get("fw_ver", "")) + "\n"
            files[f"{base}/hca_type"] = str(hca.get("ca_type", "")) + "\n"
            files[f"{base}/hw_rev"] = _hw_rev(hca.get("hw_rev", "0x0")) + "\n"
            files[f"{base}/board_id"] = str(hca.get("board_id", "")) + "\n"
            files[f"{base}/node_desc"] = f"{hostname} {dev}\n"
            files[f"{base}/device/numa_node"] = f"{int(hca.get('numa_node', -1))}\n"
            netdev = hca.get("netdev")
            if netdev:
                up = hca.get("state") == "active"
                files[f"{base}/device/net/{netdev}/dev_port"] = f"{int(hca['port']) - 1}\n"
                files[f"{base}/device/net/{netdev}/operstate"] = ("up" if up else "down") + "\n"
        for name, text in render_port(hca).items():
            files[f"{base}/ports/{int(hca['port'])}/{name}"] = text
        files[f"{mad}/umad{umad}/ibdev"] = dev + "\n"
        files[f"{mad}/umad{umad}/port"] = f"{int(hca['port'])}\n"
    files[f"{mad}/abi_version"] = UMAD_ABI_VERSION + "\n"
    return files


def _dev_key(device: str) -> tuple[str, int]:
    """Sort ``mlx5_10`` after ``mlx5_9`` (the kernel's probe order), not after ``mlx5_1``."""
    stem, _, num = device.rpartition("_")
    return (stem, int(num)) if stem and num.isdigit() else (device, -1)


def umad_count(node: dict[str, Any]) -> int:
    """How many ``/dev/infiniband/umadN`` placeholders the node needs."""
    return len(node.get("hcas", []))


def find_hca(node: dict[str, Any], device: str, port: int = 1) -> dict[str, Any]:
    """The node.json entry of ``device`` port ``port``; KeyError naming what exists."""
    hcas: list[dict[str, Any]] = node.get("hcas", [])
    for hca in hcas:
        if hca.get("device") == device and int(hca.get("port", 1)) == int(port):
            return hca  # the live entry, so callers can edit it in place
    names = ", ".join(f"{h.get('device')}/{h.get('port')}" for h in node.get("hcas", []))
    raise KeyError(f"{node.get('hostname')}: no HCA port {device}/{port} (have: {names or 'none'})")
