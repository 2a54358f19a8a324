"""The inventory plugin provisioner.cluster.spec, in process: which files it takes (ansible-inventory runs of it are in
test_render.py and test_site_data_safety.py)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

from provisioner.collection import INVENTORY_PLUGIN, collection

ROOT = Path(__file__).resolve().parents[2]


def plugin_module() -> ModuleType:
    path = collection().root / "plugins" / "inventory" / "spec.py"
    spec = importlib.util.spec_from_file_location("provisioner_inventory_spec", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def plugin() -> object:
    return plugin_module().InventoryModule()


@pytest.mark.parametrize(("name", "body", "taken"), [
    ("cluster.provisioner.yml", "plugin: provisioner.cluster.spec\nspec: cluster.yaml\n", True),
    ("awx.yaml", "# inventory source\nplugin: 'provisioner.cluster.spec'  # ours\nspec: c.yaml\n", True),
    ("cluster.yaml", (ROOT / "examples" / "h100-ndr-8node.yaml").read_text(), True),  # only to say what to write
    ("hosts.yml", "all:\n  hosts:\n    gpu01: {}\n", False),
    ("other.yml", "plugin: constructed\nstrict: true\n", False),
    ("short.yml", "plugin: spec\nspec: cluster.yaml\n", False),
    ("cluster.provisioner.ini", "plugin: provisioner.cluster.spec\n", False),
], ids=lambda v: v if isinstance(v, str) and "\n" not in v else "")
def test_verify_file(plugin: object, tmp_path: Path, name: str, body: str, taken: bool) -> None:
    path = tmp_path / name
    path.write_text(body)
    assert plugin.verify_file(str(path)) is taken  # type: ignore[attr-defined]


def test_a_fifo_is_not_read(plugin: object, tmp_path: Path) -> None:
    fifo = tmp_path / "cluster.provisioner.yml"
    os.mkfifo(fifo)
    assert plugin.verify_file(str(fifo)) is False  # type: ignore[attr-defined]  # returns at once, no open()


def test_the_plugin_names_itself_by_its_fqcn() -> None:
    mod = plugin_module()
    assert mod.InventoryModule.NAME == INVENTORY_PLUGIN == "provisioner.cluster.spec"
    assert "choices: [provisioner.cluster.spec]" in mod.DOCUMENTATION
