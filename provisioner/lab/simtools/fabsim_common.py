"""Helpers shared by the lab's simulated fabric tools (stdlib only).

The simulated ``ib_write_bw``, ``all_reduce_perf``, ``opensm``, ``sminfo``, ``saquery``
and ``iblinkinfo`` run inside node containers with nothing but Debian's python3, so this
module (and the tool modules next to it) must stay stdlib-only.  It is imported either
as ``provisioner.lab.simtools.fabsim_common`` (host side, tests, mypy) or as a plain
``fabsim_common`` from the scripts' own directory (``/usr/lib/provisioner-lab/``).

Everything that must be reproducible (jitter, flapping) is derived from a hash of named
inputs, never from ``random``, so a run id replays the same result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
from typing import Any

try:
    from provisioner.lab.simtools import labstate
except ImportError:  # inside a node: the scripts' own directory is on sys.path
    import labstate  # type: ignore[import-not-found,no-redef]

LIBDIR_DEFAULT = "/usr/lib/provisioner-lab"
DRIVER_VERSION_FILE = "nvidia-driver.version"


def lab_root() -> str:
    """The lab state directory: ``$PROVISIONER_LAB_ROOT`` or ``/run/lab``."""
    return os.environ.get("PROVISIONER_LAB_ROOT") or labstate.LAB_ROOT


def this_host() -> str:
    """This node's name: ``$PROVISIONER_LAB_HOST`` (tests) or the container hostname."""
    return os.environ.get("PROVISIONER_LAB_HOST") or socket.gethostname()


def lab_libdir() -> str:
    """Where the stand-in packages drop their marker files (driver version, flavours)."""
    return os.environ.get("PROVISIONER_LAB_LIBDIR") or LIBDIR_DEFAULT


def run_id() -> str:
    """Identity of one measurement run: flapping and jitter are a function of it.

    The product's scheduler (or a test) sets ``PROVISIONER_LAB_RUN_ID``; without it every
    wall-clock second is a new run, so a flapping port fails some runs and not others.
    """
    import time

    return os.environ.get("PROVISIONER_LAB_RUN_ID") or str(int(time.time()))


def unit_hash(*parts: object) -> float:
    """A deterministic number in [0, 1) from the given parts."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def jitter(spread: float, *parts: object) -> float:
    """A deterministic factor in [1 - spread, 1 + spread] keyed by ``parts``."""
    return 1.0 + spread * (2.0 * unit_hash(*parts) - 1.0)


def flaps_now(hca: dict[str, Any], run: str) -> bool:
    """Whether a flapping port drops during run ``run`` (about every other run)."""
    return bool(hca.get("flapping")) and unit_hash("flap", run, hca.get("port_guid")) < 0.5


def flap_counters(hca: dict[str, Any], run: str) -> dict[str, int]:
    """What one traffic run over a flapping port adds to its counters; {} for a steady port.

    The model: a flapping port retrains under load in every run that uses it (link_error_recovery + 1,
    a burst of symbol errors), and in the runs where it drops (:func:`flaps_now`) the link also goes down
    (link_downed + 1). So a traffic run over a flapping port always moves its counters, whether or not
    that run failed: a check that reads them before and after sees it every time.
    """
    if not hca.get("flapping"):
        return {}
    burst = 5 + int(unit_hash("symbols", run, hca.get("port_guid")) * 20)
    deltas = {"link_error_recovery": 1, "symbol_error": burst}
    if flaps_now(hca, run):
        deltas["link_downed"] = 1
    return deltas


def record_flap(host: str, hca: dict[str, Any], run: str) -> None:
    """Raise ``host``'s counters for one traffic run over ``hca`` (nothing for a steady port).

    Best effort: a lab without a writable node.json (a unit test's fixture) keeps its counters.
    """
    deltas = flap_counters(hca, run)
    if deltas:
        with contextlib.suppress(OSError, KeyError, ValueError):
            labstate.bump_counters(lab_root(), host, str(hca["device"]), int(hca.get("port", 1)), deltas)


def driver_installed() -> bool:
    """The stand-in NVIDIA driver package installs a version file; absent = no driver."""
    return os.path.isfile(os.path.join(lab_libdir(), DRIVER_VERSION_FILE))


def driver_flavor() -> str | None:
    """``open`` or ``proprietary`` from the stand-in driver's version file (JSON); None when unknown."""
    try:
        with open(os.path.join(lab_libdir(), DRIVER_VERSION_FILE), encoding="utf-8") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    flavor = data.get("flavor") if isinstance(data, dict) else None
    return str(flavor) if flavor in ("open", "proprietary") else None


def port_usable(hca: dict[str, Any]) -> bool:
    """A port carries traffic only when logically Active and physically LinkUp."""
    return hca.get("state") == "active" and hca.get("phys_state") == "linkup"


def guid_int(guid: object) -> int:
    """``0xa088c20300123456`` (or an int) -> int; 0 when it is not a number."""
    if isinstance(guid, int):
        return guid
    try:
        return int(str(guid), 16)
    except ValueError:
        return 0


def lab_hosts(root: str) -> list[str]:
    """Every node of the lab that has a node.json, sorted."""
    base = os.path.join(root, "nodes")
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    return [n for n in names if os.path.isfile(os.path.join(base, n, labstate.NODE_FILE))]


def load_fabric_or_empty(root: str) -> dict[str, Any]:
    """fabric.json, or {} when the lab has none yet (single-node tests)."""
    try:
        return labstate.load_fabric(root)
    except FileNotFoundError:
        return {}


def c_hex(value: int, width: int) -> str:
    """C's ``%#0<width>x``: ``0x`` prefix counted in the width, but none for zero."""
    if value == 0:
        return "0" * width
    return "0x" + format(value, "x").zfill(width - 2)
