"""Every simulated tool's output parses, with the product's own parser, into the fields real captures give.

For each tool the lab simulates, the simulated output (run on the host against a temporary lab
root, as tests/unit/test_simtools_*.py do) and the real captures under tests/fixtures/<tool>/ go
through the same parser. Each result is flattened to (field path, value type) pairs: ``results[].bytes
int``, ``modules{}.size int``, ``device null``. The test then demands that

* the simulator yields no (field, type) pair that no real capture yields (a private format, or a
  field real output never leaves empty that the simulator does), and
* wherever the simulated parse has a record, it has every field the real records have.

A failure names the tool, the field and the type, so the simulator cannot drift into a format of its
own without a red test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from provisioner.errors import ParseError
from provisioner.fabric import sm as fabric_sm
from provisioner.lab.hardware import LabHca, LabNodeSpec, write_lab_state
from provisioner.lab.nodetools import kmod_sim
from provisioner.lab.simtools import fabsim_pma, labstate
from provisioner.parsers import parse
from tests.unit import test_simtools_fabric as fab
from tests.unit import test_simtools_host as host
from tests.unit._parser_fixtures import FIXTURES, load

ROOT = Path(__file__).resolve().parents[2]
SIMTOOLS = ROOT / "provisioner" / "lab" / "simtools"

#: Fields whose keys are data (module names, device names, option names): compared as one value shape.
MAPS: dict[str, frozenset[str]] = {
    "lsmod": frozenset({"modules"}),
    "nvidia-smi-topo": frozenset({"nic_names", "matrix", "matrix{}", "gpu_nic_affinity"}),
    "opensm-conf": frozenset({"options"}),
    "ibqueryerrors": frozenset({"nodes[].ports[].counters"}),
}

Pairs = set[tuple[str, str]]


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "dict"
    raise TypeError(f"unexpected value type {type(value).__name__}")


def flatten(value: Any, maps: frozenset[str] = frozenset(), path: str = "") -> Pairs:
    """(path, type) for every field in a parse result; list items share ``path[]``, map values ``path{}``."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    out: Pairs = {(path, _type(value))} if path else set()
    if isinstance(value, dict):
        if path in maps:
            for item in value.values():
                out |= flatten(item, maps, f"{path}{{}}")
        else:
            for key, item in value.items():
                out |= flatten(item, maps, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for item in value:
            out |= flatten(item, maps, f"{path}[]")
    return out


def real_pairs(tool: str, parser: Callable[[str], Any] | None = None, folder: str | None = None) -> Pairs:
    """The union of (path, type) over every real capture of ``tool``."""
    fn = parser or (lambda text: parse(tool, text))
    pairs: Pairs = set()
    names = sorted(p.name for p in (FIXTURES / (folder or tool)).glob("*.txt"))
    assert names, f"no real capture for {tool}"
    for name in names:
        pairs |= flatten(fn(load(folder or tool, name)), MAPS.get(tool, frozenset()))
    return pairs


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("[]"), path.rfind("{}"))
    return path[:cut] if cut > 0 else ""


def assert_same_fields(tool: str, simulated: Iterable[Any], real: Pairs) -> None:
    sim: Pairs = set()
    for result in simulated:
        sim |= flatten(result, MAPS.get(tool, frozenset()))
    private = sorted(sim - real)
    assert not private, f"{tool}: the simulator yields fields/types no real capture yields: {private}"
    sim_paths = {p for p, _ in sim}
    fields = {p for p, _ in real if not p.endswith(("[]", "{}"))}  # an empty list or map is no missing field
    missing = sorted({p for p in fields if _parent(p) in sim_paths or _parent(p) == ""} - sim_paths)
    assert not missing, f"{tool}: the simulated parse lacks fields real captures have: {missing}"


# ---------------------------------------------------------------- host tools (nvidia-smi, ofed_info, ...)


@pytest.fixture
def hostlab(tmp_path: Path) -> Path:
    """The lab test_simtools_host.py builds: one 8-GPU, 8-rail node with DOCA-OFED installed."""
    (tmp_path / "root/nodes/gpu01").mkdir(parents=True)
    (tmp_path / "root/nodes/gpu01/node.json").write_text(json.dumps(host._node()))
    lib = tmp_path / "sys/usr/lib/provisioner-lab"
    lib.mkdir(parents=True)
    (lib / "nvidia-driver.version").write_text(json.dumps({"version": "550.90.07", "cuda": "12.4", "flavor": "open"}))
    (lib / "dcgm.version").write_text(json.dumps({"version": "3.3.9"}))
    (tmp_path / "sys/var/run").mkdir(parents=True)
    (tmp_path / "sys/var/run/nvhostengine.pid").write_text(f"{os.getpid()}\n")  # a live process: the host engine
    (lib / "ofed.version").write_text(json.dumps({"kind": "doca", "version": "24.10-1.1.4.0", "packages": {}}))
    return tmp_path


def test_nvidia_smi_topo_parity(hostlab: Path) -> None:
    outs = [parse("nvidia-smi-topo", host.run(hostlab, "nvidia-smi", "topo", "-m").stdout)]
    (hostlab / "root/nodes/gpu01/node.json").write_text(json.dumps(host._node(numa_split=8, nvswitch=False)))
    outs.append(parse("nvidia-smi-topo", host.run(hostlab, "nvidia-smi", "topo", "-m").stdout))
    assert outs[0]["gpu_nic_affinity"]["GPU0"] == ["mlx5_0"]
    assert_same_fields("nvidia-smi-topo", outs, real_pairs("nvidia-smi-topo"))


def test_dcgmi_parity(hostlab: Path) -> None:
    healthy = [parse("dcgmi", host.run(hostlab, "dcgmi", "diag", "-r", level).stdout) for level in ("1", "2", "3")]
    assert [len(o["tests"]) for o in healthy] == [9, 11, 14] and all(o["ok"] for o in healthy)
    node = host._node()
    node["gpus"][1]["ecc_uncorrected_volatile"] = 2
    node.update({"dcgm_fail": {"gpu": 3}, "nvlink_down": [5]})
    (hostlab / "root/nodes/gpu01/node.json").write_text(json.dumps(node))
    failing = parse("dcgmi", host.run(hostlab, "dcgmi", "diag", "-r", "2").stdout)
    assert failing["failed"] == ["Page Retirement/Row Remap", "Inforom", "PCIe"]
    assert_same_fields("dcgmi", [*healthy, failing], real_pairs("dcgmi"))


def test_ofed_info_parity(hostlab: Path) -> None:
    outs = [parse("ofed_info", host.run(hostlab, "ofed_info", *args).stdout) for args in (("-s",), (), ("-n",))]
    assert [(o["flavor"], o["form"]) for o in outs] == [
        ("OFED-internal", "short"),
        ("OFED-internal", "full"),
        (None, "number"),
    ]
    version = hostlab / "sys/usr/lib/provisioner-lab/ofed.version"
    version.write_text(json.dumps({"kind": "mlnx", "version": "5.8-3.0.7.0", "packages": {}}))
    outs += [parse("ofed_info", host.run(hostlab, "ofed_info", *args).stdout) for args in (("-s",), ())]
    assert (outs[-1]["flavor"], outs[-1]["base"]) == ("MLNX_OFED_LINUX", "OFED-5.8-3.0.7")
    assert_same_fields("ofed_info", outs, real_pairs("ofed_info"))


def test_ibdev2netdev_parity(hostlab: Path) -> None:
    outs = [parse("ibdev2netdev", host.run(hostlab, "ibdev2netdev", *args).stdout) for args in ((), ("-v",))]
    assert len(outs[0]["mappings"]) == 8
    assert_same_fields("ibdev2netdev", outs, real_pairs("ibdev2netdev"))


def test_lspci_parity(hostlab: Path) -> None:
    outs = [parse("lspci", host.run(hostlab, "lspci", "-D", "-nn", "-vvv").stdout)]
    node = host._node()
    node["pcie_acs"] = True
    node["hcas"][1].update(pcie_width=8, pcie_speed="16")
    (hostlab / "root/nodes/gpu01/node.json").write_text(json.dumps(node))
    outs.append(parse("lspci", host.run(hostlab, "lspci", "-D", "-nn", "-vvv").stdout))
    assert len(outs[0]["devices"]) == 8 * 6  # per GPU: root port, switch up and two down ports, GPU, HCA
    assert_same_fields("lspci", outs, real_pairs("lspci"))


def test_lsmod_parity(tmp_path: Path) -> None:
    link = tmp_path / "lsmod"
    link.symlink_to(Path(kmod_sim.__file__))
    labstate.save_modules(str(tmp_path), "gpu01",
                          ["nvidia_peermem", "ib_uverbs", "nvidia", "ib_core", "mlx5_ib", "mlx5_core"])
    env = {
        "PROVISIONER_LAB_ROOT": str(tmp_path),
        "PROVISIONER_LAB_HOST": "gpu01",
        "PROVISIONER_LAB_LIB": str(Path(labstate.__file__).parent),
        "PATH": "/usr/bin",
    }
    done = subprocess.run([sys.executable, str(link)], capture_output=True, text=True, env=env, check=True)
    out = parse("lsmod", done.stdout)
    assert out["complete"] is True and out["modules"]["ib_core"]["used_by"] == ["ib_uverbs", "mlx5_ib"]
    assert out["modules"]["ib_uverbs"]["used_by"] == ["nvidia_peermem"]  # OFED's PeerDirect lives in ib_uverbs
    assert_same_fields("lsmod", [out], real_pairs("lsmod"))


# ---------------------------------------------------------------- fabric tools


@pytest.fixture
def fablab(tmp_path: Path) -> Path:
    """The two-node, two-leaf lab test_simtools_fabric.py builds."""
    return fab.build_lab(tmp_path)


def test_perftest_parity_client_server_and_failures(fablab: Path) -> None:
    fab.activate_all(fablab)
    outs: list[dict[str, Any]] = []
    for tool, verb in (("ib_write_bw", "RDMA_Write"), ("ib_read_bw", "RDMA_Read"), ("ib_send_bw", "Send")):
        server, client = fab.perftest_pair(
            fablab, ["-d", "mlx5_0", "--report_gbits"], ["-d", "mlx5_0", "--report_gbits"], tool=tool
        )
        for done, role in ((server, "server"), (client, "client")):
            out = parse("perftest", done.stdout)
            assert (out["test"], out["program"], out["role"], out["ok"]) == (verb, tool, role, True), done.stdout
            outs.append(out)
    _s, mib = fab.perftest_pair(fablab, ["-d", "mlx5_1", "-a"], ["-d", "mlx5_1", "-a"])
    outs.append(parse("perftest", mib.stdout))
    fab.set_port(fablab, "gpu01", 0, state="down", phys_state="polling")
    down = fab.run_tool(fablab, "gpu01", "ib_write_bw", "-d", "mlx5_0")
    missing = fab.run_tool(fablab, "gpu01", "ib_write_bw", "-d", "mlx5_7")
    alone = fab.run_tool(
        fablab, "gpu02", "ib_write_bw", "-p", str(fab.free_port()), "127.0.0.1", PROVISIONER_LAB_PERFTEST_RETRY_S="0"
    )
    for done in (down, missing, alone):
        failed = parse("perftest", done.stdout + done.stderr)
        assert failed["ok"] is False and failed["error"], done.stderr
        outs.append(failed)
    assert_same_fields("perftest", outs, real_pairs("perftest"))


def test_all_reduce_perf_parity(fablab: Path) -> None:
    fab.activate_all(fablab)
    ok = fab.mpirun(fablab, "all_reduce_perf", "-b", "8", "-e", "1G", "-f", "4", "-g", "1")
    single = fab.run_tool(fablab, "gpu01", "all_reduce_perf", "-b", "8G", "-e", "8G", "-g", "2")
    (fablab.parent / "lib" / "nvidia-driver.version").unlink()
    broken = fab.run_tool(fablab, "gpu01", "all_reduce_perf")
    outs = [
        parse("nccl-tests", ok.stdout),
        parse("nccl-tests", single.stdout),
        parse("nccl-tests", broken.stdout + broken.stderr),
    ]
    assert outs[0]["ok"] and outs[0]["nranks"] == 4 and outs[2]["ok"] is False
    assert_same_fields("nccl-tests", outs, real_pairs("nccl-tests"))


def test_iblinkinfo_parity(fablab: Path) -> None:
    fab.activate_all(fablab)
    fab.set_port(fablab, "gpu02", 1, state="down", phys_state="polling")
    out = parse("iblinkinfo", fab.run_tool(fablab, "gpu01", "iblinkinfo").stdout)
    assert {lk["state"] for lk in out["links"]} == {"active", "down"}
    assert_same_fields("iblinkinfo", [out], real_pairs("iblinkinfo"))


def test_ibnetdiscover_parity(fablab: Path) -> None:
    fab.activate_all(fablab)
    done = fab.run_tool(fablab, "gpu01", "ibnetdiscover")
    out = parse("ibnetdiscover", done.stdout)
    assert out["switches"] and out["cas"] and out["links"], done.stdout
    assert_same_fields("ibnetdiscover", [out], real_pairs("ibnetdiscover"))


def test_ibqueryerrors_parity(fablab: Path) -> None:
    """A switch port and a CA port with errors, as the real captures have both (switch block with port ALL)."""
    fab.activate_all(fablab)
    _heartbeat(fablab, "0xa088c20300010000", 1, 14, "master")
    fabric = labstate.load_fabric(str(fablab))
    fabsim_pma.bump_switch_counters(fabric, "leaf00", 1, {"symbol_error": 250, "link_downed": 3})
    labstate.save_fabric(str(fablab), fabric)
    labstate.bump_counters(str(fablab), "gpu02", "mlx5_0", 1, {"port_xmit_wait": 7})
    done = fab.run_tool(fablab, "gpu01", "ibqueryerrors")
    assert done.returncode == 1, done.stderr
    out = parse("ibqueryerrors", done.stdout)
    assert sorted((n["type"], len(n["ports"])) for n in out["nodes"]) == [("ca", 1), ("switch", 2)], done.stdout
    assert out["summary"]["bad_ports"] == 2 and out["complete"]
    assert_same_fields("ibqueryerrors", [out], real_pairs("ibqueryerrors"))


def _heartbeat(lab: Path, guid: str, lid: int, priority: int, state: str) -> None:
    sm_dir = lab / "sm"
    sm_dir.mkdir(exist_ok=True)
    rec = {
        "guid": guid,
        "lid": lid,
        "priority": priority,
        "state": state,
        "activity_count": 4242,
        "heartbeat": time.time(),
    }
    (sm_dir / f"{guid}.json").write_text(json.dumps(rec))


def test_sminfo_and_saquery_parity(fablab: Path) -> None:
    fab.activate_all(fablab)
    _heartbeat(fablab, "0xa088c20300010000", 1, 14, "master")
    _heartbeat(fablab, "0xa088c20300020000", 20, 10, "standby")
    master = fab.run_tool(fablab, "gpu02", "sminfo")
    standby = fab.run_tool(fablab, "gpu02", "sminfo", "20")
    outs = [parse("sminfo", master.stdout), parse("sminfo", standby.stdout)]
    assert [o["state"] for o in outs] == ["master", "standby"], (master, standby)
    real = real_pairs("sminfo")
    assert_same_fields("sminfo", outs, real)
    # saquery SMIR gives the same SMInfo the product reads with sminfo; no real saquery capture was found, so
    # its records are held to the fields the real sminfo lines give (both become SmInfo).
    records = fabric_sm.parse_sminfo_records(fab.run_tool(fablab, "gpu02", "saquery", "SMIR").stdout)
    assert [r.state for r in records] == ["master", "standby"]
    assert_same_fields("saquery", records, real_pairs("sminfo", parser=_sm_of_a_whole_line))


def _sm_of_a_whole_line(text: str) -> Any:
    """The SmInfo a real capture gives, or nothing for the captures with no whole SMInfo line (a failed run,
    a line cut by grep): read_sminfo refuses those, and their fields are held against sminfo's own parse."""
    try:
        return fabric_sm.read_sminfo(text)
    except ParseError:
        return {}


def test_sminfo_no_answer_parses_like_the_real_failed_runs(fablab: Path) -> None:
    # No SM in the lab fabric: the simulated sminfo times out the way real sminfo does, and that output is
    # sminfo's too (ok false, the iberror message), with the fields of the real error-only capture.
    fab.activate_all(fablab)
    done = fab.run_tool(fablab, "gpu02", "sminfo")
    assert done.returncode == 255, done
    out = parse("sminfo", done.stdout + done.stderr)
    assert (out["ok"], out["error"], out["lid"]) == (False, "query", None)
    assert_same_fields("sminfo", [out], real_pairs("sminfo"))


def test_opensm_log_parity(fablab: Path) -> None:
    conf = fablab.parent / "sm.conf"
    conf.write_text("routing_engine ar_updn\n")
    log = fablab.parent / "opensm.log"
    done = fab.run_tool(fablab, "gpu01", "opensm", "-F", str(conf), "-o", "-f", str(log))
    assert done.returncode == 0, done.stderr
    report = fabric_sm.routing_from_log(log.read_text())
    assert report.engine_in_use == "ar_updn" and report.subnet_up
    real = real_pairs("opensm-log", parser=fabric_sm.routing_from_log)
    assert_same_fields("opensm log", [report], real)


def _roce_filters() -> ModuleType:
    path = ROOT / "roles" / "roce_qos" / "filter_plugins" / "roce_qos_filters.py"
    spec = importlib.util.spec_from_file_location("roce_qos_filters", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mlnx_qos_parity(tmp_path: Path) -> None:
    state = _roce_filters().mlnx_qos_state
    roce_port = LabHca("mlx5_0", rail=0, gpu=0, rate_gbps=200, link_layer="Ethernet")
    node = LabNodeSpec("roce1", gpu_count=2, hcas=(roce_port,))
    write_lab_state(str(tmp_path), "roce", [node])
    env = {**os.environ, "PROVISIONER_LAB_ROOT": str(tmp_path), "PROVISIONER_LAB_HOST": "roce1"}

    def mlnx_qos(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(SIMTOOLS / "mlnx_qos"), *args], capture_output=True, text=True, env=env, check=False
        )

    plain = mlnx_qos("-i", "enp23s0np0").stdout
    assert mlnx_qos("-i", "enp23s0np0", "--trust", "dscp").returncode == 0
    pfc = mlnx_qos("-i", "enp23s0np0", "--pfc", "0,0,0,1,0,0,0,0").stdout
    outs = [state(plain), state(pfc)]
    assert outs[1]["pfc_priorities"] == [3]
    assert_same_fields("mlnx_qos", outs, real_pairs("mlnx_qos", parser=state))


def test_flatten_names_list_items_and_map_values() -> None:
    pairs = flatten({"a": [{"b": 1}], "m": {"x": {"c": None}}, "f": 1.5}, frozenset({"m"}))
    assert pairs == {
        ("a", "list"),
        ("a[]", "dict"),
        ("a[].b", "int"),
        ("m", "dict"),
        ("m{}", "dict"),
        ("m{}.c", "null"),
        ("f", "float"),
    }


def test_assert_same_fields_catches_a_private_field_and_a_missing_one() -> None:
    real = flatten({"rows": [{"size": 1, "busbw": 2.0}]})
    with pytest.raises(AssertionError, match=r"rows\[\]\.busbw', 'null'"):
        assert_same_fields("t", [{"rows": [{"size": 1, "busbw": None}]}], real)
    with pytest.raises(AssertionError, match=r"lacks fields real captures have: \['rows\[\]\.busbw'\]"):
        assert_same_fields("t", [{"rows": [{"size": 1}]}], real)
    assert_same_fields("t", [{"rows": []}], real)
