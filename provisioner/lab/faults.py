"""Fault injection into a running lab: edits of the simulated state that take effect live.

Most faults are edits of a node's ``node.json`` (the sysfs tree is rewritten with it,
so Debian's real ``ibstat`` inside the container shows the change at once); some edit
``fabric.json`` (swapped cables) or act on the container (pause it, stop a unit,
hide a module file, regenerate SSH host keys).  Every injected fault is recorded in
the node's ``faults`` list together with the values it replaced, so :func:`clear`
restores exactly what was there and ``provision lab status`` can list them.

The pure part (:func:`apply_fault`, :func:`revert_fault`) works on dicts and returns
the container commands to run, so it is unit-tested without podman.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from provisioner.errors import LabError
from provisioner.lab import hardware
from provisioner.lab.names import container_name
from provisioner.lab.simtools import labstate

Runner = Callable[[list[str]], None]
"""Runs one podman command (arguments after ``podman``)."""

PORT_FAULTS = ("port_down", "port_disabled", "degraded_width", "degraded_rate", "slow_link", "flapping")
NODE_FAULTS = ("gpu_missing", "peermem_missing", "unreachable", "sm_killed", "hardware_swap")
FABRIC_FAULTS = ("cables_swapped",)
FAULT_KINDS = PORT_FAULTS + NODE_FAULTS + FABRIC_FAULTS

_PORT_FIELDS = ("state", "phys_state", "lid", "sm_lid", "width", "speed", "rate_gbps", "bw_factor", "flapping")
HIDDEN_SUFFIX = ".lab-hidden"
DEFAULT_SM_UNIT = "opensmd"
"""The unit of NVIDIA's opensm package (DOCA/MLNX_OFED), which the lab's stand-in installs."""


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
    elif kind == "gpu_missing":
        gpus = node.get("gpus", [])
        if not gpus:
            raise LabError(f"{host} has no GPUs to lose")
        index = int(params.get("index", len(gpus) - 1))
        if not 0 <= index < len(gpus):
            raise LabError(f"{host} has no GPU {index} (0..{len(gpus) - 1})")
        gpus[index]["present"] = False
        record["index"] = index
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
    for existing in node.get("faults", []):
        if kind != "hardware_swap" and _identity(existing) == _identity(record):
            raise LabError(f"{host}: fault {kind} is already injected there", hint="clear it first")
    node.setdefault("faults", []).append(record)
    return record, commands


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
    elif kind == "peermem_missing":
        commands.append(["exec", ctr, "sh", "-c",
                         f"for f in $(find /lib/modules -name '*{HIDDEN_SUFFIX}'); do "
                         f"mv \"$f\" \"${{f%{HIDDEN_SUFFIX}}}\"; done"])
    elif kind == "unreachable":
        node["reachable"] = True
        resume = ["unpause", ctr] if record["method"] == "pause" else ["exec", ctr, "systemctl", "start", "ssh"]
        commands.append(resume)
    elif kind == "sm_killed":
        commands.append(["exec", ctr, "systemctl", "start", str(record["unit"])])
    elif kind == "cables_swapped":
        _swap_cables(str(node["hostname"]), record, fabric)  # swapping again restores
    # hardware_swap is not undone: a replaced board stays replaced; clearing only forgets it.
    node["faults"] = [f for f in node.get("faults", []) if f is not record]
    return commands


def _matches(record: dict[str, Any], kind: str | None, params: dict[str, Any]) -> bool:
    if kind is not None and record["kind"] != kind:
        return False
    return all(str(record.get(k)) == str(v) for k, v in params.items())


def inject(root: str, host: str, kind: str, *, runner: Runner | None = None, **params: Any) -> dict[str, Any]:
    """Inject one fault into ``host`` of the lab at ``root``; return its record."""
    node = labstate.load_node(root, host)
    fabric = _load_fabric(root)
    before = copy.deepcopy(fabric)
    record, commands = apply_fault(node, kind, params, fabric)
    if kind == "peermem_missing":
        module = record["module"]
        labstate.save_modules(root, host, [m for m in labstate.load_modules(root, host) if m != module])
    for command in commands:
        (runner or _podman_runner)(command)
    labstate.save_node(root, node)
    if fabric is not None and (fabric != before or kind == "hardware_swap"):
        if kind == "hardware_swap":
            fabric.setdefault("nodes", {})[host] = hardware.fabric_node_entry(node)
        labstate.save_fabric(root, fabric)
    return record


def clear(root: str, host: str, kind: str | None = None, *, runner: Runner | None = None,
          **params: Any) -> list[dict[str, Any]]:
    """Clear the faults of ``host`` that match ``kind`` and ``params`` (all when neither); newest first."""
    node = labstate.load_node(root, host)
    fabric = _load_fabric(root)
    before = copy.deepcopy(fabric)
    cleared: list[dict[str, Any]] = []
    for record in reversed(list(node.get("faults", []))):
        if not _matches(record, kind, params):
            continue
        for command in revert_fault(node, record, fabric):
            (runner or _podman_runner)(command)
        cleared.append(record)
    if cleared:
        labstate.save_node(root, node)
        if fabric is not None and fabric != before:
            labstate.save_fabric(root, fabric)
    return cleared


def list_faults(root: str, host: str) -> list[dict[str, Any]]:
    """The faults recorded for ``host`` (without the saved values)."""
    node = labstate.load_node(root, host)
    return [{k: v for k, v in f.items() if k not in ("saved", "set")} for f in node.get("faults", [])]


def _load_fabric(root: str) -> dict[str, Any] | None:
    try:
        return labstate.load_fabric(root)
    except FileNotFoundError:
        return None
