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
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import LabError, UsageError
from provisioner.lab import hardware
from provisioner.lab.names import container_name
from provisioner.lab.simtools import labstate

Runner = Callable[[list[str]], None]
"""Runs one podman command (arguments after ``podman``)."""

PORT_FAULTS = ("port_down", "port_disabled", "degraded_width", "degraded_rate", "slow_link", "flapping")
NODE_FAULTS = ("gpu_missing", "ecc_error", "peermem_missing", "unreachable", "sm_killed", "hardware_swap")
FABRIC_FAULTS = ("cables_swapped",)
FAULT_KINDS = PORT_FAULTS + NODE_FAULTS + FABRIC_FAULTS

_PORT_FIELDS = ("state", "phys_state", "lid", "sm_lid", "width", "speed", "rate_gbps", "bw_factor", "flapping")
FLAP_ON_INJECT = {"link_downed": 1, "link_error_recovery": 1, "symbol_error": 12}
"""What a port that has started to flap shows in its counters when the fault is injected: it went down
and came back once. Every traffic run over it adds more (``fabsim_common.flap_counters``)."""
HIDDEN_SUFFIX = ".lab-hidden"
DEFAULT_SM_UNIT = "opensmd"
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
    elif kind == "ecc_error":
        node["gpus"][int(record["index"])]["ecc_uncorrected_volatile"] = record["saved"]["ecc_uncorrected_volatile"]
    if record.get("logged"):  # clearing the fault is a reboot to the kernel log: its line goes
        node["kernel_log"] = [e for e in node.get("kernel_log", []) if e.get("msg") != record["logged"]]
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
    """The faults recorded for ``host`` (without the saved values)."""
    node = labstate.load_node(root, host)
    return [{k: v for k, v in f.items() if k not in ("saved", "set")} for f in node.get("faults", [])]


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
    "unreachable": {"method": "method"},
    "sm_killed": {"unit": "unit"},
    "hardware_swap": {},
    "cables_swapped": {**_PORT_PARAMS, "other_host": "host", "other_device": "device", "other_port": "int"},
}
"""The parameters each fault kind takes, and the kind of value each one is (see :func:`check_params`)."""
_REQUIRED = {"device": {k for k, v in PARAMS.items() if "device" in v}}


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
        "width": tuple(labstate.WIDTH_LANES), "speed": tuple(labstate.LANE_GBPS), "method": ("pause", "sshd")}
    if kind in choices:
        if str(value) not in choices[kind]:
            raise ValueError("one of " + ", ".join(choices[kind]))
        return str(value)
    pattern = {"device": _DEVICE_RE, "host": _HOST_RE, "module": _MODULE_RE, "unit": _UNIT_RE}[kind]
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
    if kind == "cables_swapped":
        missing += [p for p in ("other_host", "other_device") if p not in out]
    if missing:
        raise LabError(f"{kind} needs {', '.join(missing)}")
    return out


def _yaml_entries(path: Path) -> list[tuple[int, object]]:
    """(line, value) of every item of the file's fault list: a bare YAML list or a mapping's ``faults:``."""
    try:
        text = path.read_text(encoding="utf-8")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the fault list ({exc.__class__.__name__}: {exc})") from None
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


def load_fault_list(path: Path, devices: dict[str, set[str]]) -> list[FaultEntry]:
    """Read and check a fault list against the lab's nodes (host -> its HCA devices); one-line UsageError.

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
        if node not in devices:
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


def rehearse(root: str, entries: list[FaultEntry]) -> None:
    """Apply the whole list to copies of the lab state, so a conflict (a fault injected twice, a cable that
    is not there) is reported before anything changes; UsageError naming the entry."""
    nodes: dict[str, dict[str, Any]] = {}
    fabric = copy.deepcopy(_load_fabric(root))
    for entry in entries:
        node = nodes.setdefault(entry.node, copy.deepcopy(labstate.load_node(root, entry.node)))
        try:
            apply_fault(node, entry.kind, dict(entry.params), fabric)
        except LabError as exc:
            raise UsageError(f"{entry.where}: {exc}") from None


def apply_fault_list(root: str, entries: list[FaultEntry], *, runner: Runner | None = None) -> list[dict[str, Any]]:
    """Rehearse the list, then inject each fault in order; return the records."""
    rehearse(root, entries)
    return [inject(root, e.node, e.kind, runner=runner, **e.params) for e in entries]
