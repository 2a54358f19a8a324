"""HCA firmware and mlxconfig pins: the one home of what the spec's ``software.hca_firmware`` means.

The spec pins, per board id (PSID), the firmware version and the image file in the site's mirror, and the
mlxconfig parameters every HCA must have for the next boot (ATS, PCI ordering: docs/roles.md names NVIDIA's
pages). The doca_ofed role applies them (``tasks/firmware_pins.yml``), the manifest role records what each
device reports (sysfs ``fw_ver``/``board_id``, ``mlxconfig query`` of the pinned keys), and this module compares
the two for drift and ``provision plan``: a firmware or mlxconfig change takes effect only at the next reboot (or
mlxfwreset), so every mismatch is reboot-class.

It also parses the two tools' query outputs (``flint -d DEV query``, ``mlxconfig -d DEV query``), which the lab's
simulated tools print and the unit tests hold against captures from NVIDIA's MFT documentation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from provisioner.spec.models import HcaFirmware

FIRMWARE = "firmware"
NO_PIN = "a pin for PSID "


@dataclass(frozen=True)
class Mismatch:
    """``item`` (``firmware`` or ``mlxconfig:<KEY>``) of ``device`` on ``node`` is ``have`` where ``want``."""

    node: str
    device: str
    item: str
    want: str
    have: str | None

    @property
    def message(self) -> str:
        what = "firmware" if self.item == FIRMWARE else f"mlxconfig {self.item.split(':', 1)[1]}"
        have = self.have if self.have is not None else "not reported"
        if self.want.startswith(NO_PIN):
            return f"{self.node} {self.device}: firmware {have}, and the spec has no pin for its board ({self.want})"
        return f"{self.node} {self.device}: {what} is {have}, the spec pins {self.want}"


def wanted_value(value: bool | int | str) -> str:
    """A spec value as mlxconfig's number or name: true/false are 1/0 (mlxconfig prints True(1)/False(0))."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def value_matches(observed: str, want: str) -> bool:
    """``observed`` as mlxconfig prints it (``True(1)``, ``FORCE_RELAX(1)``, ``8``) is ``want`` (number or name)."""
    named = re.fullmatch(r"([A-Za-z0-9_]*)\((-?\d+)\)", observed.strip())
    if named:
        return want == named.group(2) or want.upper() == named.group(1).upper()
    return observed.strip().upper() == want.upper()


def role_vars(hf: HcaFirmware | None) -> dict[str, Any]:
    """The preflight, doca_ofed and manifest roles' variables for the pins (none without ``hca_firmware``: the defaults
    manage nothing)."""
    if hf is None:
        return {}
    def pins() -> dict[str, dict[str, str]]:  # one copy per variable: a shared one would render as a YAML alias
        return {psid: {"version": p.version, "image": p.image} for psid, p in sorted(hf.pins.items())}

    return {"manifest_mlxconfig_keys": sorted(hf.mlxconfig),
            "preflight_firmware_pins": pins(), "preflight_firmware_mirror": hf.mirror,
            "doca_ofed_firmware_mirror": hf.mirror, "doca_ofed_firmware_pins": pins(),
            "doca_ofed_mlxconfig_settings": {k: wanted_value(v) for k, v in sorted(hf.mlxconfig.items())}}


# ---------------------------------------------------------------------------------------------------------
# parsing the tools' query output

def parse_flint_query(text: str) -> dict[str, str]:
    """``flint -d DEV query``: ``psid``, ``fw_version`` (the image on flash) and ``fw_running``.

    After a burn, before the reset, flint prints the new image's ``FW Version`` and the one still running as
    ``FW Version(Running)``; otherwise the two are the same. ValueError when PSID or version is missing.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip(), value.strip().split()[0])
    if "PSID" not in fields or "FW Version" not in fields:
        raise ValueError("not flint query output: no PSID or FW Version line")
    return {"psid": fields["PSID"], "fw_version": fields["FW Version"],
            "fw_running": fields.get("FW Version(Running)", fields["FW Version"])}


_PARAM = re.compile(r"^\s*\*?\s*([A-Z][A-Z0-9_]*(?:\[[0-9.]+\])?)\s+(\S.*?)\s*$")


def parse_mlxconfig_query(text: str) -> dict[str, str]:
    """``mlxconfig -d DEV query [KEY...]``: ``{KEY: value}`` of the Next Boot column (the last one).

    Plain query prints one column (Next Boot); ``-e`` prints Default, Current and Next Boot, a ``*`` marking
    changed rows. ValueError when there is no ``Configurations:`` header.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("Configurations:")), None)
    if start is None:
        raise ValueError("not mlxconfig query output: no 'Configurations:' header")
    out: dict[str, str] = {}
    for line in lines[start + 1:]:
        match = _PARAM.match(line)
        if match:
            out[match.group(1)] = match.group(2).split()[-1]
    return out


# ---------------------------------------------------------------------------------------------------------
# comparing a node's manifest with the pins (pure)

def _device_mismatches(hf: HcaFirmware, node: str, device: str, hca: Mapping[str, Any]) -> list[Mismatch]:
    out: list[Mismatch] = []
    board, running = hca.get("board_id"), hca.get("fw_ver")
    if hf.pins:
        pin = hf.pins.get(str(board)) if board else None
        if pin is None:
            out.append(Mismatch(node, device, FIRMWARE, f"{NO_PIN}{board}", str(running) if running else None))
        elif running != pin.version:
            out.append(Mismatch(node, device, FIRMWARE, pin.version, str(running) if running else None))
    raw = hca.get("mlxconfig")
    seen: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    for key, value in sorted(hf.mlxconfig.items()):
        want, have = wanted_value(value), seen.get(key)
        if have is None or not value_matches(str(have), want):
            out.append(Mismatch(node, device, f"mlxconfig:{key}", want, None if have is None else str(have)))
    return out


def mismatches(hf: HcaFirmware | None, node: str, manifest: Mapping[str, Any]) -> list[Mismatch]:
    """Every device of ``node`` whose running firmware or next-boot mlxconfig value differs from the pins."""
    if hf is None:
        return []
    hcas = manifest.get("hcas") or {}
    return [m for dev in sorted(hcas) if isinstance(hcas[dev], dict)
            for m in _device_mismatches(hf, node, str(dev), hcas[dev])]
