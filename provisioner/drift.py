"""Drift: what the nodes' manifests say is installed, against the spec's pins and against each other.

Every converge playbook ends with the `manifest` role, which writes ``/var/lib/provisioner/manifest.json`` on
each node from dpkg-query, ``ofed_info -s``, lsmod and sysfs (never from the spec). This module reads those
files back over SSH and reports two kinds of findings, each with node, item, expected and observed:

* **spec** (error): a pinned component differs from the pin, or is missing where the spec wants it (a held
  package someone upgraded by hand, a node that missed a converge);
* **peers** (warning): nodes of one hardware profile that differ from each other (a package, the kernel,
  a loaded module, HCA firmware, holds) — the majority value is named as expected, because a node that runs
  another NCCL or kernel than its peers slows or hangs collectives without printing an error.

The comparison functions are pure (manifests in, findings out); fetching and storing are separate.
Reports go to ``<state>/drift/latest.json`` (and ``runs/<run-id>/drift.json`` during a run), the manifests to
``<state>/manifests/<node>.json``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from provisioner import hcafw
from provisioner.errors import ProvisionerError
from provisioner.spec.cluster import Cluster
from provisioner.state import utcnow, write_json_atomic

MANIFEST_PATH = "/var/lib/provisioner/manifest.json"
SCHEMA = 1
FETCH_TIMEOUT_S = 20.0
ABSENT = "(absent)"

Kind = Literal["spec", "peers", "manifest"]
Manifest = dict[str, Any]


class ManifestError(ProvisionerError):
    """A manifest that is not the role's JSON (one line: which node, what is wrong)."""


@dataclass(frozen=True)
class DriftFinding:
    """One difference: ``item`` on ``node`` is ``observed`` where ``expected`` (the pin or the majority)."""

    kind: Kind
    node: str
    item: str
    expected: str | None
    observed: str | None
    message: str

    @property
    def severity(self) -> str:
        return "error" if self.kind == "spec" else "warning"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "severity": self.severity}


# ---------------------------------------------------------------------------------------------------------
# reading manifests

def parse_manifest(text: str, node: str) -> Manifest:
    """The manifest JSON of ``node``, checked for the keys the comparison reads."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{node}: {MANIFEST_PATH} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{node}: {MANIFEST_PATH} is not a JSON object")
    if data.get("schema") != SCHEMA:
        raise ManifestError(f"{node}: {MANIFEST_PATH} has schema {data.get('schema')!r}, this provisioner reads "
                            f"{SCHEMA}")
    for key, typ in (("packages", dict), ("holds", list), ("modules", dict), ("hcas", dict), ("os", dict)):
        if not isinstance(data.get(key), typ):
            raise ManifestError(f"{node}: {MANIFEST_PATH} lacks '{key}' ({typ.__name__})")
    return data


def items(manifest: Manifest) -> dict[str, str]:
    """The comparable items of a manifest, flattened to strings (port GUIDs are left out: unique per node)."""
    os_info = manifest.get("os") or {}
    out: dict[str, str] = {
        "kernel": str(manifest.get("kernel") or ABSENT),
        "os": f"{os_info.get('id', '?')} {os_info.get('version_id', '?')}",
        "ofed": str(manifest.get("ofed") or ABSENT),
        "holds": ",".join(sorted(manifest.get("holds") or [])) or "(none)",
    }
    for name, version in sorted((manifest.get("packages") or {}).items()):
        out[f"package:{name}"] = str(version)
    for name, version in sorted((manifest.get("modules") or {}).items()):
        out[f"module:{name}"] = str(version) if version else "loaded"
    for dev, hca in sorted((manifest.get("hcas") or {}).items()):
        if isinstance(hca, dict) and hca.get("fw_ver"):
            out[f"firmware:{dev}"] = str(hca["fw_ver"])
    return out


# ---------------------------------------------------------------------------------------------------------
# comparison (pure)

def matches_pin(observed: str, pin: str) -> bool:
    """``observed`` is the pin or a more precise form of it (2.21.5 ↔ 2.21.5-1+cuda12.4, 550.90.07 ↔ 550.90.07-1)."""
    return observed == pin or (observed.startswith(pin) and observed[len(pin)] in ".-+~:")


@dataclass(frozen=True)
class Pin:
    """What the spec wants of one component on one node: the item name, the pin and how to find it."""

    item: str
    pin: str
    observe: Callable[[Manifest], str | None]
    hint: str = ""


def _package(name: str) -> Callable[[Manifest], str | None]:
    def observe(m: Manifest) -> str | None:
        v = (m.get("packages") or {}).get(name)
        return str(v) if v is not None else None
    return observe


def _cgroup(m: Manifest) -> str | None:
    """The cgroup hierarchy the node booted (v1, v2), as the manifest role read it from /proc/self/mountinfo."""
    v = m.get("cgroup")
    return str(v) if v else None


def _ofed_version(m: Manifest) -> str | None:
    """``MLNX_OFED_LINUX-23.10-2.1.3.1`` → ``23.10-2.1.3.1``."""
    raw = m.get("ofed")
    if not raw:
        return None
    match = re.match(r"^(?:MLNX_OFED_LINUX|OFED-internal|OFED)-(.+)$", str(raw))
    return match.group(1) if match else str(raw)


def _nccl_cuda_build(m: Manifest) -> str | None:
    """The CUDA a libnccl2 package was built for: ``2.21.5-1+cuda12.4`` → ``12.4``."""
    v = (m.get("packages") or {}).get("libnccl2")
    match = re.search(r"\+cuda(\d+\.\d+)", str(v)) if v else None
    return match.group(1) if match else None


def node_pins(cluster: Cluster) -> dict[str, list[Pin]]:
    """Per node, the pins the spec puts on it (GPU software on GPU nodes, the RDMA stack on every node)."""
    from provisioner.render.model import build_inventory

    sw = cluster.spec.software
    groups = build_inventory(cluster).groups
    lustre = set(groups.get("lustre_clients", []))
    slurm_v1 = set(groups.get("slurm_nodes", [])) if cluster.spec.slurm and cluster.spec.slurm.cgroup == "v1" else set()
    branch = sw.driver.branch
    flavor = "-open" if sw.driver.kernel_modules == "open" else ""
    cuda = ".".join(sw.cuda.split(".")[:2])
    out: dict[str, list[Pin]] = {}
    for n in cluster.nodes:
        pins: list[Pin] = []
        if n.gpu_count:
            pins.append(Pin("driver", sw.driver.version, _package(f"nvidia-driver-{branch}{flavor}")))
            if sw.fabric_manager or (sw.fabric_manager is None and n.nvswitch):
                pins.append(Pin("fabric_manager", sw.driver.version, _package(f"nvidia-fabricmanager-{branch}")))
            pins.append(Pin("cuda", sw.cuda, _package(f"cuda-toolkit-{cuda.replace('.', '-')}")))
            pins.append(Pin("nccl", sw.nccl, _package("libnccl2")))
            pins.append(Pin("nccl_cuda_build", cuda, _nccl_cuda_build))
            pins.append(Pin("nccl_tests", sw.nccl_tests, _package("nccl-tests")))
        if sw.ofed.version and sw.ofed.flavor == "doca":
            pins.append(Pin("doca_ofed", sw.ofed.version, _package("doca-ofed")))
        elif sw.ofed.version and sw.ofed.flavor == "mlnx_ofed":
            pins.append(Pin("ofed", sw.ofed.version, _ofed_version))
        if sw.lustre_client and n.name in lustre:
            pins.append(Pin("lustre_client", sw.lustre_client, _package("lustre-client-utils")))
        if n.name in slurm_v1:
            pins.append(Pin("cgroup", "v1", _cgroup, "slurm.cgroup: v1 boots the node with "
                            "systemd.unified_cgroup_hierarchy=0"))
        out[n.name] = pins
    return out


def spec_findings(pins: Mapping[str, Iterable[Pin]], manifests: Mapping[str, Manifest]) -> list[DriftFinding]:
    """Nodes whose installed versions differ from the spec's pins, or lack a pinned component."""
    found: list[DriftFinding] = []
    for node in sorted(manifests):
        for pin in pins.get(node, ()):
            got = pin.observe(manifests[node])
            if got is None:
                found.append(DriftFinding("spec", node, pin.item, pin.pin, None,
                                          f"{pin.item} {pin.pin} is pinned but not installed on {node}"))
            elif not matches_pin(got, pin.pin):
                found.append(DriftFinding("spec", node, pin.item, pin.pin, got,
                                          f"{pin.item} on {node} is {got}, the spec pins {pin.pin}"))
    return found


def peer_findings(groups: Mapping[str, Iterable[str]], manifests: Mapping[str, Manifest]) -> list[DriftFinding]:
    """Within each group of nodes that should be alike, the nodes whose item differs from the majority.

    An item one node has and another lacks counts ("(absent)"). Without a strict majority (two nodes that
    disagree) every node is named with the values seen, since nothing says which one is right.
    """
    found: list[DriftFinding] = []
    for group, members in sorted(groups.items()):
        nodes = sorted(n for n in members if n in manifests)
        if len(nodes) < 2:
            continue
        flat = {n: items(manifests[n]) for n in nodes}
        keys = sorted({k for v in flat.values() for k in v})
        for key in keys:
            values = {n: flat[n].get(key, ABSENT) for n in nodes}
            counts = Counter(values.values())
            if len(counts) < 2:
                continue
            value, count = counts.most_common(1)[0]
            if count * 2 > len(nodes):
                for n in nodes:
                    if values[n] != value:
                        found.append(DriftFinding(
                            "peers", n, key, value, values[n],
                            f"{key} on {n} is {values[n]}; {count} of {len(nodes)} nodes of {group} have {value}"))
            else:
                seen = "; ".join(f"{v} on {', '.join(sorted(h for h in nodes if values[h] == v))}"
                                 for v in sorted(counts))
                for n in nodes:
                    found.append(DriftFinding("peers", n, key, None, values[n],
                                              f"{key}: nodes of {group} disagree, no majority ({seen})"))
    return found


def peer_groups(cluster: Cluster) -> dict[str, list[str]]:
    """Nodes that should run the same software: one hardware profile *and* the same roles (an NFS server and a
    standby SM of one profile differ on purpose: the server has nfs-ganesha)."""
    out: dict[str, list[str]] = {}
    for n in cluster.nodes:
        roles = sorted(n.roles)
        group = f"profile {n.profile}" + (f" with roles {', '.join(roles)}" if roles else "")
        out.setdefault(group, []).append(n.name)
    return out


def compare(cluster: Cluster, manifests: Mapping[str, Manifest]) -> list[DriftFinding]:
    """Every drift finding for these manifests: against the spec first, then between peers."""
    return (spec_findings(node_pins(cluster), manifests) + hca_findings(cluster, manifests)
            + peer_findings(peer_groups(cluster), manifests))


def hca_findings(cluster: Cluster, manifests: Mapping[str, Manifest]) -> list[DriftFinding]:
    """HCAs whose running firmware or next-boot mlxconfig value differs from ``software.hca_firmware``."""
    hf = cluster.spec.software.hca_firmware
    return [DriftFinding("spec", m.node, f"{m.item}:{m.device}", m.want, m.have, m.message)
            for node in sorted(manifests) for m in hcafw.mismatches(hf, node, manifests[node])]


# ---------------------------------------------------------------------------------------------------------
# report, storage

@dataclass
class DriftReport:
    checked_at: str
    nodes: list[str]
    findings: list[DriftFinding] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)      # node -> why it has no manifest
    run_id: str | None = None

    @property
    def errors(self) -> list[DriftFinding]:
        return [f for f in self.findings if f.severity == "error"]

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "checked_at": self.checked_at, "run_id": self.run_id, "nodes": self.nodes,
                "missing": self.missing, "findings": [f.to_dict() for f in self.findings]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DriftReport:
        findings = [DriftFinding(f["kind"], f["node"], f["item"], f.get("expected"), f.get("observed"),
                                 f["message"]) for f in data.get("findings") or []]
        return cls(str(data.get("checked_at")), list(data.get("nodes") or []), findings,
                   dict(data.get("missing") or {}), data.get("run_id"))

    def note(self) -> str:
        """One line for the run journal / summary."""
        spec = sum(1 for f in self.findings if f.kind == "spec")
        peers = sum(1 for f in self.findings if f.kind == "peers")
        text = f"{len(self.nodes) - len(self.missing)} manifest(s): {spec} off the spec, {peers} peer drift"
        return text + (f", {len(self.missing)} without manifest" if self.missing else "")


def build_report(cluster: Cluster, nodes: Iterable[str], manifests: Mapping[str, Manifest],
                 missing: Mapping[str, str], run_id: str | None = None) -> DriftReport:
    wanted = list(nodes)
    mine = {n: m for n, m in manifests.items() if n in wanted}
    return DriftReport(utcnow(), wanted, compare(cluster, mine), dict(missing), run_id)


def drift_dir(state_dir: Path) -> Path:
    return state_dir / "drift"


def save_report(state_dir: Path, report: DriftReport, manifests: Mapping[str, Manifest]) -> Path:
    """latest.json (what `provision status` shows), the run's copy, and each node's manifest as fetched."""
    for node, manifest in manifests.items():
        write_json_atomic(state_dir / "manifests" / f"{node}.json", manifest)
    if report.run_id:
        write_json_atomic(state_dir / "runs" / report.run_id / "drift.json", report.to_json())
    path = drift_dir(state_dir) / "latest.json"
    write_json_atomic(path, report.to_json())
    return path


def load_latest(state_dir: Path) -> DriftReport | None:
    """The last drift report of this cluster, or None when there is none (or it cannot be read)."""
    path = drift_dir(state_dir) / "latest.json"
    try:
        return DriftReport.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def summary_lines(report: DriftReport) -> list[str]:
    """For a person: the note, then one line per finding and per node without a manifest."""
    lines = [f"drift ({report.checked_at}): {report.note()}"]
    for f in report.findings:
        lines.append(f"  {f.severity.upper():7s} {f.node} {f.item}: {f.message}")
    lines.extend(f"  WARNING {node}: no manifest ({why})" for node, why in sorted(report.missing.items()))
    return lines


# ---------------------------------------------------------------------------------------------------------
# fetching over SSH

def fetch_manifests(remote: Any, nodes: Iterable[str], timeout: float = FETCH_TIMEOUT_S
                    ) -> tuple[dict[str, Manifest], dict[str, str]]:
    """Read every node's manifest through ``remote`` (a :class:`provisioner.remote.Remote`).

    Returns the parsed manifests and, per node without one, why (unreachable, missing file, bad JSON).
    """
    commands = {n: ["cat", MANIFEST_PATH] for n in nodes}
    results = remote.run_many(commands, timeout)
    manifests: dict[str, Manifest] = {}
    missing: dict[str, str] = {}
    for node in sorted(commands):
        done = results[node]
        if done.rc != 0:
            why = (done.stderr.strip().splitlines() or [f"rc {done.rc}"])[-1]
            missing[node] = "unreachable: " + why if done.rc == 255 else why
            continue
        try:
            manifests[node] = parse_manifest(done.stdout, node)
        except ManifestError as exc:
            missing[node] = str(exc)
    return manifests, missing


def check_cluster(cluster: Cluster, state_dir: Path, *, nodes: Iterable[str] | None = None,
                  run_id: str | None = None, remote: Any = None) -> DriftReport:
    """Fetch, compare and store: what `provision drift` and the run engine's hook do."""
    from provisioner.remote import SshRemote, targets_from_cluster

    wanted = list(nodes) if nodes is not None else [n.name for n in cluster.nodes]
    if remote is None:
        with SshRemote(targets_from_cluster(cluster)) as ssh:
            manifests, missing = fetch_manifests(ssh, wanted)
    else:
        manifests, missing = fetch_manifests(remote, wanted)
    report = build_report(cluster, wanted, manifests, missing, run_id)
    save_report(state_dir, report, manifests)
    return report


def drift_spec(spec: Path, overlay: Path | None = None, *, limit: str | None = None,
               state_dir: Path | None = None) -> DriftReport:
    """`provision drift`: the spec loaded once, the nodes ``limit`` selects (host patterns over its hosts and
    groups, or a hostlist; all when None) read and compared (:func:`check_cluster`), the report stored."""
    from provisioner.phases import expand_limit
    from provisioner.render.model import build_inventory
    from provisioner.spec import load_cluster
    from provisioner.state import state_dir_for

    cluster, _ = load_cluster(spec, overlay)
    nodes = expand_limit(limit, [n.name for n in cluster.nodes], build_inventory(cluster).groups)
    return check_cluster(cluster, state_dir_for(cluster.name, state_dir), nodes=nodes)
