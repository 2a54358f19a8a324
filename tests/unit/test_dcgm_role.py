"""The dcgm role (unit level; its molecule scenario is not written yet): the pin, the hold, nv-hostengine, and
which nodes the gpu_stack play gives it."""

from __future__ import annotations

from pathlib import Path

import jinja2
import yaml

from provisioner.render.model import build_inventory
from provisioner.spec import load_cluster

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "dcgm"


def _defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def test_the_package_is_pinned_with_the_cuda_repositorys_epoch_and_held() -> None:
    defaults = _defaults()
    version = jinja2.Template(defaults["dcgm_package_version"]).render(dcgm_version="3.3.9")
    assert (defaults["dcgm_package"], version) == ("datacenter-gpu-manager", "1:3.3.9")
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    install, hold, service = tasks
    assert install["ansible.builtin.apt"]["name"] == "{{ dcgm_package }}={{ dcgm_package_version }}"
    assert hold["ansible.builtin.dpkg_selections"] == {"name": "{{ dcgm_package }}", "selection": "hold"}
    assert service["ansible.builtin.systemd_service"] == {"name": "{{ dcgm_service }}", "enabled": True,
                                                          "state": "started"}
    assert defaults["dcgm_service"] == "nvidia-dcgm"


def test_every_default_is_a_documented_argument() -> None:
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(specs) == set(_defaults())


def test_gpu_stack_gives_it_to_gpu_nodes_where_the_spec_pins_dcgm() -> None:
    play = yaml.safe_load((ROOT / "playbooks" / "gpu_stack.yml").read_text())[0]
    (entry,) = [r for r in play["roles"] if isinstance(r, dict) and r.get("role") == "dcgm"]
    assert "groups.get('gpu_nodes', [])" in entry["when"] and "dcgm_version | default('', true)" in entry["when"]
    pinned, _ = load_cluster(ROOT / "examples" / "h100-ndr-8node.yaml")
    unpinned, _ = load_cluster(ROOT / "examples" / "a100-hdr-4node.yaml")
    assert build_inventory(pinned).groupvars["all"]["dcgm_version"] == "3.3.9"
    assert build_inventory(unpinned).groupvars["all"]["dcgm_version"] is None  # the role is skipped
