"""PCIe truth: every GPU and HCA of a GPU node trained at the link it is capable of, and no PCIe bridge between a
GPU and an HCA redirects peer-to-peer traffic to the root complex (ACS).

One SSH round trip per GPU node (:data:`PROBE_SCRIPT`): ``lspci -D -nn -vvv`` (as root: unprivileged lspci cannot
read the capabilities), then ``nvidia-smi``'s GPU index per PCI address and ``ibdev2netdev -v``'s RDMA device per
PCI address, so a finding names ``gpu3`` or ``mlx5_1`` rather than an address.

- A GPU (vendor 10de, class 0302/0300) or HCA (15b3, class 0207/0200) whose LnkSta is below its LnkCap (lspci's
  ``(downgraded)``, or narrower/slower) is an error: a x8 link halves what the device can move (an NDR HCA needs
  Gen5 x16). The cause is in the host (seating, riser, slot, BIOS link settings), never a cable.
- A bridge on the path between a GPU and an HCA below their lowest common bridge (the switch ports they hang
  from) with ``ACSCtl`` ReqRedir+ or CmpltRedir+ is an error: NVIDIA's NCCL troubleshooting guide ("PCI Access
  Control Services") says ACS redirects every peer-to-peer transfer through the CPU root complex, which cuts
  GPUDirect RDMA bandwidth or hangs it; it is to be disabled on those bridges (BIOS, or setpci at every boot).
  A GPU and an HCA under different root ports share no bridge: their traffic crosses the root complex anyway and
  ACS does not change it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from provisioner.errors import ParseError
from provisioner.fabric.findings import CheckResult, Finding, Value
from provisioner.parsers import parse
from provisioner.parsers.lspci import below_capable
from provisioner.remote import Completed

CHECK = "pcie"
NAMES_MARK = "--- provisioner pcie: names ---"
PROBE_SCRIPT = ("command -v lspci >/dev/null 2>&1 || { echo 'lspci: command not found (install pciutils)' >&2; "
                "exit 127; }; lspci -D -nn -vvv; rc=$?; "
                f"echo '{NAMES_MARK}'; nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader 2>/dev/null; "
                "ibdev2netdev -v 2>/dev/null; exit $rc")

GPU_CLASSES = ("0302", "0300")
HCA_CLASSES = ("0207", "0200")
DOWNTRAINED_HINT = ("host-side, not a cable: reseat the card, check the riser and the slot (and that the slot is "
                    "wired x16), and the BIOS PCIe settings (link speed, bifurcation); then lspci -vvv again")
ACS_HINT = ("host-side, not a cable: disable ACS on the bridges between GPUs and HCAs as NVIDIA documents (BIOS: "
            "disable ACS / IO virtualization, or at every boot: setpci -s {bdf} ECAP_ACS+0x6.w=0000, e.g. the "
            "nvidia_peermem role's nvidia_peermem_pcie_acs_disable)")
_GPU_LINE_RE = re.compile(r"^\s*(?P<index>\d+),\s*(?P<addr>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s*$")


def _bdf(addr: str) -> str:
    """``00000000:18:00.0`` (nvidia-smi) or ``0000:18:00.0`` as lspci -D prints it (4-digit domain, lowercase)."""
    domain, rest = addr.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}".lower()


def split_probe(stdout: str) -> tuple[str, str]:
    """The probe's output cut into (lspci, names); names is "" when the mark is missing."""
    head, _, names = stdout.partition(NAMES_MARK + "\n")
    return head, names


def device_names(names: str) -> dict[str, str]:
    """PCI address -> ``gpuN`` (nvidia-smi's index) or the RDMA device (``mlx5_1``) from the probe's names part."""
    out: dict[str, str] = {}
    for line in names.splitlines():
        if m := _GPU_LINE_RE.match(line):
            out[_bdf(m.group("addr"))] = f"gpu{m.group('index')}"
    try:
        mappings = parse("ibdev2netdev", names)["mappings"]
    except ParseError:
        mappings = []
    for mp in mappings:
        if mp["pci"]:
            out.setdefault(mp["pci"], mp["device"])
    return out


#: Without ``-nn`` (a pasted capture): the class and vendor names lspci prints for those codes.
_GPU_CLASS_NAMES = ("3D controller", "VGA compatible controller")
_HCA_CLASS_NAMES = ("Infiniband controller", "Ethernet controller")


def kind(dev: Mapping[str, Any]) -> str | None:
    """``gpu``, ``hca`` or None for a parsed lspci device: by class code and vendor ID (``-nn``), else by the
    class and vendor names lspci prints for them."""
    name = dev["name"] or ""
    if (dev["vendor_id"] == "10de" and dev["class_code"] in GPU_CLASSES) or (
            dev["vendor_id"] is None and dev["class_name"] in _GPU_CLASS_NAMES and name.startswith("NVIDIA ")):
        return "gpu"
    if (dev["vendor_id"] == "15b3" and dev["class_code"] in HCA_CLASSES) or (
            dev["vendor_id"] is None and dev["class_name"] in _HCA_CLASS_NAMES and name.startswith("Mellanox ")):
        return "hca"
    return None


def _link(link: Mapping[str, Any]) -> str:
    return f"x{link['width']} {link['speed_gts']}GT/s"


def link_findings(node: str, devices: list[dict[str, Any]], names: Mapping[str, str]) -> list[Finding]:
    """An error per GPU or HCA whose link trained below its capability."""
    found = []
    for dev in devices:
        if kind(dev) is None or not below_capable(dev):
            continue
        name = names.get(dev["bdf"], dev["bdf"])
        cap, sta = _link(dev["link_cap"]), _link(dev["link_sta"])
        found.append(Finding(
            CHECK, "error", node, name, None, cap, sta,
            f"{node}: {name} ({dev['bdf']}, {dev['name']}) trained at PCIe {sta}, capable of {cap}",
            DOWNTRAINED_HINT))
    return found


def _parents(devices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """bdf -> the bridge whose secondary..subordinate bus range holds the device's bus (the narrowest one)."""
    bridges = [d for d in devices if d["bus_range"] and d["bdf"]]
    out: dict[str, dict[str, Any]] = {}
    for dev in devices:
        if not dev["bdf"]:
            continue
        domain, bus = dev["domain"], int(dev["bdf"].split(":")[1], 16)
        holders = [b for b in bridges if b["domain"] == domain and b is not dev
                   and b["bus_range"]["secondary"] <= bus <= b["bus_range"]["subordinate"]]
        if holders:
            out[dev["bdf"]] = min(holders, key=lambda b: b["bus_range"]["subordinate"] - b["bus_range"]["secondary"])
    return out


def _path(bdf: str, parents: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The bridges above ``bdf``, nearest first, up to its root port."""
    path: list[dict[str, Any]] = []
    while (up := parents.get(bdf)) is not None and up not in path:
        path.append(up)
        bdf = up["bdf"]
    return path


def redirects(dev: Mapping[str, Any]) -> bool:
    """ACS Request or Completion Redirect enabled on a bridge (``ACSCtl: ... ReqRedir+`` / ``CmpltRedir+``)."""
    ctl = dev["acs_ctl"] or {}
    return bool(ctl.get("ReqRedir") or ctl.get("CmpltRedir"))


def acs_findings(node: str, devices: list[dict[str, Any]], names: Mapping[str, str]) -> list[Finding]:
    """An error per bridge with ACS redirect on the path between a GPU and an HCA that share a bridge."""
    parents = _parents(devices)
    gpus = [d for d in devices if kind(d) == "gpu"]
    hcas = [d for d in devices if kind(d) == "hca"]
    between: dict[str, tuple[dict[str, Any], set[str]]] = {}
    for gpu in gpus:
        gpu_path = _path(gpu["bdf"], parents)
        for hca in hcas:
            hca_path = _path(hca["bdf"], parents)
            common = [b for b in gpu_path if b in hca_path]
            if not common:
                continue  # under different root ports: through the root complex whatever ACS says
            lca = common[0]
            for bridge in gpu_path[:gpu_path.index(lca)] + hca_path[:hca_path.index(lca)]:
                if redirects(bridge):
                    pair = f"{names.get(gpu['bdf'], gpu['bdf'])}–{names.get(hca['bdf'], hca['bdf'])}"
                    between.setdefault(bridge["bdf"], (bridge, set()))[1].add(pair)
    found = []
    for bdf, (bridge, pairs) in sorted(between.items()):
        flags = " ".join(f"{k}{'+' if bridge['acs_ctl'].get(k) else '-'}" for k in ("ReqRedir", "CmpltRedir"))
        found.append(Finding(
            CHECK, "error", node, bdf, None, "ReqRedir- CmpltRedir-", flags,
            f"{node}: PCIe bridge {bdf} ({bridge['name']}) between {', '.join(sorted(pairs))} has ACS redirect on "
            f"({flags}): GPUDirect peer-to-peer traffic goes through the CPU root complex (about half the bandwidth, "
            "or a hang)",
            ACS_HINT.format(bdf=bdf)))
    return found


def _unreadable(done: Completed) -> str | None:
    """Why the probe gave nothing to judge, or None."""
    if done.unreachable:
        return done.stderr.strip() or "unreachable"
    if done.timed_out:
        return "lspci timed out"
    if done.rc == 127:
        return (done.stderr.strip().splitlines() or ["lspci: command not found"])[-1]
    return None


def check_node(node: str, done: Completed) -> CheckResult:
    """The ``pcie`` result of one GPU node from its :data:`PROBE_SCRIPT` output."""
    lspci_text, names_text = split_probe(done.stdout)
    why = _unreadable(done)
    if why is not None:
        return CheckResult.could_not_run(CHECK, node, why)
    try:
        devices = parse("lspci", lspci_text)["devices"]
    except ParseError:
        first = next((ln.strip() for ln in (lspci_text + done.stderr).splitlines() if ln.strip()), "(no output)")
        return CheckResult.could_not_run(CHECK, node, f"lspci -vvv output could not be read: {first[:200]!r} "
                                                      f"[exit {done.rc}]")
    judged = [d for d in devices if kind(d) is not None]
    if not judged:
        return CheckResult.could_not_run(CHECK, node, "lspci -D -nn -vvv lists no NVIDIA GPU (10de, class 0302/0300) "
                                                      "and no Mellanox HCA (15b3, class 0207/0200)")
    blind = [d["bdf"] for d in judged if d["link_cap"] is None or d["link_sta"] is None]
    if blind:
        return CheckResult.could_not_run(CHECK, node, f"lspci shows no LnkCap/LnkSta for {', '.join(blind)} "
                                                      "(not run as root? its capabilities read '<access denied>')")
    names = device_names(names_text)
    found = link_findings(node, devices, names) + acs_findings(node, devices, names)
    measured: dict[str, Value] = {"gpus": sum(kind(d) == "gpu" for d in judged),
                                  "hcas": sum(kind(d) == "hca" for d in judged),
                                  "bridges": sum(1 for d in devices if d["bus_range"])}
    return CheckResult.from_findings(CHECK, node, found, measured)
