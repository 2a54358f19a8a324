"""Ansible inventory plugin provisioner.cluster.spec: a provisioner cluster spec as an inventory source.

A config-file plugin, the way AWX / Automation Platform inventory sources expect: the inventory source is a small
YAML file that names the plugin and the spec,

    # cluster.provisioner.yml
    plugin: provisioner.cluster.spec
    spec: cluster.yaml            # relative to this file
    overlay: site-overlay.yaml    # optional, as `provision --overlay`

and `ansible-inventory -i cluster.provisioner.yml --list` gives exactly the groups and variables `provision
render` writes (both come from provisioner.render.build_inventory). The collection must be on Ansible's
collections path (`provision collection-path` prints the directory; the repository's ansible.cfg names it).
"""

from __future__ import annotations

import os
import re
from typing import Any

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin
from ansible.utils.unsafe_proxy import wrap_var

DOCUMENTATION = r"""
name: spec
short_description: provisioner cluster spec (cluster.yaml) as an inventory source
description:
  - Reads a provisioner cluster spec, and optionally an overlay, validates them with provisioner's rules and adds
    the hosts, groups (per role, profile, rail and leaf) and variables that C(provision render) writes.
  - The inventory source is a YAML file (C(.yml) or C(.yaml)) whose C(plugin) key names this plugin.
  - A spec or overlay with errors fails the inventory load with every error and its file:line:col.
  - Every value comes from site data and reaches Ansible marked unsafe, so it is never templated.
  - Needs the provisioner Python package in the Python that runs Ansible.
options:
  plugin:
    description: The name of this plugin; it marks the file as this plugin's configuration.
    required: true
    type: str
    choices: [provisioner.cluster.spec]
  spec:
    description: The cluster spec file; a relative path is relative to the directory of this configuration file.
    required: true
    type: str
  overlay:
    description:
      - An overlay merged over the spec, as C(provision --overlay) (site addresses, SSH settings, site_vars).
      - A relative path is relative to the directory of this configuration file.
    required: false
    type: str
"""

EXAMPLES = r"""
# cluster.provisioner.yml, next to cluster.yaml; ansible-inventory -i cluster.provisioner.yml --graph
plugin: provisioner.cluster.spec
spec: cluster.yaml
overlay: overlays/site.yaml
"""

NAME = "provisioner.cluster.spec"
_PLUGIN_LINE = re.compile(r"""^plugin:\s*["']?provisioner\.cluster\.spec["']?\s*(#.*)?$""")
_HEAD_BYTES = 65536


def _head_lines(path: str) -> list[str] | None:
    """The first lines of a regular file, or None: a FIFO or device named *.yml must not hang the inventory load."""
    if not path.endswith((".yaml", ".yml")) or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(_HEAD_BYTES).splitlines()
    except (OSError, UnicodeDecodeError):
        return None


def _is_spec(lines: list[str]) -> bool:
    return any(ln.startswith("cluster:") for ln in lines) and any(ln.startswith("nodes:") for ln in lines)


class InventoryModule(BaseInventoryPlugin):  # type: ignore[misc]
    NAME = NAME
    # Every value comes from the spec or the overlay (site data): never a template. Plain values of an inventory
    # plugin are untrusted in ansible-core 2.19, and wrap_var below marks them unsafe explicitly as well.
    trusted_by_default = False

    def verify_file(self, path: str) -> bool:
        """A configuration file naming this plugin; also a bare spec, only to say what to write instead."""
        if not super().verify_file(path):
            return False
        lines = _head_lines(path)
        if lines is None:
            return False
        return any(_PLUGIN_LINE.match(ln) for ln in lines) or _is_spec(lines)

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        lines = _head_lines(path) or []
        if _is_spec(lines) and not any(_PLUGIN_LINE.match(ln) for ln in lines):
            raise AnsibleParserError(
                f"{path} is a cluster spec, not an inventory source: write a file such as cluster.provisioner.yml "
                f"with 'plugin: {NAME}' and 'spec: {os.path.basename(path)}' and give that to -i")
        self._read_config_data(path)
        base = os.path.dirname(os.path.abspath(path))
        spec = os.path.join(base, os.path.expanduser(str(self.get_option("spec"))))
        overlay_opt = self.get_option("overlay")
        overlay = os.path.join(base, os.path.expanduser(str(overlay_opt))) if overlay_opt else None
        try:
            from provisioner.errors import ProvisionerError
            from provisioner.render.model import build_inventory
            from provisioner.spec import load_spec
        except ImportError as exc:  # pragma: no cover - provisioner must be installed next to ansible
            raise AnsibleParserError(f"provisioner is not importable from this Python: {exc}") from exc
        try:
            res = load_spec(spec, overlay)
            if res.errors or res.cluster is None:
                raise AnsibleParserError("\n".join(d.format() for d in res.errors))
            inv = build_inventory(res.cluster)  # refuses paths ssh would not read as paths (provisioner.render.ssh)
        except ProvisionerError as exc:
            raise AnsibleParserError(f"{path}: {exc}") from None
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
