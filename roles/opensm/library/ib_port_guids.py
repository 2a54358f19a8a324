#!/usr/bin/python3
"""Ansible module: list the node's InfiniBand ports from sysfs (read-only).

Why a module: the SM's own port GUID and the partition members' GUIDs must come from the
hardware, never from hand-typed inventory; sysfs ``gids/0`` holds the port GUID as the low
64 bits of the link-local GID.  The same module runs delegated on partition members.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: ib_port_guids
short_description: List InfiniBand ports (device, port, port GUID, state, LID) from sysfs
description:
  - Reads /sys/class/infiniband/<device>/ports/<n>/{gids/0,link_layer,state,lid,sm_lid}. Never changes anything.
options:
  sysfs:
    description: The infiniband sysfs class directory.
    type: path
    default: /sys/class/infiniband
author: provisioner
"""

EXAMPLES = r"""
- name: Read the port GUIDs
  ib_port_guids:
  register: ports
"""

RETURN = r"""
ports:
  description: One entry per port, sorted by device then port.
  type: list
  elements: dict
  returned: always
"""

import os  # noqa: E402 - Ansible modules put DOCUMENTATION first

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _guid(gid: str) -> str:
    """Port GUID = interface ID (last four groups) of GID 0."""
    groups = gid.split(":")
    if len(groups) != 8:
        return ""
    return "0x" + "".join(g.zfill(4) for g in groups[4:]).lower()


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        return 0


def list_ports(sysfs: str) -> list[dict[str, object]]:
    """Every port of every device under ``sysfs``."""
    ports: list[dict[str, object]] = []
    try:
        devices = sorted(os.listdir(sysfs))
    except OSError:
        return ports
    for dev in devices:
        base = os.path.join(sysfs, dev, "ports")
        try:
            numbers = sorted(os.listdir(base), key=lambda n: int(n) if n.isdigit() else 0)
        except OSError:
            continue
        for num in numbers:
            pdir = os.path.join(base, num)
            state = _read(os.path.join(pdir, "state"))
            ports.append(
                {
                    "device": dev,
                    "port": _int(num),
                    "guid": _guid(_read(os.path.join(pdir, "gids", "0"))),
                    "link_layer": _read(os.path.join(pdir, "link_layer")) or "InfiniBand",
                    "state": state.split(":", 1)[-1].strip() if state else "",
                    "lid": _int(_read(os.path.join(pdir, "lid")) or "0"),
                    "sm_lid": _int(_read(os.path.join(pdir, "sm_lid")) or "0"),
                }
            )
    return ports


def main() -> None:
    module = AnsibleModule(argument_spec={"sysfs": {"type": "path", "default": "/sys/class/infiniband"}},
                           supports_check_mode=True)
    ports = list_ports(module.params["sysfs"])
    module.exit_json(changed=False, ports=ports)


if __name__ == "__main__":
    main()
