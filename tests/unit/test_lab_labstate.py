"""labstate: sysfs rendering in the kernel's formats, atomic writes, stale-file removal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provisioner.lab.hardware import LabHca, LabNodeSpec, node_state
from provisioner.lab.simtools import labstate


def _node() -> dict[str, object]:
    spec = LabNodeSpec("gpu01", hcas=(LabHca("mlx5_0", gpu=0), LabHca("mlx5_1", rail=1, gpu=4, numa=1)))
    return node_state("c1", spec)


def test_guid_colon_form() -> None:
    assert labstate.guid_colon("0xa088c20300123456") == "a088:c203:0012:3456"
    assert labstate.gid_from_guid("0xa088c20300123456") == "fe80:0000:0000:0000:a088:c203:0012:3456"
    with pytest.raises(ValueError):
        labstate.guid_colon("0xnothex")


@pytest.mark.parametrize(
    ("gbps", "width", "speed", "text"),
    [(400, "4X", "NDR", "400 Gb/sec (4X NDR)"), (2.5, "1X", "SDR", "2.5 Gb/sec (1X SDR)"),
     (200, "2X", "NDR", "200 Gb/sec (2X NDR)")],
)
def test_rate_string(gbps: float, width: str, speed: str, text: str) -> None:
    assert labstate.rate_string(gbps, width, speed) == text


def test_rate_gbps_is_int_when_whole() -> None:
    assert labstate.rate_gbps("NDR", "2X") == 200
    assert isinstance(labstate.rate_gbps("NDR", "2X"), int)
    assert labstate.rate_gbps("SDR", "1X") == 2.5


def test_render_sysfs_has_what_ibstat_reads() -> None:
    files = labstate.render_sysfs(_node())
    port = "sys/class/infiniband/mlx5_0/ports/1/"
    assert files[port + "state"] == "2: INIT\n"
    assert files[port + "phys_state"] == "5: LinkUp\n"
    assert files[port + "rate"] == "400 Gb/sec (4X NDR)\n"
    assert files[port + "lid"] == "0x0\n"
    assert files[port + "pkeys/0"] == "0xffff\n"
    assert files[port + "gids/0"].startswith("fe80:0000:0000:0000:a088:c203:")
    assert files["sys/class/infiniband/mlx5_0/node_type"] == "1: CA\n"
    assert files["sys/class/infiniband/mlx5_0/hw_rev"] == "0\n"
    assert files["sys/class/infiniband_mad/abi_version"] == "5\n"
    assert files["sys/class/infiniband_mad/umad1/ibdev"] == "mlx5_1\n"
    assert files["sys/class/infiniband_mad/umad1/port"] == "1\n"


def test_render_orders_devices_like_the_kernel() -> None:
    node = _node()
    hcas = node["hcas"]
    assert isinstance(hcas, list)
    extra = dict(hcas[0], device="mlx5_10")
    node["hcas"] = [extra, *hcas]
    files = labstate.render_sysfs(node)
    assert files["sys/class/infiniband_mad/umad0/ibdev"] == "mlx5_0\n"
    assert files["sys/class/infiniband_mad/umad2/ibdev"] == "mlx5_10\n"


def test_render_rejects_unknown_state() -> None:
    node = _node()
    node["hcas"][0]["state"] = "sleepy"  # type: ignore[index]
    with pytest.raises(ValueError, match="port state"):
        labstate.render_sysfs(node)


def test_save_node_writes_tree_and_removes_stale(tmp_path: Path) -> None:
    root = str(tmp_path)
    node = _node()
    labstate.save_node(root, node)
    base = Path(labstate.sysfs_dir(root, "gpu01"))
    assert (base / "infiniband/mlx5_1/ports/1/state").read_text() == "2: INIT\n"
    assert labstate.load_node(root, "gpu01") == node
    inode = os.stat(base).st_ino
    node["hcas"] = node["hcas"][:1]  # type: ignore[index]
    labstate.save_node(root, node)
    assert not (base / "infiniband/mlx5_1").exists()
    assert not (base / "infiniband_mad/umad1").exists()
    assert os.stat(base).st_ino == inode  # the bind-mounted directory itself survives
    assert not [p for p in base.rglob(".*")]  # no temp files left behind


def test_modules_roundtrip_and_dedupe(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert labstate.load_modules(root, "gpu01") == []
    labstate.save_modules(root, "gpu01", ["nvidia", "ib_core", "nvidia"])
    assert labstate.load_modules(root, "gpu01") == ["nvidia", "ib_core"]


def test_fabric_roundtrip(tmp_path: Path) -> None:
    labstate.save_fabric(str(tmp_path), {"cluster": "c1", "nodes": {}})
    assert labstate.load_fabric(str(tmp_path))["cluster"] == "c1"


def test_node_dir_rejects_path_tricks() -> None:
    with pytest.raises(ValueError):
        labstate.node_dir("/run/lab", "../etc")
