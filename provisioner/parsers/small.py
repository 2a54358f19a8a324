"""Parsers for the one-line-per-record tools: ibdev2netdev, ofed_info -s, lsmod, sminfo, opensm.conf.

Each is small enough that a module per tool would only add import noise; they share the
same contract as the others (``text -> dict``, ``ParseError`` when it is not that tool).
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import norm_guid, require_text

# --- ibdev2netdev ------------------------------------------------------------------------------

_I2N_RE = re.compile(
    r"^\s*(?:\S+\s+)?(?P<dev>[A-Za-z0-9_]+)\s.*?\bport\s+(?P<port>\d+)\b.*?==>\s*(?P<net>\S+)"
    r"(?:\s+\((?P<up>Up|Down)\))?"
)


def parse_ibdev2netdev(text: str) -> dict[str, Any]:
    """Parse ``ibdev2netdev`` (plain or ``-v``). ``netdev_up`` is the netdev's state, not the IB port's."""
    require_text("ibdev2netdev", text)
    mappings: list[dict[str, Any]] = []
    warnings: list[str] = []
    for line in text.splitlines():
        m = _I2N_RE.match(line)
        if not m:
            continue
        netdev = m.group("net")
        up = m.group("up")
        mappings.append(
            {
                "device": m.group("dev"),
                "port": int(m.group("port")),
                "netdev": None if netdev in ("N/A", "NA") else netdev,
                "netdev_up": None if up is None else up == "Up",
            }
        )
    if not mappings:
        raise ParseError("ibdev2netdev: no '<dev> port N ==> <netdev>' line found")
    if any(mp["netdev"] is None for mp in mappings):
        warnings.append("some ports have no network device (N/A)")
    return {"tool": "ibdev2netdev", "mappings": mappings, "warnings": warnings}


# --- ofed_info -s --------------------------------------------------------------------------------

_OFED_RE = re.compile(r"^\s*(?P<flavor>MLNX_OFED_LINUX|OFED-internal|OFED)-(?P<ver>[0-9][0-9A-Za-z.\-]*?)(?::)?\s*$")


def parse_ofed_info(text: str) -> dict[str, Any]:
    """Parse ``ofed_info -s``: ``MLNX_OFED_LINUX-<ver>:`` (MOFED) or ``OFED-internal-<ver>:`` (DOCA-OFED)."""
    require_text("ofed_info", text)
    for line in text.splitlines():
        m = _OFED_RE.match(line)
        if m:
            flavor = "mlnx_ofed" if m.group("flavor") == "MLNX_OFED_LINUX" else "doca_ofed"
            if m.group("flavor") == "OFED":
                flavor = "ofed"
            return {"tool": "ofed_info", "flavor": flavor, "version": m.group("ver"), "warnings": []}
    raise ParseError("ofed_info: no 'MLNX_OFED_LINUX-<ver>:' or 'OFED-internal-<ver>:' line found")


# --- lsmod ---------------------------------------------------------------------------------------

_LSMOD_HEAD_RE = re.compile(r"^\s*Module\s+Size\s+Used by\s*$")
_LSMOD_ROW_RE = re.compile(r"^(?P<name>[A-Za-z0-9_\-]+)\s+(?P<size>\d+)\s+(?P<count>-?\d+|-)(?:\s+(?P<by>\S.*))?$")


def parse_lsmod(text: str) -> dict[str, Any]:
    """Parse ``lsmod``; the ``Module Size Used by`` header is required so other tables are rejected."""
    require_text("lsmod", text)
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if _LSMOD_HEAD_RE.match(line))
    except StopIteration:
        raise ParseError("lsmod: no 'Module  Size  Used by' header found") from None
    modules: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        m = _LSMOD_ROW_RE.match(line.strip())
        if not m:
            warnings.append(f"unparsed line: {line.strip()[:80]}")
            continue
        by_raw = (m.group("by") or "").strip()
        used_by = [] if by_raw.startswith("[") or not by_raw else [u for u in by_raw.split(",") if u]
        count = m.group("count")
        modules[m.group("name")] = {
            "size": int(m.group("size")),
            "used_by_count": None if count == "-" else int(count),
            "used_by": used_by,
        }
    return {"tool": "lsmod", "modules": modules, "warnings": warnings}


# --- sminfo --------------------------------------------------------------------------------------

_SMINFO_RE = re.compile(
    r"sminfo:\s+sm lid\s+(?P<lid>\d+)\s+sm guid\s+(?P<guid>0x[0-9a-fA-F]+),\s*activity count\s+(?P<act>\d+)"
    r"\s+priority\s+(?P<prio>\d+)\s+state\s+(?P<code>\d+)\s+(?P<name>SMINFO_\w+)"
)
_SM_STATES = {
    "SMINFO_NOTACT": "notactive",
    "SMINFO_DISCOVER": "discovering",
    "SMINFO_STANDBY": "standby",
    "SMINFO_MASTER": "master",
}


def parse_sminfo(text: str) -> dict[str, Any]:
    """Parse ``sminfo`` (one line, sometimes wrapped by mail archives: whitespace is normalised)."""
    require_text("sminfo", text)
    flat = " ".join(text.split())
    m = _SMINFO_RE.search(flat)
    if not m:
        raise ParseError("sminfo: no 'sminfo: sm lid N sm guid 0x.., activity count N ... state N' line")
    return {
        "tool": "sminfo",
        "lid": int(m.group("lid")),
        "guid": norm_guid(m.group("guid")),
        "activity_count": int(m.group("act")),
        "priority": int(m.group("prio")),
        "state": _SM_STATES.get(m.group("name"), m.group("name").lower()),
        "warnings": [],
    }


# --- opensm.conf ---------------------------------------------------------------------------------

_CONF_RE = re.compile(r"^(?P<key>[a-z][a-z0-9_]*)\s+(?P<val>\S.*?)\s*$")
_AR_ENGINES = ("ar_updn", "ar_ftree", "ar_torus", "ar_dor")
_KNOWN_KEYS = ("routing_engine", "sm_priority", "log_file", "sweep_interval", "guid", "lmc")


def parse_opensm_conf(text: str) -> dict[str, Any]:
    """Parse ``opensm.conf`` (``key value`` lines, ``#`` comments).

    ``adaptive_routing`` is true when the routing engine list names an AR engine
    (``ar_updn``...) or ``ar_mode``/``adaptive_routing`` style options enable it; that is
    how MLNX/DOCA opensm turns AR on.
    """
    require_text("opensm.conf", text)
    options: dict[str, str] = {}
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _CONF_RE.match(s)
        if not m:
            raise ParseError(f"opensm.conf: line is not 'key value': {s[:60]!r}")
        options[m.group("key")] = m.group("val")
    if not options or not any(k in options for k in _KNOWN_KEYS):
        raise ParseError("opensm.conf: no known opensm option (routing_engine, sm_priority, guid...)")
    engines = [e.strip() for e in options.get("routing_engine", "").split(",") if e.strip()]
    ar_flags = [v for k, v in options.items() if k in ("ar_mode", "adaptive_routing", "ar_enable")]
    ar = any(e in _AR_ENGINES for e in engines) or any(
        v.strip().lower() not in ("0", "false", "disable", "disabled", "none") for v in ar_flags
    )
    warnings = [] if engines else ["routing_engine not set: opensm uses minhop"]
    return {
        "tool": "opensm-conf",
        "options": options,
        "routing_engines": engines,
        "adaptive_routing": ar,
        "warnings": warnings,
    }
