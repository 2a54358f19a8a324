"""faults: live edits of node.json/fabric.json, recorded and exactly undone (podman calls recorded)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from provisioner.errors import LabError
from provisioner.lab import faults, hardware
from provisioner.lab.hardware import LabCable, LabHca, LabNodeSpec, LabSwitch
from provisioner.lab.simtools import labstate


def _spec(host: str) -> LabNodeSpec:
    return LabNodeSpec(host, hcas=(LabHca("mlx5_0", gpu=0), LabHca("mlx5_1", rail=1, gpu=4)))


@pytest.fixture
def lab(tmp_path: Path) -> str:
    root = str(tmp_path)
    switches = [LabSwitch("leaf0", 8), LabSwitch("leaf1", 8)]
    cables = [LabCable(h, f"mlx5_{r}", 1, f"leaf{r}", i) for i, h in enumerate(("gpu01", "gpu02"), 1)
              for r in (0, 1)]
    hardware.write_lab_state(root, "c1", [_spec("gpu01"), _spec("gpu02")], switches, cables)
    return root


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, args: list[str]) -> None:
        self.calls.append(args)


def _sysfs(root: str, host: str, rel: str) -> str:
    return (Path(labstate.sysfs_dir(root, host)) / rel).read_text()


def test_port_down_shows_in_sysfs_and_clears(lab: str) -> None:
    faults.inject(lab, "gpu01", "port_down", device="mlx5_0")
    assert _sysfs(lab, "gpu01", "infiniband/mlx5_0/ports/1/state") == "1: DOWN\n"
    assert _sysfs(lab, "gpu01", "infiniband/mlx5_0/ports/1/phys_state") == "2: Polling\n"
    assert faults.list_faults(lab, "gpu01") == [{"kind": "port_down", "device": "mlx5_0", "port": 1}]
    assert len(faults.clear(lab, "gpu01")) == 1
    assert _sysfs(lab, "gpu01", "infiniband/mlx5_0/ports/1/state") == "2: INIT\n"
    assert faults.list_faults(lab, "gpu01") == []


def test_port_disabled(lab: str) -> None:
    faults.inject(lab, "gpu01", "port_disabled", device="mlx5_1")
    assert _sysfs(lab, "gpu01", "infiniband/mlx5_1/ports/1/phys_state") == "3: Disabled\n"


def test_degraded_width_and_rate(lab: str) -> None:
    faults.inject(lab, "gpu02", "degraded_width", device="mlx5_1")
    assert _sysfs(lab, "gpu02", "infiniband/mlx5_1/ports/1/rate") == "200 Gb/sec (2X NDR)\n"
    faults.inject(lab, "gpu02", "degraded_rate", device="mlx5_0", speed="HDR")
    assert _sysfs(lab, "gpu02", "infiniband/mlx5_0/ports/1/rate") == "200 Gb/sec (4X HDR)\n"
    faults.clear(lab, "gpu02", "degraded_width")
    assert _sysfs(lab, "gpu02", "infiniband/mlx5_1/ports/1/rate") == "400 Gb/sec (4X NDR)\n"
    assert _sysfs(lab, "gpu02", "infiniband/mlx5_0/ports/1/rate") == "200 Gb/sec (4X HDR)\n"


def test_stacked_port_faults_restore_independently(lab: str) -> None:
    faults.inject(lab, "gpu01", "port_down", device="mlx5_0")
    faults.inject(lab, "gpu01", "slow_link", device="mlx5_0", bw_factor=0.25)
    faults.clear(lab, "gpu01", "port_down")
    hca = labstate.find_hca(labstate.load_node(lab, "gpu01"), "mlx5_0")
    assert (hca["state"], hca["bw_factor"]) == ("init", 0.25)


def test_slow_link_rejects_bad_factor(lab: str) -> None:
    with pytest.raises(LabError, match="bw_factor"):
        faults.inject(lab, "gpu01", "slow_link", device="mlx5_0", bw_factor=2)


def test_duplicate_and_unknown_faults_are_refused(lab: str) -> None:
    faults.inject(lab, "gpu01", "flapping", device="mlx5_0")
    with pytest.raises(LabError, match="already injected"):
        faults.inject(lab, "gpu01", "flapping", device="mlx5_0")
    with pytest.raises(LabError, match="unknown fault"):
        faults.inject(lab, "gpu01", "meteor")
    with pytest.raises(LabError, match="no HCA port mlx5_7/1"):
        faults.inject(lab, "gpu01", "port_down", device="mlx5_7")


def test_gpu_missing(lab: str) -> None:
    faults.inject(lab, "gpu01", "gpu_missing", index=3)
    node = labstate.load_node(lab, "gpu01")
    assert node["gpus"][3]["present"] is False
    # the kernel logs Xid 79 for the bus id of the lost GPU (domain:bus:device, no function)
    bus = node["gpus"][3]["pci_bus_id"].split(":")
    assert [e["msg"] for e in node["kernel_log"]] == [
        f"NVRM: Xid (PCI:{bus[0][-4:].lower()}:{bus[1].lower()}:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus."]
    faults.clear(lab, "gpu01", "gpu_missing")
    node = labstate.load_node(lab, "gpu01")
    assert node["gpus"][3]["present"] is True and node["kernel_log"] == []


def test_ecc_error_counts_and_logs_xid_48_and_clears_exactly(lab: str) -> None:
    faults.inject(lab, "gpu01", "ecc_error", **faults.check_params("ecc_error", {"index": "1", "count": "3"}))
    node = labstate.load_node(lab, "gpu01")
    assert node["gpus"][1]["ecc_uncorrected_volatile"] == 3
    assert len(node["kernel_log"]) == 1
    assert node["kernel_log"][0]["msg"].endswith("): 48, pid='<unknown>', name=<unknown>, DBE (Double Bit Error) "
                                                 "ECC Error")
    faults.clear(lab, "gpu01", "ecc_error")
    node = labstate.load_node(lab, "gpu01")
    assert node["gpus"][1]["ecc_uncorrected_volatile"] == 0 and node["kernel_log"] == []


def test_nccl_slow_sets_and_clears_the_factor(lab: str) -> None:
    faults.inject(lab, "gpu02", "nccl_slow", **faults.check_params("nccl_slow", {"factor": "0.6"}))
    assert labstate.load_node(lab, "gpu02")["nccl_factor"] == 0.6
    with pytest.raises(LabError, match="factor"):
        faults.inject(lab, "gpu01", "nccl_slow", factor=1.5)
    faults.clear(lab, "gpu02", "nccl_slow")
    assert "nccl_factor" not in labstate.load_node(lab, "gpu02")


def test_memlock_low_writes_a_limits_file_with_the_limit_as_an_argument_and_clear_removes_it(
        lab: str, tmp_path: Path) -> None:
    run = Recorder()
    faults.inject(lab, "gpu02", "memlock_low", runner=run, **faults.check_params("memlock_low", {"kib": "64"}))
    assert faults.list_faults(lab, "gpu02") == [{"kind": "memlock_low", "kib": 64}]
    (write,) = run.calls
    assert write[:4] == ["exec", "plab-c1-gpu02", "sh", "-c"] and write[5:] == ["sh", "64", faults.MEMLOCK_FAULT_FILE]
    assert "64" not in write[4], "the limit is an argument, never shell text"
    target = tmp_path / "99-memlock.conf"  # the same shell text, run here against a file of the test's
    subprocess.run(["sh", "-c", write[4], "sh", "64", str(target)], check=True)
    assert target.read_text() == "* soft memlock 64\n* hard memlock 64\n"  # limits.conf(5): domain type item value
    faults.clear(lab, "gpu02", "memlock_low", runner=run)
    assert run.calls[1] == ["exec", "plab-c1-gpu02", "rm", "-f", faults.MEMLOCK_FAULT_FILE]
    assert faults.list_faults(lab, "gpu02") == []
    with pytest.raises(LabError, match="kib"):
        faults.check_params("memlock_low", {"kib": "64; reboot"})
    with pytest.raises(LabError, match="at least 1"):
        faults.inject(lab, "gpu01", "memlock_low", runner=run, kib=0)


def test_peermem_missing_unloads_and_hides_module(lab: str) -> None:
    labstate.save_modules(lab, "gpu01", ["nvidia_peermem", "nvidia", "ib_core"])
    run = Recorder()
    faults.inject(lab, "gpu01", "peermem_missing", runner=run)
    assert labstate.load_modules(lab, "gpu01") == ["nvidia", "ib_core"]
    assert run.calls[0][:2] == ["exec", "plab-c1-gpu01"] and "nvidia_peermem.ko*" in run.calls[0][-1]
    faults.clear(lab, "gpu01", runner=run)
    assert ".lab-hidden" in run.calls[1][-1]


def test_unreachable_pauses_and_unpauses(lab: str) -> None:
    run = Recorder()
    faults.inject(lab, "gpu02", "unreachable", runner=run)
    assert labstate.load_node(lab, "gpu02")["reachable"] is False
    faults.clear(lab, "gpu02", runner=run)
    assert run.calls == [["pause", "plab-c1-gpu02"], ["unpause", "plab-c1-gpu02"]]
    assert labstate.load_node(lab, "gpu02")["reachable"] is True


def test_sm_killed_stops_the_unit(lab: str) -> None:
    run = Recorder()
    faults.inject(lab, "gpu01", "sm_killed", unit="opensm", runner=run)
    faults.clear(lab, "gpu01", runner=run)
    assert run.calls == [["exec", "plab-c1-gpu01", "systemctl", "stop", "opensm"],
                         ["exec", "plab-c1-gpu01", "systemctl", "start", "opensm"]]


def test_sm_killed_state_is_written_before_the_sm_stops(lab: str) -> None:
    """The standby sweeps every port as soon as the master is gone; a node.json read before the stop and saved
    after it would put the old SM LID back on the port (seen in the lab as one port "reporting SM LID 1")."""
    seen: list[object] = []

    def standby_sweeps(cmd: list[str]) -> None:
        seen.append([f["kind"] for f in labstate.load_node(lab, "gpu01")["faults"]])
        node = labstate.load_node(lab, "gpu01")
        node["hcas"][0]["sm_lid"] = 11  # what the new master writes the moment the old one stops
        labstate.save_node(lab, node)

    faults.inject(lab, "gpu01", "sm_killed", unit="opensm", runner=standby_sweeps)
    assert seen == [["sm_killed"]] and labstate.load_node(lab, "gpu01")["hcas"][0]["sm_lid"] == 11
    faults.clear(lab, "gpu01", runner=standby_sweeps)
    assert seen[-1] == [] and labstate.load_node(lab, "gpu01")["hcas"][0]["sm_lid"] == 11


def test_a_fault_whose_command_fails_is_not_recorded(lab: str) -> None:
    def broken(cmd: list[str]) -> None:
        raise LabError("podman exec: no such container")

    with pytest.raises(LabError, match="no such container"):
        faults.inject(lab, "gpu02", "unreachable", runner=broken)
    node = labstate.load_node(lab, "gpu02")
    assert node["faults"] == [] and node["reachable"] is True


def test_cables_swapped_edits_fabric_and_back(lab: str) -> None:
    faults.inject(lab, "gpu01", "cables_swapped", device="mlx5_0", other_host="gpu02", other_device="mlx5_0")
    cables = labstate.load_fabric(lab)["cables"]
    ends = {(c["node"], c["device"]): (c["switch"], c["switch_port"]) for c in cables}
    assert ends[("gpu01", "mlx5_0")] == ("leaf0", 2) and ends[("gpu02", "mlx5_0")] == ("leaf0", 1)
    faults.clear(lab, "gpu01")
    cables = labstate.load_fabric(lab)["cables"]
    ends = {(c["node"], c["device"]): (c["switch"], c["switch_port"]) for c in cables}
    assert ends[("gpu01", "mlx5_0")] == ("leaf0", 1)


def test_hardware_swap_new_guids_everywhere_and_new_host_keys(lab: str) -> None:
    old = labstate.load_node(lab, "gpu01")["hcas"][0]["node_guid"]
    run = Recorder()
    faults.inject(lab, "gpu01", "hardware_swap", runner=run)
    node = labstate.load_node(lab, "gpu01")
    new = node["hcas"][0]["node_guid"]
    assert new != old and node["generation"] == 1
    assert labstate.load_fabric(lab)["nodes"]["gpu01"]["hcas"][0]["node_guid"] == new
    assert _sysfs(lab, "gpu01", "infiniband/mlx5_0/node_guid") == labstate.guid_colon(new) + "\n"
    assert "ssh-keygen -A" in run.calls[0][-1]
    faults.clear(lab, "gpu01", runner=run)  # forgets the record, keeps the new board
    assert labstate.load_node(lab, "gpu01")["hcas"][0]["node_guid"] == new


def _pcie(lab: str, host: str):  # type: ignore[no-untyped-def]
    """The pcie check on ``host`` as verify runs it: the lab's lspci, nvidia-smi and ibdev2netdev -v."""
    import os
    import subprocess
    import sys

    from provisioner.fabric import pcie
    from provisioner.remote import Completed

    tools = Path(faults.__file__).resolve().parent / "simtools"
    sysroot = Path(lab) / "sysroot"  # the stand-in driver installed: nvidia-smi answers
    (sysroot / "usr/lib/provisioner-lab").mkdir(parents=True, exist_ok=True)
    (sysroot / "usr/lib/provisioner-lab/nvidia-driver.version").write_text('{"version": "550.90.07", "cuda": "12.4"}')
    labstate.save_modules(lab, host, sorted({*labstate.load_modules(lab, host), "nvidia"}))
    env = {**os.environ, "PROVISIONER_LAB_ROOT": lab, "PROVISIONER_LAB_HOST": host,
           "PROVISIONER_LAB_SYSROOT": str(sysroot)}

    def out(tool: str, *args: str) -> str:
        return subprocess.run([sys.executable, str(tools / tool), *args], capture_output=True, text=True, env=env,
                              check=True).stdout

    names = out("nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader") + out("ibdev2netdev", "-v")
    return pcie.check_node(host, Completed(0, out("lspci", "-D", "-nn", "-vvv") + pcie.NAMES_MARK + "\n" + names,
                                           ""))


def test_pcie_degraded_names_the_hca_and_clears(lab: str) -> None:
    assert _pcie(lab, "gpu02").passed  # every simulated link at x16 32GT/s, ACS only on the root ports
    faults.inject(lab, "gpu02", "pcie_degraded", **faults.check_params("pcie_degraded",
                                                                      {"device": "mlx5_1", "width": "8"}))
    (f,) = _pcie(lab, "gpu02").findings
    assert (f.node, f.device, f.expected, f.observed) == ("gpu02", "mlx5_1", "x16 32GT/s", "x8 32GT/s")
    assert _pcie(lab, "gpu01").passed
    faults.inject(lab, "gpu02", "pcie_degraded", device="gpu3", speed="16")
    assert {f.device for f in _pcie(lab, "gpu02").findings} == {"mlx5_1", "gpu3"}
    assert len(faults.clear(lab, "gpu02", "pcie_degraded")) == 2
    assert _pcie(lab, "gpu02").passed


def test_acs_enabled_names_the_switch_ports_and_clears(lab: str) -> None:
    faults.inject(lab, "gpu01", "acs_enabled")
    found = _pcie(lab, "gpu01").findings
    assert found and all(f.check == "pcie" and f.node == "gpu01" and "ACS redirect on" in f.message for f in found)
    assert {f.message.split(" between ")[1].split(" has ")[0] for f in found} == {"gpu0–mlx5_0", "gpu4–mlx5_1"}
    faults.clear(lab, "gpu01", "acs_enabled")
    assert _pcie(lab, "gpu01").passed and "pcie_acs" not in labstate.load_node(lab, "gpu01")


def _setpci(lab: str, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    tool = Path(faults.__file__).resolve().parent / "simtools" / "setpci"
    env = {**os.environ, "PROVISIONER_LAB_ROOT": lab, "PROVISIONER_LAB_HOST": host}
    return subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True, env=env, check=False)


def test_setpci_reads_and_writes_acs_control_where_lspci_shows_the_capability(lab: str) -> None:
    assert _setpci(lab, "gpu01", "-s", "0000:00:01.0", "ECAP_ACS+0x6.w").stdout == "001d\n"  # root port: redirect
    assert _setpci(lab, "gpu01", "-s", "16:00.0", "ECAP_ACS+0x6.w").stdout == "0000\n"  # switch port, healthy
    faults.inject(lab, "gpu01", "acs_enabled")
    assert _setpci(lab, "gpu01", "-s", "0000:16:00.0", "ECAP_ACS+0x6.w").stdout == "001d\n"
    gpu = _setpci(lab, "gpu01", "-s", "0000:18:00.0", "ECAP_ACS+0x6.w")  # the GPU endpoint: no ACS capability
    assert (gpu.returncode, gpu.stderr) == (1, "setpci: 0000:18:00.0: Instance #0 of Extended capability 000d not "
                                               "found - there are no capabilities with that id.\n")
    none = _setpci(lab, "gpu01", "-s", "0000:ff:1f.7", "ECAP_ACS+0x6.w=0000")
    assert (none.returncode, none.stderr) == (0, "setpci: Warning: No devices selected for operation group 1.\n")
    assert _setpci(lab, "gpu01", "-s", "0000:16:00.0", "CAP_EXP+0x10.w").returncode == 1  # not simulated
    assert _setpci(lab, "gpu01", "-D", "-s", "0000:16:00.0", "ECAP_ACS+0x6.w=0000").returncode == 0  # shows only
    assert _setpci(lab, "gpu01", "-s", "0000:16:00.0", "ECAP_ACS+0x6.w").stdout == "001d\n"


def test_the_nvidia_peermem_acs_script_clears_acs_enabled_until_the_next_boot(lab: str) -> None:
    """The role's script (pcie_acs_disable), run against the simulated lspci and setpci, clears what acs_enabled
    set, as verify's pcie check judges it; the fault again (a reboot: the switch's power-on default) brings it back,
    which is why the role runs it from a boot unit."""
    import os

    from tests.unit.test_peermem_acs_role import _render

    faults.inject(lab, "gpu01", "acs_enabled")
    assert not _pcie(lab, "gpu01").passed
    script = Path(lab) / "acs.sh"
    script.write_text(_render("pcie-acs-disable.sh.j2"))
    tools = Path(faults.__file__).resolve().parent / "simtools"
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "PROVISIONER_LAB_ROOT": lab,
           "PROVISIONER_LAB_HOST": "gpu01"}
    done = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert _pcie(lab, "gpu01").passed
    assert _setpci(lab, "gpu01", "-s", "0000:00:01.0", "ECAP_ACS+0x6.w").stdout == "0000\n"  # every ACS port
    faults.clear(lab, "gpu01", "acs_enabled")
    faults.inject(lab, "gpu01", "acs_enabled")
    assert not _pcie(lab, "gpu01").passed


@pytest.mark.parametrize(("params", "message"), [
    ({"device": "mlx5_1", "width": "3"}, "width='3' is not one of 1, 2, 4, 8, 16"),
    ({"width": "8"}, "pcie_degraded needs device"),
    ({"device": "mlx5_1", "speed": "64"}, "speed='64' is not one of"),
])
def test_pcie_degraded_params_are_checked(params: dict[str, str], message: str) -> None:
    with pytest.raises(LabError, match=message):
        faults.check_params("pcie_degraded", params)


def test_pcie_degraded_needs_a_device_the_node_has_and_a_width_or_speed(lab: str) -> None:
    with pytest.raises(LabError, match="has no GPU 9"):
        faults.inject(lab, "gpu01", "pcie_degraded", device="gpu9", width=8)
    with pytest.raises(LabError, match="has no HCA mlx5_7"):
        faults.inject(lab, "gpu01", "pcie_degraded", device="mlx5_7", width=8)
    with pytest.raises(LabError, match="width=<lanes> or speed"):
        faults.inject(lab, "gpu01", "pcie_degraded", device="mlx5_0")


def test_dcgm_fail_marks_the_gpu_for_the_simulated_dcgmi_and_clears_exactly(lab: str) -> None:
    faults.inject(lab, "gpu02", "dcgm_fail", **faults.check_params("dcgm_fail", {"gpu": "1"}))
    assert labstate.load_node(lab, "gpu02")["dcgm_fail"] == {"gpu": 1}
    with pytest.raises(LabError, match="already injected"):
        faults.inject(lab, "gpu02", "dcgm_fail", gpu=1)
    with pytest.raises(LabError, match="no GPU 9"):
        faults.inject(lab, "gpu01", "dcgm_fail", gpu=9)
    faults.clear(lab, "gpu02", "dcgm_fail")
    assert "dcgm_fail" not in labstate.load_node(lab, "gpu02")


def test_nvlink_down_takes_one_gpus_link_and_needs_the_gpu(lab: str) -> None:
    with pytest.raises(LabError, match="gpu="):
        faults.inject(lab, "gpu01", "nvlink_down")
    faults.inject(lab, "gpu01", "nvlink_down", **faults.check_params("nvlink_down", {"gpu": "3"}))
    faults.inject(lab, "gpu01", "nvlink_down", gpu=0)
    assert labstate.load_node(lab, "gpu01")["nvlink_down"] == [0, 3]
    faults.clear(lab, "gpu01", "nvlink_down")
    assert "nvlink_down" not in labstate.load_node(lab, "gpu01")
