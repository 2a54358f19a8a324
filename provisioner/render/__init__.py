"""Render the Ansible inventory from the expanded cluster."""

from provisioner.render.model import Inventory, build_inventory
from provisioner.render.write import RenderResult, render_files, render_inventory

__all__ = ["Inventory", "RenderResult", "build_inventory", "render_files", "render_inventory"]
