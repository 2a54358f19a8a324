"""Fault lists (`lab up --faults FILE`, `lab fault --file FILE`): checked as a whole, then applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import LabError, UsageError
from provisioner.lab import faults, hardware
from provisioner.lab.hardware import LabCable, LabHca, LabNodeSpec, LabSwitch
from provisioner.lab.simtools import labstate

DEVICES = {"gpu01": {"mlx5_0", "mlx5_1"}, "gpu02": {"mlx5_0", "mlx5_1"}}
NODES = [LabNodeSpec(h, gpu_count=2, hcas=(LabHca("mlx5_0", rail=0, gpu=0), LabHca("mlx5_1", rail=1, gpu=1)))
         for h in ("gpu01", "gpu02")]


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "faults.yaml"
    path.write_text(text)
    return path


GOOD = """\
faults:
  - {node: gpu01, kind: port_down, device: mlx5_1}
  - node: gpu02
    kind: slow_link
    device: mlx5_0
    bw_factor: 0.25
  - {node: gpu02, kind: peermem_missing}
"""


def test_a_good_list_loads_with_typed_params_and_lines(tmp_path: Path) -> None:
    entries = faults.load_fault_list(_file(tmp_path, GOOD), DEVICES)
    assert [(e.node, e.kind, e.params) for e in entries] == [
        ("gpu01", "port_down", {"device": "mlx5_1"}),
        ("gpu02", "slow_link", {"device": "mlx5_0", "bw_factor": 0.25}),
        ("gpu02", "peermem_missing", {}),
    ]
    assert entries[1].where.endswith("faults.yaml: faults[1] (line 3)")
    bare = faults.load_fault_list(_file(tmp_path, "- {node: gpu01, kind: hardware_swap}\n"), DEVICES)
    assert [e.kind for e in bare] == ["hardware_swap"]


@pytest.mark.parametrize(("text", "message"), [
    ("faults:\n  - {node: gpu01, kind: port_dwn, device: mlx5_0}\n",
     "faults[0] (line 2): unknown fault kind 'port_dwn'"),
    ("faults:\n  - {node: gpu01, kind: flapping, device: mlx5_0}\n  - {node: gpu09, kind: port_down, device: mlx5_0}\n",
     "faults[1] (line 3): unknown node 'gpu09'"),
    ("- {node: gpu01, kind: slow_link, device: mlx5_0, factor: 0.5}\n",
     "faults[0] (line 1): slow_link takes no parameter 'factor'"),
    ("- {node: gpu01, kind: slow_link, device: mlx5_0, bw_factor: 2}\n",
     "slow_link parameter bw_factor=2 is not a number in (0, 1]"),
    ("- {node: gpu01, kind: degraded_width, device: mlx5_0, width: 3X}\n",
     "degraded_width parameter width='3X' is not one of"),
    ("- {node: gpu01, kind: port_down}\n", "faults[0] (line 1): port_down needs device"),
    ("- {node: gpu01, kind: port_down, device: mlx5_7}\n", "gpu01 has no HCA 'mlx5_7'"),
    ("- {node: gpu01, kind: peermem_missing, module: \"x'; reboot; '\"}\n", "module="),
    ("- {node: gpu01, kind: sm_killed, unit: \"opensmd --now\"}\n", "unit="),
    ("- {node: gpu01, kind: cables_swapped, device: mlx5_0, other_host: gpu03, other_device: mlx5_0}\n",
     "has no HCA 'mlx5_0'"),
    ("- gpu01 port_down\n", "faults[0] (line 1): an entry must be a mapping"),
    ("- {kind: port_down}\n", "an entry needs node: and kind:"),
    ("nodes: [gpu01]\n", "no 'faults:' list"),
    ("faults: {node: gpu01}\n", "must be a YAML list"),
    ("faults:\n  - {node: gpu01, kind: [\n", "not valid YAML at line"),
])
def test_bad_entries_are_one_line_errors_naming_file_and_entry(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        faults.load_fault_list(_file(tmp_path, text), DEVICES)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(tmp_path / "faults.yaml") in str(err.value)


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"nope\.yaml: no such file, expected a fault list"):
        faults.load_fault_list(tmp_path / "nope.yaml", DEVICES)


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Issue #26 item 5: the old reader opened a FIFO and waited for a writer for ever."""
    import os
    import threading

    fifo = tmp_path / "faults.yaml"
    os.mkfifo(fifo)
    raised: list[BaseException] = []

    def load() -> None:
        try:
            faults.load_fault_list(fifo, DEVICES)
        except BaseException as exc:  # handed to the test thread
            raised.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(30)
    if worker.is_alive():  # unblock the reader (a writer that closes at once), then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(5)
        pytest.fail("load_fault_list blocked on a FIFO")
    assert len(raised) == 1 and isinstance(raised[0], UsageError)
    assert f"{fifo}: not a regular file" in str(raised[0])


def test_check_params_types_cli_strings() -> None:
    assert faults.check_params("gpu_missing", {"index": "1"}) == {"index": 1}
    assert faults.check_params("slow_link", {"device": "mlx5_0", "bw_factor": "0.5"})["bw_factor"] == 0.5
    with pytest.raises(LabError, match="unknown fault kind"):
        faults.check_params("nope", {})


@pytest.fixture()
def lab(tmp_path: Path) -> str:
    root = str(tmp_path / "lab")
    switches = [LabSwitch("leaf0", 8), LabSwitch("leaf1", 8)]
    cables = [LabCable(h, f"mlx5_{r}", 1, f"leaf{r}", i) for i, h in enumerate(("gpu01", "gpu02"), 1) for r in (0, 1)]
    hardware.write_lab_state(root, "ff", NODES, switches, cables)
    return root


def test_a_list_is_rehearsed_whole_before_anything_changes(lab: str, tmp_path: Path) -> None:
    text = ("- {node: gpu01, kind: port_down, device: mlx5_0}\n"
            "- {node: gpu01, kind: port_down, device: mlx5_0}\n")
    entries = faults.load_fault_list(_file(tmp_path, text), faults.lab_devices(lab))
    calls: list[list[str]] = []
    with pytest.raises(UsageError, match=r"faults\[1\] \(line 2\): gpu01: fault port_down is already injected"):
        faults.apply_fault_list(lab, entries, runner=calls.append)
    assert labstate.load_node(lab, "gpu01")["faults"] == [] and calls == []


def test_a_list_is_applied_in_order(lab: str, tmp_path: Path) -> None:
    entries = faults.load_fault_list(_file(tmp_path, GOOD), faults.lab_devices(lab))
    calls: list[list[str]] = []
    records = faults.apply_fault_list(lab, entries, runner=calls.append)
    assert [r["kind"] for r in records] == ["port_down", "slow_link", "peermem_missing"]
    gpu01 = {h["device"]: h for h in labstate.load_node(lab, "gpu01")["hcas"]}
    assert (gpu01["mlx5_1"]["state"], gpu01["mlx5_1"]["phys_state"]) == ("down", "polling")
    gpu02 = {h["device"]: h for h in labstate.load_node(lab, "gpu02")["hcas"]}
    assert gpu02["mlx5_0"]["bw_factor"] == 0.25
    assert "nvidia_peermem" not in labstate.load_modules(lab, "gpu02")
    assert len(calls) == 1 and calls[0][:2] == ["exec", "plab-ff-gpu02"]


def test_switch_faults_in_a_list_target_switches(lab: str, tmp_path: Path) -> None:
    from provisioner.lab import fromspec

    fromspec.write_switch_links(lab, [fromspec.LabSwitchLink("leaf0", 8, "leaf1", 8)])
    text = ("- {node: leaf0, kind: uplink_down, port: 8}\n"
            "- {node: gpu01, kind: port_down, device: mlx5_0}\n")
    entries = faults.load_fault_list(_file(tmp_path, text), faults.lab_devices(lab), faults.lab_switches(lab))
    records = faults.apply_fault_list(lab, entries, runner=lambda _cmd: None)
    assert [(r["kind"], r.get("switch")) for r in records] == [("uplink_down", "leaf0"), ("port_down", None)]
    assert labstate.load_fabric(lab)["switch_links"][0]["state"] == "down"
    for bad, message in (("- {node: leaf0, kind: port_down, device: mlx5_0}\n", "switch faults"),
                         ("- {node: gpu01, kind: switch_down}\n", "switch faults"),
                         ("- {node: leaf0, kind: uplink_down}\n", "uplink_down needs port")):
        with pytest.raises(UsageError, match=message):
            faults.load_fault_list(_file(tmp_path, bad), faults.lab_devices(lab), faults.lab_switches(lab))


def test_cli_clear_without_a_kind_clears_every_fault_of_the_node(lab: str, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`provision lab fault CLUSTER NODE --clear`, as its help says (it used to ask for a kind)."""
    from provisioner.cli import main
    from provisioner.lab import cluster

    monkeypatch.setattr(cluster, "cluster_dir", lambda _name: Path(lab))
    faults.inject(lab, "gpu01", "port_down", device="mlx5_0")
    faults.inject(lab, "gpu01", "slow_link", device="mlx5_1")
    assert main(["lab", "fault", "ff", "gpu01", "--clear"]) == 0
    assert labstate.load_node(lab, "gpu01")["faults"] == []
    assert "gpu01: cleared slow_link, port_down" in capsys.readouterr().out
    assert main(["lab", "fault", "ff", "gpu09", "--clear"]) == 2  # one line, not a traceback
    assert "no node or switch 'gpu09'" in capsys.readouterr().err
