"""``provision lab up --faults FILE`` and ``provision lab fault --file FILE`` on real containers.

Three GPU nodes of examples/lab/cluster.yaml (renamed to its own cluster, own PROVISIONER_LAB_DIR) are
brought up through the CLI with a fault list; the faults are then seen inside the containers with Debian's
real ``ibstat`` and the simulated ``ibnetdiscover``/``iblinkinfo`` (podman exec). The lab is always torn down.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _labspec import cluster_name  # type: ignore[import-not-found]

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

ROOT = Path(__file__).resolve().parents[2]
NAME = cluster_name("labfaults")
PROVISION = str(Path(sys.executable).parent / "provision")
FAULTS = """\
faults:
  - {node: gpu01, kind: port_down, device: mlx5_1}
  - {node: gpu02, kind: degraded_width, device: mlx5_0, width: 2X}
"""


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROVISION, *args], env=env, capture_output=True, text=True, timeout=600, check=False)


def _exec(host: str, *cmd: str) -> str:
    done = subprocess.run(["podman", "exec", f"plab-{NAME}-{host}", *cmd], capture_output=True, text=True,
                          timeout=60, check=False)
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    work = tmp_path_factory.mktemp("faultsfile")
    spec = work / "cluster.yaml"
    spec.write_text((ROOT / "examples/lab/cluster.yaml").read_text().replace("{name: lab,", f"{{name: {NAME},"))
    env = {**os.environ, "PROVISIONER_LAB_DIR": os.environ.get("PROVISIONER_LAB_DIR") or str(work / "labdir")}
    (work / "faults.yaml").write_text(FAULTS)
    try:
        up = _cli("lab", "up", str(spec), "--nodes", "3", "--faults", str(work / "faults.yaml"), env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "2 fault(s) injected" in up.stdout
        yield work, env
    finally:
        down = _cli("lab", "down", NAME, env=env)
        assert down.returncode == 0, down.stdout + down.stderr


def test_faults_from_the_file_show_in_real_ibstat(lab: tuple[Path, dict[str, str]]) -> None:
    gpu01 = _exec("gpu01", "ibstat", "mlx5_1")
    assert re.search(r"State: Down\s+Physical state: Polling", gpu01), gpu01
    gpu02 = _exec("gpu02", "ibstat", "mlx5_0")
    assert "Rate: 200" in gpu02, gpu02
    assert "Rate: 400" in _exec("gpu03", "ibstat", "mlx5_0")


def test_simulated_discovery_sees_the_faults_and_the_uplinks(lab: tuple[Path, dict[str, str]]) -> None:
    topo = _exec("gpu03", "ibnetdiscover")
    assert '# "gpu03 mlx5_0"' in topo and '"gpu01 mlx5_0"' in topo
    assert '"gpu01 mlx5_1"' not in topo  # its only port is down: ibnetdiscover cannot reach it
    assert re.search(r'"gpu02 mlx5_0" lid \d+ 2xNDR', topo), topo
    assert re.search(r'# "spine1" lid \d+ 4xNDR', topo), topo
    links = _exec("gpu03", "iblinkinfo")
    assert re.search(r'==\( 4X .*LinkUp\)==>\s+\d+\s+\d+\[  \] "spine1"', links), links


def test_fault_file_on_a_running_lab_is_checked_whole_first(lab: tuple[Path, dict[str, str]]) -> None:
    work, env = lab
    bad = work / "bad.yaml"
    bad.write_text("- {node: gpu03, kind: port_down, device: mlx5_0}\n- {node: gpu03, kind: port_dwn}\n")
    done = _cli("lab", "fault", NAME, "--file", str(bad), env=env)
    assert done.returncode == 2 and "faults[1] (line 2): unknown fault kind 'port_dwn'" in done.stderr
    assert "Traceback" not in done.stderr
    assert "Rate: 400" in _exec("gpu03", "ibstat", "mlx5_0") and "State: Down" not in _exec("gpu03", "ibstat", "mlx5_0")
    good = work / "good.yaml"
    good.write_text("- {node: gpu03, kind: port_disabled, device: mlx5_0}\n")
    done = _cli("lab", "fault", NAME, "--file", str(good), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"Physical state: Disabled", _exec("gpu03", "ibstat", "mlx5_0"))
