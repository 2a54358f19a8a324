"""Read a cluster.yaml into an expanded Cluster, collecting every problem with its file:line:col.

Stages, each adding diagnostics and never stopping at the first problem: YAML (syntax, duplicate keys) →
schema (pydantic, unknown keys with "did you mean") → expansion (hostlists, references, duplicates) →
design rules (provisioner.spec.rules). Only a file that cannot be read at all is an exception.
"""

from __future__ import annotations

import copy
import difflib
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path as FsPath
from typing import Any

from pydantic import BaseModel, ValidationError

from provisioner.errors import SpecInvalid
from provisioner.gcpause import without_gc
from provisioner.spec import hostlist
from provisioner.spec.catalog import GPU_MODELS, RATE_NAMES
from provisioner.spec.cluster import CableX, Cluster, Node, Port, SwitchX
from provisioner.spec.diagnostics import Diagnostic, Severity, fold
from provisioner.spec.models import Cable, NodeGroup, Profile, Spec, Switch
from provisioner.spec.reserved import ReservedName
from provisioner.spec.yamlload import Located, Path, load_yaml
from provisioner.userfile import MAX_USER_FILE_BYTES, read_user_text

MAX_SPEC_BYTES = MAX_USER_FILE_BYTES


@dataclass
class LoadResult:
    cluster: Cluster | None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]


class _Report:
    """Collects diagnostics against one located document (and the overlay merged onto it, if any).

    A path given by the overlay is reported at the overlay's file:line, everything else at the spec's."""

    def __init__(self, located: Located | None, file: str, overlay: Located | None = None) -> None:
        self.located = located
        self.file = file
        self.overlay = overlay
        self.items: list[Diagnostic] = []

    def where(self, path: Path, *, key: bool = False) -> tuple[str, int, int]:
        if self.overlay is not None and _depth(self.overlay, path, key) >= max(1, _depth(self.located, path, key)):
            m = self.overlay.mark(path, key=key)
            return self.overlay.file, m.line, m.col
        if self.located is None:
            return self.file, 1, 1
        m = self.located.mark(path, key=key)
        return self.file, m.line, m.col

    def add(self, path: Path, rule: str, message: str, hint: str = "", *,
            severity: Severity = "error", key: bool = False) -> None:
        file, line, col = self.where(path, key=key)
        self.items.append(Diagnostic(file, line, col, rule, severity, message, hint))


def did_you_mean(word: str, choices: Iterable[str], otherwise: str, cutoff: float = 0.6) -> str:
    """The hint for a name that is not among ``choices``: the closest one (difflib) or ``otherwise``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f"did you mean '{close[0]}'?" if close else otherwise


def _depth(located: Located | None, path: Path, key: bool) -> int:
    """How much of `path` the document itself holds (the longest prefix it has a position for)."""
    if located is None:
        return 0
    for n in range(len(path), 0, -1):
        p = tuple(path[:n])
        if p in located.marks or (key and p in located.key_marks):
            return n
    return 0


def rate_gbps(value: int | str) -> float:
    """A rate given as Gb/s or by name (NDR) in Gb/s."""
    return float(RATE_NAMES[value]) if isinstance(value, str) else float(value)


# --- schema errors ---------------------------------------------------------------------------------------------
def _unwrap(annotation: Any) -> list[Any]:
    """The model classes an annotation can hold (through Optional, list, dict, Annotated)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, dict, tuple):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out.extend(_unwrap(arg))
        return out
    return [annotation]


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the field at `loc` (loc ends with that field's name)."""
    current: type[BaseModel] = Spec
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        finfo = current.model_fields.get(str(part))
        if finfo is None:
            # a dict key (profile name): stay on the dict's value type found before
            continue
        candidates = [c for c in _unwrap(finfo.annotation) if isinstance(c, type) and issubclass(c, BaseModel)]
        if not candidates:
            return None
        current = candidates[0]
    return current


def _union_errors(errors: list[Any]) -> list[Any]:
    """A string that fails a `bool | int | str` field reports why the string is wrong, not that it is no bool."""
    def member(err: Any) -> str | None:
        last = err["loc"][-1] if err["loc"] else None
        return last if isinstance(last, str) and (last in ("bool", "int", "float") or "str" in last) else None

    def key(err: Any) -> tuple[Any, ...]:
        return tuple(err["loc"][:-1])

    stringy = {key(e) for e in errors if member(e) and "str" in str(member(e)) and isinstance(e.get("input"), str)}
    return [e for e in errors if not (member(e) in ("bool", "int", "float") and key(e) in stringy)]


def _schema_diagnostics(exc: ValidationError, rep: _Report, data: Any) -> None:
    for err in _union_errors(list(exc.errors())):
        loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
        if loc and loc[-1] == "[key]":  # a dict key failed (a site_vars name): point at the key
            path = tuple(loc[:-1])
            error = err.get("ctx", {}).get("error")
            if isinstance(error, ReservedName):
                rep.add(path, "SPEC-RESERVED-VAR", str(error),
                        "site_vars set role tunables only; connection settings come from the spec's ssh:", key=True)
            else:
                msg = str(err["msg"]).removeprefix("Value error, ")
                rep.add(path, "SPEC-SCHEMA", f"key '{path[-1]}': {msg}", "", key=True)
            continue
        # pydantic adds union member names (e.g. 'int', "literal['SDR',...]") to loc; drop what the data lacks
        data_loc: list[str | int] = []
        node: Any = data
        for part in loc:
            in_dict = isinstance(node, dict) and part in node
            in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
            if in_dict or in_list:
                data_loc.append(part)
                node = node[part]
            elif err["type"] in ("missing", "extra_forbidden") and part == loc[-1]:
                data_loc.append(part)
        path = tuple(data_loc)
        where = ".".join(str(p) for p in path) or "(top)"
        kind = err["type"]
        if kind == "extra_forbidden":
            key = str(path[-1]) if path else "?"
            model = _model_at(path)
            known = sorted(model.model_fields) if model else []
            if key.lower() in {"password", "secret", "passwd", "token", "api_key"}:
                rep.add(path, "SPEC-SECRET-INLINE", f"secret '{key}' written in the spec at {where}",
                        "credentials come from a file or ansible-vault: credentials: {file: path}", key=True)
                continue
            hint = did_you_mean(key, known, f"known keys here: {', '.join(known)}" if known else "remove it")
            rep.add(path, "SPEC-UNKNOWN-KEY", f"unknown key '{key}'", hint, key=True)
        elif kind == "missing":
            parent = ".".join(str(p) for p in path[:-1]) or "the spec"
            rep.add(path[:-1] if path else path, "SPEC-MISSING",
                    f"'{path[-1] if path else '?'}' is required in {parent}", "add it (see examples/)")
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
            if kind == "string_pattern_mismatch":
                msg = f"value {err.get('input')!r} is not allowed here"
                hint = f"it must match {err.get('ctx', {}).get('pattern', '')} (values reach command lines)"
            elif kind.startswith("literal_error"):
                hint = str(err.get("ctx", {}).get("expected", ""))
                hint = f"expected {hint}" if hint else ""
            else:
                hint = ""
            rep.add(path, "SPEC-SCHEMA", f"{where}: {msg}", hint)


# --- expansion -------------------------------------------------------------------------------------------------
@dataclass
class _Seen:
    """Where each host name, address and GUID was first given: nodes and switches share the names and addresses."""

    names: dict[str, Path] = field(default_factory=dict)
    addrs: dict[str, Path] = field(default_factory=dict)
    guids: dict[str, Path] = field(default_factory=dict)


def _expand(spec: Spec, rep: _Report) -> Cluster:
    cluster = Cluster(spec=spec, file=rep.file, fabric_rate_gbps=rate_gbps(spec.fabric.rate))
    profiles_ports = {pname: _expand_profile(spec, pname, prof, cluster.fabric_rate_gbps, rep)
                      for pname, prof in spec.profiles.items()}
    seen = _Seen()
    _expand_nodes(spec, profiles_ports, cluster, seen, rep)
    _expand_switches(spec, cluster, seen, rep)
    _expand_cabling(spec, profiles_ports, cluster, rep)
    from provisioner.spec.ipoib import expand_ipoib

    cluster.ipoib = expand_ipoib(cluster)
    return cluster


def _expand_profile(spec: Spec, pname: str, prof: Profile, fabric_rate: float, rep: _Report) -> list[Port]:
    """One profile's ports, checked for repeated devices and rails, GPUs it does not have and its GPU model."""
    ports = _profile_ports(spec, pname, prof, fabric_rate, rep)
    _check_profile_ports(pname, prof, ports, rep)
    if prof.gpu and prof.gpu.model not in GPU_MODELS:
        rep.add(("profiles", pname, "gpu", "model"), "SPEC-GPU-MODEL",
                f"unknown GPU model '{prof.gpu.model}'",
                did_you_mean(prof.gpu.model, GPU_MODELS, f"known: {', '.join(GPU_MODELS)}", cutoff=0.5))
    return ports


def _profile_ports(spec: Spec, pname: str, prof: Profile, fabric_rate: float, rep: _Report) -> list[Port]:
    """The ports of a profile's HCA entries, each device range expanded, rails numbered on from the last one."""
    default_ll = "ethernet" if spec.fabric.type in ("roce", "ethernet") else "infiniband"
    ports: list[Port] = []
    next_rail = 0
    for hi, hca in enumerate(prof.hcas):
        path: Path = ("profiles", pname, "hcas", hi)
        try:
            devices = hostlist.expand(hca.device, ordered=True)
        except hostlist.HostlistError as exc:
            rep.add((*path, "device"), "SPEC-HOSTLIST", str(exc), "write e.g. mlx5_[0-7]")
            continue
        netdevs = _netdevs(hca.netdev, len(devices), path, rep)
        for di, dev in enumerate(devices):
            many = len(devices) > 1
            rail = hca.rail + di if hca.rail is not None else (next_rail if hca.purpose == "rail" else None)
            gpu = (hca.gpu + di if hca.gpu is not None else
                   (rail if (prof.gpu and hca.purpose == "rail" and rail is not None
                             and rail < prof.gpu.count) else None))
            ports.append(Port(
                device=dev, port=hca.port,
                rate_gbps=rate_gbps(hca.rate) if hca.rate is not None else fabric_rate,
                width=hca.width, link_layer=hca.link_layer or default_ll, rail=rail, gpu=gpu,
                numa=hca.numa, netdev=netdevs[di], pci=None if many else hca.pci,
                purpose=hca.purpose, path=path))
            if hca.purpose == "rail" and rail is not None:
                next_rail = rail + 1
    return ports


def _check_profile_ports(pname: str, prof: Profile, ports: list[Port], rep: _Report) -> None:
    """A device/port given twice, two rail HCAs on one rail, an HCA serving a GPU the profile does not have."""
    seen: dict[tuple[str, int], Port] = {}
    for p in ports:
        if (p.device, p.port) in seen:
            rep.add(p.path, "SPEC-DUP-DEVICE", f"profile '{pname}' lists {p.device} port {p.port} twice",
                    "each device/port once")
        seen[(p.device, p.port)] = p
    rails: dict[int, Port] = {}
    for p in ports:
        if p.rail is not None and p.purpose == "rail":
            if p.rail in rails:
                rep.add(p.path, "SPEC-DUP-RAIL",
                        f"profile '{pname}': {p.device} and {rails[p.rail].device} are both on rail {p.rail}",
                        "give each rail HCA its own rail index")
            rails[p.rail] = p
        if prof.gpu and p.gpu is not None and p.gpu >= prof.gpu.count:
            rep.add((*p.path, "gpu"), "SPEC-HCA-GPU",
                    f"{p.device} serves GPU {p.gpu} but profile '{pname}' has {prof.gpu.count} GPUs",
                    "GPU indexes start at 0")


def _expand_nodes(spec: Spec, profiles_ports: dict[str, list[Port]], cluster: Cluster, seen: _Seen,
                  rep: _Report) -> None:
    for gi, group in enumerate(spec.nodes):
        path = ("nodes", gi)
        pairs = _node_group_pairs(spec, group, path, rep)
        if pairs is None:
            continue
        if group.guids and len(pairs) > 1:
            rep.add((*path, "guids"), "SPEC-GUIDS-RANGE", "guids can only be given for a single node",
                    "split the node out of the range")
        prof = spec.profiles[group.profile]
        roles, node_ports = tuple(group.roles), tuple(profiles_ports[group.profile])
        profile_devices = {p.device for p in node_ports}
        for name, addr in pairs:
            if not _node_name_and_address_ok(name, addr, path, seen, rep):
                continue
            guids = {k: v.lower() for k, v in (group.guids or {}).items()}
            _check_guids(guids, group.profile, profile_devices, path, seen, rep)
            cluster.nodes.append(Node(
                name=name, address=addr, profile=group.profile, roles=roles,
                ports=node_ports,
                gpu_model=prof.gpu.model if prof.gpu else None, gpu_count=prof.gpu.count if prof.gpu else 0,
                nvswitch=bool(prof.gpu and prof.gpu.nvswitch), guids=guids, path=path))


def _node_group_pairs(spec: Spec, group: NodeGroup, path: Path, rep: _Report) -> list[tuple[str, str]] | None:
    """A node group's (name, address) pairs; None (reported) when the ranges or the profile are wrong."""
    try:
        names = hostlist.expand(group.name, ordered=True)
    except hostlist.HostlistError as exc:
        rep.add((*path, "name"), "SPEC-HOSTLIST", str(exc), "write e.g. gpu[001-128]")
        return None
    try:
        addrs = hostlist.expand(group.address, ordered=True)
    except hostlist.HostlistError as exc:
        rep.add((*path, "address"), "SPEC-HOSTLIST", str(exc), "write e.g. 10.0.0.[11-138]")
        return None
    if len(names) != len(addrs):
        rep.add((*path, "address"), "SPEC-RANGE-LENGTH",
                f"{len(names)} names but {len(addrs)} addresses",
                "name and address ranges expand in step: make them the same length")
        return None
    if group.profile not in spec.profiles:
        rep.add((*path, "profile"), "SPEC-UNDEFINED-PROFILE", f"profile '{group.profile}' is not defined",
                did_you_mean(group.profile, spec.profiles, "define it under profiles:"))
        return None
    return list(zip(names, addrs, strict=True))


def _node_name_and_address_ok(name: str, addr: str, path: Path, seen: _Seen, rep: _Report) -> bool:
    """False (reported) for a bad or repeated name or a bad address; a repeated address is reported, kept."""
    if not _valid_hostname(name):
        rep.add((*path, "name"), "SPEC-HOSTNAME", f"'{name}' is not a valid host name",
                "lowercase letters, digits and '-'")
        return False
    if not _valid_ipv4(addr):
        rep.add((*path, "address"), "SPEC-ADDRESS", f"'{addr}' is not an IPv4 address",
                "write a dotted quad such as 10.0.0.11")
        return False
    if name in seen.names:
        rep.add((*path, "name"), "SPEC-DUP-HOST", f"host '{name}' is defined twice",
                f"first at line {_line(rep, seen.names[name])}")
        return False
    if addr in seen.addrs:
        rep.add((*path, "address"), "SPEC-DUP-ADDRESS", f"address {addr} ({name}) is used twice",
                f"first at line {_line(rep, seen.addrs[addr])}")
    seen.names[name] = (*path, "name")
    seen.addrs[addr] = (*path, "address")
    return True


def _check_guids(guids: dict[str, str], profile: str, profile_devices: set[str], path: Path, seen: _Seen,
                 rep: _Report) -> None:
    for dev, guid in guids.items():
        if guid in seen.guids:
            rep.add((*path, "guids", dev), "SPEC-DUP-GUID", f"GUID {guid} is given twice",
                    f"first at line {_line(rep, seen.guids[guid])}")
        seen.guids[guid] = (*path, "guids", dev)
        if dev not in profile_devices:
            rep.add((*path, "guids", dev), "SPEC-UNDEFINED-DEVICE",
                    f"{dev} is not a device of profile '{profile}'", "use a device the profile lists")


def _expand_switches(spec: Spec, cluster: Cluster, seen: _Seen, rep: _Report) -> None:
    sw_seen: dict[str, Path] = {}
    for si, sw in enumerate(spec.switches):
        path = ("switches", si)
        pairs = _switch_pairs(sw, path, rep)
        for name, sw_addr in pairs or []:
            if not _valid_hostname(name):
                rep.add((*path, "name"), "SPEC-HOSTNAME", f"'{name}' is not a valid switch name",
                        "lowercase letters, digits and '-'")
                continue
            if name in sw_seen or name in seen.names:
                rep.add((*path, "name"), "SPEC-DUP-HOST", f"name '{name}' is used twice", "names are unique")
                continue
            if sw_addr is not None:
                if not _valid_ipv4(sw_addr):
                    rep.add((*path, "address"), "SPEC-ADDRESS", f"'{sw_addr}' is not an IPv4 address", "")
                elif sw_addr in seen.addrs:
                    rep.add((*path, "address"), "SPEC-DUP-ADDRESS", f"address {sw_addr} ({name}) is used twice",
                            f"first at line {_line(rep, seen.addrs[sw_addr])}")
                seen.addrs.setdefault(sw_addr, (*path, "address"))
            sw_seen[name] = path
            cluster.switches.append(SwitchX(
                name=name, address=sw_addr, tier=sw.tier, ports=sw.ports, uplinks=sw.uplinks,
                uplink_rate_gbps=rate_gbps(sw.uplink_rate) if sw.uplink_rate is not None else cluster.fabric_rate_gbps,
                device_type=sw.device_type, embedded_sm=sw.embedded_sm, path=path))


def _switch_pairs(sw: Switch, path: Path, rep: _Report) -> list[tuple[str, str | None]] | None:
    """A switch entry's (name, address or None) pairs; None (reported) when the ranges are wrong."""
    try:
        names = hostlist.expand(sw.name, ordered=True)
        sw_addrs: list[str | None] = (list(hostlist.expand(sw.address, ordered=True)) if sw.address
                                      else [None] * len(names))
    except hostlist.HostlistError as exc:
        rep.add(path, "SPEC-HOSTLIST", str(exc), "write e.g. leaf[01-04]")
        return None
    if len(sw_addrs) != len(names):
        rep.add((*path, "address"), "SPEC-RANGE-LENGTH", f"{len(names)} names but {len(sw_addrs)} addresses",
                "make the ranges the same length")
        return None
    return list(zip(names, sw_addrs, strict=True))


@dataclass
class _Cabling:
    """What the cabling entries are checked against, and the switch ports already cabled."""

    node_by_name: dict[str, Node]
    devices_of: dict[str, set[str]]
    switch_by_name: dict[str, SwitchX]
    used_ports: dict[tuple[str, int], Path] = field(default_factory=dict)


def _expand_cabling(spec: Spec, profiles_ports: dict[str, list[Port]], cluster: Cluster, rep: _Report) -> None:
    known = _Cabling(node_by_name={n.name: n for n in cluster.nodes},
                     devices_of={pname: {p.device for p in ports} for pname, ports in profiles_ports.items()},
                     switch_by_name={s.name: s for s in cluster.switches})
    for ci, cab in enumerate(spec.fabric.topology.cabling):
        path = ("fabric", "topology", "cabling", ci)
        parsed = _cable_entry(cab, path, known, rep)
        if parsed is None:
            continue
        cnodes, cports, leaf = parsed
        ports_path = (*path, "ports")
        keys = [(leaf.name, sport) for sport in cports]
        if (all(n in known.node_by_name and cab.hca in known.devices_of[known.node_by_name[n].profile]
                for n in cnodes)
                and max(cports) <= leaf.ports and known.used_ports.keys().isdisjoint(keys)
                and len(set(keys)) == len(keys)):
            # the usual line: every cable fine, added at once (the loop below finds what is wrong with the others)
            known.used_ports.update(dict.fromkeys(keys, ports_path))
            cluster.cables.extend([CableX(n, cab.hca, leaf.name, p, path) for n, p in zip(cnodes, cports, strict=True)])
            continue
        for nname, sport in zip(cnodes, cports, strict=True):
            if _cable_ok(cab, nname, sport, leaf, path, known, rep):
                known.used_ports[(leaf.name, sport)] = ports_path
                cluster.cables.append(CableX(nname, cab.hca, leaf.name, sport, path))


def _cable_entry(cab: Cable, path: Path, known: _Cabling, rep: _Report) -> tuple[list[str], list[int], SwitchX] | None:
    """A cabling entry's nodes, switch ports and switch; None (reported) when the ranges or the switch are wrong."""
    try:
        cnodes = hostlist.expand(cab.nodes, ordered=True)
        body = cab.ports if cab.ports.startswith("[") else f"[{cab.ports}]"
        cports = [int(p) for p in hostlist.expand(body, ordered=True)]
    except (hostlist.HostlistError, ValueError) as exc:
        rep.add(path, "SPEC-HOSTLIST", str(exc), "write nodes: gpu[01-16], ports: 1-16")
        return None
    if len(cnodes) != len(cports):
        rep.add((*path, "ports"), "SPEC-RANGE-LENGTH", f"{len(cnodes)} nodes but {len(cports)} switch ports",
                "one switch port per node")
        return None
    if cab.switch not in known.switch_by_name:
        rep.add((*path, "switch"), "SPEC-UNDEFINED-SWITCH", f"switch '{cab.switch}' is not defined",
                did_you_mean(cab.switch, known.switch_by_name, "define it under switches:"))
        return None
    return list(cnodes), cports, known.switch_by_name[cab.switch]


def _cable_ok(cab: Cable, nname: str, sport: int, leaf: SwitchX, path: Path, known: _Cabling,
              rep: _Report) -> bool:
    """One cable of an entry that is not fine as a whole: False (reported) for what is wrong with it."""
    if nname not in known.node_by_name:
        rep.add((*path, "nodes"), "SPEC-UNDEFINED-NODE", f"node '{nname}' is not defined",
                "cable only nodes listed under nodes:")
        return False
    if cab.hca not in known.devices_of[known.node_by_name[nname].profile]:
        rep.add((*path, "hca"), "SPEC-UNDEFINED-DEVICE",
                f"{nname} has no device {cab.hca} in its profile", "use a device of the profile")
        return False
    if sport > leaf.ports:
        rep.add((*path, "ports"), "SPEC-SWITCH-PORT", f"{leaf.name} has {leaf.ports} ports, not {sport}",
                "check the port numbers")
        return False
    key = (leaf.name, sport)
    if key in known.used_ports:
        rep.add((*path, "ports"), "SPEC-DUP-CABLE", f"{leaf.name} port {sport} is cabled twice",
                f"first at line {_line(rep, known.used_ports[key])}")
        return False
    return True


_NETDEV = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")


def _netdevs(expr: str | None, count: int, path: Path, rep: _Report) -> list[str | None]:
    """The netdev of each device of an HCA entry: `netdev` expands in step with `device` (one name, one device)."""
    if expr is None:
        return [None] * count
    try:
        names = hostlist.expand(expr)
    except hostlist.HostlistError as exc:
        rep.add((*path, "netdev"), "SPEC-HOSTLIST", str(exc), "write e.g. ibp[24,41]s0 or ibp24s0,ibp41s0")
        return [None] * count
    if len(names) != count:
        rep.add((*path, "netdev"), "SPEC-RANGE-LENGTH", f"{count} device(s) but {len(names)} netdev name(s)",
                "name one netdev per device, in the same order")
        return [None] * count
    out: list[str | None] = []
    for name in names:
        if not _NETDEV.match(name):
            rep.add((*path, "netdev"), "SPEC-NETDEV", f"'{name}' is not a network interface name",
                    "at most 15 characters of A-Z a-z 0-9 . _ : -")
            out.append(None)
        else:
            out.append(name)
    return out


def _line(rep: _Report, path: Path) -> int:
    return rep.where(path)[1]


_HOSTNAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_IPV4 = re.compile(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})")


def _valid_hostname(name: str) -> bool:
    return _HOSTNAME.fullmatch(name) is not None


def _valid_ipv4(addr: str) -> bool:
    m = _IPV4.fullmatch(addr)
    return m is not None and all(len(p) < 3 or p <= "255" for p in m.groups())


# --- overlay ---------------------------------------------------------------------------------------------------
def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base.get(k), v) if k in base else v
        return out
    return over


# --- entry points ----------------------------------------------------------------------------------------------
def read_spec_text(path: str | FsPath, what: str = "a spec file") -> str:
    """The text of a spec or overlay file, read bounded (:mod:`provisioner.userfile`): a FIFO, a device, a
    directory or a file over MAX_SPEC_BYTES is refused at once."""
    return read_user_text(path, what)


OVERLAY_KEYS = frozenset(Spec.model_fields) | {"addresses"}


@without_gc
def load_text(text: str, file: str, overlay: dict[str, Any] | Located | None = None) -> LoadResult:
    """Validate spec `text` (named `file` in diagnostics); never raises for bad content.

    `overlay` (the lab's, or a site's) is merged onto the spec before validation, so its values are checked
    like the spec's; given as a Located (load_spec does), its problems name the overlay's file and line.
    Its `addresses` (node -> management address) must name nodes of the spec and be IPv4 addresses."""
    located, problems = load_yaml(text, file)
    over = overlay if isinstance(overlay, Located) else (
        Located(data=overlay, file="<overlay>") if overlay is not None else None)
    rep = _Report(located, file, over)
    for pr in problems:
        rep.items.append(Diagnostic(file, pr.mark.line, pr.mark.col, pr.rule, "error", pr.message, pr.hint))
    if located is None:
        return LoadResult(None, rep.items)
    if not isinstance(located.data, dict):
        rep.add((), "SPEC-SCHEMA", "the spec must be a mapping with cluster:, software:, profiles:, nodes:, fabric:",
                "start from one of the files in examples/")
        return LoadResult(None, rep.items)
    data = located.data
    addresses: dict[str, Any] = {}
    if over is not None and over.data:
        if not isinstance(over.data, dict):
            rep.add((), "SPEC-SCHEMA", "an overlay must be a mapping of spec keys (and addresses:)")
            return LoadResult(None, _finish(rep.items))
        raw = over.data.get("addresses") or {}
        if not isinstance(raw, dict):
            rep.add(("addresses",), "SPEC-SCHEMA", "addresses: must map node names to IPv4 addresses")
            raw = {}
        addresses = dict(raw)
        for k in over.data:
            if k not in OVERLAY_KEYS:
                rep.add((k,), "SPEC-UNKNOWN-KEY", f"unknown key '{k}' in the overlay",
                        did_you_mean(str(k), sorted(OVERLAY_KEYS), "an overlay holds spec keys and addresses:"),
                        key=True)
        rest = {k: v for k, v in over.data.items() if k != "addresses" and k in OVERLAY_KEYS}
        data = _deep_merge(data, rest)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        _schema_diagnostics(exc, rep, data)
        repaired = _repair(data, exc)
        if repaired is None:
            return LoadResult(None, _finish(rep.items))
        # The rest of the spec is still checked (references, duplicates, design rules), so one run reports
        # every problem; the cluster itself is not returned, since part of the spec was set aside.
        spec_ok, kept = repaired
        _expand_and_check(spec_ok, _RemappedReport(rep, kept), addresses)
        return LoadResult(None, _finish(rep.items))
    cluster = _expand_and_check(spec, rep, addresses)
    return LoadResult(cluster, _finish(rep.items))


class _RemappedReport(_Report):
    """Reports against the original document while checking a repaired copy whose lists lost items."""

    def __init__(self, inner: _Report, kept: dict[tuple[str | int, ...], list[int]]) -> None:
        super().__init__(inner.located, inner.file, inner.overlay)
        self.items = inner.items
        self.kept = kept

    def add(self, path: Path, rule: str, message: str, hint: str = "", *,
            severity: Severity = "error", key: bool = False) -> None:
        out: list[str | int] = []
        for part in path:
            prefix = tuple(out)
            if isinstance(part, int) and prefix in self.kept and part < len(self.kept[prefix]):
                part = self.kept[prefix][part]
            out.append(part)
        super().add(tuple(out), rule, message, hint, severity=severity, key=key)


def _expand_and_check(spec: Spec, rep: _Report, addresses: dict[str, Any]) -> Cluster:
    cluster = _expand(spec, rep)
    if addresses:
        cluster.nodes = [replace(n, address=a) if isinstance(a := addresses.get(n.name), str) else n
                         for n in cluster.nodes]
        _check_overlay_addresses(cluster, rep, addresses)
    from provisioner.spec.rules import run_rules

    run_rules(cluster, rep)
    return cluster


def _check_overlay_addresses(cluster: Cluster, rep: _Report, addresses: dict[str, Any]) -> None:
    """Overlay addresses are checked like the spec's: a known node, a dotted-quad IPv4, no address twice."""
    known = {n.name for n in cluster.nodes}
    for name, addr in addresses.items():
        path: Path = ("addresses", name)
        if name not in known:
            rep.add(path, "SPEC-UNDEFINED-NODE", f"the overlay gives an address for '{name}', not a node of the spec",
                    did_you_mean(str(name), sorted(known), "list only the spec's nodes"), key=True)
        elif not isinstance(addr, str) or not _valid_ipv4(addr):
            rep.add(path, "SPEC-ADDRESS", f"'{addr}' is not an IPv4 address",
                    "write a dotted quad such as 10.0.0.11 (addresses reach SSH and the inventory)")
    by_address: dict[str, list[str]] = {}
    for n in cluster.nodes:
        by_address.setdefault(n.address, []).append(n.name)
    for addr, names in by_address.items():
        for name in names:
            if len(names) > 1 and name in addresses:
                others = ", ".join(x for x in names if x != name)
                rep.add(("addresses", name), "SPEC-DUP-ADDRESS", f"address {addr} of {name} is also {others}'s",
                        "each node its own address")


def _repair(data: dict[str, Any], exc: ValidationError) -> tuple[Spec, dict[tuple[str | int, ...], list[int]]] | None:
    """The spec with each broken part set aside (its list item dropped, or its key left to the default).

    None when a broken part is required and has no default: then only the schema errors are reported.
    """
    doc = copy.deepcopy(data)
    removals: list[tuple[str | int, ...]] = []
    for err in exc.errors():
        loc = [p for p in err["loc"] if isinstance(p, str | int)]
        # walk the data: stop at the deepest list item on the way (drop it), else the key itself
        node: Any = doc
        cut: tuple[str | int, ...] | None = None
        walked: list[str | int] = []
        for part in loc:
            if isinstance(node, dict) and part in node:
                walked.append(part)
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                walked.append(part)
                cut = tuple(walked)
                node = node[part]
            else:
                break
        if cut is None:
            if err["type"] == "missing" or not walked:
                return None
            cut = tuple(walked)
        removals.append(cut)
    kept: dict[tuple[str | int, ...], list[int]] = {}
    for path in sorted(set(removals), key=lambda p: [(1, x) if isinstance(x, int) else (0, x) for x in p],
                       reverse=True):
        parent: Any = doc
        try:
            for part in path[:-1]:
                parent = parent[part]
            last = path[-1]
            if isinstance(parent, list) and isinstance(last, int):
                # remember which original index each remaining item had (paths are in original indices, since
                # removals run deepest and last first and never shift an earlier sibling)
                idx = kept.setdefault(path[:-1], list(range(len(parent))))
                del idx[last]
            del parent[last]
        except (KeyError, IndexError, TypeError):
            return None
    try:
        return Spec.model_validate(doc), kept
    except ValidationError:
        return None


def _finish(items: list[Diagnostic]) -> list[Diagnostic]:
    """Every diagnostic once, one line per cause (a range's hosts folded), in file order; a value YAML could not
    read is reported once (not again as a schema error)."""
    unread = {(d.file, d.line, d.col) for d in items if d.rule == "YAML-VALUE"}
    kept = {d for d in items if d.rule.startswith("YAML-") or (d.file, d.line, d.col) not in unread}
    return sorted(fold(kept), key=_order)


def _order(d: Diagnostic) -> tuple[int, int, str, str]:
    return (d.line, d.col, d.rule, d.message)


def load_spec(path: str | FsPath, overlay: str | FsPath | None = None) -> LoadResult:
    """Read and validate the spec file at `path` (and an optional overlay such as the lab's)."""
    text = read_spec_text(path)
    over: Located | None = None
    if overlay is not None:
        loc, probs = load_yaml(read_spec_text(overlay, "an overlay file"), str(overlay))
        if probs:
            return LoadResult(None, _finish([Diagnostic(str(overlay), p.mark.line, p.mark.col, p.rule, "error",
                                                        p.message, p.hint) for p in probs]))
        if loc is None or not isinstance(loc.data, dict):
            return LoadResult(None, [Diagnostic(str(overlay), 1, 1, "SPEC-SCHEMA", "error",
                                                "an overlay must be a mapping of spec keys (and addresses:)")])
        over = loc
    return load_text(text, str(path), over)


def load_cluster(path: str | FsPath, overlay: str | FsPath | None = None) -> tuple[Cluster, list[Diagnostic]]:
    """Like load_spec, but raise SpecInvalid when there is any error; returns the cluster and its warnings."""
    res = load_spec(path, overlay)
    if res.errors or res.cluster is None:
        raise SpecInvalid(list(res.diagnostics))
    return res.cluster, res.warnings
