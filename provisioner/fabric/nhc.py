"""LBNL Node Health Check (NHC) configuration from the spec: the verified state, checked before every job.

``verify`` proves the fabric once; NHC keeps proving the cheap parts of it (port rates, mounts, GPU count, the SM
daemon) on every node, every few minutes, from Slurm. One ``nhc.conf`` serves the whole cluster: each check is
written once, for the nodes that share it, behind an NHC *match string* (``<target> || <check>``).

NHC's match strings (mej/nhc README, "Match Strings"; ``mcheck_range`` in scripts/common.nhc) decide the form:

* a bare target is a bash **glob**, so ``gpu[01-64]`` would be a character class matching ``gpu0``, ``gpu1``,
  ``gpu6``, ``gpu4``: a node range must be written in braces, ``{gpu[01-64]}``;
* inside the braces each comma-separated item is one name (with a number) or ``prefix[START-END]suffix``: one
  range per item, no commas inside brackets (``{n00[00-29,54,87].sci}`` is not supported);
* a node matches a range only when its number has the range's width (``${#NODE}`` against the width of START,
  or of END when END is longer), so ``{gpu[9-10]}`` misses ``gpu9``: every range here keeps one width;
* a name without a number is not a range item at all (``RANGE_MATCH_REGEXP1`` needs digits): such a node gets
  its own line with its name as the (exact) glob.

``check_ps_service`` is written without ``-S``: ``-S`` *starts* the service when it is not running, and a
health check must not start a subnet manager behind the spec's back (priorities, master before standby). NVIDIA's
opensm runs as unit ``opensmd`` but process ``opensm``, and the check matches the process name (``-m '*daemon'``,
daemon defaulting to the service name), so it says ``-d opensm opensmd``.
"""

from __future__ import annotations

import re
from collections import defaultdict

from provisioner.spec import hostlist
from provisioner.spec.cluster import Cluster, Node
from provisioner.spec.ipoib import nfs_server_address
from provisioner.spec.rules import members

_LAST_NUMBER = re.compile(r"^(?P<prefix>.*?)(?P<num>\d+)(?P<suffix>[^\d]*)$")
SM_SERVICE = {"nvidia": ("opensm", "opensmd"), "upstream": ("opensm", "opensm")}
"""``fabric.subnet_manager.build`` -> (process name, systemd unit) the opensm role installs (roles/opensm/vars)."""


def _mount_targets(cluster: Cluster, node: Node) -> list[tuple[str, str, str]]:
    """(fstype, source, mountpoint) of every NFS/Lustre mount the spec puts on ``node``, the source written as the
    roles mount it: NHC's check_fs_mount compares it with /proc/mounts, where an NFS mount over IPoIB shows the
    server's IPoIB address (``10.30.0.21:/export/shared``), not the server's name."""
    storage = cluster.spec.storage
    out = []
    for m in storage.nfs.mounts:
        clients = members(m.on, cluster)
        if node.name in clients:
            out.append(("nfs" if m.version == "3" else "nfs4", f"{nfs_server_address(cluster, m, clients)}:{m.export}",
                        m.mount))
    out += [("lustre", f"{':'.join(fs.mgs)}:/{fs.fsname}", fs.mount) for fs in storage.lustre
            if node.name in members(fs.on, cluster)]
    return out


def node_checks(cluster: Cluster, node: Node) -> list[str]:
    """The NHC checks (without target) that hold for one node."""
    checks = [f"check_hw_ib {p.rate_gbps:g} {p.device}:{p.port}" for p in node.ports if p.link_layer == "infiniband"]
    checks += [f'check_fs_mount_rw -t "{fstype}" -s "{source}" -f "{mount}"'
               for fstype, source, mount in _mount_targets(cluster, node)]
    if node.gpu_count:
        # stock NHC has no GPU-count check: check_cmd_output matches the last GPU index nvidia-smi -L lists
        checks.append(f"check_cmd_output -t 30 -m '/^GPU {node.gpu_count - 1}:/' -e 'nvidia-smi -L'")
    sm = cluster.spec.fabric.subnet_manager
    if sm is not None and sm.kind == "opensm" and any(s.node == node.name for s in sm.nodes):
        process, unit = SM_SERVICE[sm.build]
        checks.append(f"check_ps_service -u root -d {process} {unit}" if process != unit
                      else f"check_ps_service -u root {unit}")
    return checks


def nhc_targets(names: list[str]) -> list[str]:
    """NHC match strings that together select exactly ``names`` (see the module doc for the rules they follow)."""
    runs: dict[tuple[str, int, str], list[tuple[int, str]]] = defaultdict(list)
    plain: list[str] = []
    for name in names:
        m = _LAST_NUMBER.match(name)
        if m is None or not m["prefix"]:
            plain.append(name)
            continue
        runs[(m["prefix"], len(m["num"]), m["suffix"])].append((int(m["num"]), m["num"]))
    items: list[str] = []
    for (prefix, _, suffix), numbers in sorted(runs.items()):
        numbers = sorted(set(numbers))
        start = 0
        for i in range(1, len(numbers) + 1):
            if i == len(numbers) or numbers[i][0] != numbers[i - 1][0] + 1:
                lo, hi = numbers[start][1], numbers[i - 1][1]
                items.append(f"{prefix}{lo}{suffix}" if lo == hi else f"{prefix}[{lo}-{hi}]{suffix}")
                start = i
    out = ["{" + ",".join(items) + "}"] if items else []
    return out + sorted(set(plain))


def export_nhc(cluster: Cluster) -> str:
    """One ``nhc.conf`` for every node of the cluster: each check once, for the nodes that share it."""
    nodes_of: dict[str, list[str]] = {}
    for node in sorted(cluster.nodes, key=lambda n: n.name):
        for check in node_checks(cluster, node):
            nodes_of.setdefault(check, []).append(node.name)
    by_nodes: dict[tuple[str, ...], list[str]] = {}
    for check, names in nodes_of.items():
        by_nodes.setdefault(tuple(names), []).append(check)
    source = cluster.source
    lines = [f"# nhc.conf for cluster {cluster.name}: generated by provisioner from {source}; edit the spec, not "
             "this file.",
             "# Targets in braces are NHC node ranges ({gpu[01-64]}); a bare gpu[01-64] would be a glob.", ""]
    for group, checks in by_nodes.items():
        lines.append(f"### {hostlist.compress(group)}")
        targets = nhc_targets(list(group))
        width = max(len(t) for t in targets)
        lines += [f"{target:>{width}} || {check}" for target in targets for check in checks]
        lines.append("")
    return "\n".join(lines)
