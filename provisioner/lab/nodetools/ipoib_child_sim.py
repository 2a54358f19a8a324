#!/usr/bin/python3
"""The lab kernel's ib_ipoib P_Key children: made as soon as the node's network configuration asks for one.

On a real node a P_Key child exists once something asks the ib_ipoib driver for it: ``echo 0x8001 >
/sys/class/net/ib0/create_child`` or its rtnetlink equivalent (``ip link add link ib0 name ib0.8001 type ipoib pkey
0x8001``, and systemd-networkd's ``.netdev`` with ``Kind=ipoib``, which the ipoib role writes); the kernel makes
``<parent>.<pkey as %04x>`` at once (Linux ``Documentation/infiniband/ipoib.rst``; docs/lab-hardware-model.md,
"Simulated IPoIB"). The lab's shared kernel has no ib_ipoib, so networkd cannot create the child there and the
role writes no ``.netdev`` on simulated links; what it writes on every node is the child's ``.network`` (``[Match]
Name=ibp23s0.8001``). This tool is the lab's stand-in for the driver: it runs at boot and whenever networkd's
configuration directories change (``plab-ipoib-children.path``), and

* for every ``.network`` that matches a name ``<parent>.<4 hex digits>`` whose parent link exists and which no link
  has yet, creates the child on the parent (a macvlan in bridge mode: its frames go out on the parent's simulated
  rail, where the partition's other members' children receive them) and records its P_Key in
  ``/run/provisioner-lab/ipoib/<child>.pkey`` (the driver's ``/sys/class/net/<child>/pkey``, which the lab's read-only
  sysfs cannot hold), and networkd then configures it from that ``.network`` like any new link;
* deletes the children it made whose ``.network`` is gone (the driver's ``delete_child``).

A link that already exists under a child's name (one the lab attached at start) is left as it is. File names,
interface names and P_Keys are data: they reach ``ip`` as separate arguments, never a shell. Stdlib only.
Environment (for tests on the host): ``PLAB_IPOIB_NETWORK_DIRS`` (colon-separated), ``PLAB_IPOIB_STATE``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

NETWORK_DIRS = ("/etc/systemd/network", "/run/systemd/network")
STATE_DIR = "/run/provisioner-lab/ipoib"
CHILD_NAME = re.compile(r"([A-Za-z0-9_:-]{1,10})\.([0-9a-f]{4})")
"""ipoib_vlan_add names a child "%s.%04x" (parent, P_Key); IFNAMSIZ leaves 15 characters."""


def match_names(text: str) -> list[str]:
    """The names a .network file's ``[Match] Name=`` lines list (space-separated; an empty value resets)."""
    names: list[str] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Match" and line.split("=", 1)[0].strip() == "Name":
            value = line.split("=", 1)[1].strip() if "=" in line else ""
            names = names + value.split() if value else []
    return names


def wanted_children(texts: Iterable[str]) -> dict[str, tuple[str, str]]:
    """``{child: (parent, "0x8001")}`` for every child name the .network files match."""
    out: dict[str, tuple[str, str]] = {}
    for text in texts:
        for name in match_names(text):
            m = CHILD_NAME.fullmatch(name)
            if m:
                out[name] = (m.group(1), "0x" + m.group(2))
    return out


def plan(wanted: Mapping[str, tuple[str, str]], links: set[str], made: set[str]) -> tuple[list[str], list[str]]:
    """(children to create, children to delete): create those wanted whose parent exists and that no link has yet;
    delete those this tool made that are no longer wanted."""
    create = sorted(c for c, (parent, _) in wanted.items() if parent in links and c not in links)
    delete = sorted(c for c in made if c not in wanted)
    return create, delete


def _network_texts(dirs: Iterable[str]) -> list[str]:
    texts = []
    for d in dirs:
        for path in sorted(Path(d).glob("*.network")) if Path(d).is_dir() else []:
            try:
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue  # removed while we read: the next change runs us again
    return texts


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    return {line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.splitlines() if line.count(":") >= 2}


def sync(dirs: Iterable[str], state: Path) -> int:
    """Make the links match the configuration; 0, or 1 when a child could not be made (said on stderr)."""
    state.mkdir(parents=True, exist_ok=True, mode=0o755)
    made = {p.name.removesuffix(".pkey") for p in state.glob("*.pkey")}
    wanted = wanted_children(_network_texts(dirs))
    create, delete = plan(wanted, _links(), made)
    rc = 0
    for child in delete:
        subprocess.run(["ip", "link", "del", "dev", child], capture_output=True, check=False)
        (state / f"{child}.pkey").unlink(missing_ok=True)
        print(f"deleted P_Key child {child}: no configuration asks for it any more", file=sys.stderr)
    for child in create:
        parent, pkey = wanted[child]
        done = subprocess.run(["ip", "link", "add", "link", parent, "name", child, "type", "macvlan", "mode", "bridge"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"could not create P_Key child {child} of {parent}: {done.stderr.strip()}", file=sys.stderr)
            rc = 1
            continue
        (state / f"{child}.pkey").write_text(pkey + "\n", encoding="ascii")
        print(f"created P_Key child {child} of {parent} with P_Key {pkey}", file=sys.stderr)
    return rc


def _fingerprint(dirs: Iterable[str]) -> list[tuple[str, int, int]]:
    out = []
    for d in dirs:
        for path in sorted(Path(d).glob("*.network")) if Path(d).is_dir() else []:
            try:
                st = path.stat()
            except OSError:
                continue
            out.append((str(path), st.st_mtime_ns, st.st_size))
    return out


def main() -> int:
    """Sync until the configuration stops changing: the path unit does not start us again for a change made while
    we run (a oneshot being started only merges with its running start), so we look again ourselves."""
    dirs = os.environ.get("PLAB_IPOIB_NETWORK_DIRS", ":".join(NETWORK_DIRS)).split(":")
    state = Path(os.environ.get("PLAB_IPOIB_STATE", STATE_DIR))
    rc, seen = 0, None
    for _ in range(20):
        now = _fingerprint(dirs)
        if now == seen:
            break
        seen = now
        rc = sync(dirs, state)
    return rc


if __name__ == "__main__":
    sys.exit(main())
