"""The lab's commands as library calls (`provision lab up` and `provision lab fault`); the CLI parses their
options and prints what they return. The lab's own modules are looked up per call (tests stand in for them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from provisioner.errors import UsageError
from provisioner.lab import cluster as lab_cluster
from provisioner.lab import faults, fromspec
from provisioner.spec import Diagnostic

Say = Callable[[str], None]


def cluster_name(arg: str) -> str:
    """A cluster name given directly or through its spec file."""
    from provisioner.spec import load_cluster

    p = Path(arg)
    if arg.endswith((".yaml", ".yml")) and p.is_file():
        return load_cluster(p)[0].name
    return arg


def lab_up_spec(spec: Path, *, max_nodes: int | None = None, faults_file: Path | None = None,
                progress: Say = lambda _m: None,
                warn: Callable[[list[Diagnostic]], None] = lambda _d: None) -> tuple[Any, int]:
    """`provision lab up`: the spec loaded once (its warnings to ``warn``), one container per node (the first
    ``max_nodes``), the switch links written, the faults of ``faults_file`` (checked against the lab's nodes
    before anything starts) injected: the lab's info and how many faults were injected."""
    from provisioner.lab.ipoib import lab_ipoib_links
    from provisioner.spec import load_cluster

    cluster, warnings = load_cluster(spec)
    warn(warnings)
    nodes = fromspec.lab_nodes(cluster)[:max_nodes] if max_nodes else fromspec.lab_nodes(cluster)
    wanted = faults.load_fault_list(faults_file, {n.hostname: {h.device for h in n.hcas} for n in nodes},
                                    {s.name for s in cluster.switches}) if faults_file else []
    info = lab_cluster.lab_up(cluster.name, fromspec.lab_nodes(cluster), fromspec.lab_switches(cluster),
                              fromspec.lab_cables(cluster), max_nodes=max_nodes, progress=progress,
                              versions=fromspec.lab_versions(cluster), nfs_exports=fromspec.lab_nfs_exports(cluster),
                              ipoib_links=lab_ipoib_links(cluster))
    root = str(lab_cluster.cluster_dir(cluster.name))
    fromspec.write_switch_links(root, fromspec.lab_switch_links(cluster))
    for record in faults.apply_fault_list(root, wanted):
        progress(f"injected {record['kind']} " + " ".join(f"{k}={v}" for k, v in record.items()
                                                          if k not in ("kind", "saved", "set")))
    return info, len(wanted)


def _params(params: list[str] | None) -> dict[str, Any]:
    kv: dict[str, Any] = {}
    for item in params or []:
        if "=" not in item:
            raise UsageError(f"parameter '{item}' is not key=value")
        k, v = item.split("=", 1)
        kv[k] = v
    return kv


def lab_fault(cluster: str, node: str | None, kind: str | None, params: list[str] | None, *, clear: bool = False,
              file: Path | None = None) -> str:
    """`provision lab fault`: inject (or clear) one fault, or every fault of a YAML list; the line to print."""
    name = cluster_name(cluster)
    root = str(lab_cluster.cluster_dir(name))
    if file is not None:
        if node or kind or params or clear:
            raise UsageError("--file takes no node, kind, parameters or --clear")
        records = faults.apply_fault_list(root, faults.load_fault_list(file, faults.lab_devices(root),
                                                                       faults.lab_switches(root)))
        return f"injected {len(records)} fault(s) from {file}"
    if not node or (not kind and not clear):
        raise UsageError("give a node and a fault kind (or --file FILE)")
    kv = _params(params)
    if node not in faults.lab_devices(root) and node not in faults.lab_switches(root):
        raise UsageError(f"no node or switch {node!r} in lab {name}", hint="provision lab status CLUSTER lists them")
    if clear:
        done = faults.clear(root, node, None if kind in (None, "all") else kind, **kv)
        return f"{node}: cleared {', '.join(r['kind'] for r in done) or 'nothing (no such fault)'}"
    if kind is None:
        raise UsageError("give a fault kind")
    faults.inject(root, node, kind, **faults.check_params(kind, kv))
    return f"{node}: injected {kind}"
