"""Links and bandwidth checks for real: SSH with verified host keys into the lab's containers, Debian's real
ibstat over the simulated sysfs, the simulated ib_write_bw's TCP rendezvous between containers; healthy first,
then with injected faults that the checks must name.

Needs root, podman and the Debian mirror (the first run builds the lab image). Run: ``pytest -m lab tests/lab``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.lab import cluster as lab
from provisioner.lab import faults
from provisioner.lab.fromspec import lab_cables, lab_nodes, lab_switches
from provisioner.lab.host import ensure_containers_conf, podman
from provisioner.lab.names import container_name
from provisioner.lab.simtools import labstate
from provisioner.spec import Cluster, load_cluster
from provisioner.verify import verify

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

NAME = "labverify"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab" / "cluster.yaml"


def _swept(root: str, hosts: list[str]) -> None:
    """Stand in for the SM's sweep (the SM role is tested elsewhere): ports Active, LIDs set, SM LID 1."""
    lid = 1
    for host in hosts:
        node = labstate.load_node(root, host)
        for hca in node["hcas"]:
            lid += 1
            hca.update(state="active", lid=lid, sm_lid=1)
        labstate.save_node(root, node)


def _install_perftest(hosts: list[str]) -> None:
    """Stand in for the converge phase installing perftest: the simulated ib_write_bw at /usr/bin."""
    tool = Path(lab.__file__).resolve().parent / "simtools" / "ib_write_bw"
    for host in hosts:
        podman("cp", str(tool), f"{container_name(NAME, host)}:/usr/bin/ib_write_bw")


@pytest.fixture(scope="module")
def labc(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str]]:
    os.environ.setdefault("PROVISIONER_LAB_DIR", str(tmp_path_factory.mktemp("labdir")))
    ensure_containers_conf()
    spec = tmp_path_factory.mktemp("spec") / "cluster.yaml"
    spec.write_text(EXAMPLE.read_text().replace("cluster: {name: lab,", f"cluster: {{name: {NAME},"))
    base, _ = load_cluster(spec)
    request.addfinalizer(lambda: lab.lab_down(NAME))
    info = lab.lab_up(NAME, lab_nodes(base), lab_switches(base), lab_cables(base))
    root = str(info.state_dir)
    _swept(root, [n.name for n in base.nodes])
    _install_perftest([n.name for n in base.nodes])
    cluster, _ = load_cluster(spec, info.overlay)
    yield cluster, root


def test_healthy_lab_passes_links_and_bandwidth(labc: tuple[Cluster, str], tmp_path: Path) -> None:
    cluster, _ = labc
    run = verify(cluster, tests=["links", "bandwidth"], state_dir=tmp_path)
    assert run.exit_code == 0, [f"{f.location()}: {f.message}" for f in run.report.findings()]
    assert set(run.report.bandwidth) == {0, 1}
    assert all(g > 0.9 * 400 for cells in run.report.bandwidth.values() for g in cells.values())
    assert set(run.inventory) == {"gpu01", "gpu02", "gpu03", "sm1", "sm2"}
    assert (tmp_path / "verify" / "latest" / "report.html").is_file()


def test_slow_link_and_degraded_width_are_named(labc: tuple[Cluster, str], tmp_path: Path) -> None:
    cluster, root = labc
    faults.inject(root, "gpu02", "slow_link", device="mlx5_1", bw_factor=0.5)
    faults.inject(root, "gpu03", "degraded_width", device="mlx5_0", width="2X")
    try:
        run = verify(cluster, tests=["links", "bandwidth"], state_dir=tmp_path)
    finally:
        faults.clear(root, "gpu02")
        faults.clear(root, "gpu03")
    errors = [f for f in run.report.findings() if f.severity == "error"]
    assert run.exit_code == 1
    width = [f for f in errors if f.check == "links"]
    assert [(f.node, f.device) for f in width] == [("gpu03", "mlx5_0")]
    assert "width 2X, expected 4X" in width[0].message  # ibstatus gives the width
    bw = {(f.node, f.rail) for f in errors if f.check == "pairwise_bandwidth"}
    assert ("gpu02", 1) in bw and ("gpu03", 0) in bw


def test_dead_peer_is_a_finding_not_a_hang(labc: tuple[Cluster, str], tmp_path: Path) -> None:
    cluster, root = labc
    faults.inject(root, "gpu01", "unreachable", method="pause")
    try:
        run = verify(cluster, tests=["links"], state_dir=tmp_path)
    finally:
        faults.clear(root, "gpu01")
    assert [(c.name, c.node) for c in run.report.checks if not c.ran] == [("ssh", "gpu01")]
