"""Parser for ``ibstat`` (infiniband-diags): CAs, their ports, and any ``ibpanic``/``ibwarn`` lines.

ibstat prints one ``CA 'name'`` block per device with ``Key: value`` lines; indentation is
tabs on a terminal but is often lost when people paste it, so the parser keys on the labels,
not on the indentation. ``ibpanic`` can abort the listing mid-way (a device whose sysfs is
incomplete): everything printed before it is kept and the message goes to ``errors``.
"""

from __future__ import annotations

import re
from typing import Any

from provisioner.errors import ParseError
from provisioner.parsers._common import (
    norm_guid,
    norm_link_layer,
    norm_phys_state,
    norm_state,
    require_text,
    to_float,
    to_int,
)

_CA_RE = re.compile(r"^\s*CA '([^']+)'\s*$")
_PORT_RE = re.compile(r"^\s*Port (\d+):\s*$")
_KV_RE = re.compile(r"^\s*([A-Za-z][A-Za-z _]*?):\s*(.*?)\s*$")
_ERR_RE = re.compile(r"^\s*(?:ibpanic|ibwarn|iberror|ibstat: iberror)\b")
_FAILED_AFTER_RE = re.compile(r"\bibstat: ")  # then 'failed' later on the line; `.*\bibstat: .*failed` backtracked


def _is_error_line(line: str) -> bool:
    """An ib* diagnostic line, or an 'ibstat: ... failed' one (linear in the line)."""
    if _ERR_RE.match(line):
        return True
    m = _FAILED_AFTER_RE.search(line)
    return m is not None and "failed" in line[m.end():]


def _new_port(num: int) -> dict[str, Any]:
    return {
        "port": num,
        "state": None,
        "physical_state": None,
        "rate_gbps": None,
        "base_lid": None,
        "sm_lid": None,
        "port_guid": None,
        "link_layer": None,
    }


def _new_device(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "ca_type": None,
        "num_ports": None,
        "firmware": None,
        "node_guid": None,
        "ports": [],
    }


def _set_port_field(port: dict[str, Any], key: str, value: str) -> None:
    if key == "state":
        port["state"] = norm_state(value)
    elif key == "physical state":
        port["physical_state"] = norm_phys_state(value)
    elif key == "rate":
        port["rate_gbps"] = to_float(value.split()[0]) if value else None
    elif key == "base lid":
        port["base_lid"] = to_int(value)
    elif key == "sm lid":
        port["sm_lid"] = to_int(value)
    elif key == "port guid":
        port["port_guid"] = norm_guid(value)
    elif key == "link layer":
        port["link_layer"] = norm_link_layer(value)


def _set_device_field(dev: dict[str, Any], key: str, value: str) -> None:
    if key == "ca type":
        dev["ca_type"] = value or None
    elif key == "number of ports":
        dev["num_ports"] = to_int(value)
    elif key == "firmware version":
        dev["firmware"] = value or None
    elif key == "node guid":
        dev["node_guid"] = norm_guid(value)


def _port_warnings(dev: str, port: dict[str, Any]) -> list[str]:
    """Flag the values that look fine but are not: a Down port's rate, a LinkUp port not Active."""
    where = f"{dev} port {port['port']}"
    out: list[str] = []
    if port["state"] is None:
        out.append(f"{where}: no recognisable State line")
    if port["state"] == "down" and port["rate_gbps"] is not None:
        out.append(f"{where}: port is Down, Rate {port['rate_gbps']:g} is a placeholder, not a link rate")
    if port["physical_state"] == "linkup" and port["state"] in ("init", "armed"):
        out.append(f"{where}: physical link is up but the port is {port['state']} (no subnet manager?)")
    return out


def parse_ibstat(text: str) -> dict[str, Any]:
    """Parse ``ibstat`` output into devices, ports, errors and warnings."""
    require_text("ibstat", text)
    devices: list[dict[str, Any]] = []
    errors: list[str] = []
    dev: dict[str, Any] | None = None
    port: dict[str, Any] | None = None
    for line in text.splitlines():
        if _is_error_line(line):
            errors.append(line.strip())
            continue
        m = _CA_RE.match(line)
        if m:
            dev = _new_device(m.group(1))
            devices.append(dev)
            port = None
            continue
        if dev is None:
            continue
        m = _PORT_RE.match(line)
        if m:
            port = _new_port(int(m.group(1)))
            dev["ports"].append(port)
            continue
        kv = _KV_RE.match(line)
        if not kv:
            continue
        key, value = kv.group(1).strip().lower(), kv.group(2)
        if port is not None and key in (
            "state",
            "physical state",
            "rate",
            "base lid",
            "lmc",
            "sm lid",
            "capability mask",
            "port guid",
            "link layer",
        ):
            _set_port_field(port, key, value)
        else:
            _set_device_field(dev, key, value)
    # An error-only ibstat is its own ibpanic/iberror; ibwarn lines alone, or another tool's "<tool>: iberror:"
    # line (sminfo, ibnetdiscover), are the libraries' noise of some other diagnostic, not ibstat output.
    own = any(e.startswith(("ibpanic", "iberror", "ibstat")) for e in errors)
    foreign = any(": iberror:" in e and not e.split(": iberror:")[0].endswith("ibstat") for e in errors)
    if not devices and (not own or foreign):
        raise ParseError("ibstat: no \"CA '<name>'\" block found; this is not ibstat output")
    warnings: list[str] = []
    for d in devices:
        if d["num_ports"] is not None and d["num_ports"] != len(d["ports"]):
            warnings.append(f"{d['name']}: reports {d['num_ports']} port(s) but {len(d['ports'])} listed")
        for p in d["ports"]:
            warnings.extend(_port_warnings(d["name"], p))
    return {"tool": "ibstat", "devices": devices, "errors": errors, "warnings": warnings}
