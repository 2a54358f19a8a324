"""The lab's simulated flint and mlxconfig (MFT), run on the host against a temporary lab.

Their query output goes through the same parsers (provisioner.hcafw) that hold real captures
(tests/unit/test_hcafw.py); a burn changes the flash, not the running firmware; a set changes only the next boot.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner import hcafw
from provisioner.lab.hardware import LabHca, LabNodeSpec, write_lab_state
from provisioner.lab.simtools import labstate

SIMTOOLS = Path(__file__).resolve().parents[2] / "provisioner" / "lab" / "simtools"
NDR_PSID, NDR_FW = "MT_0000000838", "28.39.1002"


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    node = LabNodeSpec("fw1", gpu_count=2, hcas=(LabHca("mlx5_0", rail=0, gpu=0, rate_gbps=400),
                                                 LabHca("mlx5_1", rail=1, gpu=1, rate_gbps=400)))
    write_lab_state(str(tmp_path), "fw", [node])
    return tmp_path


def run(lab: Path, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROVISIONER_LAB_ROOT": str(lab), "PROVISIONER_LAB_HOST": "fw1"}
    return subprocess.run([sys.executable, str(SIMTOOLS / tool), *args], capture_output=True, text=True, env=env,
                          check=False)


def image(tmp_path: Path, psid: str, version: str) -> str:
    path = tmp_path / f"fw-{psid}-{version}.bin"
    path.write_text(f"provisioner-lab-firmware\npsid={psid}\nversion={version}\n")
    return str(path)


def sysfs_fw(lab: Path, dev: str) -> str:
    return (Path(labstate.sysfs_dir(str(lab), "fw1")) / "infiniband" / dev / "fw_ver").read_text().strip()


def test_flint_query_reads_like_the_real_tool(lab: Path) -> None:
    out = run(lab, "flint", "-d", "mlx5_0", "q")
    assert out.returncode == 0, out.stderr
    assert hcafw.parse_flint_query(out.stdout) == {"psid": NDR_PSID, "fw_version": NDR_FW, "fw_running": NDR_FW}
    assert "FW Version(Running)" not in out.stdout


def test_a_burn_changes_the_flash_and_the_card_runs_the_old_image_until_a_reboot(lab: Path, tmp_path: Path) -> None:
    out = run(lab, "flint", "-d", "mlx5_0", "-i", image(tmp_path, NDR_PSID, "28.39.1050"), "-y", "burn")
    assert out.returncode == 0, out.stderr
    assert "Current FW version on flash:  28.39.1002" in out.stdout and "New FW version:               28.39.1050" in \
        out.stdout
    assert hcafw.parse_flint_query(run(lab, "flint", "-d", "mlx5_0", "q").stdout) == {
        "psid": NDR_PSID, "fw_version": "28.39.1050", "fw_running": NDR_FW}
    assert sysfs_fw(lab, "mlx5_0") == NDR_FW
    assert hcafw.parse_flint_query(run(lab, "flint", "-d", "mlx5_1", "q").stdout)["fw_version"] == NDR_FW


def test_flint_refuses_an_image_of_another_board_and_writes_nothing(lab: Path, tmp_path: Path) -> None:
    out = run(lab, "flint", "-d", "mlx5_0", "-i", image(tmp_path, "MT_0000000223", "20.39.1002"), "-y", "burn")
    assert out.returncode == 1 and "PSID mismatch" in out.stderr
    assert hcafw.parse_flint_query(run(lab, "flint", "-d", "mlx5_0", "q").stdout)["fw_version"] == NDR_FW


@pytest.mark.parametrize(("args", "err"), [
    (("-d", "mlx5_9", "q"), "Cannot open Device: mlx5_9"),
    (("-d", "mlx5_0", "-i", "/nonexistent", "burn"), "Cannot open"),
    (("-d", "mlx5_0", "burn"), "requires an image")])
def test_flint_errors_are_one_line_and_exit_1(lab: Path, args: tuple[str, ...], err: str) -> None:
    out = run(lab, "flint", *args)
    assert out.returncode == 1 and err in out.stderr and out.stderr.count("\n") == 1


def test_mlxconfig_starts_at_the_defaults_and_query_parses(lab: Path) -> None:
    out = run(lab, "mlxconfig", "-d", "mlx5_0", "query", "ATS_ENABLED", "PCI_WR_ORDERING", "LINK_TYPE_P1")
    assert out.returncode == 0, out.stderr
    assert hcafw.parse_mlxconfig_query(out.stdout) == {"ATS_ENABLED": "False(0)", "PCI_WR_ORDERING": "per_mkey(0)",
                                                       "LINK_TYPE_P1": "IB(1)"}


def test_mlxconfig_set_changes_the_next_boot_of_that_device_only(lab: Path) -> None:
    out = run(lab, "mlxconfig", "-y", "-d", "mlx5_0", "set", "ATS_ENABLED=1", "PCI_WR_ORDERING=force_relax")
    assert out.returncode == 0, out.stderr
    assert "Please reboot machine to load new configurations." in out.stdout
    queried = run(lab, "mlxconfig", "-d", "mlx5_0", "q", "ATS_ENABLED", "PCI_WR_ORDERING")
    got = hcafw.parse_mlxconfig_query(queried.stdout)
    assert got == {"ATS_ENABLED": "True(1)", "PCI_WR_ORDERING": "force_relax(1)"}
    assert all(hcafw.value_matches(got[k], "1") for k in got)
    other = hcafw.parse_mlxconfig_query(run(lab, "mlxconfig", "-d", "mlx5_1", "q", "ATS_ENABLED").stdout)
    assert other == {"ATS_ENABLED": "False(0)"}


@pytest.mark.parametrize("pair", ["NOT_A_PARAM=1", "ATS_ENABLED=7", "ATS_ENABLED=maybe"])
def test_mlxconfig_refuses_what_the_device_does_not_have(lab: Path, pair: str) -> None:
    out = run(lab, "mlxconfig", "-y", "-d", "mlx5_0", "set", pair)
    assert out.returncode == 1 and out.stderr.startswith("-E- ")
    assert hcafw.parse_mlxconfig_query(run(lab, "mlxconfig", "-d", "mlx5_0", "q", "ATS_ENABLED").stdout) == {
        "ATS_ENABLED": "False(0)"}


def test_the_manifest_gatherer_records_the_pinned_mlxconfig_values(lab: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "manifest_gather", Path(__file__).resolve().parents[2] / "roles" / "manifest" / "files" / "manifest_gather.py")
    assert spec is not None and spec.loader is not None
    gather = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gather)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mlxconfig").symlink_to(SIMTOOLS / "mlxconfig")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("PROVISIONER_LAB_ROOT", str(lab))
    monkeypatch.setenv("PROVISIONER_LAB_HOST", "fw1")
    assert run(lab, "mlxconfig", "-y", "-d", "mlx5_1", "set", "ATS_ENABLED=True").returncode == 0
    assert gather.mlxconfig("mlx5_1", ["ATS_ENABLED", "PCI_WR_ORDERING"]) == {
        "ATS_ENABLED": "True(1)", "PCI_WR_ORDERING": "per_mkey(0)"}
    assert gather.mlxconfig("mlx5_1", []) is None            # nothing pinned: mlxconfig is not run
    assert gather.mlxconfig("mlx5_9", ["ATS_ENABLED"]) is None  # a failing query records nothing
