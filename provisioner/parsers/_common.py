"""Shared helpers for the output parsers: enum normalisation, number and GUID handling.

Every parser is a pure function ``text -> dict``; these helpers keep the vocabulary
(state names, GUID spelling, units) identical across tools so that downstream checks can
compare an ``ibstat`` port with an ``iblinkinfo`` link without caring where each came from.
"""

from __future__ import annotations

import re

from provisioner.errors import ParseError

#: Logical port states, keyed by every spelling the tools print (ibstat, ibstatus, iblinkinfo).
_STATES: dict[str, str] = {
    "down": "down",
    "init": "init",
    "initializing": "init",
    "initialize": "init",
    "armed": "armed",
    "active": "active",
    "active_defer": "active",
}

#: Physical port states, keyed by every spelling the tools print.
_PHYS_STATES: dict[str, str] = {
    "sleep": "sleep",
    "polling": "polling",
    "disabled": "disabled",
    "portconfigurationtraining": "training",
    "training": "training",
    "linkup": "linkup",
    "linkerrorrecovery": "error_recovery",
    "errorrecovery": "error_recovery",
    "error_recovery": "error_recovery",
    "phytest": "phy_test",
    "phy_test": "phy_test",
    "phy test": "phy_test",
}

_GUID_RE = re.compile(r"^(?:0x)?([0-9a-fA-F]{1,16})$")


def norm_state(raw: str) -> str | None:
    """Map a tool's logical state ("Active", "4: ACTIVE", "Initializing") to the enum, or None."""
    word = raw.strip().split(":")[-1].strip().lower()
    return _STATES.get(word)


def norm_phys_state(raw: str) -> str | None:
    """Map a tool's physical state ("LinkUp", "5: LinkUp", "Polling") to the enum, or None."""
    word = raw.strip().split(":")[-1].strip().lower()
    return _PHYS_STATES.get(word) or _PHYS_STATES.get(word.replace(" ", ""))


def norm_link_layer(raw: str) -> str | None:
    """Map "InfiniBand"/"Ethernet" to the lowercase enum, or None when it is neither."""
    word = raw.strip().lower()
    return word if word in ("infiniband", "ethernet") else None


def norm_guid(raw: str) -> str | None:
    """Spell a GUID as ``0x`` + 16 lowercase hex digits (tools drop leading zeros), or None."""
    m = _GUID_RE.match(raw.strip().rstrip(","))
    if not m:
        return None
    return "0x" + m.group(1).lower().rjust(16, "0")


def to_float(raw: str) -> float | None:
    """Parse a float, returning None for placeholders such as ``N/A`` or ``...``."""
    try:
        return float(raw)
    except ValueError:
        return None


def to_int(raw: str) -> int | None:
    """Parse a decimal or ``0x`` integer, returning None for placeholders."""
    try:
        return int(raw, 0) if raw.lower().startswith("0x") else int(raw)
    except ValueError:
        return None


#: libibmad/libibnetdisc's own error prefixes, and ``IBEXIT``'s ``<tool>: iberror: failed: ...`` (the tool's name
#: as in argv[0], so possibly with a path: ``/usr/sbin/ibnetdiscover: iberror: failed: discover failed``).
_DIAG_PREFIXES = ("ibwarn:", "ibpanic:", "iberror:")
#: ``IBND_ERROR``/``IBWARN`` in libraries built with file/line prefixes:
#: ``src/query_smp.c:199; umad (DR path ...) bad status 110; Connection timed out``,
#: ``/var/tmp/OFED_topdir/BUILD/rdma-core-2307mlnx47/libibnetdisc/ibnetdisc.c:802; can't open MAD port ((null):0)``.
_SRC_LINE_RE = re.compile(r"^\S+\.c:\d+; \S")


def diag_error_line(stripped: str, tool: str) -> bool:
    """True for an infiniband-diags error line: ``ibwarn:``/``ibpanic:``/``iberror:``, ``<tool>: iberror: ...``
    (with or without a path before the tool's name) and the libraries' ``file.c:NNN; message`` lines."""
    if stripped.startswith(_DIAG_PREFIXES) or _SRC_LINE_RE.match(stripped):
        return True
    head, sep, _ = stripped.partition(": iberror:")
    return bool(sep) and head.rsplit("/", 1)[-1] == tool


def iberror_text(stripped: str, tool: str) -> str | None:
    """The message of ``<tool>: iberror: failed: <message>`` (IBEXIT's last word), else None."""
    head, sep, rest = stripped.partition(": iberror:")
    if not sep or head.rsplit("/", 1)[-1] != tool:
        return None
    return rest.strip().removeprefix("failed:").strip() or rest.strip()


def require_text(tool: str, text: str) -> str:
    """Reject empty or binary input up front, with the one-line message the CLI prints."""
    if not text or not text.strip():
        raise ParseError(f"{tool}: empty input")
    if "\x00" in text:
        raise ParseError(f"{tool}: input is binary, not {tool} output")
    return text
