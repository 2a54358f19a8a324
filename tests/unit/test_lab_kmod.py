"""The simulated modprobe/lsmod/rmmod: kmod's formats and messages, state in modules.json."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.lab.nodetools import kmod_sim
from provisioner.lab.simtools import labstate

SCRIPT = Path(kmod_sim.__file__)
SIMTOOLS = Path(labstate.__file__).parent


def test_lsmod_layout_matches_kmod() -> None:
    text = kmod_sim.lsmod_text(["mlx5_ib", "mlx5_core", "ib_core"])
    lines = text.splitlines()
    assert lines[0] == "Module                  Size  Used by"
    assert lines[2] == "mlx5_core            2342912  1 mlx5_ib"
    assert lines[3] == "ib_core               462848  1 mlx5_ib"
    assert lines[1] == "mlx5_ib               458752  0"


def test_load_needs_a_module_file(tmp_path: Path) -> None:
    with pytest.raises(kmod_sim.Failure) as info:
        kmod_sim.load([], "nvidia_peermem", str(tmp_path))
    assert str(info.value) == f"modprobe: FATAL: Module nvidia_peermem not found in directory {tmp_path}"
    (tmp_path / "updates" / "dkms").mkdir(parents=True)
    (tmp_path / "updates" / "dkms" / "nvidia-peermem.ko").write_text("")
    (tmp_path / "updates" / "dkms" / "nvidia.ko.xz").write_text("")
    assert kmod_sim.load(["ib_core"], "nvidia-peermem", str(tmp_path)) == ["nvidia_peermem", "nvidia", "ib_core"]


def test_unload_messages() -> None:
    with pytest.raises(kmod_sim.Failure, match="rmmod: ERROR: Module x is not currently loaded"):
        kmod_sim.unload([], "x", "rmmod")
    with pytest.raises(kmod_sim.Failure, match="in use by: mlx5_ib"):
        kmod_sim.unload(["mlx5_ib", "ib_core"], "ib_core", "rmmod")
    assert kmod_sim.unload(["a"], "b", "modprobe") == ["a"]


def _run(tool: str, args: list[str], root: Path, modules: Path) -> subprocess.CompletedProcess[str]:
    link = root / tool
    if not link.exists():
        link.symlink_to(SCRIPT)
    env = {"PROVISIONER_LAB_ROOT": str(root), "PROVISIONER_LAB_HOST": "gpu01",
           "PROVISIONER_LAB_MODULES_DIR": str(modules), "PROVISIONER_LAB_LIB": str(SIMTOOLS), "PATH": "/usr/bin"}
    return subprocess.run([sys.executable, str(link), *args], capture_output=True, text=True, env=env, check=False)


def test_scripts_end_to_end(tmp_path: Path) -> None:
    modules = tmp_path / "lib-modules"
    modules.mkdir()
    labstate.save_modules(str(tmp_path), "gpu01", ["ib_core"])
    failed = _run("modprobe", ["nvidia_peermem"], tmp_path, modules)
    assert failed.returncode == 1
    assert failed.stderr == f"modprobe: FATAL: Module nvidia_peermem not found in directory {modules}\n"
    assert _run("modprobe", ["-q", "nvidia_peermem"], tmp_path, modules).stderr == ""
    (modules / "nvidia_peermem.ko").write_text("")
    assert _run("modprobe", ["nvidia_peermem"], tmp_path, modules).returncode == 0
    assert labstate.load_modules(str(tmp_path), "gpu01") == ["nvidia_peermem", "ib_core"]
    assert "nvidia_peermem" in _run("lsmod", [], tmp_path, modules).stdout
    assert _run("rmmod", ["nvidia_peermem"], tmp_path, modules).returncode == 0
    assert labstate.load_modules(str(tmp_path), "gpu01") == ["ib_core"]


def test_the_nodes_dmesg_prints_the_fault_injectors_xid_lines_beside_the_module_loaders(tmp_path: Path) -> None:
    """The lab layer's dmesg (this script, /usr/local/sbin, first on root's PATH) is the node's one kernel log: the
    module loader's lines and the Xid lines gpu_missing/ecc_error write to node.json's kernel_log, in time order.
    It printed only the loader's, so verify's xid check over SSH saw no Xid in the fault lab."""
    from provisioner.lab import faults
    from provisioner.lab.simtools import labkernel

    modules = tmp_path / "lib-modules"
    modules.mkdir()
    node = {"hostname": "gpu01", "gpus": [{"index": 0, "pci_bus_id": "00000000:18:00.0", "present": True}]}
    node["kernel_log"] = [{"t": 5.0, "msg": faults.xid_line(node["gpus"][0], 79)}]
    labstate.save_node(str(tmp_path), node)
    labkernel.append_dmesg(str(tmp_path), "gpu01", ["nvidia-peermem: loading out-of-tree module"])
    out = _run("dmesg", [], tmp_path, modules).stdout
    assert "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." in out, out
    assert "nvidia-peermem: loading out-of-tree module" in out and out.index("NVRM: Xid") < out.index("peermem"), out
