"""Ansible inventory plugin: use a provisioner cluster spec directly as an inventory source.

    ansible-inventory -i cluster.yaml --list

works from the repository root (ansible.cfg enables this plugin), and AWX / Automation Platform can use the
spec as an inventory source the same way. The groups and variables are exactly those `provision render` writes,
because both come from provisioner.render.build_inventory.
"""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin
from ansible.utils.unsafe_proxy import wrap_var

DOCUMENTATION = r"""
name: provisioner_spec
short_description: provisioner cluster spec (cluster.yaml) as an inventory source
description:
  - Reads a provisioner cluster spec (a YAML file with C(cluster), C(nodes), C(profiles) and C(fabric) keys),
    validates it with provisioner's rules and adds its hosts, groups (per role, profile, rail and leaf) and
    variables.
  - A spec with errors fails the inventory load with every error and its file:line:col.
options: {}
"""


class InventoryModule(BaseInventoryPlugin):  # type: ignore[misc]
    NAME = "provisioner_spec"
    # Every value comes from the spec (site data): never a template. Plain values of an inventory plugin are
    # untrusted in ansible-core 2.19, and wrap_var below marks them unsafe explicitly as well.
    trusted_by_default = False

    def verify_file(self, path: str) -> bool:
        if not super().verify_file(path) or not path.endswith((".yaml", ".yml")) or not os.path.isfile(path):
            return False  # a FIFO or device named *.yaml must not hang the inventory load
        try:
            with open(path, encoding="utf-8") as fh:
                head = fh.read(65536)
        except OSError:
            return False
        lines = head.splitlines()
        return any(ln.startswith("cluster:") for ln in lines) and any(ln.startswith("nodes:") for ln in lines)

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        try:
            from provisioner.errors import ProvisionerError
            from provisioner.render.model import build_inventory
            from provisioner.spec import load_spec
        except ImportError as exc:  # pragma: no cover - provisioner must be installed next to ansible
            raise AnsibleParserError(f"provisioner is not importable from this Python: {exc}") from exc
        try:
            res = load_spec(path)
        except ProvisionerError as exc:
            raise AnsibleParserError(str(exc)) from None
        if res.errors or res.cluster is None:
            raise AnsibleParserError("\n".join(d.format() for d in res.errors))
        inv = build_inventory(res.cluster)
        for node in res.cluster.nodes:
            self.inventory.add_host(node.name)
        for group, hosts in inv.groups.items():
            self.inventory.add_group(group)
            for h in hosts:
                self.inventory.add_host(h, group=group)
        for group, gvars in inv.groupvars.items():
            if group != "all":
                self.inventory.add_group(group)
            for key, value in gvars.items():
                self.inventory.set_variable(group, key, wrap_var(value))
        for host, hv in inv.hostvars.items():
            for key, value in hv.items():
                self.inventory.set_variable(host, key, wrap_var(value))
