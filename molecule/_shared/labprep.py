"""Prepare the lab hardware and vendor repository of one molecule scenario, before its containers exist.

Molecule's podman driver bind-mounts host directories into the containers at ``create``; they must
exist by then.  Each scenario therefore runs this script as its ``dependency`` step (a shell
dependency, listed before ``create`` in every sequence).  It reads the scenario's ``lab.yml``::

    cluster: mol-driver              # lab cluster name (node.json "cluster")
    network: false                   # true: also make sure the lab's podman network exists
    ipoib_networks: []               # simulated IPoIB networks to create (provisioner/lab/ipoib.py); the
                                     #   scenario's destroy.yml removes them
    versions:                        # VendorVersions sets built into the repository;
      - {}                           #   the first is the pinned set (defaults = the lab's pins)
      - {driver: "550.127.05"}       #   the others are newer "drift" versions that pins must beat
    nodes:                           # LabNodeSpec per platform; hostname = platform name
      - hostname: mol-driver1
        gpu_count: 2
        hcas: [{device: mlx5_0, rail: 0, gpu: 0}]

and writes, under the scenario's ephemeral directory (``$MOLECULE_EPHEMERAL_DIRECTORY``):

- ``lab/``: node.json, modules.json, the sysfs tree per node and fabric.json (mounted at ``/run/lab``;
  ``lab/nodes/<host>/sys/class`` is mounted over ``/sys/class``);
- ``vendor-repo/``: the signed apt repository (mounted read-only at ``/run/lab/vendor-repo``); its
  keyring ``vendor-repo/lab-vendor.gpg`` is what the scenario's ``vendor_repos_*.key`` names.  The
  signing key's GNUPGHOME is a sibling (``.vendor-repo.gnupg``), never mounted into a node.

It also makes sure the node image exists (built once by the lab) and writes the project-local
``containers.conf`` podman needs on this host (``.lab/containers.conf``, named by CONTAINERS_CONF in
the scenario's ``ansible.env``).  Running it again changes nothing: the lab's writers leave
unchanged files alone and the repository is rebuilt only when its inputs change.

Usage: ``python molecule/_shared/labprep.py [lab.yml [ephemeral-dir]]`` (defaults from the molecule env).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import LabError, ProvisionerError
from provisioner.lab.hardware import LabHca, LabNodeSpec, write_lab_state
from provisioner.lab.packages import VendorVersions
from provisioner.lab.simtools import labstate
from provisioner.lab.vendor_repo import build_vendor_repo

PROJECT_DIR = Path(__file__).resolve().parents[2]
REPO_MOUNT = "vendor-repo"
"""Directory name of the repository, on the host and under /run/lab in the node."""


@dataclass(frozen=True)
class LabPlan:
    """What one scenario's lab.yml asks for."""

    cluster: str
    nodes: tuple[LabNodeSpec, ...]
    versions: tuple[VendorVersions, ...]
    network: bool = False
    ipoib_networks: tuple[str, ...] = ()


def _known_keys(cls: type[Any]) -> set[str]:
    return {f.name for f in fields(cls)}


def _check_keys(data: dict[str, Any], cls: type[Any], where: str) -> None:
    """Reject unknown keys: a typo in lab.yml must not silently fall back to a default."""
    unknown = sorted(set(data) - _known_keys(cls))
    if unknown:
        raise LabError(f"{where}: unknown key(s) {', '.join(unknown)}",
                       hint=f"allowed: {', '.join(sorted(_known_keys(cls)))}")


def parse_plan(data: Any, where: str = "lab.yml") -> LabPlan:
    """Turn lab.yml's data into a :class:`LabPlan` (pure; raises LabError on a malformed file)."""
    if not isinstance(data, dict):
        raise LabError(f"{where}: expected a mapping at the top")
    _check_keys(data, LabPlan, where)
    cluster = data.get("cluster")
    if not isinstance(cluster, str) or not cluster:
        raise LabError(f"{where}: 'cluster' must be a non-empty name")
    raw_nodes = data.get("nodes") or []
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise LabError(f"{where}: 'nodes' must list at least one node")
    nodes = []
    for i, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict):
            raise LabError(f"{where}: nodes[{i}] must be a mapping")
        _check_keys(raw, LabNodeSpec, f"{where}: nodes[{i}]")
        hcas = []
        for j, hca in enumerate(raw.get("hcas") or []):
            if not isinstance(hca, dict):
                raise LabError(f"{where}: nodes[{i}].hcas[{j}] must be a mapping")
            _check_keys(hca, LabHca, f"{where}: nodes[{i}].hcas[{j}]")
            hcas.append(LabHca(**hca))
        nodes.append(LabNodeSpec(**{**raw, "hcas": tuple(hcas)}))
    raw_versions = data.get("versions") or [{}]
    if not isinstance(raw_versions, list):
        raise LabError(f"{where}: 'versions' must be a list of version sets")
    versions = []
    for i, raw in enumerate(raw_versions):
        if not isinstance(raw, dict):
            raise LabError(f"{where}: versions[{i}] must be a mapping")
        _check_keys(raw, VendorVersions, f"{where}: versions[{i}]")
        # YAML reads 550.90 as a float: versions are strings (the switches, fabric_manager, kernel_packages and
        # containers, stay booleans).
        values: dict[str, Any] = {k: v if isinstance(v, bool) else str(v) for k, v in raw.items()}
        versions.append(VendorVersions(**values))
    hosts = [n.hostname for n in nodes]
    if len(set(hosts)) != len(hosts):
        raise LabError(f"{where}: a hostname is listed twice")
    ipoib_nets = data.get("ipoib_networks", [])
    if not isinstance(ipoib_nets, list) or not all(isinstance(n, str) and n.startswith("plab-") for n in ipoib_nets):
        raise LabError(f"{where}: 'ipoib_networks' must be a list of plab-... network names")
    return LabPlan(cluster, tuple(nodes), tuple(versions), bool(data.get("network", False)), tuple(ipoib_nets))


def load_plan(path: Path) -> LabPlan:
    """Read and parse a scenario's lab.yml."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LabError(f"cannot read {path}: {exc.strerror}") from exc
    return parse_plan(data, str(path))


def mount_sources(ephemeral: Path, host: str) -> dict[str, str]:
    """Container path -> host path of the bind mounts one node needs (what molecule.yml lists)."""
    lab = ephemeral / "lab"
    return {
        labstate.LAB_ROOT: str(lab),
        "/sys/class": str(lab / "nodes" / host / labstate.SYSFS_PREFIX),
        f"{labstate.LAB_ROOT}/{REPO_MOUNT}": str(ephemeral / REPO_MOUNT),
    }


def prepare(plan: LabPlan, ephemeral: Path, say: Any = print) -> None:
    """Write the simulated hardware and build the repository (no containers are touched)."""
    lab = ephemeral / "lab"
    lab.mkdir(parents=True, exist_ok=True)
    (lab / "sm").mkdir(exist_ok=True)
    (lab / REPO_MOUNT).mkdir(exist_ok=True)  # mount point of the nested repository mount
    changed = write_lab_state(str(lab), plan.cluster, list(plan.nodes))
    say(f"labprep: hardware of {len(plan.nodes)} node(s) ready ({len(changed)} written) in {lab}")
    info = build_vendor_repo(ephemeral / REPO_MOUNT, list(plan.versions), progress=None)
    say(f"labprep: vendor repo {info.path} ({len(info.packages)} packages), keyring {info.keyring_path}")


def prepare_host(plan: LabPlan, say: Any = print) -> None:
    """containers.conf, image and (when asked) network: what podman needs before molecule's create."""
    from provisioner.lab import image, network
    from provisioner.lab.host import ensure_containers_conf

    conf = ensure_containers_conf(PROJECT_DIR / ".lab")
    os.environ["CONTAINERS_CONF"] = str(conf)
    image.ensure_image(lambda m: say(f"labprep: {m}"))
    if plan.network:
        network.ensure_network()
    if plan.ipoib_networks:
        from provisioner.lab.host import podman
        from provisioner.lab.ipoib import create_args

        for name in plan.ipoib_networks:
            if podman("network", "exists", name, check=False).returncode != 0:
                podman(*create_args(name))
                say(f"labprep: simulated IPoIB network {name} created")


def main(argv: list[str]) -> int:
    """Entry point of the scenario's shell dependency."""
    scenario_dir = os.environ.get("MOLECULE_SCENARIO_DIRECTORY", ".")
    plan_file = Path(argv[1]) if len(argv) > 1 else Path(scenario_dir) / "lab.yml"
    eph = argv[2] if len(argv) > 2 else os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY")
    if not eph:
        print("labprep: MOLECULE_EPHEMERAL_DIRECTORY is not set and no directory was given", file=sys.stderr)
        return 2
    try:
        plan = load_plan(plan_file)
        prepare_host(plan)
        prepare(plan, Path(eph))
    except (ProvisionerError, ValueError) as exc:
        print(f"labprep: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
