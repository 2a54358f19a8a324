"""Parser for ``lspci -vvv`` (with or without ``-nn`` and ``-D``): per device its address, class, IDs, the PCIe
link it is capable of (``LnkCap``) and the one it trained at (``LnkSta``), a bridge's bus range and its ACS
capability and control flags.

Read as operators paste it: every line is taken stripped (lspci's tab indentation carries no meaning the
keys do not), a device starts at its ``BB:DD.F class: name`` line, and key lines pasted without their device line
(``lspci -vvv | grep -e LnkCap -e LnkSta``, ``| grep ACSCtl``) are kept as devices with ``bdf`` null, one per
repeated key, with a warning. ``LnkCap2``/``LnkSta2`` are other registers and never read as the link.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import require_text

#: ``0000:02:08.0 PCI bridge: PLX ...``, ``da:00.0 3D controller [0302]: NVIDIA ... [10de:20b0] (rev a1)``.
_HEADER_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])\s+"
    r"(?P<cls>[^:\[\]]+?)(?:\s\[(?P<code>[0-9a-fA-F]{4})\])?:\s+(?P<rest>\S.*)$"
)
_IDS_RE = re.compile(
    r"^(?P<name>.*?)(?:\s\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\])?"
    r"(?:\s\(rev (?P<rev>[0-9a-fA-F]+)\))?(?:\s\(prog-if .*\))?$"
)
_LNKCAP_RE = re.compile(r"^LnkCap:\s*Port #\d+, Speed (?P<speed>[0-9.]+)GT/s, Width x(?P<width>\d+)")
_LNKSTA_RE = re.compile(
    r"^LnkSta:\s*Speed (?P<speed>[0-9.]+)GT/s(?: \((?P<sdown>ok|downgraded|overdriven)\))?, "
    r"Width x(?P<width>\d+)(?: \((?P<wdown>ok|downgraded|overdriven)\))?"
)
_BUS_RE = re.compile(
    r"^Bus: primary=(?P<p>[0-9a-fA-F]+), secondary=(?P<s>[0-9a-fA-F]+), subordinate=(?P<o>[0-9a-fA-F]+)"
)
_ACS_RE = re.compile(r"^(?P<key>ACSCap|ACSCtl):\s*(?P<flags>.*)$")
_FLAG_RE = re.compile(r"([A-Za-z][A-Za-z0-9]*)([+-])")
_EXPRESS_RE = re.compile(r"^Capabilities: \[[0-9a-f]+\] Express \(v\d\) (?P<type>[A-Za-z ]+?)(?: \(Slot[+-]\))?,")
_DRIVER_RE = re.compile(r"^Kernel driver in use: (?P<driver>\S+)")

#: The keys a device has once per lspci block; one seen again in a headerless paste starts the next device.
_ONCE = ("link_cap", "link_sta", "acs_cap", "acs_ctl", "bus_range")


def _new_device(m: re.Match[str] | None) -> dict[str, Any]:
    dev: dict[str, Any] = {
        "bdf": None, "domain": None, "class_name": None, "class_code": None, "vendor_id": None,
        "device_id": None, "name": None, "rev": None, "port_type": None, "driver": None,
        "link_cap": None, "link_sta": None, "bus_range": None, "acs_cap": None, "acs_ctl": None,
    }
    if m is None:
        return dev
    domain = (m.group("domain") or "0000").lower().rjust(4, "0")
    ids = _IDS_RE.match(m.group("rest"))
    assert ids is not None  # every tail matches: all parts are optional
    dev.update(
        bdf=f"{domain}:{m.group('bus')}:{m.group('dev')}.{m.group('fn')}".lower(), domain=domain,
        class_name=m.group("cls").strip(), class_code=(m.group("code") or "").lower() or None,
        vendor_id=(ids.group("vendor") or "").lower() or None, device_id=(ids.group("device") or "").lower() or None,
        name=ids.group("name").strip(), rev=ids.group("rev"),
    )
    return dev


def _speed(raw: str) -> float:
    value = float(raw)
    return int(value) if value.is_integer() else value


def _key_line(line: str) -> tuple[str, Any] | None:
    """(field, value) for a line the parser reads, else None."""
    if m := _LNKCAP_RE.match(line):
        return "link_cap", {"speed_gts": _speed(m.group("speed")), "width": int(m.group("width"))}
    if m := _LNKSTA_RE.match(line):
        return "link_sta", {"speed_gts": _speed(m.group("speed")), "width": int(m.group("width")),
                            "speed_downgraded": m.group("sdown") == "downgraded",
                            "width_downgraded": m.group("wdown") == "downgraded"}
    if m := _ACS_RE.match(line):
        flags = {name: sign == "+" for name, sign in _FLAG_RE.findall(m.group("flags"))}
        return ("acs_cap" if m.group("key") == "ACSCap" else "acs_ctl"), flags
    if m := _BUS_RE.match(line):
        return "bus_range", {"primary": int(m.group("p"), 16), "secondary": int(m.group("s"), 16),
                             "subordinate": int(m.group("o"), 16)}
    if m := _EXPRESS_RE.match(line):
        return "port_type", m.group("type").strip().lower().replace(" ", "_")
    if m := _DRIVER_RE.match(line):
        return "driver", m.group("driver")
    return None


def parse_lspci(text: str) -> dict[str, Any]:
    """Parse ``lspci -vvv`` output into ``devices`` (see the module docstring)."""
    require_text("lspci", text)
    devices: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    headerless = 0
    for raw in text.splitlines():
        line = raw.strip()
        if m := _HEADER_RE.match(line):
            current = _new_device(m)
            devices.append(current)
            continue
        found = _key_line(line)
        if found is None:
            continue
        key, value = found
        if current is None or (current["bdf"] is None and key in _ONCE and current[key] is not None):
            current = _new_device(None)
            devices.append(current)
            headerless += 1
        current[key] = value
    if not devices:
        raise ParseError("lspci: no device line ('BB:DD.F class: name') and no LnkCap/LnkSta/ACSCtl line found")
    warnings: list[str] = []
    if headerless:
        warnings.append(f"{headerless} device(s) pasted without their 'BB:DD.F class: name' line (grep'd?): "
                        "their address and class are unknown")
    return {"tool": "lspci", "devices": devices, "warnings": warnings}


def below_capable(dev: dict[str, Any]) -> bool:
    """Whether a parsed endpoint's link trained below what it can do: lspci marks the speed or width
    ``(downgraded)``, or (an lspci too old to print marks) LnkSta is narrower or slower than LnkCap.

    Meant for endpoints (GPUs, HCAs): a root or downstream port below its own LnkCap is normal when the device
    behind it is narrower."""
    cap, sta = dev["link_cap"], dev["link_sta"]
    if sta is None:
        return False
    if sta["speed_downgraded"] or sta["width_downgraded"]:
        return True
    return cap is not None and (sta["width"] < cap["width"] or sta["speed_gts"] < cap["speed_gts"])
