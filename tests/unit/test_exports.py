"""Exports for the tools around the cluster: LBNL NHC's nhc.conf and Slurm's topology.conf / gres.conf.

Golden files under tests/golden/exports/<example>/ (PROVISIONER_UPDATE_GOLDEN=1 refreshes them; read the diff).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main
from provisioner.errors import UsageError
from provisioner.export.slurm import export_gres, export_topology
from provisioner.fabric.nhc import export_nhc, nhc_targets
from provisioner.spec import load_cluster, load_text

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "exports"
CASES = {
    "lab": (ROOT / "examples/lab/cluster.yaml", ("nhc.conf", "topology.conf", "gres.conf")),
    "h100-ndr-64node-3tier": (ROOT / "examples/h100-ndr-64node-3tier.yaml", ("nhc.conf", "topology.conf")),
    "h100-ndr-8node": (ROOT / "examples/h100-ndr-8node.yaml", ("nhc.conf",)),
}


def _render(spec: Path, name: str) -> str:
    cluster, _ = load_cluster(spec)
    return {"nhc.conf": export_nhc, "topology.conf": export_topology, "gres.conf": export_gres}[name](cluster)


@pytest.mark.parametrize(("case", "name"), [(c, n) for c, (_, names) in CASES.items() for n in names])
def test_golden(case: str, name: str) -> None:
    spec, _ = CASES[case]
    text = _render(spec, name)
    path = GOLDEN / case / name
    if os.environ.get("PROVISIONER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{path} differs (PROVISIONER_UPDATE_GOLDEN=1 to refresh)"


# --- NHC ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("names", "targets"),
    [
        ([f"gpu{i:02d}" for i in range(1, 65)], ["{gpu[01-64]}"]),
        (["gpu03", "gpu07"], ["{gpu03,gpu07}"]),
        (["gpu01", "gpu02", "gpu03", "gpu07"], ["{gpu[01-03],gpu07}"]),  # NHC: no commas inside brackets
        (["gpu8", "gpu9", "gpu10", "gpu11"], ["{gpu[8-9],gpu[10-11]}"]),  # NHC: one width per range
        (["r1n01", "r1n02", "r2n01"], ["{r1n[01-02],r2n01}"]),  # NHC: one range per item
        (["login", "gpu1"], ["{gpu1}", "login"]),  # NHC: a range item needs a number; the bare name is a glob
    ],
)
def test_nhc_targets_follow_nhc_range_rules(names: list[str], targets: list[str]) -> None:
    assert nhc_targets(names) == targets


EXAMPLES = sorted([*(ROOT / "examples").glob("*.yaml"), ROOT / "examples/lab/cluster.yaml"])


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.name if p.parent.name == "examples" else "lab")
def test_nhc_names_each_mount_as_the_roles_mount_it(spec: Path) -> None:
    """NHC's check_fs_mount compares the source with /proc/mounts: it must be what the nfs_client role mounts
    (roles/nfs_client: what = server ~ ':' ~ export, from the rendered nfs_client_mounts) and the lustre_client
    role (What = mgs:.../fsname). The lab's mount is sm1's IPoIB address, which NHC named sm1 before: every client
    would have been marked down."""
    from provisioner.render import build_inventory

    cluster, _ = load_cluster(spec)
    hostvars = build_inventory(cluster).hostvars
    mounted = 0
    for node in cluster.nodes:
        role = {(m["path"], f"{m['server']}:{m['export']}") for m in hostvars[node.name].get("nfs_client_mounts", [])}
        role |= {(m["path"], f"{':'.join(m['mgs'])}:/{m['fsname']}")
                 for m in hostvars[node.name].get("lustre_client_mounts", [])}
        assert nhc_mounts(cluster, node) == role, node.name
        mounted += len(role)
    if spec.parent.name == "lab":
        assert mounted and ("/shared", "10.30.0.21:/export/shared") in nhc_mounts(cluster, cluster.node("gpu01"))


def nhc_mounts(cluster: Any, node: Any) -> set[tuple[str, str]]:
    """(mountpoint, source) of the node's check_fs_mount_rw lines."""
    from provisioner.fabric.nhc import node_checks

    found = (re.match(r'check_fs_mount_rw -t "[^"]+" -s "(?P<s>[^"]+)" -f "(?P<f>[^"]+)"', c)
             for c in node_checks(cluster, node))
    return {(m["f"], m["s"]) for m in found if m}


def test_nhc_conf_is_one_file_with_node_ranges_and_starts_nothing() -> None:
    conf = _render(ROOT / "examples/lab/cluster.yaml", "nhc.conf")
    checks = [line for line in conf.splitlines() if "||" in line]
    assert all(re.match(r"^ *(\{[^}]+\}|[a-z0-9-]+) \|\| check_", line) for line in checks), checks
    assert "{gpu[01-03],sm[1-2]} || check_hw_ib 400 mlx5_0:1" in checks
    assert "{gpu[01-03]} || check_cmd_output -t 30 -m '/^GPU 1:/' -e 'nvidia-smi -L'" in checks
    assert "{sm[1-2]} || check_ps_service -u root -d opensm opensmd" in checks  # NVIDIA's unit, opensm process
    assert not any(re.search(r" -[SrcsK]\b", line) for line in checks if "check_ps_service" in line)


def test_nhc_upstream_opensm_is_its_own_service() -> None:
    text = (ROOT / "examples/lab/cluster.yaml").read_text()
    text = text.replace("kind: opensm\n", "kind: opensm\n    build: upstream\n")
    res = load_text(text, "c.yaml")
    assert res.cluster is not None, [d.format() for d in res.errors]
    assert "{sm[1-2]} || check_ps_service -u root opensm\n" in export_nhc(res.cluster)


# --- Slurm ----------------------------------------------------------------------------------------------------
def test_topology_puts_each_node_under_one_leaf_and_never_mixes_nodes_and_switches() -> None:
    text = _render(ROOT / "examples/h100-ndr-64node-3tier.yaml", "topology.conf")
    lines = [line for line in text.splitlines() if line.startswith("SwitchName=")]
    assert all(("Nodes=" in line) != ("Switches=" in line) for line in lines)
    leaves = [line for line in lines if "Nodes=" in line]
    assert leaves == ["SwitchName=leaf01 Nodes=gpu[001-032]", "SwitchName=leaf09 Nodes=gpu[033-064]",
                      "SwitchName=svcleaf Nodes=ufm[1-2]"]
    assert "SwitchName=core1 Switches=spine[01-16]" in lines
    assert all(len(line) <= 1024 for line in text.splitlines())  # older slurm.conf parsers stop at 1024


def test_topology_without_cabling_says_what_is_missing() -> None:
    cluster, _ = load_cluster(ROOT / "examples/a100-10gbe-2node.yaml")
    assert not cluster.cables
    with pytest.raises(UsageError, match=r"fabric\.topology\.cabling"):
        export_topology(cluster)


def test_gres_explicit_and_autodetect() -> None:
    cluster, _ = load_cluster(ROOT / "examples/h100-ndr-8node.yaml")
    assert "NodeName=gpu[01-08] Name=gpu File=/dev/nvidia[0-7]\n" in export_gres(cluster)
    auto = export_gres(cluster, autodetect=True)
    assert "\nAutoDetect=nvml\n" in auto and "File=" not in auto


def test_cli_export_slurm_writes_both_files(tmp_path: Path) -> None:
    rc = main(["export", "slurm", str(ROOT / "examples/lab/cluster.yaml"), "--out", str(tmp_path / "slurm")])
    assert rc == 0
    assert (tmp_path / "slurm/topology.conf").read_text() == (GOLDEN / "lab/topology.conf").read_text()
    assert (tmp_path / "slurm/gres.conf").read_text() == (GOLDEN / "lab/gres.conf").read_text()


def test_cli_export_nhc_writes_one_file(tmp_path: Path) -> None:
    rc = main(["export", "nhc", str(ROOT / "examples/lab/cluster.yaml"), "--out", str(tmp_path / "nhc.conf")])
    assert rc == 0
    assert (tmp_path / "nhc.conf").read_text() == (GOLDEN / "lab/nhc.conf").read_text()
