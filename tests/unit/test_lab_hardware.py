"""hardware: deterministic identities, speeds, cabling checks, idempotent state writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.lab import hardware
from provisioner.lab.hardware import LabCable, LabHca, LabNodeSpec, LabSwitch
from provisioner.lab.simtools import labstate

SPEC = LabNodeSpec("gpu01", hcas=(LabHca("mlx5_0", gpu=0), LabHca("mlx5_1", rail=1, gpu=4, numa=1)))


def test_guids_are_deterministic_and_depend_on_every_part() -> None:
    a = hardware.derive_guid("c1", "gpu01", "mlx5_0", 0)
    assert a == hardware.derive_guid("c1", "gpu01", "mlx5_0", 0)
    assert a.startswith("0xa088c20300") and len(a) == 18
    others = {hardware.derive_guid(*p) for p in
              [("c2", "gpu01", "mlx5_0", 0), ("c1", "gpu02", "mlx5_0", 0), ("c1", "gpu01", "mlx5_1", 0),
               ("c1", "gpu01", "mlx5_0", 1)]}
    assert a not in others and len(others) == 4


def test_node_state_is_reproducible() -> None:
    assert hardware.node_state("c1", SPEC) == hardware.node_state("c1", SPEC)


def test_node_state_fields() -> None:
    node = hardware.node_state("c1", SPEC)
    gpu0, hca1 = node["gpus"][0], node["hcas"][1]
    assert gpu0["pci_bus_id"] == "00000000:18:00.0" and gpu0["uuid"].startswith("GPU-")
    assert len(node["gpus"]) == 8 and node["gpus"][7]["numa_node"] == 1
    assert hca1["pci"] == "0000:99:00.0" and hca1["netdev"] == "ibp153s0"
    assert (hca1["state"], hca1["phys_state"], hca1["lid"]) == ("init", "linkup", 0)
    assert hca1["speed"] == "NDR" and hca1["ca_type"] == "MT4129"


def test_roce_ports_start_active() -> None:
    spec = LabNodeSpec("gpu01", hcas=(LabHca("mlx5_0", rate_gbps=200, link_layer="Ethernet"),))
    hca = hardware.node_state("c1", spec)["hcas"][0]
    assert hca["state"] == "active" and hca["netdev"].startswith("enp") and hca["speed"] == "HDR"


@pytest.mark.parametrize(("rate", "width", "speed"), [(400, "4X", "NDR"), (200, "4X", "HDR"),
                                                      (100, "4X", "EDR"), (56, "4X", "FDR"), (200, "2X", "NDR")])
def test_speed_for(rate: int, width: str, speed: str) -> None:
    assert hardware.speed_for(rate, width) == speed


def test_speed_for_rejects_impossible_rate() -> None:
    with pytest.raises(ValueError):
        hardware.speed_for(123, "4X")


def test_regenerate_identity_changes_guids_keeps_state() -> None:
    node = hardware.node_state("c1", SPEC)
    node["hcas"][0]["state"] = "active"
    before = [h["port_guid"] for h in node["hcas"]]
    hardware.regenerate_identity(node, 1, set())
    assert node["generation"] == 1
    assert all(a != b for a, b in zip(before, [h["port_guid"] for h in node["hcas"]], strict=True))
    assert node["hcas"][0]["state"] == "active"
    fresh = hardware.node_state("c1", SPEC, generation=1)
    assert [h["port_guid"] for h in node["hcas"]] == [h["port_guid"] for h in fresh["hcas"]]


def test_validate_cabling() -> None:
    switches = [LabSwitch("leaf0", 2)]
    good = [LabCable("gpu01", "mlx5_0", 1, "leaf0", 1)]
    assert hardware.validate_cabling([SPEC], switches, good) == []
    bad = [LabCable("gpu01", "mlx5_0", 1, "leaf0", 3), LabCable("gpu09", "mlx5_0", 1, "leaf0", 3),
           LabCable("gpu01", "mlx5_1", 1, "spine", 1)]
    problems = hardware.validate_cabling([SPEC], switches, bad)
    assert any("no port 3" in p for p in problems)
    assert any("unknown HCA port gpu09" in p for p in problems)
    assert any("cabled twice" in p for p in problems)
    assert any("unknown switch spine" in p for p in problems)


def test_write_lab_state_is_idempotent_and_keeps_faults(tmp_path: Path) -> None:
    root = str(tmp_path)
    switches, cables = [LabSwitch("leaf0", 8)], [LabCable("gpu01", "mlx5_0", 1, "leaf0", 1)]
    assert hardware.write_lab_state(root, "c1", [SPEC], switches, cables) == ["gpu01"]
    fabric = labstate.load_fabric(root)
    assert fabric["nodes"]["gpu01"]["hcas"][0]["port_guid"].startswith("0xa088c2")
    assert fabric["switches"][0]["guid"].startswith("0xa088c2")
    assert labstate.load_modules(root, "gpu01") == labstate.DEFAULT_MODULES
    node = labstate.load_node(root, "gpu01")
    node["faults"] = [{"kind": "flapping"}]
    labstate.save_node(root, node)
    fabric["sm"] = {"host": "gpu01"}
    labstate.save_fabric(root, fabric)
    mtime = (tmp_path / "fabric.json").stat().st_mtime_ns
    assert hardware.write_lab_state(root, "c1", [SPEC], switches, cables) == []
    assert labstate.load_node(root, "gpu01")["faults"] == [{"kind": "flapping"}]
    assert json.loads((tmp_path / "fabric.json").read_text())["sm"] == {"host": "gpu01"}
    assert (tmp_path / "fabric.json").stat().st_mtime_ns == mtime
