"""`provision discover`: draft a spec from what a running cluster reports.

Each node answers one fixed probe over SSH (the same strict host-key checking as every other command: a node whose
key is not in known_hosts is not probed): its hostname, /etc/os-release, ``nvidia-smi --query-gpu`` and ``topo -m``
(GPU model and count, which HCA sits next to which GPU), ``ibstat`` (HCAs, ports, rates, link layers, GUIDs),
``ofed_info -s``, ``sminfo`` and the installed packages. One node with an InfiniBand port also runs
``ibnetdiscover``: the switches and every cable from a node port to a switch port, matched to the nodes by the HCAs'
node GUIDs (so it does not depend on node descriptions), and the switch-to-switch links that give the tiers; the
same node asks the SA for every subnet manager, master and standby (``saquery SMIR``).

What a node reports is data: a value enters the draft only when it fits its field's pattern (FIELDS), anything
else is a TODO that shows it through safetext.printable (escaped, one line, cut short).

The draft is plain spec YAML: nodes of one hardware kind share a profile and are folded into hostlists, cabling is
folded into ranges, and everything a running cluster cannot tell (repositories, roles beyond the SM, partitions,
storage, what to pin) is written as a TODO comment, with the versions found on the nodes as comments beside the
software pins. The draft is validated before it is written.

A new cluster has no verified known_hosts yet and no spec for ``provision trust-host`` to read, so discover takes the
consoles' fingerprints itself (``--fingerprints``, trust-host's file format and parser): each node's offered key is
recorded only where it matches (provisioner.hostkeys' one decision table), and any refusal stops the run before a
node is probed. Behind a bastion (``--jump``, validated as the spec's ``ssh.jump``) the key reads and the probe go
through it, and the draft carries the same ``ssh.jump``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.errors import ParseError, RemoteError, UsageError
from provisioner.fabric.sm import SmInfo, parse_sminfo_records
from provisioner.parsers import parse
from provisioner.parsers.nvidia_query import QUERY, parse_nvidia_smi_query
from provisioner.remote import Completed, JumpTarget, Remote, SshTarget
from provisioner.safetext import printable
from provisioner.spec import hostlist
from provisioner.spec.catalog import GPU_MODELS, RATE_NAMES
from provisioner.spec.compat import DOCA_OFED
from provisioner.spec.models import DEVICE_NAME_PATTERN, HOST_NAME_PATTERN, VERSION_PATTERN

if TYPE_CHECKING:
    from collections.abc import Callable

    import paramiko

    from provisioner.spec.models import SshJump
    from provisioner.trust import TrustResult

_MARK = "@@provision-discover@@"
_SECTIONS = (
    ("hostname", "hostname"),
    ("os-release", "cat /etc/os-release"),
    ("kernel", "uname -r"),
    ("nvidia-smi", f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits"),
    ("topo", "nvidia-smi topo -m"),
    ("ibstat", "ibstat"),
    ("ofed", "ofed_info -s"),
    ("sminfo", "sminfo"),
    ("packages", "dpkg-query -W -f '${Package}\\t${Version}\\t${Status}\\n'"),
)
PROBE = "; ".join(f"echo '{_MARK} {name}'; {cmd} 2>&1; echo \"{_MARK} rc $?\"" for name, cmd in _SECTIONS)
"""One shell line, the same for every node (no site data in it): each tool's output between markers, with its exit
status, so one SSH round trip per node reads everything."""
PROBE_TIMEOUT_S = 60.0
FABRIC_TIMEOUT_S = 180.0

PACKAGES_OF_INTEREST = ("libnccl2", "nccl-tests", "nvidia-fabricmanager", "cuda-toolkit", "doca-ofed", "mlnx-ofed",
                        "opensm", "nvidia-driver", "nvidia-dkms", "lustre-client")
PLACEHOLDERS = {"driver": "550.90.07", "cuda": "12.4.1", "nccl": "2.21.5"}
"""Written (with a TODO) when a pin cannot be read from the nodes; the examples' set (valid for ubuntu-22.04 and
debian-12; ubuntu-24.04 gets PLACEHOLDERS_2404)."""
PLACEHOLDERS_2404 = {"driver": "560.35.03", "cuda": "12.6.2", "nccl": "2.21.5"}
OS_NAMES = {("ubuntu", "22.04"): "ubuntu-22.04", ("ubuntu", "24.04"): "ubuntu-24.04", ("debian", "12"): "debian-12"}

#: What a node reports becomes spec text only when it fits its field's pattern (the spec's own where it has one):
#: a value that does not is left out, with a TODO showing it escaped (safetext.printable) and cut short.
FIELDS: dict[str, tuple[re.Pattern[str], str]] = {
    "hostname": (re.compile(HOST_NAME_PATTERN), "a host name (a-z, 0-9, '-')"),
    "kernel": (re.compile(r"^[0-9A-Za-z.+~_-]{1,64}$"), "a kernel version"),
    "driver": (re.compile(VERSION_PATTERN), "a driver version"),
    "HCA": (re.compile(DEVICE_NAME_PATTERN), "a device name (A-Z, a-z, 0-9, '_')"),
}
SHOWN_CHARS = 64
"""How much of a value that fits no pattern a TODO shows."""


# --- what one node said ---------------------------------------------------------------------------------------
@dataclass
class Hca:
    device: str
    port: int
    rate_gbps: float | None
    link_layer: str  # infiniband | ethernet
    state: str | None
    node_guid: str | None
    port_guid: str | None
    gpu: int | None = None


@dataclass
class NodeFacts:
    host: str  # as given on the command line
    address: str
    name: str | None = None
    os: str | None = None
    os_pretty: str | None = None
    kernel: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    gpu_note: str | None = None  # why no GPUs were read
    nvlink_all: bool = False
    hcas: list[Hca] = field(default_factory=list)
    hca_note: str | None = None
    ofed: dict[str, Any] | None = None
    sminfo: dict[str, Any] | None = None
    packages: dict[str, str] = field(default_factory=dict)
    unreachable: str | None = None
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (field, the value shown safe): fits no pattern


def _fits(facts: NodeFacts, what: str, value: str) -> bool:
    """Whether a node's ``value`` fits the pattern of ``what`` (FIELDS); one that does not is noted in
    ``facts.rejected``, shown safe, and never enters the draft."""
    if FIELDS[what][0].fullmatch(value):
        return True
    facts.rejected.append((what, printable(value, SHOWN_CHARS)))
    return False


def split_sections(text: str) -> dict[str, tuple[int, str]]:
    """``{section: (exit status, output)}`` from the probe's marked output."""
    out: dict[str, tuple[int, str]] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(_MARK + " "):
            word = line[len(_MARK) + 1:]
            if word.startswith("rc ") and name is not None:
                rc = word[3:].strip()
                out[name] = (int(rc) if rc.isdigit() else 1, "\n".join(lines) + "\n")
                name, lines = None, []
            else:
                name, lines = word.strip(), []
        elif name is not None:
            lines.append(line)
    return out


def _os_release(text: str) -> tuple[str | None, str | None]:
    values = dict(re.findall(r'^([A-Z_]+)="?([^"\n]*)"?$', text, flags=re.M))
    key = (values.get("ID", "").lower(), values.get("VERSION_ID", ""))
    return OS_NAMES.get(key), values.get("PRETTY_NAME") or " ".join(key).strip() or None


def _short(text: str) -> str:
    """A tool's output or error as one safe line for a comment or a message (no control characters)."""
    return printable(text, 160)


def read_node(host: str, address: str, done: Completed) -> NodeFacts:
    """The facts one node's probe output holds; what could not be read is noted, never guessed."""
    facts = NodeFacts(host=host, address=address)
    if done.unreachable:
        facts.unreachable = _short(done.stderr) or "unreachable"
        return facts
    sections = split_sections(done.stdout)
    if not sections:
        facts.unreachable = f"the probe printed nothing usable (rc {done.rc}): {_short(done.stderr)}"
        return facts
    _read_system(facts, sections)
    if facts.unreachable:
        return facts
    topo = _read_gpus(facts, sections)
    _read_hcas(facts, sections, topo)
    rc, text = sections.get("ofed", (1, ""))
    if rc == 0:
        try:
            facts.ofed = parse("ofed_info", text)
        except ParseError:
            facts.ofed = None
    rc, text = sections.get("sminfo", (1, ""))
    if rc == 0:
        try:
            facts.sminfo = parse("sminfo", text)
        except ParseError:
            facts.sminfo = None
    rc, text = sections.get("packages", (1, ""))
    if rc == 0:
        for line in text.splitlines():
            cells = line.split("\t")
            if len(cells) >= 3 and cells[2].endswith(" installed") and cells[0].startswith(PACKAGES_OF_INTEREST):
                facts.packages[cells[0]] = cells[1]
    return facts


def _read_system(facts: NodeFacts, sections: Mapping[str, tuple[int, str]]) -> None:
    """Hostname, OS and kernel; a node whose hostname is no host name is left out (its name is the spec's key)."""
    rc, text = sections.get("hostname", (1, ""))
    name = text.strip().split(".")[0].lower() if rc == 0 else ""
    if name and not FIELDS["hostname"][0].fullmatch(name):
        facts.unreachable = f"its hostname is not {FIELDS['hostname'][1]}: {printable(name, SHOWN_CHARS)}"
        return
    facts.name = name or None
    rc, text = sections.get("os-release", (1, ""))
    if rc == 0:
        facts.os, facts.os_pretty = _os_release(text)
    rc, text = sections.get("kernel", (1, ""))
    kernel = text.strip() if rc == 0 else ""
    facts.kernel = kernel if kernel and _fits(facts, "kernel", kernel) else None


def _read_gpus(facts: NodeFacts, sections: Mapping[str, tuple[int, str]]) -> dict[str, Any] | None:
    """GPUs from nvidia-smi --query-gpu; returns the parsed topo -m (None when not read) for the HCAs."""
    rc, text = sections.get("nvidia-smi", (127, ""))
    if rc != 0:
        facts.gpu_note = f"nvidia-smi: {_short(text) or f'exit {rc}'}"
        return None
    try:
        facts.gpus = parse_nvidia_smi_query(text)["gpus"]
    except ParseError as exc:
        facts.gpu_note = _short(str(exc))
        return None
    for gpu in facts.gpus:  # the name only reaches a comment (the spec names the catalog's model)
        if gpu["driver_version"] and not _fits(facts, "driver", gpu["driver_version"]):
            gpu["driver_version"] = None
    rc, text = sections.get("topo", (1, ""))
    if rc != 0 or len(facts.gpus) < 1:
        return None
    try:
        topo = parse("nvidia-smi-topo", text)
    except ParseError:
        return None
    gpus, matrix = topo["gpus"], topo["matrix"]
    facts.nvlink_all = len(gpus) > 1 and all(
        str(matrix.get(a, {}).get(b, "")).startswith("NV") for a in gpus for b in gpus if a != b)
    return topo


def _read_hcas(facts: NodeFacts, sections: Mapping[str, tuple[int, str]], topo: dict[str, Any] | None) -> None:
    rc, text = sections.get("ibstat", (127, ""))
    if rc != 0:
        facts.hca_note = f"ibstat: {_short(text) or f'exit {rc}'}"
        return
    try:
        devices = parse("ibstat", text)["devices"]
    except ParseError as exc:
        facts.hca_note = _short(str(exc))
        return
    devices = [dev for dev in devices if _fits(facts, "HCA", dev["name"])]
    serves: dict[str, int] = {}
    if topo:
        names = topo.get("nic_names", {})
        for gpu in topo["gpus"]:
            for nic, link in topo["matrix"].get(gpu, {}).items():
                if link == "PIX":
                    serves.setdefault(names.get(nic, nic), int(gpu[3:]))
    for dev in devices:
        for port in dev["ports"]:
            facts.hcas.append(Hca(
                device=dev["name"], port=int(port["port"]),
                rate_gbps=port["rate_gbps"] if port["state"] not in (None, "down") else None,
                link_layer="ethernet" if port["link_layer"] == "ethernet" else "infiniband",
                state=port["state"], node_guid=dev["node_guid"], port_guid=port["port_guid"],
                gpu=serves.get(dev["name"])))


# --- the fabric -----------------------------------------------------------------------------------------------
@dataclass
class FabricFacts:
    source: str | None = None  # the node ibnetdiscover ran on
    note: str | None = None
    switches: list[dict[str, Any]] = field(default_factory=list)  # name, guid, ports, description
    cables: list[tuple[str, str, str, int]] = field(default_factory=list)  # node, device, switch, switch port
    isl: list[tuple[str, int, str, int]] = field(default_factory=list)  # switch, port, switch, port
    unknown_cas: list[str] = field(default_factory=list)
    sms: list[SmInfo] = field(default_factory=list)  # every SM the SA knows (saquery SMIR), master first
    sm_note: str | None = None  # why saquery SMIR gave none


def read_sms(remote: Remote, host: str) -> tuple[list[SmInfo], str | None]:
    """Every subnet manager, master and standby, from ``saquery SMIR`` on ``host``: the SA (the master SM)
    answers the SMInfoRecord query with its own record and one per other SM it found on the fabric (opensm's
    osm_sa_sminfo_record.c). ``sminfo`` names only the master, and ``saquery -s`` gives PortInfoRecords without
    the SM state. Returns the records, or none and why."""
    done = remote.run(host, ["saquery", "SMIR"], FABRIC_TIMEOUT_S)
    if done.rc != 0:
        return [], f"saquery SMIR on {host}: {_short(done.stdout + ' ' + done.stderr) or f'exit {done.rc}'}"
    try:
        return parse_sminfo_records(done.stdout), None
    except ParseError as exc:
        return [], f"saquery SMIR on {host}: {_short(str(exc))}"


_MANAGED_DESC = re.compile(r"^[A-Za-z0-9]+;(?P<name>[^:;]+):")


def switch_name(description: str, guid: str) -> str:
    """A spec name for a switch: the host name in a managed switch's ``MF0;<name>:<model>/U1`` description, else the
    description itself when it is a valid host name, else ``sw-<last 6 GUID digits>``."""
    m = _MANAGED_DESC.match(description)
    name = (m["name"] if m else description).strip().lower()
    if re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", name):
        return name
    return f"sw-{guid.removeprefix('0x')[-6:]}"


def read_fabric(text: str, source: str, ca_owner: Mapping[str, tuple[str, str]]) -> FabricFacts:
    """Switches, node cables and switch links from ``ibnetdiscover``; CAs matched by node GUID (``ca_owner``)."""
    topo = parse("ibnetdiscover", text)
    if not topo["ok"]:
        raise ParseError(f"ibnetdiscover failed: {topo['error']}")
    fabric = FabricFacts(source=source)
    names: dict[str, str] = {}
    taken: set[str] = set()
    for sw in topo["switches"]:
        name = switch_name(sw["name"] or "", sw["guid"] or "")
        if name in taken:
            name = f"{name}-{(sw['guid'] or '')[-4:]}"
        taken.add(name)
        names[sw["guid"]] = name
        fabric.switches.append({"name": name, "guid": sw["guid"], "ports": sw["num_ports"],
                                "description": sw["name"]})
    for link in topo["links"]:
        ends = [(link["from_guid"], link["from_port"]), (link["to_guid"], link["to_port"])]
        sw_ends = [(names[g], p) for g, p in ends if g in names]
        ca_ends = [(g, p) for g, p in ends if g not in names]
        if len(sw_ends) == 2:
            fabric.isl.append((sw_ends[0][0], sw_ends[0][1], sw_ends[1][0], sw_ends[1][1]))
        elif len(sw_ends) == 1 and ca_ends:
            owner = ca_owner.get(str(ca_ends[0][0]))
            if owner is None:
                desc = link["to_name"] if link["to_guid"] == ca_ends[0][0] else link["from_name"]
                fabric.unknown_cas.append(str(desc or ca_ends[0][0]))
                continue
            fabric.cables.append((owner[0], owner[1], sw_ends[0][0], sw_ends[0][1]))
    return fabric


# --- drafting -------------------------------------------------------------------------------------------------
def _rate_text(gbps: float) -> str:
    names = [n for n, v in RATE_NAMES.items() if v == gbps]
    return names[0] if len(names) == 1 else f"{gbps:g}"


def _gpu_key(smi_name: str) -> str | None:
    return next((k for k, m in GPU_MODELS.items() if m.smi_name == smi_name), None)


@dataclass(frozen=True)
class _Kind:
    gpu_key: str | None
    gpu_name: str | None
    gpu_count: int
    nvswitch: bool
    hcas: tuple[tuple[str, int, float | None, str, int | None], ...]


def _kind(n: NodeFacts) -> _Kind:
    name = n.gpus[0]["name"] if n.gpus else None
    hcas = tuple((h.device, h.port, h.rate_gbps, h.link_layer, h.gpu) for h in n.hcas)
    key = _gpu_key(name) if name else None
    sxm = bool(key and GPU_MODELS[key].form == "sxm")
    return _Kind(key, name, len(n.gpus), bool(n.nvlink_all and sxm and len(n.gpus) > 1), hcas)


def _dev_key(dev: str) -> tuple[str, int]:
    m = re.match(r"^(.*?)(\d+)$", dev)
    return (m.group(1), int(m.group(2))) if m else (dev, -1)


def _profile_yaml(name: str, kind: _Kind, fabric_rate: float) -> list[str]:
    lines = [f"  {name}:"]
    if kind.gpu_count and kind.gpu_key:
        lines.append(f"    gpu: {{model: {kind.gpu_key}, count: {kind.gpu_count}, nvswitch: "
                     f"{'true' if kind.nvswitch else 'false'}}}")
        if kind.nvswitch:
            lines.append("    # nvswitch: every GPU pair is on NVLink (nvidia-smi topo -m) on an SXM board")
    elif kind.gpu_count:
        shown = printable(kind.gpu_name or "", SHOWN_CHARS).replace('"', '\\"')
        lines.append(f"    # TODO gpu: {kind.gpu_count} x \"{shown}\" is not in the GPU catalog "
                     "(provisioner/spec/catalog.py); add it or name the model")
    entries: list[str] = []
    hcas = sorted(kind.hcas, key=lambda h: _dev_key(h[0]))
    i = 0
    while i < len(hcas):
        dev, port, rate, ll, gpu = hcas[i]
        j = i + 1
        if port == 1:  # fold mlx5_0..mlx5_N whose GPU is the spec's default (rail i serves GPU i)
            while (j < len(hcas) and hcas[j][1:4] == (port, rate, ll) and _dev_key(hcas[j][0])[0] == _dev_key(dev)[0]
                   and _dev_key(hcas[j][0])[1] == _dev_key(hcas[j - 1][0])[1] + 1):
                j += 1
        group = hcas[i:j]
        default_gpu = all(h[4] is None or h[4] == (i + k if i + k < kind.gpu_count else None)
                          for k, h in enumerate(group))
        if len(group) > 1 and not default_gpu:
            group, j = group[:1], i + 1
        devices = dev if len(group) == 1 else f'"{hostlist.compress([h[0] for h in group])}"'
        parts = [f"device: {devices}"]
        if port != 1:
            parts.append(f"port: {port}")
        if rate is not None and rate != fabric_rate:
            parts.append(f"rate: {_rate_text(rate)}")
        if ll == "ethernet":
            parts.append("link_layer: ethernet")
        if len(group) == 1 and gpu is not None and gpu != (i if i < kind.gpu_count else None):
            parts.append(f"gpu: {gpu}")
        storage = (len(group) == 1 and gpu is None and i >= kind.gpu_count > 0
                   and any(h[4] is not None for h in hcas))
        if storage:
            parts.append("purpose: storage")
        entries.append("{" + ", ".join(p for p in parts if p) + "}")
        if storage:
            entries[-1] += "  # next to no GPU (topo -m) on a GPU node: taken for a storage port, check it"
        if rate is None:
            entries[-1] += "  # port down at discovery: rate not read"
        i = j
    if entries:
        lines.append("    hcas:")
        lines += [f"      - {e}" for e in entries]
    else:
        lines.append("    hcas: []")
    return lines


def _runs(pairs: Sequence[tuple[str, str]]) -> list[tuple[list[str], list[str]]]:
    """Split (name, value) pairs, sorted by name in hostlist order, into runs whose values also ascend in hostlist
    order, so each run folds into two hostlists that pair as written."""
    ordered = sorted(pairs, key=lambda p: _hl_key(p[0]))
    runs: list[tuple[list[str], list[str]]] = []
    for name, value in ordered:
        if runs and _hl_key(runs[-1][1][-1]) < _hl_key(value) and _prefix(runs[-1][0][-1]) == _prefix(name):
            runs[-1][0].append(name)
            runs[-1][1].append(value)
        else:
            runs.append(([name], [value]))
    out: list[tuple[list[str], list[str]]] = []
    for names, values in runs:  # keep only what ClusterShell pairs exactly as written; split what it would not
        try:
            ok = (hostlist.expand(hostlist.compress(names), ordered=True) == names
                  and hostlist.expand(_bracketed(values), ordered=True) == values)
        except hostlist.HostlistError:
            ok = False
        out += [(names, values)] if ok else [([n], [v]) for n, v in zip(names, values, strict=True)]
    return out


def _bracketed(values: list[str]) -> str:
    text = hostlist.compress(values)
    return f"[{text}]" if all(v.isdigit() for v in values) and not text.startswith("[") else text


def _prefix(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def _hl_key(name: str) -> tuple[str, tuple[tuple[int, str], ...]]:
    """ClusterShell's order: by the name's pattern, then each number by (length, text)."""
    return (_prefix(name), tuple((len(d), d) for d in re.findall(r"\d+", name)))


def _version_from(packages: Mapping[str, str], prefix: str) -> str | None:
    found = sorted(v for p, v in packages.items() if p == prefix or p.startswith(prefix + "-"))
    if not found:
        return None
    m = re.match(r"^(?:\d+:)?([0-9][0-9.]*[0-9])", found[-1])
    return m.group(1) if m else None


def _uniform(values: Mapping[str, str | None]) -> tuple[str | None, str]:
    """The value most nodes share (None if none has one) and a comment naming who has what."""
    have = {n: v for n, v in values.items() if v}
    if not have:
        return None, "not found on any node"
    counts = Counter(have.values())
    best, _ = counts.most_common(1)[0]
    parts = [f"{v} on {hostlist.compress([n for n, w in have.items() if w == v])}" for v, _ in counts.most_common()]
    missing = [n for n in values if n not in have]
    if missing:
        parts.append(f"none on {hostlist.compress(missing)}")
    return best, "; ".join(parts)


@dataclass
class Draft:
    text: str
    todo: list[str]
    nodes: int
    switches: int
    cables: int
    skipped: list[str]


def draft_spec(nodes: Sequence[NodeFacts], fabric: FabricFacts, *, cluster_name: str, ssh: Mapping[str, Any]) -> Draft:
    """The spec YAML for what ``nodes`` and ``fabric`` reported."""
    todo: list[str] = []
    live, skipped = _answered(nodes)
    fabric_type, fabric_rate = _fabric_type_and_rate(live, todo)
    kinds, prof_name = _profiles(live)
    sm_nodes = _sm_nodes(live, fabric.sms)
    out = _head_lines(live, fabric, cluster_name, ssh, todo)
    for kind, name in prof_name.items():
        out += _profile_yaml(name, kind, fabric_rate)
    out += ["", "nodes:", *_node_lines(kinds, prof_name, sm_nodes)]
    out.append("# TODO roles: only subnet managers are discovered; mark login, nfs_server, storage, management nodes")
    out += _unread_lines(live, skipped, todo)
    switches, cabling = _switch_lines(fabric, {n.name or n.host for n in live}, todo)
    out += ["", *switches, "", "fabric:", f"  type: {fabric_type}", f"  rate: {_rate_text(fabric_rate)}"]
    kind_text = "rail_optimized" if _multi_rail(fabric) else "fat_tree"
    out += ["  topology:", f"    kind: {kind_text}"]
    if cabling:
        out += ["    cabling:", *cabling]
    if fabric_type == "infiniband":
        out += _sm_lines(sm_nodes, live, fabric, todo)
    else:
        out += ["  roce: {pfc_priority: 3, ecn: true}  # TODO not discovered (mlnx_qos, switch settings): check it"]
        todo.append("fabric.roce: PFC/ECN settings are a placeholder")
    out += ["", "# TODO partitions, storage (NFS, Lustre) and verify thresholds are not discovered."]
    return Draft("\n".join(out) + "\n", todo, len(live), len(fabric.switches), len(fabric.cables), skipped)


def _answered(nodes: Sequence[NodeFacts]) -> tuple[list[NodeFacts], list[str]]:
    """The nodes that answered with a hostname and a line per node that did not; refused when none did or two
    report one hostname."""
    skipped = [f"{n.host}: {n.unreachable}" for n in nodes if n.unreachable]
    live = [n for n in nodes if not n.unreachable and n.name]
    if not live:
        raise UsageError("no node answered the probe: nothing to draft", hint="; ".join(skipped[:3]))
    dup = [name for name, c in Counter(n.name for n in live).items() if c > 1]
    if dup:
        raise UsageError(f"several hosts report the same hostname: {', '.join(sorted(str(d) for d in dup))}")
    return live, skipped


def _fabric_type_and_rate(live: Sequence[NodeFacts], todo: list[str]) -> tuple[str, float]:
    """InfiniBand unless only Ethernet ports report a rate; the rate most ports report."""
    ib_rates = [h.rate_gbps for n in live for h in n.hcas if h.link_layer == "infiniband" and h.rate_gbps]
    eth_rates = [h.rate_gbps for n in live for h in n.hcas if h.link_layer == "ethernet" and h.rate_gbps]
    fabric_type = "infiniband" if ib_rates or not eth_rates else "roce"
    rates = ib_rates if fabric_type == "infiniband" else eth_rates
    fabric_rate = Counter(rates).most_common(1)[0][0] if rates else 400.0
    if not rates:
        todo.append("fabric.rate: no port reported a rate")
    return fabric_type, fabric_rate


def _profiles(live: Sequence[NodeFacts]) -> tuple[dict[_Kind, list[NodeFacts]], dict[_Kind, str]]:
    """The nodes of each hardware kind, and each kind's profile name (named after it, the most GPUs first)."""
    kinds: dict[_Kind, list[NodeFacts]] = defaultdict(list)
    for n in live:
        kinds[_kind(n)].append(n)
    prof_name: dict[_Kind, str] = {}
    for kind in sorted(kinds, key=lambda k: (-k.gpu_count, hostlist.compress([n.name or "" for n in kinds[k]]))):
        base = (f"{(kind.gpu_key or 'gpu').split('-')[0].lower()}x{kind.gpu_count}" if kind.gpu_count
                else f"svc{len(kind.hcas)}")
        name, i = base, 2
        while name in prof_name.values():
            name, i = f"{base}-{i}", i + 1
        prof_name[kind] = name
    return kinds, prof_name


def _head_lines(live: Sequence[NodeFacts], fabric: FabricFacts, cluster_name: str, ssh: Mapping[str, Any],
                todo: list[str]) -> list[str]:
    """The draft up to ``profiles:``: the header, cluster (OS), ssh, the software pins, repositories."""
    os_value, os_note = _uniform({n.name or n.host: n.os for n in live})
    os_name = os_value or "ubuntu-22.04"
    if not os_value:
        todo.append("cluster.os: no node runs a supported OS (ubuntu-22.04, ubuntu-24.04, debian-12)")
    _, kernel_note = _uniform({n.name or n.host: n.kernel for n in live})
    out: list[str] = [
        f"# Drafted by `provision discover` from {len(live)} node(s)"
        + (f" and ibnetdiscover on {fabric.source}" if fabric.source else "") + ".",
        "# Review it before use: lines marked TODO could not be discovered. Validate with `provision validate`.",
        f"cluster: {{name: {cluster_name}, os: {os_name}}}  # os: {os_note}",
        f"# kernel: {kernel_note}",
        f"ssh: {{user: {ssh['user']}, known_hosts: {ssh['known_hosts']}"
        + (f", key: {ssh['key']}" if ssh.get("key") else "") + (f", port: {ssh['port']}" if ssh['port'] != 22 else "")
        + _jump_yaml(ssh.get("jump")) + "}",
        "",
        "software:",
    ]
    out += _software_lines(live, PLACEHOLDERS_2404 if os_name == "ubuntu-24.04" else PLACEHOLDERS, todo)
    out += ["", "# TODO repositories: not discovered (the nodes' apt sources are not read). Name your mirrors and",
            "# set offline: true for an air-gapped site.", "repositories: {offline: false}", "", "profiles:"]
    todo.append("repositories: name the package mirrors")
    return out


def _software_lines(live: Sequence[NodeFacts], place: Mapping[str, str], todo: list[str]) -> list[str]:
    """The software pins the nodes agree on (placeholders and a TODO where they do not), and fabric manager."""
    by_name = {n.name or n.host: n for n in live}
    driver, driver_note = _uniform({k: n.gpus[0]["driver_version"] for k, n in by_name.items() if n.gpus})
    cuda, cuda_note = _uniform({k: _version_from(n.packages, "cuda-toolkit") for k, n in by_name.items()
                                if n.gpus})
    nccl, nccl_note = _uniform({k: _version_from(n.packages, "libnccl2") for k, n in by_name.items() if n.gpus})
    ofed_ver, ofed_note = _uniform({k: (f"{n.ofed['flavor']} {n.ofed['version']}" if n.ofed else None)
                                    for k, n in by_name.items()})
    out = _pin("  driver: {version: \"%s\"}", driver, place["driver"], f"driver: {driver_note}", todo, "driver")
    out += _pin('  cuda: "%s"', cuda, place["cuda"], f"cuda-toolkit: {cuda_note}", todo, "cuda")
    out += _pin('  nccl: "%s"', nccl, place["nccl"], f"libnccl2: {nccl_note}", todo, "nccl")
    out += _ofed_lines(ofed_ver, ofed_note, todo)
    fm = sorted({v for n in live for p, v in n.packages.items() if p.startswith("nvidia-fabricmanager")})
    if fm:
        out.append(f"  # nvidia-fabricmanager installed: {printable(', '.join(fm), 160)}")
    return out


def _node_lines(kinds: Mapping[_Kind, list[NodeFacts]], prof_name: Mapping[_Kind, str],
                sm_nodes: Collection[str]) -> list[str]:
    """``nodes:`` entries: per profile the others then the subnet managers, each run of names as one range."""
    out: list[str] = []
    for kind, name in prof_name.items():
        for is_sm in (False, True):
            members = [n for n in kinds[kind] if (n.name in sm_nodes) == is_sm]
            roles = (["compute"] if kind.gpu_count else []) + (["subnet_manager"] if is_sm else [])
            role_text = f", roles: [{', '.join(roles)}]" if roles and roles != ["compute"] else ""
            for names, addrs in _runs([(n.name or "", n.address) for n in members]):
                out.append(f'  - {{name: "{hostlist.compress(names)}", address: "{hostlist.compress(addrs)}", '
                           f"profile: {name}{role_text}}}")
    return out


def _unread_lines(live: Sequence[NodeFacts], skipped: Sequence[str], todo: list[str]) -> list[str]:
    """Comments for what was not read (tools that failed), what a node reported that fits no pattern (FIELDS:
    shown escaped, never drafted) and the nodes left out; every text in them has been through printable."""
    out: list[str] = []
    unread: dict[tuple[str, str], list[str]] = defaultdict(list)
    for n in live:
        for what, note in (("GPU", n.gpu_note), ("HCA", n.hca_note)):
            if note:
                unread[(what, note)].append(n.name or n.host)
    for (what, note), names in unread.items():
        folded = hostlist.compress(names)
        out.append(f"# no {what} read on {folded} ({note}): {what}s there, if any, are not in the draft")
        if what == "HCA":
            todo.append(f"HCAs not read on {folded}")
    rejected: dict[tuple[str, str], list[str]] = defaultdict(list)
    for n in live:
        for what, shown in n.rejected:
            rejected[(what, shown)].append(n.name or n.host)
    for (what, shown), names in rejected.items():
        line = (f"{what} on {hostlist.compress(names)} is not {FIELDS[what][1]}, left out of the draft: "
                f"{shown}")
        out.append(f"# TODO {line}")
        todo.append(line)
    if skipped:
        out.append("# not probed (left out of the draft):")
        out += [f"#   {s}" for s in skipped]
    return out


def _jump_yaml(jump: Mapping[str, Any] | None) -> str:
    """``, jump: {host: ..., user: ..., port: ...}`` for the draft's ssh line (user and port only when given)."""
    if not jump:
        return ""
    parts = [f"host: {jump['host']}"] + ([f"user: {jump['user']}"] if jump.get("user") else [])
    parts += [f"port: {jump['port']}"] if jump.get("port", 22) != 22 else []
    return f", jump: {{{', '.join(parts)}}}"


def _pin(fmt: str, value: str | None, placeholder: str, note: str, todo: list[str], what: str) -> list[str]:
    if value:
        return [fmt % value + f"  # installed: {note}"]
    todo.append(f"software.{what}: not installed on the nodes; {placeholder} is a placeholder")
    return [fmt % placeholder + f"  # TODO placeholder: {note}"]


def _ofed_lines(value: str | None, note: str, todo: list[str]) -> list[str]:
    if not value:
        return [f"  ofed: {{flavor: inbox}}  # ofed_info: {note}"]
    flavor, _, version = value.partition(" ")  # "<flavor as ofed_info prints it> <version>"
    if flavor == "MLNX_OFED_LINUX":
        return [f'  ofed: {{flavor: mlnx_ofed, version: "{version}"}}  # ofed_info -s: {note}']
    doca = next((d for d, o in DOCA_OFED.items()
                 if o == version or o.startswith(version + ".") or version.startswith(o + ".")), None)
    if doca and flavor == "OFED-internal":
        return [f'  ofed: {{flavor: doca, version: "{doca}"}}  # ofed_info -s: {note}']
    todo.append(f"software.ofed: {flavor} {version} is installed, but which DOCA release ships it is not in "
                "spec/compat.DOCA_OFED")
    return [f"  ofed: {{flavor: inbox}}  # TODO ofed_info -s: {note}; set the flavor and release it came from"]


def _sm_nodes(live: Sequence[NodeFacts], sms: Sequence[SmInfo]) -> dict[str, SmInfo]:
    """``{node: its SM}`` for the SMs that run on probed nodes (by port GUID): every SM ``saquery SMIR`` listed,
    else the master that sminfo names."""
    port_owner = {h.port_guid: n.name for n in live for h in n.hcas if h.port_guid}
    found = list(sms) or [SmInfo(guid=n.sminfo["guid"], lid=int(n.sminfo.get("lid") or 0),
                                 priority=int(n.sminfo.get("priority") or 0), state="master")
                          for n in live if n.sminfo and n.sminfo.get("guid")]
    out: dict[str, SmInfo] = {}
    for sm in found:
        owner = port_owner.get(sm.guid)
        if owner and owner not in out:
            out[owner] = sm
    return out


def _sm_lines(sm_nodes: Mapping[str, SmInfo], live: Sequence[NodeFacts], fabric: FabricFacts,
              todo: list[str]) -> list[str]:
    if sm_nodes:
        items = ", ".join(f"{{node: {n}, priority: {sm.priority}}}" for n, sm in sorted(sm_nodes.items()))
        lines = ["  subnet_manager:", "    kind: opensm", f"    nodes: [{items}]"]
        if not fabric.sms:
            return [*lines, "    # the master SM sminfo names; TODO add standby SMs (sminfo shows only the master; "
                    f"{fabric.sm_note or 'saquery SMIR did not run'})"]
        ordered = sorted(sm_nodes.items(), key=lambda kv: (kv[1].state != "master", _hl_key(kv[0])))
        states = ", ".join(f"{sm.state} {n}" for n, sm in ordered)
        lines.append(f"    # saquery SMIR: {states}")
        mine = {sm.guid for sm in sm_nodes.values()}
        others = [f"{sm.state} {sm.guid} (lid {sm.lid})" for sm in fabric.sms if sm.guid not in mine]
        if others:
            lines.append(f"    # SMs on no probed node (a switch, a UFM host?): {', '.join(others)}")
        return lines
    ib = [n for n in live if any(h.link_layer == "infiniband" for h in n.hcas)]
    pick = next((n for n in ib if not n.gpus), ib[0] if ib else live[0])
    todo.append("fabric.subnet_manager: no SM answered sminfo; the draft names one node to fill the key")
    return ["  subnet_manager:", "    kind: opensm",
            f"    nodes: [{{node: {pick.name}, priority: 15}}]  # TODO no SM answered sminfo: choose the SM nodes"]


def _multi_rail(fabric: FabricFacts) -> bool:
    per_node: dict[str, set[str]] = defaultdict(set)
    for node, _, switch, _ in fabric.cables:
        per_node[node].add(switch)
    return any(len(s) > 1 for s in per_node.values())


def _switch_lines(fabric: FabricFacts, nodes: set[str], todo: list[str]) -> tuple[list[str], list[str]]:
    if not fabric.switches:
        todo.append(f"switches and cabling: {fabric.note or 'ibnetdiscover did not run'}")
        return [f"# TODO switches and cabling not discovered: {fabric.note or 'ibnetdiscover did not run'}"], []
    leaves = {sw for node, _, sw, _ in fabric.cables if node in nodes}
    neighbours: dict[str, set[str]] = defaultdict(set)
    for a, _, b, _ in fabric.isl:
        neighbours[a].add(b)
        neighbours[b].add(a)
    tier: dict[str, str] = {s: "leaf" for s in leaves}
    for level in ("spine", "core"):
        lower = {s for s, t in tier.items() if t == {"spine": "leaf", "core": "spine"}[level]}
        for s in sorted({n for x in lower for n in neighbours[x]} - set(tier)):
            tier[s] = level
    uplinks: Counter[str] = Counter()
    rank = {"leaf": 0, "spine": 1, "core": 2}
    for a, _, b, _ in fabric.isl:
        if a in tier and b in tier and rank[tier[a]] != rank[tier[b]]:
            uplinks[a if rank[tier[a]] < rank[tier[b]] else b] += 1
    groups: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    for sw in fabric.switches:
        groups[(tier.get(sw["name"], "leaf"), int(sw["ports"]), uplinks[sw["name"]])].append(sw["name"])
    lines = ["switches:"]
    for (t, ports, up), names in sorted(groups.items(), key=lambda g: (rank[g[0][0]], _hl_key(g[1][0]))):
        for run, _ in _runs([(n, n) for n in names]):
            lines.append(f'  - {{name: "{hostlist.compress(run)}", tier: {t}, ports: {ports}, uplinks: {up}}}')
    unplaced = sorted(s["name"] for s in fabric.switches if s["name"] not in tier)
    if unplaced:
        lines.append(f"# {hostlist.compress(unplaced)}: no path to the nodes' leaves seen; tier leaf assumed")
    if fabric.unknown_cas:
        lines.append(f"# {len(fabric.unknown_cas)} other CA port(s) on the fabric (not probed nodes, SHARP "
                     "aggregation nodes...) are not cabled in the draft")
    cabling: list[str] = []
    by: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for node, dev, leaf, port in fabric.cables:
        if node in nodes:
            by[(dev, leaf)].append((node, str(port)))
    for (dev, leaf), pairs in sorted(by.items(), key=lambda kv: (_hl_key(kv[0][1]), _dev_key(kv[0][0]))):
        for names, port_list in _runs(pairs):
            port_text = hostlist.compress(port_list)
            cabling.append(f'      - {{nodes: "{hostlist.compress(names)}", hca: {dev}, switch: {leaf}, '
                           f'ports: "{port_text.strip("[]")}"}}')
    return lines, cabling


# --- running it -----------------------------------------------------------------------------------------------
def targets(hosts: str, addresses: str | None, *, user: str, port: int, key: Path | None,
            known_hosts: Path, jump: JumpTarget | None = None) -> dict[str, SshTarget]:
    """One SSH target per host of the hostlist; addresses from ``addresses`` (in step), the host itself when it is
    an IP address or the nodes sit behind ``jump`` (the bastion resolves it, as ``ssh -J`` does: the control
    node's resolver may not know the nodes' names), else what the control node's resolver says."""
    try:
        names = hostlist.expand(hosts, ordered=addresses is not None)
        addrs = hostlist.expand(addresses, ordered=True) if addresses else None
    except hostlist.HostlistError as exc:
        raise UsageError(f"hosts: {exc}") from None
    if addrs is not None and len(addrs) != len(names):
        raise UsageError(f"{len(names)} hosts but {len(addrs)} addresses", hint="give one address per host")
    out: dict[str, SshTarget] = {}
    for i, host in enumerate(names):
        if addrs is not None:
            addr = addrs[i]
        else:
            try:
                addr = str(ipaddress.ip_address(host))
            except ValueError:
                if jump is not None:
                    addr = host  # the bastion resolves it
                else:
                    try:
                        addr = socket.gethostbyname(host)
                    except OSError as exc:
                        raise UsageError(f"{host}: cannot resolve its address ({exc})",
                                         hint="give --address with one address per host") from None
        out[host] = SshTarget(name=host, address=addr, user=user, port=port, key=key, known_hosts=known_hosts,
                              jump=jump)
    return out


def jump_option(text: str) -> SshJump:
    """``--jump``: ``[user@]host[:port]`` or the spec's mapping form (``{host: b, user: ops, port: 22}``), validated
    by the spec's own ``ssh.jump`` model, so discover reaches exactly the bastions a spec may name."""
    import yaml
    from pydantic import ValidationError

    from provisioner.spec.models import SshJump

    value = text.strip()
    fields: object
    if value.startswith("{"):
        try:
            fields = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise UsageError(f"--jump {text!r}: not a YAML mapping ({_short(str(exc))})") from None
        if not isinstance(fields, dict):
            raise UsageError(f"--jump {text!r}: not a mapping")
    else:
        user, at, rest = value.rpartition("@")
        host, colon, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
        fields = {"host": host} | ({"user": user} if at else {}) | ({"port": port} if colon else {})
    try:
        return SshJump.model_validate(fields)
    except ValidationError as exc:
        why = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'jump'}: {e['msg']}" for e in exc.errors())
        raise UsageError(f"--jump {text!r}: {why}",
                         hint="write user@host[:port] or {host: bastion.example.com, user: ops, port: 22}") from None


def trust_first(hosts: Mapping[str, SshTarget], expected: Mapping[str, str], *,
                fetch: Callable[[SshTarget], paramiko.PKey] | None = None, progress: Any = None) -> list[TrustResult]:
    """``--fingerprints``: record each host's offered key in known_hosts where it matches the console's fingerprint
    (trust-host's rules: provisioner.trust and hostkeys' decision table); a host with no fingerprint given is never
    trusted on its offer. Any refusal raises RemoteError after every host was read (the matching keys stay
    recorded: each was verified); nothing has been probed then. A bastion is connected first: when its own key is
    unknown or changed, no node is contacted. An unreachable host is left to the probe, which reports it."""
    from provisioner.hostkeys import KeyReader
    from provisioner.trust import trust_hosts

    say = progress or (lambda _m: None)
    with KeyReader() as reader:
        if fetch is None:
            for jump in sorted({t.jump for t in hosts.values() if t.jump}, key=lambda j: j.label):
                reader.bastion(jump).transport()  # RemoteError: an untrusted or unreachable bastion, nothing asked
        results = trust_hosts(hosts, list(hosts), expected, fetch or reader, among="the hosts to discover")
    for r in results:
        say(f"host key of {r.node}: {r.status}: {r.offered or '-'}: {r.detail}")
    refused = [r.node for r in results if r.status == "refused"]
    if refused:
        raise RemoteError(f"host key refused for {', '.join(refused)}; no node was probed",
                          hint="compare the fingerprints with the nodes' consoles, correct them and run again "
                          "(keys that matched are recorded)")
    return results


def discover(remote: Remote, hosts: Mapping[str, SshTarget], *, cluster_name: str, ssh: Mapping[str, Any],
             progress: Any = None) -> Draft:
    """Probe every host, run ibnetdiscover and saquery SMIR on one with an InfiniBand port, and draft the spec."""
    say = progress or (lambda _m: None)
    say(f"probing {len(hosts)} node(s)")
    results = remote.run_many({h: ["sh", "-c", PROBE] for h in hosts}, PROBE_TIMEOUT_S)
    nodes = [read_node(h, hosts[h].address, results[h]) for h in hosts]
    fabric = FabricFacts(note="no probed node has an InfiniBand port with a link")
    owner = {h.node_guid: (n.name, h.device) for n in nodes if n.name for h in n.hcas if h.node_guid}
    linked = [n for n in nodes if any(h.link_layer == "infiniband" and h.state not in (None, "down") for h in n.hcas)]
    asked = None
    for n in linked:
        say(f"ibnetdiscover on {n.host}")
        asked = n.host
        done = remote.run(n.host, ["ibnetdiscover"], FABRIC_TIMEOUT_S)
        if done.rc != 0:
            fabric.note = f"ibnetdiscover on {n.host}: {_short(done.stdout + ' ' + done.stderr) or f'exit {done.rc}'}"
            continue
        try:
            fabric = read_fabric(done.stdout, n.name or n.host, {g: (str(a), d) for g, (a, d) in owner.items()})
        except ParseError as exc:
            fabric.note = f"ibnetdiscover on {n.host}: {_short(str(exc))}"
            continue
        break
    if asked is not None:  # the SMs, from the node that answered ibnetdiscover (else the last one asked)
        say(f"saquery SMIR on {asked}")
        fabric.sms, fabric.sm_note = read_sms(remote, asked)
    return draft_spec(nodes, fabric, cluster_name=cluster_name, ssh=ssh)


def discover_hosts(hosts: str, *, address: str | None = None, user: str = "root",
                   known_hosts: Path = Path("known_hosts"), key: Path | None = None, port: int = 22,
                   name: str = "cluster", fingerprint: str | None = None, fingerprints: Path | None = None,
                   jump: str | None = None, progress: Any = None) -> Draft:
    """`provision discover` up to the draft: the options checked (UsageError), the hosts' keys trusted first when
    fingerprints are given (any refusal stops it before a node is probed), every host probed over SSH."""
    from provisioner.remote import SshRemote  # looked up per call: tests stand in for it
    from provisioner.trust import expected_fingerprints

    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?", name):
        raise UsageError(f"--name {name!r}: lowercase letters, digits and '-', at most 32")
    bastion = jump_option(jump) if jump is not None else None
    hop = JumpTarget.of(bastion, user=user, key=key, known_hosts=known_hosts) if bastion else None
    chosen = targets(hosts, address, user=user, port=port, key=key, known_hosts=known_hosts, jump=hop)
    expected = expected_fingerprints(list(chosen), fingerprint, fingerprints)
    ssh = {"user": user, "known_hosts": str(known_hosts), "key": str(key) if key else None, "port": port,
           "jump": bastion.model_dump() if bastion else None}
    if fingerprint is not None or fingerprints is not None:
        trust_first(chosen, expected, progress=progress)
    with SshRemote(chosen) as remote:
        return discover(remote, chosen, cluster_name=name, ssh=ssh, progress=progress)
