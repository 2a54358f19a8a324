"""doca_ofed's tasks/firmware_pins.yml, run by ansible-playbook on localhost against the lab's simulated flint and
mlxconfig (a temporary lab; molecule doca_ofed runs the same tasks in containers): --check writes nothing, a run
flashes and sets only what differs, a second run changes nothing, a value changed by hand is set back, and a
missing image or an unpinned board stops before any flash with one line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner import hcafw
from provisioner.lab.hardware import LabHca, LabNodeSpec, write_lab_state

REPO = Path(__file__).resolve().parents[2]
SIMTOOLS = REPO / "provisioner" / "lab" / "simtools"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
PINS = {"MT_0000000838": {"version": "28.39.1050", "image": "fw-28_39_1050.bin"}}
SETTINGS = {"ATS_ENABLED": "1", "ADVANCED_PCI_SETTINGS": "true", "PCI_WR_ORDERING": "force_relax"}


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    write_lab_state(str(tmp_path / "lab"), "fw", [LabNodeSpec("fw1", gpu_count=2, hcas=(
        LabHca("mlx5_0", rail=0, gpu=0, rate_gbps=400), LabHca("mlx5_1", rail=1, gpu=1, rate_gbps=400)))])
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "fw-28_39_1050.bin").write_text(
        "provisioner-lab-firmware\npsid=MT_0000000838\nversion=28.39.1050\n")
    return tmp_path


def tool(lab: Path, name: str, *args: str) -> str:
    env = {**os.environ, "PROVISIONER_LAB_ROOT": str(lab / "lab"), "PROVISIONER_LAB_HOST": "fw1"}
    return subprocess.run([sys.executable, str(SIMTOOLS / name), *args], capture_output=True, text=True, env=env,
                          check=True).stdout


def converge(lab: Path, *extra: str, pins: dict[str, Any] | None = None, tasks: str = "firmware_pins",
             role: str = "doca_ofed") -> tuple[int, list[dict[str, Any]]]:
    """rc and the task results of one run of ``role``'s ``tasks`` file on localhost."""
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [
        {"ansible.builtin.include_role": {"name": role, "tasks_from": tasks}}]}]
    (lab / "play.yml").write_text(yaml.safe_dump(play))
    variables = {"ansible_python_interpreter": sys.executable, "doca_ofed_fw_tools_package": "",
                 "doca_ofed_flint": str(SIMTOOLS / "flint"), "doca_ofed_mlxconfig": str(SIMTOOLS / "mlxconfig"),
                 "doca_ofed_sysfs_ib": str(lab / "lab/nodes/fw1/sys/class/infiniband"),
                 "doca_ofed_firmware_mirror": str(lab / "mirror"), "doca_ofed_firmware_pins": pins or PINS,
                 "doca_ofed_mlxconfig_settings": SETTINGS, "preflight_firmware_pins": pins or PINS,
                 "preflight_firmware_mirror": str(lab / "mirror"),
                 "preflight_sysfs_ib": str(lab / "lab/nodes/fw1/sys/class/infiniband")}
    (lab / "vars.json").write_text(json.dumps(variables))
    (lab / "ansible.cfg").write_text(f"[defaults]\nroles_path = {REPO / 'roles'}\n")
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "ANSIBLE_CONFIG": str(lab / "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(lab / "tmp"), "ANSIBLE_HOME": str(lab / "home"),
           "PROVISIONER_LAB_ROOT": str(lab / "lab"), "PROVISIONER_LAB_HOST": "fw1"}
    done = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", str(lab / "play.yml"), "-e",
                           f"@{lab / 'vars.json'}", *extra], capture_output=True, text=True, env=env, cwd=lab,
                          check=False)
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    return done.returncode, [{"name": t["task"]["name"].removeprefix(f"{role} : "), **t["hosts"]["localhost"]}
                             for t in tasks]


def changed(results: list[dict[str, Any]]) -> list[str]:
    return [r["name"] for r in results if r.get("changed")]


def flash(lab: Path, dev: str) -> dict[str, str]:
    return hcafw.parse_flint_query(tool(lab, "flint", "-d", dev, "query"))


def next_boot(lab: Path, dev: str) -> dict[str, str]:
    return hcafw.parse_mlxconfig_query(tool(lab, "mlxconfig", "-d", dev, "query", *sorted(SETTINGS)))


def test_check_writes_nothing_a_run_flashes_and_sets_the_next_changes_nothing_and_drift_is_set_back(lab: Path) -> None:
    rc, results = converge(lab, "--check")
    assert rc == 0 and changed(results) == []
    assert flash(lab, "mlx5_0")["fw_version"] == "28.39.1002"
    assert next_boot(lab, "mlx5_0")["ATS_ENABLED"] == "False(0)"

    rc, results = converge(lab)
    assert rc == 0
    assert changed(results) == ["Flash the pinned firmware where the flash holds another version",
                                "Set the mlxconfig parameters that differ (next boot)"]
    for dev in ("mlx5_0", "mlx5_1"):
        assert flash(lab, dev) == {"psid": "MT_0000000838", "fw_version": "28.39.1050", "fw_running": "28.39.1002"}
        assert next_boot(lab, dev) == {"ADVANCED_PCI_SETTINGS": "True(1)", "ATS_ENABLED": "True(1)",
                                       "PCI_WR_ORDERING": "force_relax(1)"}

    rc, results = converge(lab)
    assert rc == 0 and changed(results) == []

    # drift: a value changed by hand is set back, alone
    tool(lab, "mlxconfig", "-y", "-d", "mlx5_1", "set", "PCI_WR_ORDERING=0")
    rc, results = converge(lab)
    sets = next(r for r in results if r["name"] == "Set the mlxconfig parameters that differ (next boot)")
    assert rc == 0 and [i["cmd"][3:] for i in sets["results"] if i.get("changed")] == [
        ["mlx5_1", "set", "PCI_WR_ORDERING=force_relax"]]
    assert changed(results) == ["Set the mlxconfig parameters that differ (next boot)"]


@pytest.mark.parametrize(("pins", "message"), [
    ({"MT_0000000838": {"version": "28.39.2000", "image": "fw-absent.bin"}},
     "localhost: firmware image fw-absent.bin is missing from the mirror {mirror} (nothing was flashed)"),
    ({"MT_0000000223": {"version": "20.39.1002", "image": "fw-28_39_1050.bin"}},
     "localhost: no firmware pin for mlx5_0 PSID MT_0000000838, mlx5_1 PSID MT_0000000838: add it to "
     "software.hca_firmware.pins (nothing was flashed)")])
@pytest.mark.parametrize("role", ["preflight", "doca_ofed"])
def test_a_missing_image_or_an_unpinned_board_stops_before_any_flash(lab: Path, pins: dict[str, Any],
                                                                     message: str, role: str) -> None:
    # preflight stops the run before any phase; the ofed phase checks again right before it flashes
    rc, results = converge(lab, pins=pins, role=role, tasks="firmware" if role == "preflight" else "firmware_pins")
    assert rc == 2
    assert [r["msg"] for r in results if r.get("failed")] == [message.format(mirror=lab / "mirror")]
    assert changed(results) == [] and flash(lab, "mlx5_0")["fw_version"] == "28.39.1002"


def test_preflight_passes_when_every_board_has_its_image(lab: Path) -> None:
    rc, results = converge(lab, role="preflight", tasks="firmware")
    assert rc == 0 and changed(results) == [] and not [r for r in results if r.get("failed")]


def test_link_types_are_set_where_they_differ_and_then_left_alone(lab: Path) -> None:
    # tasks/link_types.yml (VPI port types) had no run before the lab had mlxconfig: its '\1' was chr(1) in Jinja
    link = ["-e", '{"doca_ofed_link_types": [{"device": "mlx5_0", "port": 1, "type": "ETH"},'
                  ' {"device": "mlx5_1", "port": 1, "type": "IB"}]}']
    rc, results = converge(lab, *link, tasks="link_types")
    assert rc == 0, [r.get("msg") for r in results if r.get("failed")]
    sets = next(r for r in results if r["name"] == "Set the link types that differ")
    assert [i["cmd"][3:] for i in sets["results"] if i.get("changed")] == [["mlx5_0", "set", "LINK_TYPE_P1=2"]]
    link_types = hcafw.parse_mlxconfig_query(tool(lab, "mlxconfig", "-d", "mlx5_0", "query", "LINK_TYPE_P1"))
    assert link_types == {"LINK_TYPE_P1": "ETH(2)"}
    rc, results = converge(lab, *link, tasks="link_types")
    assert rc == 0 and changed(results) == []
