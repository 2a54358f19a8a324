"""The molecule scaffolding and the roles' interfaces, checked without containers (fast).

The scenarios themselves run with ``scripts/molecule-all`` (root, podman); these tests catch the
mistakes that would only show there: a platform missing from lab.yml, a mount that does not match
what labprep writes, a role variable that the rendered inventory spells differently.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from provisioner.errors import LabError
from provisioner.spec.catalog import GPU_MODELS

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent for p in (ROOT / "molecule").glob("*/molecule.yml") if not p.parent.name.startswith("_"))
MY_SCENARIOS = ["cuda", "nvidia_driver", "preflight", "vendor_repos"]


def _labprep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("labprep", ROOT / "molecule/_shared/labprep.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["labprep"] = module
    spec.loader.exec_module(module)
    return module


labprep = _labprep()


class _Loader(yaml.SafeLoader):
    """Reads rendered inventory files too (their strings carry Ansible's !unsafe tag)."""


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def _yaml(path: Path) -> Any:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)


def _config(scenario: Path) -> dict[str, Any]:
    """The scenario's molecule.yml merged over the shared base (.config/molecule/config.yml) as molecule merges."""
    from molecule.util import merge_dicts

    return dict(merge_dicts(_yaml(ROOT / ".config/molecule/config.yml"), _yaml(scenario / "molecule.yml")))


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_scenarios_keep_only_what_is_theirs(scenario: Path) -> None:
    """The shared settings live in the base once: a scenario that repeats one has become a near-copy again."""
    base, own = _yaml(ROOT / ".config/molecule/config.yml"), _yaml(scenario / "molecule.yml")
    assert set(own) <= {"platforms", "provisioner", "scenario"}, sorted(set(own) - {"platforms", "provisioner"})
    assert set(own.get("scenario", {})) <= {"test_sequence"}
    assert set(own.get("provisioner", {})) <= {"inventory"}
    assert base["driver"]["name"] == "podman" and base["dependency"]["name"] == "shell"
    assert _config(scenario)["ansible"]["cfg"]["defaults"]["connection_plugins"].endswith(
        "molecule/_shared/connection_plugins")


def test_my_scenarios_exist() -> None:
    assert {s.name for s in SCENARIOS} >= set(MY_SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_every_platform_is_a_lab_node_with_its_mounts(scenario: Path) -> None:
    plan = labprep.load_plan(scenario / "lab.yml")
    molecule = _config(scenario)
    hosts = {n.hostname for n in plan.nodes}
    eph = Path("${MOLECULE_EPHEMERAL_DIRECTORY}")
    for platform in molecule["platforms"]:
        assert platform["name"] in hosts, f"{platform['name']} is not a node of {scenario.name}/lab.yml"
        wanted = {f"{src}:{dest}" for dest, src in labprep.mount_sources(eph, platform["name"]).items()}
        mounted = {v.rsplit(":", 1)[0] for v in platform.get("volumes", [])}
        assert wanted <= mounted, f"{platform['name']} lacks {sorted(wanted - mounted)}"
        assert platform["systemd"] == "always" and platform["command"] == "/sbin/init"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.name)
def test_sequences_run_labprep_after_destroy_and_before_create(scenario: Path) -> None:
    seq = _config(scenario)["scenario"]
    for name in ("test_sequence", "converge_sequence", "create_sequence", "check_sequence"):
        steps = seq[name]
        dep, create = steps.index("dependency"), steps.index("create")
        assert dep < create, name
        # destroy prunes $EPH: between labprep (dependency) and create it would remove what the platforms mount
        assert "destroy" not in steps[dep:create], name
    # scripts/molecule-all destroys a scenario's leftovers before `molecule test`, which then needs no destroy
    # first; it must still end with one, or its containers stay behind
    assert seq["test_sequence"][-1] == "destroy"


def test_parse_plan_rejects_typos_and_duplicates() -> None:
    node = {"hostname": "n1", "gpu_count": 1}
    with pytest.raises(LabError, match="unknown key"):
        labprep.parse_plan({"cluster": "c", "nodes": [{**node, "gpus": 2}]})
    with pytest.raises(LabError, match="listed twice"):
        labprep.parse_plan({"cluster": "c", "nodes": [node, node]})
    with pytest.raises(LabError, match="unknown key"):
        labprep.parse_plan({"cluster": "c", "nodes": [node], "versions": [{"drivr": "550.90.07"}]})


def test_parse_plan_keeps_versions_as_strings() -> None:
    plan = labprep.parse_plan({"cluster": "c", "nodes": [{"hostname": "n1"}],
                               "versions": [{}, {"driver": "550.127.05", "fabric_manager": False}]})
    assert plan.versions[1].driver == "550.127.05"
    assert plan.versions[1].fabric_manager is False
    assert plan.versions[0].driver == "550.90.07"



def test_parse_plan_keeps_switches_as_booleans() -> None:
    """kernel_packages and containers switch recipe sets on: "False" as a string would switch them on too."""
    plan = labprep.parse_plan({"cluster": "c", "nodes": [{"hostname": "n1"}],
                               "versions": [{"kernel_packages": False, "containers": True, "enroot": 3.5}]})
    assert plan.versions[0].kernel_packages is False and plan.versions[0].containers is True
    assert plan.versions[0].enroot == "3.5"


def test_prepare_writes_hardware_and_a_signed_repo(tmp_path: Path) -> None:
    plan = labprep.parse_plan({"cluster": "c", "nodes": [
        {"hostname": "n1", "gpu_count": 1, "hcas": [{"device": "mlx5_0"}]}]})
    said: list[str] = []
    labprep.prepare(plan, tmp_path, said.append)
    assert (tmp_path / "lab/nodes/n1/node.json").is_file()
    assert (tmp_path / "lab/nodes/n1/sys/class/infiniband/mlx5_0/ports/1/state").is_file()
    assert (tmp_path / "vendor-repo/lab-vendor.gpg").stat().st_size > 0
    assert (tmp_path / "vendor-repo/dists/bookworm/InRelease").is_file()
    assert not list((tmp_path / "lab").glob("**/*.gnupg")), "the signing key must not be under the mounted lab dir"
    assert len(said) == 2


def test_preflight_gpu_names_follow_the_catalog() -> None:
    names = _yaml(ROOT / "roles/preflight/vars/main.yml")["preflight_gpu_smi_names"]
    assert names == {key: model.smi_name for key, model in GPU_MODELS.items()}


ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())
SPECS = [*sorted((ROOT / "examples").glob("*.yaml")), ROOT / "examples/lab/cluster.yaml",
         ROOT / "tests/lab/slurm_cluster.yaml"]


@functools.cache
def _rendered_names() -> frozenset[str]:
    """Every variable name the inventory gives any host, over every example spec and the lab's Slurm spec."""
    from provisioner.render.model import build_inventory
    from provisioner.spec import load_cluster

    names: set[str] = set()
    for spec in SPECS:
        inv = build_inventory(load_cluster(spec)[0])
        for variables in [*inv.groupvars.values(), *inv.hostvars.values()]:
            names |= set(variables)
    return frozenset(names)


def _role_text(role: str) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "roles" / role).rglob("*"))
                   if p.is_file() and p.suffix in (".yml", ".yaml", ".j2", ".py", ".sh")
                   and p.relative_to(ROOT / "roles" / role).parts[0] != "meta")


def test_every_role_is_covered_and_the_inventory_is_read() -> None:
    """The role list is the roles directory (a new role is covered without editing this file)."""
    assert {"vendor_repos", "doca_ofed", "opensm", "slurm", "roce_qos", "dcgm", "host_tuning"} <= set(ROLES)
    names = _rendered_names()
    assert {"nvidia_driver_version", "slurm_controller", "roce_qos_dscp", "opensm_priority"} <= names


@pytest.mark.parametrize("role", ROLES)
def test_role_options_use_the_rendered_inventory_names(role: str) -> None:
    """Every rendered variable a role reads is declared in its argument spec under the same name, and every
    default of the role is a declared, prefixed option (its meta/argument_specs.yml is the role's interface)."""
    options = set(_yaml(ROOT / f"roles/{role}/meta/argument_specs.yml")["argument_specs"]["main"]["options"] or {})
    text = _role_text(role)
    extra = {"preflight": {"provisioner_os", "provisioner_expected_ports"}}.get(role, set())
    wanted = {name for name in _rendered_names() if name.startswith(f"{role}_") or name in extra}
    read = {name for name in wanted if re.search(rf"\b{name}\b", text)}
    assert read <= options, f"{role} reads but does not declare {sorted(read - options)}"
    defaults_file = ROOT / f"roles/{role}/defaults/main.yml"
    defaults = set((_yaml(defaults_file) or {}) if defaults_file.is_file() else {})
    assert all(name.startswith(f"{role}_") for name in defaults), f"unprefixed default in {role}"
    assert defaults <= options, f"{role} has defaults its argument spec does not declare: {sorted(defaults - options)}"
