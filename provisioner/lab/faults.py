"""Fault injection into a running lab: edits of the simulated state that take effect live.

Most faults are edits of a node's ``node.json`` (the sysfs tree is rewritten with it,
so Debian's real ``ibstat`` inside the container shows the change at once); some edit
``fabric.json`` (swapped cables) or act on the container (pause it, stop a unit,
hide a module file, regenerate SSH host keys).  Every injected fault is recorded in
the node's ``faults`` list together with the values it replaced, so :func:`clear`
restores exactly what was there and ``provision lab status`` can list them.

Switch faults (:data:`SWITCH_FAULTS`) target a switch of fabric.json instead of a node:
``uplink_down``/``uplink_degraded`` edit one switch-to-switch link, ``switch_down`` takes
the whole switch away (its links vanish and the node ports cabled to it lose their light).
They are recorded in fabric.json's ``switch_faults`` list with what they replaced.

The pure part (:func:`apply_fault`, :func:`revert_fault`) works on dicts and returns
the container commands to run, so it is unit-tested without podman.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import LabError, UsageError
from provisioner.lab import hardware
from provisioner.lab.names import container_name
from provisioner.lab.simtools import fabsim_pma, labstate
from provisioner.userfile import read_user_text

Runner = Callable[[list[str]], None]
"""Runs one podman command (arguments after ``podman``)."""

PORT_FAULTS = ("port_down", "port_disabled", "degraded_width", "degraded_rate", "slow_link", "flapping")
NODE_FAULTS = ("gpu_missing", "ecc_error", "peermem_missing", "unreachable", "sm_killed", "hardware_swap",
               "ipoib_down", "ipoib_wrong_address", "nccl_slow", "pcie_degraded", "acs_enabled",
               "memlock_low",
               "dcgm_fail", "nvlink_down")
FABRIC_FAULTS = ("cables_swapped",)
SWITCH_FAULTS = ("uplink_down", "uplink_degraded", "switch_down")
FAULT_KINDS = PORT_FAULTS + NODE_FAULTS + FABRIC_FAULTS + SWITCH_FAULTS

_PORT_FIELDS = ("state", "phys_state", "lid", "sm_lid", "width", "speed", "rate_gbps", "bw_factor", "flapping")
FLAP_ON_INJECT = {"link_downed": 1, "link_error_recovery": 1, "symbol_error": 12}
"""What a port that has started to flap shows in its counters when the fault is injected: it went down
and came back once. Every traffic run over it adds more (``fabsim_common.flap_counters``)."""
LINK_DOWN_COUNTS = {"link_downed": 1}
"""What each end of a switch link that went down shows in its counters: the link went down once."""
LINK_RETRAIN_COUNTS = {"link_error_recovery": 1, "symbol_error": 12}
"""What each end of a link that retrained narrower or slower shows: one recovery, a burst of bit errors
(the retrain half of :data:`FLAP_ON_INJECT`)."""
HIDDEN_SUFFIX = ".lab-hidden"
DEFAULT_SM_UNIT = "opensmd"
MEMLOCK_FAULT_FILE = "/etc/security/limits.d/99-provisioner-lab-fault-memlock.conf"
"""memlock_low's limits.d file: read after the doca_ofed role's 90-provisioner-memlock.conf, so pam_limits applies
its lower limit to every later login (ssh, su, runuser), as a site's stray limits file would."""
MEMLOCK_WRITE = 'umask 022; printf "* soft memlock %s\\n* hard memlock %s\\n" "$1" "$1" > "$2"'
"""The shell text that writes it; the limit and the path come as arguments, never inside the text."""
"""The unit of NVIDIA's opensm package (DOCA/MLNX_OFED), which the lab's stand-in installs."""


XID_TEXT = {79: "GPU has fallen off the bus.", 48: "DBE (Double Bit Error) ECC Error"}
"""Xid codes the GPU faults log, with the condition NVIDIA's Xid catalog names for them."""


def kernel_uptime() -> float:
    """Seconds since the (shared) kernel booted: what the kernel stamps its log lines with."""
    try:
        with open("/proc/uptime", encoding="ascii") as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def xid_line(gpu: dict[str, Any], code: int) -> str:
    """The driver's ``NVRM: Xid (PCI:dddd:bb:dd): <code>, ...`` line for ``gpu`` (its bus id without the function;
    leptonai/gpud components/accelerator/nvidia/error/xid/README.md shows real ones)."""
    domain, bus, rest = str(gpu["pci_bus_id"]).split(":")
    return (f"NVRM: Xid (PCI:{domain[-4:].lower()}:{bus.lower()}:{rest.split('.')[0].lower()}): {code}, "
            f"pid='<unknown>', name=<unknown>, {XID_TEXT[code]}")


def _log_kernel(node: dict[str, Any], record: dict[str, Any], message: str) -> None:
    """Append ``message`` to the node's simulated kernel log (read by the lab's dmesg), tied to ``record``."""
    entry = {"t": round(kernel_uptime(), 6), "msg": message}
    node.setdefault("kernel_log", []).append(entry)
    record["logged"] = message


def _gpu_index(node: dict[str, Any], host: str, params: dict[str, Any]) -> int:
    gpus = node.get("gpus", [])
    if not gpus:
        raise LabError(f"{host} has no GPUs to lose")
    index = int(params.get("index", len(gpus) - 1))
    if not 0 <= index < len(gpus):
        raise LabError(f"{host} has no GPU {index} (0..{len(gpus) - 1})")
    return index


def _podman_runner(args: list[str]) -> None:
    from provisioner.lab.host import podman

    podman(*args, timeout=60)


def _port_target(node: dict[str, Any], params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    device = params.get("device")
    if not device:
        first = node["hcas"][0]["device"] if node.get("hcas") else None
        raise LabError("this fault needs device=<HCA device>", hint=f"e.g. device={first}")
    port = int(params.get("port", 1))
    try:
        hca = labstate.find_hca(node, str(device), port)
    except KeyError as exc:
        raise LabError(str(exc.args[0])) from exc
    return hca, {"device": str(device), "port": port}


def _port_edit(kind: str, hca: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The port fields a port fault sets."""
    if kind == "port_down":
        return {"state": "down", "phys_state": "polling", "lid": 0, "sm_lid": 0}
    if kind == "port_disabled":
        return {"state": "down", "phys_state": "disabled", "lid": 0, "sm_lid": 0}
    if kind == "degraded_width":
        width = str(params.get("width", "2X"))
        return {"width": width, "rate_gbps": labstate.rate_gbps(str(hca["speed"]), width)}
    if kind == "degraded_rate":
        speed = str(params.get("speed") or _slower_speed(str(hca["speed"])))
        return {"speed": speed, "rate_gbps": labstate.rate_gbps(speed, str(hca["width"]))}
    if kind == "slow_link":
        factor = float(params.get("bw_factor", 0.5))
        if not 0 < factor <= 1:
            raise LabError(f"bw_factor must be in (0, 1], not {factor}")
        return {"bw_factor": factor}
    return {"flapping": True}


def _slower_speed(speed: str) -> str:
    order = ("SDR", "DDR", "QDR", "FDR", "EDR", "HDR", "NDR", "XDR")
    return order[max(0, order.index(speed) - 1)] if speed in order else "EDR"


def apply_fault(
    node: dict[str, Any], kind: str, params: dict[str, Any], fabric: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[list[str]]]:
    """Edit ``node`` (and ``fabric``) in place for one fault; return its record and podman commands.

    Raises LabError for an unknown kind, a bad target, or a fault already injected there.
    """
    if kind not in FAULT_KINDS:
        raise LabError(f"unknown fault {kind!r}", hint=f"one of: {', '.join(FAULT_KINDS)}")
    cluster, host = str(node.get("cluster", "")), str(node["hostname"])
    ctr = container_name(cluster, host) if cluster else host
    record: dict[str, Any] = {"kind": kind}
    commands: list[list[str]] = []
    if kind in PORT_FAULTS:
        hca, target = _port_target(node, params)
        record.update(target)
        edit = _port_edit(kind, hca, params)
        record["saved"] = {k: hca.get(k) for k in _PORT_FIELDS}
        record["set"] = edit
        hca.update(edit)
        if kind == "flapping":
            labstate.add_counters(hca, FLAP_ON_INJECT)  # not in "saved": clearing the fault keeps the counts
    elif kind == "gpu_missing":
        # a GPU that falls off the bus is gone from nvidia-smi and leaves Xid 79 in the kernel log
        index = _gpu_index(node, host, params)
        node["gpus"][index]["present"] = False
        record["index"] = index
        _log_kernel(node, record, xid_line(node["gpus"][index], 79))
    elif kind == "ecc_error":
        # an uncorrectable (double bit) ECC error: counted by nvidia-smi since the driver loaded, Xid 48 logged
        index = _gpu_index(node, host, params)
        count = int(params.get("count", 1))
        record.update({"index": index, "count": count})
        gpu = node["gpus"][index]
        record["saved"] = {"ecc_uncorrected_volatile": gpu.get("ecc_uncorrected_volatile", 0)}
        gpu["ecc_uncorrected_volatile"] = int(gpu.get("ecc_uncorrected_volatile", 0)) + count
        _log_kernel(node, record, xid_line(gpu, 48))
    elif kind == "nccl_slow":
        # NCCL's all-reduce runs at a fraction of what the rails carry while every link, and ib_write_bw, is healthy
        # (docs/lab-hardware-model.md: NVIDIA/nccl issue #2409); the simulated all_reduce_perf reads the factor
        factor = float(params.get("factor", 0.6))
        if not 0 < factor <= 1:
            raise LabError(f"nccl_slow factor must be in (0, 1], not {factor:g}")
        record.update({"factor": factor, "saved": {"nccl_factor": node.get("nccl_factor")}})
        node["nccl_factor"] = factor
    elif kind == "pcie_degraded":
        record.update(_pcie_degrade(node, host, params))
    elif kind == "acs_enabled":
        # the PCIe switch ports between each GPU and its HCAs redirect peer-to-peer traffic (the lab's lspci shows
        # ACSCtl ReqRedir+ CmpltRedir+ on them): a PLX/Broadcom switch's power-on default when nothing disables it
        # (and what setpci wrote to their ACS Control registers is gone, as after the reboot that brings it back)
        record["saved"] = {"pcie_acs": node.get("pcie_acs"), "acs_ctl": node.pop("acs_ctl", None)}
        node["pcie_acs"] = True
    elif kind == "memlock_low":
        kib = int(params.get("kib", 64))
        if kib < 1:
            raise LabError(f"memlock_low kib must be at least 1, not {kib}")
        record["kib"] = kib
        commands.append(["exec", ctr, "sh", "-c", MEMLOCK_WRITE, "sh", str(kib), MEMLOCK_FAULT_FILE])
    elif kind in ("dcgm_fail", "nvlink_down"):
        record.update(_gpu_fault(node, host, kind, params))
    elif kind == "peermem_missing":
        module = str(params.get("module", "nvidia_peermem"))
        record["module"] = module
        commands.append(["exec", ctr, "sh", "-c",
                         f"find /lib/modules -name '{module}.ko*' ! -name '*{HIDDEN_SUFFIX}' "
                         f"-exec mv {{}} {{}}{HIDDEN_SUFFIX} ';'"])
    elif kind == "unreachable":
        method = str(params.get("method", "pause"))
        if method not in ("pause", "sshd"):
            raise LabError(f"unreachable method must be pause or sshd, not {method!r}")
        record["method"] = method
        node["reachable"] = False
        commands.append(["pause", ctr] if method == "pause" else ["exec", ctr, "systemctl", "stop", "ssh"])
    elif kind == "sm_killed":
        unit = str(params.get("unit", (fabric or {}).get("sm", {}).get("unit", DEFAULT_SM_UNIT)))
        record["unit"] = unit
        commands.append(["exec", ctr, "systemctl", "stop", unit])
    elif kind == "hardware_swap":
        others = {
            guid
            for name, entry in (fabric or {}).get("nodes", {}).items()
            if name != host
            for h in entry.get("hcas", [])
            for guid in (h["node_guid"], h["port_guid"])
        }
        old = int(node.get("generation", 0))
        hardware.regenerate_identity(node, old + 1, others)
        record.update({"from_generation": old, "to_generation": old + 1})
        commands.append(["exec", ctr, "sh", "-c",
                         "rm -f /etc/ssh/ssh_host_* && ssh-keygen -A >/dev/null && systemctl restart ssh"])
    elif kind == "cables_swapped":
        record.update(_swap_cables(host, params, fabric))
    elif kind in ("ipoib_down", "ipoib_wrong_address"):
        record.update(_ipoib_fault(ctr, kind, params, commands))
    for existing in node.get("faults", []):
        if kind != "hardware_swap" and _identity(existing) == _identity(record):
            raise LabError(f"{host}: fault {kind} is already injected there", hint="clear it first")
    node.setdefault("faults", []).append(record)
    return record, commands


def _pcie_targets(node: dict[str, Any], host: str, device: str) -> list[dict[str, Any]]:
    """The node.json records of ``device``: ``gpuN`` is GPU N, anything else an HCA (each of its ports)."""
    if (m := re.fullmatch(r"gpu(\d+)", device)) is not None:
        gpus = [g for g in node.get("gpus", []) if int(g.get("index", -1)) == int(m.group(1))]
        if not gpus:
            raise LabError(f"{host} has no GPU {m.group(1)}")
        return gpus
    hcas = [h for h in node.get("hcas", []) if h.get("device") == device]
    if not hcas:
        raise LabError(f"{host} has no HCA {device}", hint="device=<mlx5_N|gpuN>")
    return hcas


def _pcie_degrade(node: dict[str, Any], host: str, params: dict[str, Any]) -> dict[str, Any]:
    """pcie_degraded: the GPU's or HCA's PCIe link trained at ``width`` lanes and/or ``speed`` GT/s below the x16
    32GT/s it is capable of (the lab's lspci prints it ``(downgraded)``)."""
    device = str(params.get("device") or "")
    if not device:
        raise LabError("pcie_degraded needs device=<mlx5_N|gpuN>")
    if params.get("width") is None and params.get("speed") is None:
        raise LabError("pcie_degraded needs width=<lanes> or speed=<GT/s>", hint="e.g. width=8")
    targets = _pcie_targets(node, host, device)
    saved = [{k: t.get(k) for k in ("pcie_width", "pcie_speed")} for t in targets]
    for t in targets:
        if params.get("width") is not None:
            t["pcie_width"] = int(params["width"])
        if params.get("speed") is not None:
            t["pcie_speed"] = str(params["speed"])
    return {"device": device, **{k: params[k] for k in ("width", "speed") if params.get(k) is not None},
            "saved": saved}


_NETDEV_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")
_CIDR_RE = re.compile(r"^[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}$")


def _ipoib_saved(netdev: str) -> str:
    """Where a node keeps the addresses an ipoib_wrong_address fault replaced (its own /run, gone at reboot)."""
    return f"/run/provisioner-lab-fault-{netdev}.addresses"


def _ipoib_fault(ctr: str, kind: str, params: dict[str, Any], commands: list[list[str]]) -> dict[str, Any]:
    """ipoib_down: the interface set administratively down in the node; ipoib_wrong_address: its IPv4 addresses
    replaced by ``address`` (the old ones saved in the node, put back on clear). Both act on the node's real
    (simulated-IPoIB) link, as an operator's mistake or a stray tool would."""
    netdev = str(params.get("netdev", ""))
    if not _NETDEV_RE.match(netdev):
        raise LabError(f"{kind} needs netdev=<IPoIB interface>", hint="e.g. netdev=ibp23s0 (the spec's netdev)")
    if kind == "ipoib_down":
        commands.append(["exec", ctr, "ip", "link", "set", "dev", netdev, "down"])
        return {"netdev": netdev}
    address = str(params.get("address", ""))
    if not _CIDR_RE.match(address):
        raise LabError("ipoib_wrong_address needs address=<A.B.C.D/prefix>", hint="e.g. address=10.30.0.99/24")
    saved = _ipoib_saved(netdev)
    commands.append(["exec", ctr, "sh", "-c",
                     f"ip -o -4 addr show dev {netdev} scope global | awk '{{print $4}}' > {saved} && "
                     f"ip addr flush dev {netdev} scope global && ip addr add {address} dev {netdev}"])
    return {"netdev": netdev, "address": address}


def _gpu_fault(node: dict[str, Any], host: str, kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """dcgm_fail: the simulated dcgmi fails its Inforom test on GPU ``gpu`` (default 0) with DCGM's words;
    nvlink_down: NVLink 0 of GPU ``gpu`` is down (nvidia-smi nvlink -s <inactive>, DCGM's PCIe test at level 2+),
    while the fabric state stays Completed."""
    if kind == "nvlink_down" and "gpu" not in params:
        raise LabError("nvlink_down needs gpu=<GPU index>", hint="e.g. gpu=3")
    index = _gpu_index(node, host, {"index": params.get("gpu", 0)})
    if kind == "dcgm_fail":
        node["dcgm_fail"] = {"gpu": index}
    else:
        node["nvlink_down"] = sorted({*node.get("nvlink_down", []), index})
    return {"gpu": index}


def _identity(record: dict[str, Any]) -> dict[str, Any]:
    """What names a fault's target (the saved/set values do not)."""
    return {k: v for k, v in record.items() if k not in ("saved", "set")}


def _cable_index(cables: list[dict[str, Any]], node: str, device: str, port: int) -> int:
    for i, cable in enumerate(cables):
        if cable["node"] == node and cable["device"] == device and int(cable["port"]) == port:
            return i
    raise LabError(f"no cable from {node}/{device}/{port} in fabric.json")


def _swap_cables(host: str, params: dict[str, Any], fabric: dict[str, Any] | None) -> dict[str, Any]:
    """Swap the switch ends of two cables (a miscabling at the switch side)."""
    if fabric is None or not fabric.get("cables"):
        raise LabError("the lab has no cabling to swap", hint="give lab_up switches and cables")
    try:
        device, other_host, other_device = params["device"], params["other_host"], params["other_device"]
    except KeyError as exc:
        raise LabError("cables_swapped needs device, other_host and other_device") from exc
    port, other_port = int(params.get("port", 1)), int(params.get("other_port", 1))
    cables = fabric["cables"]
    a = _cable_index(cables, host, str(device), port)
    b = _cable_index(cables, str(other_host), str(other_device), other_port)
    for key in ("switch", "switch_port"):
        cables[a][key], cables[b][key] = cables[b][key], cables[a][key]
    return {"device": device, "port": port, "other_host": other_host, "other_device": other_device,
            "other_port": other_port}


def revert_fault(
    node: dict[str, Any], record: dict[str, Any], fabric: dict[str, Any] | None = None,
) -> list[list[str]]:
    """Undo one recorded fault in place; return the podman commands that finish the undo."""
    kind = record["kind"]
    ctr = container_name(str(node["cluster"]), str(node["hostname"])) if node.get("cluster") else node["hostname"]
    commands: list[list[str]] = []
    if kind in PORT_FAULTS:
        hca = labstate.find_hca(node, record["device"], int(record["port"]))
        for key in record.get("set", {}):
            hca[key] = record["saved"].get(key)
    elif kind == "gpu_missing":
        node["gpus"][int(record["index"])]["present"] = True
    elif kind == "ecc_error":
        node["gpus"][int(record["index"])]["ecc_uncorrected_volatile"] = record["saved"]["ecc_uncorrected_volatile"]
    elif kind == "pcie_degraded":
        for target, saved in zip(_pcie_targets(node, str(node["hostname"]), str(record["device"])),
                                 record["saved"], strict=False):
            for key, value in saved.items():
                target.pop(key, None)
                if value is not None:
                    target[key] = value
    elif kind == "acs_enabled":
        for key in ("pcie_acs", "acs_ctl"):
            node.pop(key, None)
            if record["saved"].get(key) is not None:
                node[key] = record["saved"][key]
    elif kind == "nccl_slow":
        node.pop("nccl_factor", None)
        if record["saved"]["nccl_factor"] is not None:
            node["nccl_factor"] = record["saved"]["nccl_factor"]
    elif kind == "dcgm_fail":
        node.pop("dcgm_fail", None)
    elif kind == "nvlink_down":
        node["nvlink_down"] = [i for i in node.get("nvlink_down", []) if i != int(record["gpu"])]
        if not node["nvlink_down"]:
            del node["nvlink_down"]
    if record.get("logged"):  # clearing the fault is a reboot to the kernel log: its line goes
        node["kernel_log"] = [e for e in node.get("kernel_log", []) if e.get("msg") != record["logged"]]
    elif kind == "peermem_missing":
        commands.append(["exec", ctr, "sh", "-c",
                         f"for f in $(find /lib/modules -name '*{HIDDEN_SUFFIX}'); do "
                         f"mv \"$f\" \"${{f%{HIDDEN_SUFFIX}}}\"; done"])
    elif kind == "memlock_low":
        commands.append(["exec", ctr, "rm", "-f", MEMLOCK_FAULT_FILE])
    elif kind == "unreachable":
        node["reachable"] = True
        resume = ["unpause", ctr] if record["method"] == "pause" else ["exec", ctr, "systemctl", "start", "ssh"]
        commands.append(resume)
    elif kind == "sm_killed":
        commands.append(["exec", ctr, "systemctl", "start", str(record["unit"])])
    elif kind == "cables_swapped":
        _swap_cables(str(node["hostname"]), record, fabric)  # swapping again restores
    elif kind == "ipoib_down":
        commands.append(["exec", ctr, "ip", "link", "set", "dev", str(record["netdev"]), "up"])
    elif kind == "ipoib_wrong_address":
        dev, saved = str(record["netdev"]), _ipoib_saved(str(record["netdev"]))
        commands.append(["exec", ctr, "sh", "-c",
                         f"ip addr flush dev {dev} scope global && while read -r a; do ip addr add \"$a\" dev {dev}; "
                         f"done < {saved} && rm -f {saved}"])
    # hardware_swap is not undone: a replaced board stays replaced; clearing only forgets it.
    node["faults"] = [f for f in node.get("faults", []) if f is not record]
    return commands


def _matches(record: dict[str, Any], kind: str | None, params: dict[str, Any]) -> bool:
    if kind is not None and record["kind"] != kind:
        return False
    return all(str(record.get(k)) == str(v) for k, v in params.items())


def inject(root: str, host: str, kind: str, *, runner: Runner | None = None, **params: Any) -> dict[str, Any]:
    """Inject one fault into ``host`` (a node, or a switch for :data:`SWITCH_FAULTS`) of the lab at ``root``."""
    if kind in SWITCH_FAULTS:
        return inject_switch(root, host, kind, **params)
    if is_switch(root, host):
        raise LabError(f"{host} is a switch: its faults are {', '.join(SWITCH_FAULTS)}")
    node = labstate.load_node(root, host)
    fabric = _load_fabric(root)
    before = copy.deepcopy(fabric)
    record, commands = apply_fault(node, kind, params, fabric)
    if kind == "peermem_missing":
        module = record["module"]
        labstate.save_modules(root, host, [m for m in labstate.load_modules(root, host) if m != module])
    # The state is written before the container commands run: once a command has taken effect (an SM stopped,
    # a container paused) the simulated daemons react at once (the standby SM sweeps every port), and a node.json
    # read before that and saved after it would undo what they wrote.
    labstate.save_node(root, node)
    if fabric is not None and (fabric != before or kind == "hardware_swap"):
        if kind == "hardware_swap":
            fabric.setdefault("nodes", {})[host] = hardware.fabric_node_entry(node)
        labstate.save_fabric(root, fabric)
    try:
        for command in commands:
            (runner or _podman_runner)(command)
    except LabError:
        if kind != "hardware_swap":  # the fault did not take: forget it (a new identity cannot be undone)
            clear(root, host, kind, runner=lambda _cmd: None, **_identity_params(record))
        raise
    return record


def _identity_params(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in _identity(record).items() if k != "kind"}


def clear(root: str, host: str, kind: str | None = None, *, runner: Runner | None = None,
          **params: Any) -> list[dict[str, Any]]:
    """Clear the faults of ``host`` that match ``kind`` and ``params`` (all when neither); newest first."""
    if is_switch(root, host):
        return clear_switch(root, host, kind, **params)
    node = labstate.load_node(root, host)
    fabric = _load_fabric(root)
    before = copy.deepcopy(fabric)
    cleared: list[dict[str, Any]] = []
    commands: list[list[str]] = []
    for record in reversed(list(node.get("faults", []))):
        if not _matches(record, kind, params):
            continue
        commands += revert_fault(node, record, fabric)
        cleared.append(record)
    if cleared:  # state first, then the commands (see inject)
        labstate.save_node(root, node)
        if fabric is not None and fabric != before:
            labstate.save_fabric(root, fabric)
    for command in commands:
        (runner or _podman_runner)(command)
    return cleared


def reset_counters(root: str, host: str, device: str | None = None, port: int | None = None) -> int:
    """Zero the port counters of ``host`` (one port, one device or all), as ``perfquery -R`` does on a node.

    Clearing a fault leaves the counts it caused (a replaced cable does not reset the HCA's counters);
    an operator clears them after the fix, and so does a test before the next one. Returns the number of
    ports reset.
    """
    with labstate.node_lock(root, host):
        node = labstate.load_node(root, host)
        ports = [h for h in node.get("hcas", []) if (device is None or h.get("device") == device)
                 and (port is None or int(h.get("port", 1)) == port)]
        for hca in ports:
            hca["counters"] = dict.fromkeys(labstate.PORT_COUNTERS, 0)
        labstate.save_node(root, node)
    return len(ports)


def list_faults(root: str, host: str) -> list[dict[str, Any]]:
    """The faults recorded for ``host``, a node or a switch (without the saved values)."""
    if is_switch(root, host):
        fabric = _load_fabric(root) or {}
        records = [f for f in fabric.get("switch_faults", []) if f.get("switch") == host]
    else:
        records = labstate.load_node(root, host).get("faults", [])
    return [{k: v for k, v in f.items() if k not in ("saved", "set", "saved_ports")} for f in records]


# ---------------------------------------------------------------- switch faults


def is_switch(root: str, name: str) -> bool:
    """Whether ``name`` is a switch of the lab's fabric.json (and no node)."""
    fabric = _load_fabric(root)
    return bool(fabric) and any(str(s.get("name")) == name for s in (fabric or {}).get("switches", [])) \
        and not os.path.isfile(os.path.join(labstate.node_dir(root, name), labstate.NODE_FILE))


def _link_at(fabric: dict[str, Any], switch: str, port: int) -> tuple[dict[str, Any], tuple[str, int]]:
    """The switch-to-switch link at ``switch`` port ``port`` and its far end; LabError naming the links there are."""
    for link in fabric.get("switch_links", []) or []:
        if (str(link.get("switch")), int(link.get("port", 0))) == (switch, port):
            return link, (str(link.get("peer")), int(link.get("peer_port", 0)))
        if (str(link.get("peer")), int(link.get("peer_port", 0))) == (switch, port):
            return link, (str(link.get("switch")), int(link.get("port", 0)))
    mine = sorted(int(lk["port"]) if lk.get("switch") == switch else int(lk["peer_port"])
                  for lk in fabric.get("switch_links", []) or [] if switch in (lk.get("switch"), lk.get("peer")))
    raise LabError(f"{switch} port {port} has no switch-to-switch link",
                   hint=f"its links are on ports {', '.join(map(str, mine))}" if mine else
                   f"{switch} has no switch-to-switch links (give the spec's leaves uplinks:)")


def apply_switch_fault(fabric: dict[str, Any], nodes: dict[str, dict[str, Any]], switch: str, kind: str,
                       params: dict[str, Any]) -> dict[str, Any]:
    """Edit ``fabric`` (and the ``nodes`` cabled to the switch, for switch_down) for one switch fault.

    ``nodes`` maps host -> node.json of every node (only the edited ones need saving). Returns the record.
    """
    if kind not in SWITCH_FAULTS:
        raise LabError(f"{kind} is no switch fault", hint=f"one of: {', '.join(SWITCH_FAULTS)}")
    sw = next((s for s in fabric.get("switches", []) if str(s.get("name")) == switch), None)
    if sw is None:
        raise LabError(f"no switch {switch!r} in the lab")
    record: dict[str, Any] = {"kind": kind, "switch": switch}
    if kind in ("uplink_down", "uplink_degraded"):
        if "port" not in params:
            raise LabError(f"{kind} needs port=<the switch port of the link>")
        port = int(params["port"])
        link, far = _link_at(fabric, switch, port)
        record["port"] = port
        if kind == "uplink_down":
            edit: dict[str, Any] = {"state": "down"}
            counts = LINK_DOWN_COUNTS
        else:
            width = str(params.get("width") or ("2X" if not params.get("speed") else link.get("width", "4X")))
            speed = str(params.get("speed") or link.get("speed", "NDR"))
            labstate.rate_gbps(speed, width)  # a known speed and width, or ValueError
            edit = {"width": width, "speed": speed}
            counts = LINK_RETRAIN_COUNTS
            record.update({k: v for k, v in (("width", params.get("width")), ("speed", params.get("speed"))) if v})
        record["saved"] = {k: link.get(k) for k in edit}
        record["set"] = edit
        record["peer"], record["peer_port"] = far
        link.update(edit)
        for end in ((switch, port), far):
            fabsim_pma.bump_switch_counters(fabric, end[0], end[1], counts)
    else:
        if sw.get("down"):
            raise LabError(f"{switch}: fault switch_down is already injected there", hint="clear it first")
        sw["down"] = True
        saved_ports = []
        for cable in fabric.get("cables", []) or []:
            if cable.get("switch") != switch or cable.get("node") not in nodes:
                continue
            hca = labstate.find_hca(nodes[cable["node"]], str(cable["device"]), int(cable.get("port", 1)))
            edit = {"state": "down", "phys_state": "polling", "lid": 0, "sm_lid": 0}
            saved_ports.append({"host": cable["node"], "device": cable["device"], "port": int(cable.get("port", 1)),
                                "saved": {k: hca.get(k) for k in edit}})
            hca.update(edit)
        record["saved_ports"] = saved_ports
        for link in fabric.get("switch_links", []) or []:
            if link.get("state") == "down":
                continue
            if link.get("switch") == switch:
                fabsim_pma.bump_switch_counters(fabric, str(link["peer"]), int(link["peer_port"]), LINK_DOWN_COUNTS)
            elif link.get("peer") == switch:
                fabsim_pma.bump_switch_counters(fabric, str(link["switch"]), int(link["port"]), LINK_DOWN_COUNTS)
    for existing in fabric.get("switch_faults", []):
        if _identity(existing) == _identity(record):
            raise LabError(f"{switch}: fault {kind} is already injected there", hint="clear it first")
    fabric.setdefault("switch_faults", []).append(record)
    return record


def revert_switch_fault(fabric: dict[str, Any], nodes: dict[str, dict[str, Any]], record: dict[str, Any]) -> None:
    """Undo one recorded switch fault in place (the counters it raised stay, as after a real repair)."""
    if record["kind"] == "switch_down":
        for sw in fabric.get("switches", []):
            if sw.get("name") == record["switch"]:
                sw.pop("down", None)
        for saved in record.get("saved_ports", []):
            if saved["host"] in nodes:
                labstate.find_hca(nodes[saved["host"]], saved["device"], int(saved["port"])).update(saved["saved"])
    else:
        link, _ = _link_at(fabric, str(record["switch"]), int(record["port"]))
        for key in record.get("set", {}):
            link[key] = record["saved"].get(key)
            if link[key] is None:
                link.pop(key)
    fabric["switch_faults"] = [f for f in fabric.get("switch_faults", []) if f is not record]


def _switch_state(root: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    fabric = _load_fabric(root)
    if fabric is None:
        raise LabError("the lab has no fabric.json (is it up?)")
    return fabric, {h: labstate.load_node(root, h) for h in lab_devices(root)}


def inject_switch(root: str, switch: str, kind: str, **params: Any) -> dict[str, Any]:
    """Inject one switch fault into the lab at ``root``; return its record."""
    fabric, nodes = _switch_state(root)
    before = copy.deepcopy(nodes)
    try:
        record = apply_switch_fault(fabric, nodes, switch, kind, dict(params))
    except ValueError as exc:
        raise LabError(f"{kind}: {exc}") from None
    for host, node in nodes.items():
        if node != before[host]:
            labstate.save_node(root, node)
    labstate.save_fabric(root, fabric)
    return record


def clear_switch(root: str, switch: str, kind: str | None = None, **params: Any) -> list[dict[str, Any]]:
    """Clear the faults of ``switch`` that match ``kind`` and ``params`` (all when neither); newest first."""
    fabric, nodes = _switch_state(root)
    before = copy.deepcopy(nodes)
    cleared = []
    for record in reversed(list(fabric.get("switch_faults", []))):
        if record.get("switch") == switch and _matches(record, kind, params):
            revert_switch_fault(fabric, nodes, record)
            cleared.append(record)
    if cleared:
        for host, node in nodes.items():
            if node != before[host]:
                labstate.save_node(root, node)
        labstate.save_fabric(root, fabric)
    return cleared


def reset_switch_counters(root: str, switch: str | None = None) -> int:
    """Zero the port counters of one switch (or all), as ``ibqueryerrors -k -K`` would; returns switches reset."""
    fabric = _load_fabric(root) or {}
    done = 0
    for sw in fabric.get("switches", []):
        if switch is None or sw.get("name") == switch:
            sw.pop("counters", None)
            done += 1
    if done:
        labstate.save_fabric(root, fabric)
    return done


def _load_fabric(root: str) -> dict[str, Any] | None:
    try:
        return labstate.load_fabric(root)
    except FileNotFoundError:
        return None


# ---------------------------------------------------------------- fault lists (``--faults FILE`` / ``--file FILE``)

_DEVICE_RE = re.compile(r"^[A-Za-z0-9_]{1,32}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_MODULE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_UNIT_RE = re.compile(r"^[A-Za-z0-9@._-]{1,128}$")
_PORT_PARAMS = {"device": "device", "port": "int"}
PCIE_WIDTHS = ("1", "2", "4", "8", "16")
PCIE_SPEEDS = ("2.5", "5", "8", "16", "32")
"""What a pcie_degraded link may train at: lanes, and GT/s of PCIe 1.0 to 5.0."""
PARAMS: dict[str, dict[str, str]] = {
    "port_down": _PORT_PARAMS,
    "port_disabled": _PORT_PARAMS,
    "flapping": _PORT_PARAMS,
    "degraded_width": {**_PORT_PARAMS, "width": "width"},
    "degraded_rate": {**_PORT_PARAMS, "speed": "speed"},
    "slow_link": {**_PORT_PARAMS, "bw_factor": "factor"},
    "gpu_missing": {"index": "int"},
    "ecc_error": {"index": "int", "count": "int"},
    "peermem_missing": {"module": "module"},
    "nccl_slow": {"factor": "factor"},
    "pcie_degraded": {"device": "device", "width": "pcie_width", "speed": "pcie_speed"},
    "acs_enabled": {},
    "memlock_low": {"kib": "int"},
    "dcgm_fail": {"gpu": "int"},
    "nvlink_down": {"gpu": "int"},
    "unreachable": {"method": "method"},
    "sm_killed": {"unit": "unit"},
    "hardware_swap": {},
    "ipoib_down": {"netdev": "netdev"},
    "ipoib_wrong_address": {"netdev": "netdev", "address": "cidr"},
    "cables_swapped": {**_PORT_PARAMS, "other_host": "host", "other_device": "device", "other_port": "int"},
    "uplink_down": {"port": "int"},
    "uplink_degraded": {"port": "int", "width": "width", "speed": "speed"},
    "switch_down": {},
}
"""The parameters each fault kind takes, and the kind of value each one is (see :func:`check_params`)."""
_REQUIRED = {"device": {k for k, v in PARAMS.items() if "device" in v},
             "netdev": {"ipoib_down", "ipoib_wrong_address"}, "address": {"ipoib_wrong_address"},
             "gpu": {"nvlink_down"}}


@dataclass(frozen=True)
class FaultEntry:
    """One entry of a fault list: which node, which fault, its parameters, and where it was written."""

    node: str
    kind: str
    params: dict[str, Any]
    where: str
    """``FILE: faults[i] (line n)``, for error messages."""


def _value(kind: str, value: object) -> object:
    """``value`` converted to what a parameter of this value kind holds; ValueError when it cannot be."""
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).isdigit():
            raise ValueError("a whole number")
        return int(value)
    if kind == "factor":
        number = float(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else -1.0
        if not 0 < number <= 1:
            raise ValueError("a number in (0, 1]")
        return number
    choices: dict[str, tuple[str, ...]] = {
        "width": tuple(labstate.WIDTH_LANES), "speed": tuple(labstate.LANE_GBPS), "method": ("pause", "sshd"),
        "pcie_width": PCIE_WIDTHS, "pcie_speed": PCIE_SPEEDS}
    if kind in choices:
        if str(value) not in choices[kind]:
            raise ValueError("one of " + ", ".join(choices[kind]))
        return str(value)
    pattern = {"device": _DEVICE_RE, "host": _HOST_RE, "module": _MODULE_RE, "unit": _UNIT_RE,
               "netdev": _NETDEV_RE, "cidr": _CIDR_RE}[kind]
    if not isinstance(value, str) or not pattern.match(value):
        raise ValueError(f"a name matching {pattern.pattern}")
    return value


def check_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of one fault, checked and typed; LabError naming the first bad one.

    Every value that can reach a command line inside a node (module, unit) is checked against a strict
    pattern here, before anything runs.
    """
    if kind not in PARAMS:
        raise LabError(f"unknown fault kind {kind!r}", hint=f"one of: {', '.join(FAULT_KINDS)}")
    allowed = PARAMS[kind]
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key not in allowed:
            known = ", ".join(allowed) or "none"
            raise LabError(f"{kind} takes no parameter {key!r}", hint=f"its parameters: {known}")
        try:
            out[key] = _value(allowed[key], value)
        except ValueError as exc:
            raise LabError(f"{kind} parameter {key}={value!r} is not {exc}") from None
    missing = [p for p, kinds in _REQUIRED.items() if kind in kinds and p not in out]
    if kind in ("uplink_down", "uplink_degraded") and "port" not in out:
        missing.append("port")
    if kind == "cables_swapped":
        missing += [p for p in ("other_host", "other_device") if p not in out]
    if missing:
        raise LabError(f"{kind} needs {', '.join(missing)}")
    return out


def _yaml_entries(path: Path) -> list[tuple[int, object]]:
    """(line, value) of every item of the file's fault list: a bare YAML list or a mapping's ``faults:``."""
    text = read_user_text(path, "a fault list")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from None
    node, items = root, data
    if isinstance(root, yaml.MappingNode) and isinstance(data, dict):
        if "faults" not in data:
            raise UsageError(f"{path}: no 'faults:' list", hint="write faults: [{node: gpu01, kind: port_down, ...}]")
        node = next(v for k, v in root.value if k.value == "faults")
        items = data["faults"]
    if not isinstance(node, yaml.SequenceNode) or not isinstance(items, list):
        raise UsageError(f"{path}: the fault list must be a YAML list of {{node, kind, <params>}} entries")
    return [(item.start_mark.line + 1, value) for item, value in zip(node.value, items, strict=True)]


def load_fault_list(path: Path, devices: dict[str, set[str]], switches: frozenset[str] | set[str] = frozenset(),
                    ) -> list[FaultEntry]:
    """Read and check a fault list against the lab's nodes (host -> its HCA devices) and switches; one-line
    UsageError.

    Nothing is applied here: every entry is checked first (kind, node, parameter names and values,
    devices that exist on that node), and the first problem is reported with the file, the entry's
    index and its line.
    """
    entries: list[FaultEntry] = []
    for index, (line, raw) in enumerate(_yaml_entries(path)):
        where = f"{path}: faults[{index}] (line {line})"
        if not isinstance(raw, dict):
            raise UsageError(f"{where}: an entry must be a mapping {{node, kind, <params>}}")
        params = {str(k): v for k, v in raw.items() if k not in ("node", "kind")}
        node, kind = raw.get("node"), raw.get("kind")
        if not isinstance(node, str) or not isinstance(kind, str):
            raise UsageError(f"{where}: an entry needs node: and kind:")
        if (kind in SWITCH_FAULTS) != (node in switches) or (node not in devices and node not in switches):
            if node in switches or kind in SWITCH_FAULTS:
                raise UsageError(f"{where}: {kind} on {node}: switch faults ({', '.join(SWITCH_FAULTS)}) target a "
                                 "switch, the others a node", hint=f"lab switches: {', '.join(sorted(switches))}")
            raise UsageError(f"{where}: unknown node {node!r}", hint=f"lab nodes: {', '.join(sorted(devices))}")
        try:
            checked = check_params(kind, params)
        except LabError as exc:
            raise UsageError(f"{where}: {exc}") from None
        for key, host in (("device", node), ("other_device", checked.get("other_host", node))):
            if key in checked and checked[key] not in devices.get(str(host), set()):
                raise UsageError(f"{where}: {host} has no HCA {checked[key]!r}",
                                 hint=f"its HCAs: {', '.join(sorted(devices.get(str(host), set()))) or 'none'}")
        if "other_host" in checked and checked["other_host"] not in devices:
            raise UsageError(f"{where}: unknown node {checked['other_host']!r}")
        entries.append(FaultEntry(node, kind, checked, where))
    return entries


def lab_devices(root: str) -> dict[str, set[str]]:
    """Host -> HCA devices of the running lab at ``root`` (from node.json)."""
    base = Path(root) / "nodes"
    hosts = sorted(p.name for p in base.iterdir() if (p / labstate.NODE_FILE).is_file()) if base.is_dir() else []
    return {h: {str(x["device"]) for x in labstate.load_node(root, h).get("hcas", [])} for h in hosts}


def lab_switches(root: str) -> set[str]:
    """The switches of the running lab at ``root`` (from fabric.json)."""
    return {str(s.get("name")) for s in (_load_fabric(root) or {}).get("switches", [])}


def rehearse(root: str, entries: list[FaultEntry]) -> None:
    """Apply the whole list to copies of the lab state, so a conflict (a fault injected twice, a cable that
    is not there) is reported before anything changes; UsageError naming the entry."""
    nodes: dict[str, dict[str, Any]] = {}
    fabric = copy.deepcopy(_load_fabric(root))
    for entry in entries:
        try:
            if entry.kind in SWITCH_FAULTS:
                every = {h: nodes.setdefault(h, copy.deepcopy(labstate.load_node(root, h))) for h in lab_devices(root)}
                apply_switch_fault(fabric or {}, every, entry.node, entry.kind, dict(entry.params))
                continue
            node = nodes.setdefault(entry.node, copy.deepcopy(labstate.load_node(root, entry.node)))
            apply_fault(node, entry.kind, dict(entry.params), fabric)
        except LabError as exc:
            raise UsageError(f"{entry.where}: {exc}") from None


def apply_fault_list(root: str, entries: list[FaultEntry], *, runner: Runner | None = None) -> list[dict[str, Any]]:
    """Rehearse the list, then inject each fault in order; return the records."""
    rehearse(root, entries)
    return [inject(root, e.node, e.kind, runner=runner, **e.params) for e in entries]
