"""`provision discover` against the lab's hardware model, on the host (no containers).

The nodes' answers come from the lab's own simulated tools run here (nvidia-smi --query-gpu and topo -m, the
simulated ibnetdiscover over fabric.json), ibstat is written from the same node.json the lab's sysfs is built
from, in Debian's ibstat layout. The draft must validate and equal the lab spec in nodes, profiles and cabling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from provisioner.discover import PROBE, discover, read_fabric, split_sections, switch_name, targets
from provisioner.lab import fromspec
from provisioner.lab.hardware import write_lab_state
from provisioner.lab.simtools import labstate
from provisioner.parsers.nvidia_query import parse_nvidia_smi_query
from provisioner.remote import RC_UNREACHABLE, Background, Completed
from provisioner.spec import load_cluster, load_text
from provisioner.spec.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
SIMTOOLS = ROOT / "provisioner" / "lab" / "simtools"
FIXTURES = ROOT / "tests" / "fixtures"
OS_RELEASE = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\nID=debian\n'
STATE = {"init": "Initializing", "active": "Active", "down": "Down", "armed": "Armed"}


def _ibstat(node: dict[str, Any]) -> str:
    """Debian's ibstat layout for node.json's HCAs (what the real binary prints from the lab's sysfs)."""
    out = []
    for h in node["hcas"]:
        out += [f"CA '{h['device']}'", f"\tCA type: {h.get('ca_type', 'MT4129')}", "\tNumber of ports: 1",
                f"\tNode GUID: {h['node_guid']}", f"\tSystem image GUID: {h['sys_image_guid']}",
                f"\tPort {h['port']}:", f"\t\tState: {STATE[h['state']]}", "\t\tPhysical state: LinkUp",
                f"\t\tRate: {h['rate_gbps']}", f"\t\tBase lid: {h['lid']}", "\t\tLMC: 0", f"\t\tSM lid: {h['sm_lid']}",
                f"\t\tPort GUID: {h['port_guid']}", f"\t\tLink layer: {h['link_layer']}"]
    return "\n".join(out) + "\n"


class LabRemote:
    """Answers the probe and ibnetdiscover from a lab state directory, like the lab's containers would."""

    def __init__(self, lab: Path, down: Sequence[str] = (),
                 answers: Mapping[str, Mapping[str, tuple[int, str]]] | None = None,
                 missing: Sequence[str] = ()) -> None:
        self.lab, self.down, self.missing = lab, set(down), set(missing)
        self.answers = answers or {}  # {host: {section: (rc, output)}}: what a node says instead
        self.commands: list[tuple[str, tuple[str, ...]]] = []

    def _tool(self, host: str, *argv: str) -> tuple[int, str]:
        env = {**os.environ, "PROVISIONER_LAB_ROOT": str(self.lab / "root"), "PROVISIONER_LAB_HOST": host,
               "PROVISIONER_LAB_SYSROOT": str(self.lab / "sys")}
        done = subprocess.run([sys.executable, str(SIMTOOLS / argv[0]), *argv[1:]], capture_output=True, text=True,
                              env=env, check=False)
        return done.returncode, done.stdout + done.stderr

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        self.commands.append((host, tuple(argv)))
        if list(argv) == ["sh", "-c", PROBE]:
            return self._probe(host)
        if argv[0] in self.missing:
            return Completed(127, "", f"sh: 1: {argv[0]}: not found\n")
        rc, out = self._tool(host, *argv)
        return Completed(rc, out, "")

    def _probe(self, host: str) -> Completed:
        if host in self.down:
            return Completed(RC_UNREACHABLE, "", f"{host}: cannot connect: timed out")
        node = labstate.load_node(str(self.lab / "root"), host)
        fields = "index,name,pci.bus_id,driver_version,memory.total"
        answers = [("hostname", 0, host + "\n"), ("os-release", 0, OS_RELEASE), ("kernel", 0, "6.1.0-28-amd64\n"),
                   ("nvidia-smi", *self._tool(host, "nvidia-smi", f"--query-gpu={fields}",
                                              "--format=csv,noheader,nounits")),
                   ("topo", *self._tool(host, "nvidia-smi", "topo", "-m")),
                   ("ibstat", 0, _ibstat(node)), ("ofed", *self._tool(host, "ofed_info", "-s")),
                   ("sminfo", 127, "sh: 1: sminfo: not found\n"),
                   ("packages", 0, "libnccl2\t2.21.5-1+cuda12.4\tinstall ok installed\n"
                                   "cuda-toolkit-12-4\t12.4.1-1\tinstall ok installed\n")]
        instead = self.answers.get(host, {})
        answers = [(name, *instead.get(name, (rc, out))) for name, rc, out in answers]
        text = "".join(f"@@provision-discover@@ {name}\n{out}@@provision-discover@@ rc {rc}\n"
                       for name, rc, out in answers)
        return Completed(0, text, "")

    def start(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Background:
        raise AssertionError("discover starts nothing in the background")

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        return {h: self.run(h, argv, timeout, env) for h, argv in commands.items()}


@pytest.fixture
def lab(tmp_path: Path) -> tuple[Path, Cluster]:
    cluster, _ = load_cluster(ROOT / "examples/lab/cluster.yaml")
    root = str(tmp_path / "root")
    write_lab_state(root, "lab", fromspec.lab_nodes(cluster), fromspec.lab_switches(cluster),
                    fromspec.lab_cables(cluster))
    fromspec.write_switch_links(root, fromspec.lab_switch_links(cluster))
    for n in cluster.nodes:  # the driver is installed and loaded (as `provision lab up` + gpu_stack leave it)
        labstate.save_modules(root, n.name, [*labstate.DEFAULT_MODULES, "nvidia"])
    lib = tmp_path / "sys/usr/lib/provisioner-lab"
    lib.mkdir(parents=True)
    (lib / "nvidia-driver.version").write_text(json.dumps({"version": "550.90.07", "cuda": "12.4", "flavor": "open"}))
    # DOCA-OFED 2.9.1 as the stand-in package installs it (ofed_info -s: OFED-internal-24.10-1.1.4.0)
    (lib / "ofed.version").write_text(json.dumps({"kind": "doca", "version": "24.10-1.1.4.0", "packages": {}}))
    return tmp_path, cluster


def hardware(c: Cluster) -> dict[str, Any]:
    """What discover must reproduce: each node's address and hardware, the switches and the cables."""
    return {
        "nodes": {n.name: (n.address, n.gpu_model, n.gpu_count, n.nvswitch,
                           sorted((p.device, p.port, p.rate_gbps, p.width, p.link_layer, p.rail, p.gpu)
                                  for p in n.ports)) for n in c.nodes},
        "cables": sorted((x.node, x.device, x.switch, x.switch_port) for x in c.cables),
        "switches": sorted((s.name, s.tier, s.ports, s.uplinks) for s in c.switches),
    }


def _draft(lab: Path, cluster: Cluster, down: Sequence[str] = (),
           answers: Mapping[str, Mapping[str, tuple[int, str]]] | None = None, missing: Sequence[str] = (),
           hosts: str = "gpu[01-03],sm[1-2]", addresses: str = "10.213.38.[11-13],10.213.38.[21-22]",
           ) -> tuple[Any, LabRemote]:
    remote = LabRemote(lab, down, answers, missing)
    chosen = targets(hosts, addresses, user="root", port=22, key=None, known_hosts=lab / "known_hosts")
    return discover(remote, chosen, cluster_name="lab", ssh={"user": "root", "known_hosts": "known_hosts", "port": 22}
                    ), remote


def test_draft_of_the_lab_validates_and_equals_its_spec(lab: tuple[Path, Cluster]) -> None:
    draft, remote = _draft(*lab)
    res = load_text(draft.text, "draft.yaml")
    assert not res.errors, [d.format() for d in res.errors] + [draft.text]
    assert res.cluster is not None
    assert hardware(res.cluster) == hardware(lab[1]), draft.text
    # one probe per node, one ibnetdiscover, one saquery SMIR (no SM runs in this lab: the TODO below)
    assert sorted(h for h, argv in remote.commands if argv[0] == "sh") == ["gpu01", "gpu02", "gpu03", "sm1", "sm2"]
    assert [argv for _, argv in remote.commands if argv[0] != "sh"] == [("ibnetdiscover",), ("saquery", "SMIR")]
    text = draft.text
    assert 'cabling:\n      - {nodes: "gpu[01-03]", hca: mlx5_0, switch: leaf1, ports: "1-3"}' in text
    assert '{name: "leaf[1-2]", tier: leaf, ports: 64, uplinks: 8}' in text
    assert 'driver: {version: "550.90.07"}  # installed: driver: 550.90.07 on gpu[01-03]' in text
    assert 'ofed: {flavor: doca, version: "2.9.1"}  # ofed_info -s: OFED-internal 24.10-1.1.4.0 on' in text
    assert "# TODO no SM answered sminfo" in text and "TODO repositories" in text


@pytest.mark.parametrize(("fixture", "line"), [
    ("daocloud_mlnx_23_07.txt", 'ofed: {flavor: mlnx_ofed, version: "23.07-0.5.1.2"}'),
    ("openshift_docs_doca_24_07.txt", "ofed: {flavor: inbox}  # TODO"),  # DOCA 24.07's release: not in the table
])
def test_ofed_from_real_ofed_info_output(fixture: str, line: str) -> None:
    from provisioner.discover import _ofed_lines
    from provisioner.parsers import parse

    info = parse("ofed_info", (FIXTURES / "ofed_info" / fixture).read_text())
    todo: list[str] = []
    out = _ofed_lines(f"{info['flavor']} {info['version']}", "x", todo)
    assert out[0].strip().startswith(line), out
    assert bool(todo) == ("TODO" in line)


def test_an_unreachable_node_is_left_out_and_named(lab: tuple[Path, Cluster]) -> None:
    draft, _ = _draft(*lab, down=["gpu02"])
    assert draft.skipped == ["gpu02: gpu02: cannot connect: timed out"]
    assert "#   gpu02: gpu02: cannot connect: timed out" in draft.text
    res = load_text(draft.text, "draft.yaml")
    assert res.cluster is not None and not res.errors, [d.format() for d in res.errors]
    assert [n.name for n in res.cluster.nodes] == ["gpu01", "gpu03", "sm1", "sm2"]
    assert '{name: "gpu[01,03]", address: "10.213.38.[11,13]", profile: h100x2}' in draft.text


def test_probe_sections_keep_each_tools_output_and_status() -> None:
    text = "@@provision-discover@@ hostname\ngpu01\n@@provision-discover@@ rc 0\n" \
           "@@provision-discover@@ ibstat\nsh: 1: ibstat: not found\n@@provision-discover@@ rc 127\n"
    assert split_sections(text) == {"hostname": (0, "gpu01\n"), "ibstat": (127, "sh: 1: ibstat: not found\n")}


def test_fabric_from_a_real_ndr_capture() -> None:
    """NVIDIA/topograph's QM9701 capture: leaf named from its MF0;<name>:<model> description, CAs by node GUID."""
    text = (FIXTURES / "ibnetdiscover/topograph_ndr_qm9701_excerpt.txt").read_text()
    owners = {f"0x{g}": (f"a08-p1-dgx-04-c{i:02d}", "mlx5_5") for i, g in enumerate(
        ["e09d7303007a4bd8", "e09d730300859298", "e09d730300858270"], start=1)}
    fabric = read_fabric(text, "x", owners)
    leaf = "a09-p1-ibleaf-04-04"
    assert leaf in {s["name"] for s in fabric.switches}
    assert sorted(c for c in fabric.cables if c[2] == leaf) == [
        ("a08-p1-dgx-04-c01", "mlx5_5", leaf, 1), ("a08-p1-dgx-04-c02", "mlx5_5", leaf, 2),
        ("a08-p1-dgx-04-c03", "mlx5_5", leaf, 3)]
    assert any("Aggregation Node" in c for c in fabric.unknown_cas)  # SHARP's CA is no node of ours


@pytest.mark.parametrize(("desc", "name"), [("MF0;A09-P1-IBLEAF-04-04:MQM9701/U1", "a09-p1-ibleaf-04-04"),
                                            ("leaf1", "leaf1"), ("Quantum Mellanox Technologies", "sw-abcdef")])
def test_switch_names(desc: str, name: str) -> None:
    assert switch_name(desc, "0x0000000000abcdef") == name


def test_nvidia_smi_query_from_the_lab_tool(lab: tuple[Path, Cluster]) -> None:
    rc, out = LabRemote(lab[0])._tool("gpu01", "nvidia-smi", "--query-gpu=index,name,pci.bus_id,driver_version,"
                                      "memory.total", "--format=csv,noheader,nounits")
    assert rc == 0
    gpus = parse_nvidia_smi_query(out)["gpus"]
    assert [(g["index"], g["name"], g["driver_version"], g["memory_mib"]) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", "550.90.07", 81559), (1, "NVIDIA H100 80GB HBM3", "550.90.07", 81559)]


def test_profile_folds_rails_and_marks_a_port_next_to_no_gpu() -> None:
    from provisioner.discover import _Kind, _profile_yaml

    kind = _Kind("H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", 2, True,
                 (("mlx5_0", 1, 400.0, "infiniband", 0), ("mlx5_1", 1, 400.0, "infiniband", 1),
                  ("mlx5_2", 1, 200.0, "infiniband", None)))
    lines = _profile_yaml("h100x2", kind, 400.0)
    assert '      - {device: "mlx5_[0-1]"}' in lines
    storage = "      - {device: mlx5_2, rate: 200, purpose: storage}  # next to no GPU"  # 200: HDR or NDR200
    assert any(line.startswith(storage) for line in lines), lines
    crossed = _Kind(kind.gpu_key, kind.gpu_name, 2, True,
                    (("mlx5_0", 1, 400.0, "infiniband", 1), ("mlx5_1", 1, 400.0, "infiniband", 0)))
    assert _profile_yaml("h", crossed, 400.0)[-2:] == ["      - {device: mlx5_0, gpu: 1}",
                                                        "      - {device: mlx5_1, gpu: 0}"]
