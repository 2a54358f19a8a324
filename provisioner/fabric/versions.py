"""Software versions against the spec's pins, and the same on every node.

A node that runs another NCCL or driver than its peers trains slower or hangs in a collective, and nothing
prints an error; so the check compares each node with the pin (error) and firmware across nodes (warning:
mixed firmware is legal but is the first thing to rule out when one node is slow).

Probes (fixed command lines, no spec value in them) and how their output is read:

* ``ofed_info -s`` → the ``ofed_info`` parser (``MLNX_OFED_LINUX-<v>:`` / ``OFED-internal-<v>:``);
* ``dpkg-query -W -f=${Version} doca-ofed`` → the DOCA version the spec pins for ``flavor: doca``
  (``ofed_info`` shows the OFED component version, 24.10-…, not the DOCA release, 2.9.1);
* ``nvidia-smi --query-gpu=driver_version --format=csv,noheader`` → one line per GPU;
* ``nvidia-smi --query-gpu=persistence_mode --format=csv,noheader`` → ``Enabled``/``Disabled`` per GPU: not a
  version, but the driver's one runtime setting the driver role owns (Ubuntu's nvidia-persistenced unit starts
  the daemon with ``--no-persistence-mode``), so a node where it is off is a finding here;
* ``cat /usr/local/cuda/version.json`` (CUDA ≥ 11.1; ``version.txt`` "CUDA Version x.y.z" before);
* the NCCL library file name ``libnccl.so.<x.y.z>`` (what the packages install on every distribution).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from provisioner.errors import ParseError
from provisioner.fabric.findings import Finding
from provisioner.parsers import parse
from provisioner.spec.cluster import Cluster

CHECK = "versions"

PROBES: dict[str, list[str]] = {
    "ofed": ["ofed_info", "-s"],
    "doca": ["dpkg-query", "-W", "-f=${Version}", "doca-ofed"],
    "driver": ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
    "persistence": ["nvidia-smi", "--query-gpu=persistence_mode", "--format=csv,noheader"],
    "cuda": ["sh", "-c", "cat /usr/local/cuda/version.json 2>/dev/null || cat /usr/local/cuda/version.txt"],
    "nccl": [
        "sh", "-c",
        "ls -1 /usr/lib/x86_64-linux-gnu/libnccl.so.* /usr/lib/aarch64-linux-gnu/libnccl.so.* /usr/lib64/libnccl.so.* "
        "/usr/local/cuda/lib64/libnccl.so.* 2>/dev/null; true",  # ls fails when any one glob is empty
    ],
}

_NCCL_FILE = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)\b")
_CUDA_TXT = re.compile(r"CUDA Version (\d[\d.]*)")
_DRIVER = re.compile(r"^\d+\.\d+(\.\d+)?$")


def read_version(component: str, text: str) -> str | None:
    """The version in one probe's output, or None when the output does not contain one (not installed)."""
    text = text.strip()
    if not text:
        return None
    if component == "ofed":
        try:
            return str(parse("ofed_info", text)["version"])
        except ParseError:
            return None
    if component == "driver":
        lines = {ln.strip() for ln in text.splitlines() if _DRIVER.match(ln.strip())}
        return sorted(lines)[0] if len(lines) == 1 else (", ".join(sorted(lines)) or None)
    if component == "cuda":
        if text.startswith("{"):
            try:
                data: Any = json.loads(text)
                return str(data["cuda"]["version"])
            except (ValueError, KeyError, TypeError):
                return None
        m = _CUDA_TXT.search(text)
        return m.group(1) if m else None
    if component == "nccl":
        found = sorted(set(_NCCL_FILE.findall(text)), key=lambda v: tuple(int(x) for x in v.split(".")))
        return found[-1] if found else None
    if component == "persistence":
        modes = {ln.strip() for ln in text.splitlines()} & {"Enabled", "Disabled"}
        return ", ".join(sorted(modes)) or None
    if component == "doca":
        return text.split()[0] if re.match(r"^\d", text) else None
    return text.splitlines()[0]


def matches_pin(observed: str, pin: str) -> bool:
    """``observed`` is the pinned version or a more precise form of it (12.4 ↔ 12.4.1, 2.9.1 ↔ 2.9.1-1)."""
    return observed == pin or (observed.startswith(pin) and observed[len(pin)] in ".-+~")


def pins(cluster: Cluster) -> dict[str, str]:
    """What the spec pins, by component name (the names used in the reports' version table)."""
    sw = cluster.spec.software
    out = {"driver": sw.driver.version, "cuda": sw.cuda, "nccl": sw.nccl}
    if sw.ofed.version and sw.ofed.flavor == "doca":
        out["doca"] = sw.ofed.version
    elif sw.ofed.version and sw.ofed.flavor == "mlnx_ofed":
        out["ofed"] = sw.ofed.version
    return out


def components_for(cluster: Cluster, node_has_gpu: bool) -> list[str]:
    """Which probes a node gets: GPU software only on GPU nodes, the RDMA stack everywhere."""
    comps = ["ofed"]
    if cluster.spec.software.ofed.flavor == "doca":
        comps.append("doca")
    if node_has_gpu:
        comps += ["driver", "persistence", "cuda", "nccl"]
    return comps


def version_findings(cluster: Cluster, observed: Mapping[str, Mapping[str, str | None]],
                     groups: Mapping[str, Iterable[str]] | None = None) -> list[Finding]:
    """Pinned components that differ from the pin (error) or are missing (error), then drift between peers.

    ``observed`` is ``{node: {component: version or None}}`` for the components each node was probed for;
    ``groups`` are the peer groups (:func:`provisioner.drift.peer_groups`: one profile and the same roles).
    """
    pinned = pins(cluster)
    found: list[Finding] = []
    for node in sorted(observed):
        for comp, got in sorted(observed[node].items()):
            if comp == PERSISTENCE:
                found += persistence_findings(node, got)
                continue
            want = pinned.get(comp)
            if want is None:
                continue
            if got is None:
                found.append(Finding(CHECK, "error", node, None, None, want, None,
                                     f"{comp} {want} is pinned but not found on {node}",
                                     "run the converge phase for this node (provision up --limit NODE)"))
            elif not matches_pin(got, want):
                found.append(Finding(CHECK, "error", node, None, None, want, got,
                                     f"{comp} is {got} on {node}, the spec pins {want}",
                                     "converge the node again; a held or manually installed package wins "
                                     "otherwise (apt-mark showhold)"))
    # Unpinned components (e.g. the OFED build under DOCA) must still agree between peers.
    found += drift_findings(observed, skip={*pinned, PERSISTENCE}, check=CHECK, what="version", groups=groups)
    return found


PERSISTENCE = "persistence"


def persistence_findings(node: str, got: str | None) -> list[Finding]:
    """GPUs without persistence mode (error): the driver deinitialises them between jobs, job starts get slower
    and GPU state is lost. None (nvidia-smi did not answer) is left to the driver finding."""
    if got is None or got == "Enabled":
        return []
    return [Finding(CHECK, "error", node, None, None, "Enabled", got,
                    f"GPU persistence mode is {got} on {node}",
                    "nvidia-persistenced is stopped or runs with --no-persistence-mode (Ubuntu's packaged unit): "
                    "converge the gpu_stack phase (the driver role's drop-in enables it), then check "
                    "`systemctl cat nvidia-persistenced`")]


def drift_findings(
    observed: Mapping[str, Mapping[str, str | None]], *, skip: Iterable[str] = (), check: str, what: str,
    as_device: bool = False, groups: Mapping[str, Iterable[str]] | None = None,
) -> list[Finding]:
    """Nodes whose value of a component differs from the majority of their peers (the odd one out after a swap).

    Only peers are compared: the nodes of one group of ``groups`` (one hardware profile and the same roles), so
    a login node is not drift from an NFS server of the same profile. Without ``groups`` all nodes are peers.
    """
    skipped = set(skip)
    parts = {k: list(v) for k, v in groups.items()} if groups is not None else {"the other nodes": list(observed)}
    found: list[Finding] = []
    for label, members in sorted(parts.items()):
        peers = sorted(n for n in members if n in observed)
        counts: dict[str, Counter[str]] = {}
        for node in peers:
            for comp, ver in observed[node].items():
                if ver is not None and comp not in skipped:
                    counts.setdefault(comp, Counter())[ver] += 1
        for comp, counter in sorted(counts.items()):
            if len(counter) < 2:
                continue
            majority = max(counter.items(), key=lambda kv: (kv[1], kv[0]))[0]
            for node in peers:
                got = observed[node].get(comp)
                if got is not None and got != majority:
                    found.append(Finding(check, "warning", node, comp if as_device else None, None, majority, got,
                                         f"{comp} {what} on {node} is {got}; {counter[majority]} of its peers "
                                         f"({label}) run {majority}",
                                         "align it with its peers (mlxfw/mlxfwmanager for HCA firmware)"))
    return sorted(found, key=lambda f: (f.device or "", f.node or ""))


def firmware_findings(firmware: Mapping[str, Mapping[str, str]],
                      groups: Mapping[str, Iterable[str]] | None = None) -> list[Finding]:
    """HCA firmware that differs between peers (warning), per device position: ``{node: {device: fw}}``.

    Devices of different models legitimately differ, so the comparison is per device name (mlx5_0 with
    mlx5_0) between nodes of one profile, which is the same model.
    """
    return drift_findings(firmware, check=CHECK, what="firmware", as_device=True, groups=groups)
