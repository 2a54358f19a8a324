"""Filters of the nfs_server role: how nfs.conf turns on the NFS/RDMA listener, and what nfsd listens on.

nfs-utils changed the meaning of ``[nfsd] rdma=`` in 2.4.2 (commit 0240df0e "nfsd: Adjust nfs.conf setting/parsing
of rdma port", Sep 2019; first tag nfs-utils-2-4-2): before, ``rdma=`` held the port or service name (``rdma=20049``,
``rdma=nfsrdma``); since, it is a boolean and the port is ``rdma-port=`` (the old form is still read when the
boolean is not true). The role writes the form the installed version documents. ``/proc/fs/nfsd/portlist`` lists one
``<transport> <port>`` line per listener (``rdma 20049``, ``tcp 2049``), which is where the kernel says whether the
RDMA listener is really up.
"""

from __future__ import annotations

import re
from typing import Any

NEW_FORM_SINCE = (2, 4, 2)


class NfsServerFilterError(ValueError):
    """The input is not what the filter reads."""


def upstream_version(version: str) -> tuple[int, ...]:
    """``1:2.6.2-4+deb12u1`` (dpkg) or ``2.3.3-57.el8`` (rpm) -> (2, 6, 2): epoch and packaging dropped."""
    text = str(version).strip()
    text = text.split(":", 1)[1] if ":" in text else text
    m = re.match(r"^(\d+(?:\.\d+)*)", text)
    if m is None:
        raise NfsServerFilterError(f"not a package version: {version!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def rdma_settings(version: str, port: int) -> dict[str, Any]:
    """The ``[nfsd]`` keys that turn the RDMA listener on for this nfs-utils version (None: remove the key)."""
    if upstream_version(version) >= NEW_FORM_SINCE:
        return {"rdma": "y", "rdma-port": str(int(port))}
    return {"rdma": str(int(port)), "rdma-port": None}


def portlist(text: str) -> list[list[Any]]:
    """``/proc/fs/nfsd/portlist`` -> [[transport, port], ...] (``rdma 20049`` -> ["rdma", 20049])."""
    out: list[list[Any]] = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out.append([parts[0], int(parts[1])])
        elif line.strip():
            raise NfsServerFilterError(f"not a portlist line: {line!r}")
    return out


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {"nfs_server_rdma_settings": rdma_settings, "nfs_server_portlist": portlist}
