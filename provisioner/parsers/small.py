"""Parsers for the one-line-per-record tools: ibdev2netdev, ofed_info, lsmod, sminfo, opensm.conf.

Each is small enough that a module per tool would only add import noise; they share the
same contract as the others (``text -> dict``, ``ParseError`` when it is not that tool).
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import diag_error_line, iberror_text, norm_guid, require_text
from provisioner.parsers._opensm_options import UPSTREAM_OPTIONS

# --- ibdev2netdev ------------------------------------------------------------------------------

_I2N_RE = re.compile(
    r"^\s*(?:(?P<pci>\S+)\s+)?(?P<dev>[A-Za-z0-9_]+)\s.*?\bport\s+(?P<port>\d+)\b.*?==>\s*(?P<net>\S+)"
    r"(?:\s+\((?P<up>Up|Down)\))?"
)


_PCI_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def _pci_address(raw: str | None) -> str | None:
    """``-v``'s leading PCI address as ``dddd:bb:dd.f`` (lowercase), else None."""
    m = _PCI_RE.match(raw or "")
    return f"{int(m.group(1), 16):04x}:{m.group(2)}:{m.group(3)}.{m.group(4)}".lower() if m else None


def parse_ibdev2netdev(text: str) -> dict[str, Any]:
    """Parse ``ibdev2netdev`` (plain or ``-v``). ``netdev_up`` is the netdev's state, not the IB port's; ``pci`` is
    the device's PCI address, which only ``-v`` prints (null otherwise)."""
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
                "pci": _pci_address(m.group("pci")),
            }
        )
    if not mappings:
        raise ParseError("ibdev2netdev: no '<dev> port N ==> <netdev>' line found")
    if any(mp["netdev"] is None for mp in mappings):
        warnings.append("some ports have no network device (N/A)")
    return {"tool": "ibdev2netdev", "mappings": mappings, "warnings": warnings}


# --- ofed_info ----------------------------------------------------------------------------------

#: ``MLNX_OFED_LINUX-23.10-1.1.9.0 (OFED-23.10-1.1.9):`` (full form), ``MLNX_OFED_LINUX-5.8-1.1.2.1:`` (-s),
#: ``OFED-internal-24.07-0.6.1:`` (DOCA-OFED), also pasted without the colon or indented.
_OFED_RE = re.compile(
    r"^\s*(?P<prefix>MLNX_OFED_LINUX|MLNX_EN_LINUX|OFED-internal|OFED)-(?P<ver>[0-9][0-9A-Za-z.\-]*?)"
    r"(?:\s+\((?P<base>OFED-[^)\s]+)\))?:?\s*$"
)
#: ``ofed_info -n``: the version number alone (``5.0-2.1.8``, ``24.10-1.1.4.0``).
_OFED_NUMBER_RE = re.compile(r"^\s*(?P<ver>[0-9]+\.[0-9]+-[0-9][0-9.]*)\s*$")
_OFED_FAMILY = {
    "MLNX_OFED_LINUX": "mlnx_ofed",
    "MLNX_EN_LINUX": "mlnx_en",
    "OFED-internal": "doca_ofed",
    "OFED": "ofed",
}


def parse_ofed_info(text: str) -> dict[str, Any]:
    """Parse ``ofed_info`` in its three forms: full listing, ``-s`` and ``-n``.

    ``flavor`` is the prefix exactly as the tool prints it (``MLNX_OFED_LINUX``, ``OFED-internal``...);
    ``family`` is the normalised name (``mlnx_ofed``, ``doca_ofed``, ``ofed``); ``-n`` prints neither,
    so both are null there. ``base`` is the upstream OFED release the full form names in parentheses.
    """
    require_text("ofed_info", text)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _OFED_RE.match(line)
        if not m:
            continue
        rest = [ln for ln in lines[i + 1 :] if ln.strip()]
        form = "full" if m.group("base") or (rest and rest[0].strip().endswith(":")) else "short"
        warnings: list[str] = []
        if not line.rstrip().endswith(":"):
            warnings.append("version line has no trailing ':' (copied from a log or trimmed?)")
        return {
            "tool": "ofed_info",
            "flavor": m.group("prefix"),
            "family": _OFED_FAMILY[m.group("prefix")],
            "version": m.group("ver"),
            "base": m.group("base"),
            "form": form,
            "warnings": warnings,
        }
    numbers = [ln for ln in lines if ln.strip()]
    if len(numbers) == 1:
        n = _OFED_NUMBER_RE.match(numbers[0])
        if n:
            return {
                "tool": "ofed_info",
                "flavor": None,
                "family": None,
                "version": n.group("ver"),
                "base": None,
                "form": "number",
                "warnings": ["ofed_info -n names no flavour: MLNX_OFED and DOCA-OFED versions look alike"],
            }
    raise ParseError("ofed_info: no 'MLNX_OFED_LINUX-<ver>', 'OFED-internal-<ver>' or bare version line found")


# --- lsmod ---------------------------------------------------------------------------------------

_LSMOD_HEAD_RE = re.compile(r"^\s*Module\s+Size\s+Used by\s*$")
_LSMOD_ROW_RE = re.compile(r"^(?P<name>[A-Za-z0-9_\-]+)\s+(?P<size>\d+)\s+(?P<count>-?\d+|-)(?:\s+(?P<by>\S.*))?$")


def _lsmod_row(line: str) -> tuple[str, dict[str, Any]] | None:
    m = _LSMOD_ROW_RE.match(line.strip())
    if not m:
        return None
    by_raw = (m.group("by") or "").strip()
    used_by = [] if by_raw.startswith("[") or not by_raw else [u for u in by_raw.split(",") if u]
    count = m.group("count")
    return m.group("name"), {
        "size": int(m.group("size")),
        "used_by_count": None if count == "-" else int(count),
        "used_by": used_by,
    }


def parse_lsmod(text: str) -> dict[str, Any]:
    """Parse ``lsmod``, whole or filtered (``lsmod | grep nvidia``).

    With the ``Module Size Used by`` header the listing is complete (``complete: true``) and an odd
    line is only a warning. Without it (grep drops the header) every non-blank line must be an lsmod
    row, which is what keeps other tables out; ``complete`` is then false, because a module absent
    from a filtered listing may still be loaded.
    """
    require_text("lsmod", text)
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _LSMOD_HEAD_RE.match(line)), None)
    modules: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    body = lines[start + 1 :] if start is not None else lines
    for n, line in enumerate(body, start=(start or -1) + 2):
        if not line.strip():
            continue
        row = _lsmod_row(line)
        if row is None:
            if start is None:
                raise ParseError(f"lsmod: line {n} is not a 'module size count [users]' row and there is no header")
            warnings.append(f"unparsed line: {line.strip()[:80]}")
            continue
        modules[row[0]] = row[1]
    if start is None:
        if not modules:
            raise ParseError("lsmod: no 'Module  Size  Used by' header and no module row")
        warnings.append("no 'Module Size Used by' header: a filtered listing, modules missing from it may be loaded")
    return {"tool": "lsmod", "complete": start is not None, "modules": modules, "warnings": warnings}


# --- sminfo --------------------------------------------------------------------------------------

_SMINFO_RE = re.compile(
    r"sminfo:\s+sm lid\s+(?P<lid>\d+)\s+sm guid\s+(?P<guid>0x[^\s,]+),\s*activity count\s+(?P<act>\d+)"
    r"\s+priority\s+(?P<prio>\d+)\s+state\s+(?P<code>\d+)\s+(?P<name>SMINFO_\w+)"
)
#: What ``sminfo | grep -o 'priority.*'`` leaves: priority (or nothing) and the state with its name.
_SMINFO_TAIL_RE = re.compile(r"(?:^|\s)(?:priority\s+(?P<prio>\d+)\s+)?state\s+(?P<code>\d+)\s+(?P<name>SMINFO_\w+)")
_SM_STATES = {
    "SMINFO_NOTACT": "notactive",
    "SMINFO_DISCOVER": "discovering",
    "SMINFO_STANDBY": "standby",
    "SMINFO_MASTER": "master",
}


def _sminfo_record(**fields: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"tool": "sminfo", "ok": True, "lid": None, "guid": None, "activity_count": None,
                           "priority": None, "state": None, "error": None, "errors": [], "warnings": []}
    rec.update(fields)
    return rec


def parse_sminfo(text: str) -> dict[str, Any]:
    """Parse ``sminfo``: the one SMInfo line, or the error a run printed instead.

    The line is sometimes wrapped by mail archives (whitespace is normalised). A run that could not query
    prints ``ibwarn:`` lines and ``sminfo: iberror: failed: <why>`` (``query`` when no SM answered,
    ``Failed to open '(null)' port '0'`` when the umad port could not be opened): that is sminfo's output too,
    parsed to ``ok: false`` with ``error`` (the iberror message) and every error line in ``errors``. Piped
    through ``grep -o 'priority.*'`` only priority and state are left: lid, GUID and activity count are null,
    with a warning.
    Operators often mask the SM GUID before posting (``0x2cGUID``, ``0xe89e4903003xxxxx``): the rest of the
    line is still read, ``guid`` is null with a warning.
    """
    require_text("sminfo", text)
    lines = [line.strip() for line in text.splitlines()]
    errors = [line for line in lines if diag_error_line(line, "sminfo")]
    flat = " ".join(" ".join(line for line in lines if line not in errors).split())
    m = _SMINFO_RE.search(flat)
    if m:
        guid = norm_guid(m.group("guid"))
        return _sminfo_record(
            lid=int(m.group("lid")),
            guid=guid,
            activity_count=int(m.group("act")),
            priority=int(m.group("prio")),
            state=_SM_STATES.get(m.group("name"), m.group("name").lower()),
            errors=errors,
            warnings=[] if guid else [f"sm guid {m.group('guid')} is not hex (masked in the paste?): guid unknown"],
        )
    failure = next((msg for line in errors if (msg := iberror_text(line, "sminfo")) is not None), None)
    if failure is not None:
        return _sminfo_record(ok=False, error=failure, errors=errors)
    tail = _SMINFO_TAIL_RE.search(flat)
    if tail and len(flat.split()) <= 6:
        return _sminfo_record(
            priority=int(tail.group("prio")) if tail.group("prio") else None,
            state=_SM_STATES.get(tail.group("name"), tail.group("name").lower()),
            warnings=["only the end of the sminfo line (filtered output?): sm lid, guid and activity count unknown"],
        )
    raise ParseError("sminfo: no 'sminfo: sm lid N sm guid 0x.., activity count N ... state N' line "
                     "and no 'sminfo: iberror:' line")


# --- opensm.conf ---------------------------------------------------------------------------------

_CONF_RE = re.compile(r"^(?P<key>[a-z][a-z0-9_]*)\s+(?P<val>\S.*?)\s*$")
_AR_ENGINES = ("ar_updn", "ar_ftree", "ar_torus", "ar_dor")
#: What ``opensm -c`` writes for an option that is not set.
_UNSET = "(null)"


def parse_opensm_conf(text: str) -> dict[str, Any]:
    """Parse ``opensm.conf`` (``key value`` lines, ``#`` comments).

    A file is an opensm.conf when every line is ``key value`` and at least one key is an upstream
    OpenSM option (:data:`UPSTREAM_OPTIONS`); a site file may set one QoS option and nothing else.
    ``(null)``, which ``opensm -c`` writes for an unset option, counts as unset. ``adaptive_routing``
    is true when the routing engine list names an AR engine (``ar_updn``...) or an
    ``ar_mode``/``adaptive_routing`` style option enables it; that is how MLNX/DOCA opensm turns AR on.
    """
    require_text("opensm.conf", text)
    options: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _CONF_RE.match(s)
        if not m:
            raise ParseError(f"opensm.conf: line {n} is not 'key value': {s[:60]!r}")
        options[m.group("key")] = m.group("val")
    if not any(k in UPSTREAM_OPTIONS for k in options):
        raise ParseError("opensm.conf: no OpenSM option (routing_engine, sm_priority, guid, qos_*...) in the text")
    engine_value = options.get("routing_engine", "")
    engines = [] if engine_value == _UNSET else [e.strip() for e in engine_value.split(",") if e.strip()]
    ar_flags = [v for k, v in options.items() if k in ("ar_mode", "adaptive_routing", "ar_enable")]
    ar = any(e in _AR_ENGINES for e in engines) or any(
        v.strip().lower() not in ("0", "false", "disable", "disabled", "none", _UNSET) for v in ar_flags
    )
    warnings = [] if engines else ["routing_engine not set: opensm uses minhop"]
    return {
        "tool": "opensm-conf",
        "options": options,
        "routing_engines": engines,
        "adaptive_routing": ar,
        "warnings": warnings,
    }
