"""Persistence mode in the lab: the stand-in nvidia-persistenced and what the simulated nvidia-smi reports.

The real daemon turns persistence mode on for every GPU unless started with --no-persistence-mode, which
Ubuntu's packaged unit passes, and turns it off when it stops (NVIDIA/nvidia-persistenced). The daemon runs
here for real (forking, PID file under a temp sysroot) and nvidia-smi reads its command line from /proc.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.lab.packages import VendorVersions, driver_recipes

REPO = Path(__file__).resolve().parents[2]
SMI = REPO / "provisioner/lab/simtools/nvidia-smi"
DAEMON = REPO / "provisioner/lab/packages/files/nvidia-persistenced"
PID_FILE = "var/run/nvidia-persistenced/nvidia-persistenced.pid"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Path]:
    node = {"hostname": "gpu01", "gpus": [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
         "uuid": f"GPU-{i}", "serial": f"{i}", "memory_mib": 81559, "numa_node": 0, "present": True}
        for i in range(2)], "hcas": []}
    (tmp_path / "root/nodes/gpu01").mkdir(parents=True)
    (tmp_path / "root/nodes/gpu01/node.json").write_text(json.dumps(node))
    lib = tmp_path / "sys/usr/lib/provisioner-lab"
    lib.mkdir(parents=True)
    (lib / "nvidia-driver.version").write_text(json.dumps({"version": "550.90.07", "cuda": "12.4", "flavor": "open"}))
    yield tmp_path
    pid_file = tmp_path / "sys" / PID_FILE
    if pid_file.is_file():  # never leave a daemon behind
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def _env(lab: Path) -> dict[str, str]:
    return {**os.environ, "PROVISIONER_LAB_ROOT": str(lab / "root"), "PROVISIONER_LAB_HOST": "gpu01",
            "PROVISIONER_LAB_SYSROOT": str(lab / "sys")}


def smi(lab: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, str(SMI), *args], capture_output=True, text=True, env=_env(lab),
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def daemon(lab: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DAEMON), *args], capture_output=True, text=True, env=_env(lab),
                          check=False, timeout=30)


def modes(lab: Path) -> tuple[list[str], list[str], list[str]]:
    """Persistence mode per GPU as -q, the --query-gpu field and the default table show it."""
    query_all = [line.split(":", 1)[1].strip() for line in smi(lab, "-q").splitlines()
                 if line.strip().startswith("Persistence Mode")]
    query = smi(lab, "--query-gpu=index,persistence_mode", "--format=csv,noheader").splitlines()
    table = [line[41 - 3:41].strip() for line in smi(lab).splitlines() if "NVIDIA H100" in line]
    return query_all, query, table


def test_no_daemon_means_persistence_mode_disabled(lab: Path) -> None:
    assert modes(lab) == (["Disabled", "Disabled"], ["0, Disabled", "1, Disabled"], ["Off", "Off"])
    assert "    Persistence Mode                : Disabled" in smi(lab, "-q").splitlines()


def test_ubuntus_flags_leave_it_disabled_and_the_default_enables_it(lab: Path) -> None:
    started = daemon(lab, "--no-persistence-mode", "--verbose")  # Ubuntu's ExecStart, minus --user
    assert started.returncode == 0, started.stderr  # Type=forking: the parent returns once the daemon is up
    pid = int((lab / "sys" / PID_FILE).read_text())
    assert Path(f"/proc/{pid}").exists() and pid != os.getpid()
    assert modes(lab) == (["Disabled", "Disabled"], ["0, Disabled", "1, Disabled"], ["Off", "Off"])
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if not (lab / "sys" / PID_FILE).exists():
            break
        time.sleep(0.05)
    assert not (lab / "sys" / PID_FILE).exists()  # the daemon removes its PID file when it stops
    assert daemon(lab, "--verbose").returncode == 0  # no flag: the daemon's default is ON
    assert modes(lab) == (["Enabled", "Enabled"], ["0, Enabled", "1, Enabled"], ["On", "On"])


def test_last_flag_wins_like_nvgetopt(lab: Path) -> None:
    assert daemon(lab, "--no-persistence-mode", "--persistence-mode").returncode == 0
    assert modes(lab)[0] == ["Enabled", "Enabled"]


def test_a_stale_pid_file_is_not_a_running_daemon(lab: Path) -> None:
    pid_file = lab / "sys" / PID_FILE
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(f"{os.getpid()}\n")  # a live process, but not nvidia-persistenced
    assert modes(lab)[0] == ["Disabled", "Disabled"]
    pid_file.write_text("999999999\n")
    assert modes(lab)[0] == ["Disabled", "Disabled"]


def test_unknown_user_fails_like_the_real_daemon(lab: Path) -> None:
    failed = daemon(lab, "--user", "no-such-user-here", "--persistence-mode")
    assert failed.returncode == 1
    assert "ERROR: Failed to find user ID of user 'no-such-user-here'" in failed.stderr
    assert not (lab / "sys" / PID_FILE).exists()


def test_packaged_unit_is_ubuntus_and_the_package_makes_the_user() -> None:
    recipe = next(r for r in driver_recipes(VendorVersions()) if r.name == "nvidia-compute-utils-550")
    unit = next(f.content.decode() for f in recipe.files if f.path.endswith("nvidia-persistenced.service"))
    assert "Type=forking\n" in unit
    assert "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose\n" in unit
    assert "ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n" in unit
    assert "useradd --system" in recipe.postinst and " nvidia-persistenced\n" in recipe.postinst
