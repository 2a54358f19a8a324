"""A fake remote for storage verification on nodes without a kernel NFS client (the lab's situation), and the
bundled lab spec loaded with the lab overlay's site_vars. Shared by test_storage.py and test_verify_storage.py."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from provisioner.fabric import storage
from provisioner.remote import Completed
from provisioner.spec.cluster import Cluster
from provisioner.spec.load import load_text

ROOT = Path(__file__).resolve().parents[2]
LAB_SPEC = ROOT / "examples" / "lab" / "cluster.yaml"
LAB_EXPORT_URL = "nfs://10.30.0.21/export/shared/"


def lab_cluster(site_vars: Mapping[str, Any] | None = None) -> Cluster:
    """The bundled lab spec with the lab overlay's site_vars (or ``site_vars``): what `lab-demo` verifies."""
    from provisioner.lab.cluster import LAB_SITE_VARS

    overlay = {"site_vars": dict(LAB_SITE_VARS if site_vars is None else site_vars)}
    result = load_text(LAB_SPEC.read_text(encoding="utf-8"), "cluster.yaml", overlay=overlay)
    assert result.cluster is not None, result.diagnostics
    return result.cluster


class NoKernelNfsRemote:
    """Nodes whose kernel has (or lacks) NFS, libnfs tools on some, and an NFS server holding files.

    ``served`` False: the server answers NFS calls with an error, as nfs-cp does when no export is there.
    """

    def __init__(self, kernel_nfs: Sequence[str] = (), no_tools: Sequence[str] = (), served: bool = True,
                 server_dir_differs: bool = False, tables: Mapping[str, str] | None = None) -> None:
        self.kernel_nfs = set(kernel_nfs)
        self.no_tools = set(no_tools)
        self.served = served
        self.server_dir_differs = server_dir_differs
        self.tables = dict(tables or {})
        self.exported: dict[str, str] = {}  # file name in the export -> content (the server's directory)
        self.calls: list[tuple[str, list[str]]] = []

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        args = list(argv)
        self.calls.append((host, args))
        script = args[2] if args[0] == "sh" else ""
        if args == ["true"]:  # verify's reachability probe
            return Completed(0, "", "")
        if "cat /proc/mounts" in script:
            return Completed(0, self.tables.get(host, "overlay / overlay rw,relatime 0 0\n"), "")
        if "/proc/filesystems" in script:
            kinds = [k for k in storage.KERNEL_SUPPORT if f"echo {k}=yes" in script]
            has = {"nfs": host in self.kernel_nfs, "lustre": False, "nfsd": False}
            return Completed(0, "".join(f"{k}={'yes' if has[k] else 'no'}\n" for k in kinds), "")
        for tool in ("nfs-cp", "nfs-cat", "nfs-ls"):
            if f"command -v {tool}" in script:
                if host in self.no_tools:
                    return Completed(127, "", f"{tool}: not installed (libnfs-utils)\n")
                if not self.served:
                    return Completed(1, "", "Failed to mount nfs share : nfs_service failed\n"
                                            f"Failed to open {LAB_EXPORT_URL}x?version=4\n")
                words = list(shlex.shlex(script, posix=True, punctuation_chars=True))
                url = words[len(words) - 1 - words[::-1].index(tool) + (2 if tool == "nfs-cp" else 1)]
                assert url.startswith(LAB_EXPORT_URL) and url.endswith("?version=4"), url
                name = url[len(LAB_EXPORT_URL):-len("?version=4")]
                if tool == "nfs-cp":
                    self.exported[name] = shlex.split(script.split("printf %s ", 1)[1])[0]
                    return Completed(0, "", "")
                if tool == "nfs-cat":
                    return Completed(0, self.exported.get(name, ""), "") if name in self.exported else \
                        Completed(1, "", "Failed to open file")
                return Completed(0, "\n".join(self.exported) + "\n", "")
        prefix = "/export/shared/"
        if args[0] == "cat" and args[1].startswith(prefix):
            content = None if self.server_dir_differs else self.exported.get(args[1][len(prefix):])
            return Completed(0, content, "") if content is not None else Completed(1, "", "No such file or directory")
        if args[:2] == ["rm", "-f"] and args[2].startswith(prefix):
            self.exported.pop(args[2][len(prefix):], None)
            return Completed(0, "", "")
        raise AssertionError(f"unexpected command on {host}: {args}")

    def start(self, *a: Any, **k: Any) -> Any:
        raise AssertionError("not used")

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        return {h: self.run(h, argv, timeout) for h, argv in commands.items()}


