"""Filters of the ipoib role: read ``ip addr show`` and compare it with the planned interfaces.

Why a filter and not regexes in YAML: the role reconfigures an interface only when the kernel's view differs from
the plan, and reports exactly what differs; the same reading is unit-tested on a real captured IPoIB interface
(tests/fixtures/ip-addr). The layout is iproute2's default text (one ``N: name[@link]: <FLAGS> mtu M ... state S``
line per interface, then ``link/<type>`` and ``inet A/P`` lines), which Debian and Ubuntu print alike.

The files the role owns for a plan, and which of the files found on a node are its own stale ones, are filters too:
the role removes exactly what it wrote and no longer needs, and the unit tests pin that down per backend.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

_HEADER = re.compile(r"^\d+:\s+(?P<name>[^:@\s]+)(?:@\S+)?:\s+<(?P<flags>[^>]*)>(?P<rest>.*)$")
_LINK = re.compile(r"^\s+link/(?P<type>\S+)")
_INET = re.compile(r"^\s+inet\s+(?P<cidr>\d{1,3}(?:\.\d{1,3}){3}/\d{1,2})\b")


class IpoibParseError(ValueError):
    """The text is not ``ip addr show`` output."""


def ip_addr_state(text: str) -> dict[str, dict[str, Any]]:
    """``ip addr show`` -> {name: {flags, mtu, state, link_type, addresses, up}} (up: UP and LOWER_UP, carrier)."""
    out: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in (text or "").splitlines():
        head = _HEADER.match(line)
        if head:
            rest = head.group("rest")
            mtu = re.search(r"\bmtu (\d+)", rest)
            state = re.search(r"\bstate (\S+)", rest)
            flags = [f for f in head.group("flags").split(",") if f]
            current = {"flags": flags, "mtu": int(mtu.group(1)) if mtu else None,
                       "state": state.group(1) if state else None, "link_type": None, "addresses": [],
                       "up": "UP" in flags and "LOWER_UP" in flags and "NO-CARRIER" not in flags}
            out[head.group("name")] = current
            continue
        if current is None:
            continue
        link = _LINK.match(line)
        if link and current["link_type"] is None:
            current["link_type"] = link.group("type")
            continue
        inet = _INET.match(line)
        if inet:
            current["addresses"].append(inet.group("cidr"))
    if not out:
        raise IpoibParseError("no interface in `ip addr show` output")
    return out


def problems(plan: list[dict[str, Any]], state: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """What differs between the planned interfaces and the kernel's view: [{name, problem}], plan order.

    Only what the role itself sets is compared (presence, up, the planned address, MTU); the IPoIB mode and the
    P_Key are the kernel's once the interface exists, and `provision verify` reads them from sysfs.
    """
    out: list[dict[str, str]] = []
    for iface in plan:
        name = str(iface["name"])
        want = f"{iface['address']}/{iface['prefix']}"
        got = state.get(name)
        if got is None:
            out.append({"name": name, "problem": "does not exist"})
            continue
        if not got["up"]:
            out.append({"name": name, "problem": f"is down (<{','.join(got['flags'])}>)"})
        if want not in got["addresses"]:
            out.append({"name": name, "problem": f"has {', '.join(got['addresses']) or 'no IPv4 address'}, "
                                                 f"planned {want}"})
        if got["mtu"] != int(iface["mtu"]):
            out.append({"name": name, "problem": f"has MTU {got['mtu']}, planned {iface['mtu']}"})
    return out


def not_infiniband(state: dict[str, dict[str, Any]], names: list[str]) -> list[str]:
    """The names among ``names`` whose link is not link/infiniband (missing ones are not listed)."""
    return [n for n in names if n in state and state[n]["link_type"] != "infiniband"]


def owned_files(plan: list[dict[str, Any]], backend: str, simulated: bool, prefix: str, networkd_dir: str,
                netplan_file: str, udev_rule: str) -> list[str]:
    """The paths the role writes for ``plan`` on ``backend`` (what networkd.yml / netplan.yml and mode.yml write).

    networkd: a .network per interface; netplan: the netplan file of the ports and a .network per P_Key child. Both:
    a .netdev per child, a drop-in on netplan's 10-netplan-<parent>.network per parent with children (netplan only)
    and the mode udev rule, none of them for simulated links. No interface planned: nothing.
    """
    if not plan:
        return []
    children = [i for i in plan if i.get("parent")]
    base = networkd_dir.rstrip("/") or "/"
    out: list[str] = []
    if backend == "netplan":
        out.append(netplan_file)
        out += [f"{base}/{prefix}-{i['name']}.network" for i in children]
    else:
        out += [f"{base}/{prefix}-{i['name']}.network" for i in plan]
    if not simulated:
        out += [f"{base}/{prefix}-{i['name']}.netdev" for i in children]
        if backend == "netplan":
            parents = list(dict.fromkeys(str(i["parent"]) for i in children))
            out += [f"{base}/10-netplan-{p}.network.d/{prefix}.conf" for p in parents]
        out.append(udev_rule)
    return out


def stale_files(found: list[str], owned: list[str], prefix: str, networkd_dir: str, netplan_file: str,
                udev_rule: str) -> list[str]:
    """The paths among ``found`` that the role writes (its own names, in their own places) and no longer owns.

    A path elsewhere (another drop-in directory, a subdirectory, a look-alike name) is never returned, whatever
    ``found`` holds: the role removes only what it wrote.
    """
    base = posixpath.normpath(networkd_dir)
    own = re.compile(rf"{re.escape(prefix)}-[^/]+\.(network|netdev)")
    dropin_dir = re.compile(r"10-netplan-[^/]+\.network\.d")
    keep = {posixpath.normpath(p) for p in owned}
    out: list[str] = []
    for path in found:
        norm = posixpath.normpath(path)
        head, name = posixpath.split(norm)
        ours = (norm in (posixpath.normpath(netplan_file), posixpath.normpath(udev_rule))
                or (head == base and own.fullmatch(name) is not None)
                or (posixpath.dirname(head) == base and dropin_dir.fullmatch(posixpath.basename(head)) is not None
                    and name == f"{prefix}.conf"))
        if ours and norm not in keep and norm not in out:
            out.append(norm)
    return out


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "ipoib_addr_state": ip_addr_state,
            "ipoib_problems": problems,
            "ipoib_not_infiniband": not_infiniband,
            "ipoib_owned_files": owned_files,
            "ipoib_stale_files": stale_files,
        }
