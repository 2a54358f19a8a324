"""Shared storage against the spec: every client has every NFS/Lustre mount, from the right source, over the
right transport, with the right options; a file written on one node is read back on another; and the write
throughput of one ``dd`` clears ``storage.min_write_mbps`` when the spec sets it.

Why each part exists: an NFS mount that silently fell back from RDMA to TCP (``proto=tcp`` instead of
``proto=rdma``), lost ``nconnect`` or came up read-only still "works" and still shows in ``df``; checkpoints
then write at a tenth of the expected rate and nothing prints an error. The kernel's own mount table is the
only place that says what was negotiated, so the check reads ``/proc/mounts`` (``findmnt -J`` output is
accepted too) and compares option by option. A mount that is present can still point at a stale or wrong
export; the round trip (write a token on node A, read it on node B) proves both see the same data.

Nodes that cannot mount at all: a site may declare, with the roles' own switches (``site_vars``
``nfs_client_require_kernel_nfs: false``, ``lustre_client_require_kernel_support: false``), that its kernels need
not have the client (the roles then write the units and skip the mount). A missing mount is then reported
*skipped*, never passed, and only after the node's kernel was seen to lack the filesystem (a kernel that has it
and still shows no mount fails as usual). For a skipped NFS mount the export is still checked for real, from
user space: libnfs's ``nfs-cp``/``nfs-cat`` write a token over NFS from one client, read it back from another,
and the server's own directory must hold it (``storage_export``).

Everything here is a pure function of the spec and of tool output, except :func:`check_storage`, which only
decides what to run where through a :class:`provisioner.remote.Remote`.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from provisioner.errors import ParseError
from provisioner.fabric.findings import CheckResult, Finding, Severity, Value
from provisioner.remote import Completed, Remote
from provisioner.spec import ipoib
from provisioner.spec.cluster import Cluster
from provisioner.spec.rules import members

CHECK = "storage"
ROUNDTRIP_CHECK = "storage_roundtrip"
THROUGHPUT_CHECK = "storage_throughput"
EXPORT_CHECK = "storage_export"
PROBE_TIMEOUT_S = 30.0
DD_TIMEOUT_S = 600.0
DEFAULT_WRITE_MIB = 1024
RDMA_PORT = "20049"

Kind = Literal["nfs", "lustre"]

KERNEL_SUPPORT: dict[str, tuple[str, str, str]] = {
    "nfs": ("nfs_client_require_kernel_nfs", "grep -Eqw 'nfs4?' /proc/filesystems || modinfo nfs >/dev/null 2>&1",
            "NFS client"),
    "lustre": ("lustre_client_require_kernel_support",
               "grep -qw lustre /proc/filesystems || modinfo lustre >/dev/null 2>&1", "Lustre client"),
    "nfsd": ("nfs_server_require_kernel_nfsd", "grep -qw nfsd /proc/filesystems || modinfo nfsd >/dev/null 2>&1",
             "NFS server (nfsd)"),
}
"""Per kernel filesystem: the role variable that makes it optional, the probe the role itself runs (exit 0:
the kernel has it), and what to call it."""

# Options that only mount(8)/systemd read: they never appear in the kernel's mount table.
_USERSPACE_OPTIONS = frozenset({"_netdev", "nofail", "auto", "noauto", "user", "users", "nouser", "defaults"})
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/@+-]*$")
_DD_LINE = re.compile(r"^(?P<bytes>\d+) bytes\b.*\bcopied, (?P<secs>[0-9]+(?:[.,][0-9]+)?) s\b", re.MULTILINE)


# ---------------------------------------------------------------- observed mounts (parsers)
@dataclass(frozen=True, slots=True)
class MountEntry:
    """One line of the kernel's mount table: ``source target fstype options``."""

    source: str
    target: str
    fstype: str
    options: tuple[str, ...]

    def option(self, name: str) -> str | None:
        """Value of ``name=value``; ``""`` for a bare flag; None when absent (last one wins, like the kernel)."""
        found: str | None = None
        for opt in self.options:
            key, sep, value = opt.partition("=")
            if key == name:
                found = value if sep else ""
        return found


def _unescape(field: str) -> str:
    """/proc/mounts escapes space, tab, newline and backslash as ``\\ooo`` octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_proc_mounts(text: str) -> list[MountEntry]:
    """Entries of ``/proc/mounts`` (or ``/etc/mtab``), in table order (later entries are mounted on top)."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) < 4:
            raise ParseError(f"/proc/mounts line {number} has {len(fields)} fields, expected at least 4: {line!r}")
        source, target, fstype, options = (_unescape(f) for f in fields[:4])
        entries.append(MountEntry(source, target, fstype, tuple(o for o in options.split(",") if o)))
    return entries


def _flatten(nodes: Iterable[Any], out: list[MountEntry]) -> None:
    for node in nodes:
        if not isinstance(node, dict) or "target" not in node:
            raise ParseError("findmnt -J: every filesystem needs a 'target'")
        options = str(node.get("options") or "")
        out.append(MountEntry(str(node.get("source") or ""), str(node["target"]), str(node.get("fstype") or ""),
                              tuple(o for o in options.split(",") if o)))
        _flatten(node.get("children") or [], out)


def parse_findmnt_json(text: str) -> list[MountEntry]:
    """Entries of ``findmnt -J`` (tree or ``--list``), parents before children."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"findmnt -J output is not JSON: {exc.msg} at line {exc.lineno}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("filesystems"), list):
        raise ParseError("findmnt -J output has no 'filesystems' list")
    out: list[MountEntry] = []
    _flatten(data["filesystems"], out)
    return out


_MOUNT_LINE = re.compile(r"^(?P<source>\S+) on (?P<target>\S+) type (?P<fstype>\S+) \((?P<options>[^)]*)\)$")


def parse_mount_output(text: str) -> list[MountEntry]:
    """Entries of ``mount`` (util-linux) output, ``SOURCE on TARGET type FSTYPE (OPTIONS)``, in order."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _MOUNT_LINE.match(line.strip())
        if m is None:
            raise ParseError(f"mount output line {number} is not 'SOURCE on TARGET type FSTYPE (OPTIONS)': {line!r}")
        entries.append(MountEntry(m["source"], m["target"], m["fstype"],
                                  tuple(o for o in m["options"].split(",") if o)))
    return entries


def parse_mounts(text: str) -> list[MountEntry]:
    """Any of: JSON (``findmnt -J``) when it starts with ``{``, ``mount`` output (``X on Y type T (...)``), else the
    ``/proc/mounts`` table."""
    if text.lstrip().startswith("{"):
        return parse_findmnt_json(text)
    first = next((line for line in text.splitlines() if line.strip()), "")
    return parse_mount_output(text) if _MOUNT_LINE.match(first.strip()) else parse_proc_mounts(text)


# ---------------------------------------------------------------- expected mounts (from the spec)
@dataclass(frozen=True, slots=True)
class ExpectedMount:
    """A mount the spec puts on a node. ``sources`` lists every spelling the kernel may show for it."""

    kind: Kind
    path: str
    sources: tuple[str, ...]
    fstypes: tuple[str, ...]
    transport: str | None = None
    version: str | None = None
    nconnect: int | None = None
    options: tuple[str, ...] = ()
    automount: bool = False
    server: str = ""
    address: str = ""
    export: str = ""
    server_kernel: bool = False
    network: str | None = None  # the IPoIB network the mount goes over (its address is the server's IPoIB one)

    @property
    def label(self) -> str:
        return f"{self.kind} {self.path}"


def _nfs_fstypes(version: str) -> tuple[str, ...]:
    # The kernel reports every NFSv4.x mount as "nfs4" (even with -t nfs) and v3 as "nfs".
    return ("nfs",) if version == "3" else ("nfs4",)


def expected_mounts(cluster: Cluster) -> dict[str, list[ExpectedMount]]:
    """``{node: [ExpectedMount, ...]}`` for every node that gets NFS or Lustre mounts, from the spec alone."""
    out: dict[str, list[ExpectedMount]] = {}
    known = {n.name for n in cluster.nodes}
    storage = cluster.spec.storage
    kernel_exports = {(e.server, e.path) for e in storage.nfs.exports if e.implementation == "kernel"}
    for m in storage.nfs.mounts:
        clients = members(m.on, cluster)
        network = ipoib.mount_network(cluster, m, clients)
        address = ipoib.nfs_server_address(cluster, m, clients)
        exp = ExpectedMount(
            kind="nfs", path=m.mount,
            sources=tuple(dict.fromkeys((f"{address}:{m.export}", f"{m.server}:{m.export}"))),
            fstypes=_nfs_fstypes(m.version), transport=m.transport, version=m.version, nconnect=m.nconnect,
            options=tuple(m.options), automount=m.automount, server=m.server, address=address, export=m.export,
            server_kernel=(m.server, m.export) in kernel_exports, network=network)
        for host in clients:
            if host in known:
                out.setdefault(host, []).append(exp)
    for fs in storage.lustre:
        exp = ExpectedMount(kind="lustre", path=fs.mount, sources=(f"{':'.join(fs.mgs)}:/{fs.fsname}",),
                            fstypes=("lustre",), options=tuple(fs.options))
        for host in members(fs.on, cluster):
            if host in known:
                out.setdefault(host, []).append(exp)
    return out


# ---------------------------------------------------------------- comparison (pure)
def _finding(node: str, exp: ExpectedMount, expected: Value, observed: Value, message: str, hint: str,
             severity: Severity = "error") -> Finding:
    return Finding(check=CHECK, severity=severity, node=node, device=None, port=None, expected=expected,
                   observed=observed, message=f"{exp.path}: {message}", hint=hint)


def _lustre_nids(source: str) -> list[str]:
    """NIDs of a Lustre client source (``a@o2ib,b@o2ib:c@o2ib:/fs`` -> [a, b, c] order kept)."""
    head, _, _ = source.rpartition(":/")
    return [nid for group in head.split(":") for nid in group.split(",") if nid]


def _source_matches(exp: ExpectedMount, got: MountEntry) -> bool:
    if got.source in exp.sources:
        return True
    if exp.kind == "lustre":
        # mount.lustre may canonicalise separators (',' within a failover pair, ':' between pairs).
        want = exp.sources[0]
        return (got.source.rpartition(":/")[2] == want.rpartition(":/")[2]
                and set(_lustre_nids(got.source)) == set(_lustre_nids(want)))
    return False


def _option_present(want: str, got: MountEntry) -> bool:
    key, sep, value = want.partition("=")
    have = got.option(key)
    return have is not None and (not sep or have == value)


def _nfs_findings(node: str, exp: ExpectedMount, got: MountEntry) -> list[Finding]:
    out: list[Finding] = []
    vers = got.option("vers")
    if exp.version and vers != exp.version:
        out.append(_finding(node, exp, exp.version, vers, f"NFS version {vers or 'unknown'}, the spec says "
                            f"{exp.version}", "the server may not offer that version; check its exports and "
                            "remount with vers= set"))
    proto = got.option("proto")
    if exp.transport and proto != exp.transport:
        hint = ("NFS over RDMA fell back or was never asked for: load rpcrdma on the client (modprobe rpcrdma), "
                "make the server listen on rdma 20049 (/proc/fs/nfsd/portlist), remount with proto=rdma,port=20049"
                if exp.transport == "rdma" else "remount with proto=tcp")
        out.append(_finding(node, exp, exp.transport, proto, f"transport proto={proto or 'unknown'}, the spec "
                            f"says {exp.transport}", hint))
    elif exp.transport == "rdma" and got.option("port") not in (RDMA_PORT, None):
        out.append(_finding(node, exp, RDMA_PORT, got.option("port"), f"RDMA on port {got.option('port')}, "
                            f"expected {RDMA_PORT}", "remount with port=20049 (the NFS/RDMA port)",
                            severity="warning"))
    addr = got.option("addr")
    if exp.network is not None and addr is not None and addr != exp.address:
        out.append(_finding(node, exp, exp.address, addr, f"the kernel talks to addr={addr}, not {exp.server}'s "
                            f"IPoIB address {exp.address} on {exp.network}", "the source names a host that resolves "
                            "to another interface (RDMA-CM then picks Ethernet or fails): mount the IPoIB address"))
    if exp.nconnect is not None and exp.nconnect > 1:
        have = got.option("nconnect")
        if have != str(exp.nconnect):
            out.append(_finding(node, exp, exp.nconnect, have, f"nconnect={have or 1}, the spec says "
                                f"{exp.nconnect}", "the kernel needs 5.3+ for nconnect; remount with "
                                f"nconnect={exp.nconnect}"))
    return out


def compare_mount(node: str, exp: ExpectedMount, got: MountEntry | None) -> list[Finding]:
    """Findings for one expected mount against the top-most kernel entry at its path (None: nothing there)."""
    if got is None:
        return [_finding(node, exp, exp.sources[0], None, f"{exp.kind} mount missing (nothing mounted there)",
                         f"systemctl status {unit_name(exp.path)}; journalctl -u {unit_name(exp.path)}")]
    if got.fstype == "autofs":
        what = ("the automount did not trigger the mount" if exp.automount
                else "only an automount point is there, the spec asks for a mount at boot")
        return [_finding(node, exp, exp.fstypes[0], "autofs", what,
                         f"ls {exp.path}; systemctl status {unit_name(exp.path)}")]
    out: list[Finding] = []
    if got.fstype not in exp.fstypes:
        out.append(_finding(node, exp, exp.fstypes[0], got.fstype, f"filesystem type {got.fstype}, expected "
                            f"{'/'.join(exp.fstypes)}", "something else is mounted on this path; unmount it and "
                            "start the mount unit"))
        return out
    if not _source_matches(exp, got):
        out.append(_finding(node, exp, exp.sources[0], got.source, f"mounted from {got.source}, the spec says "
                            f"{exp.sources[0]}", "wrong server or export: fix the mount unit/fstab line"))
    if got.option("ro") is not None and "ro" not in exp.options:
        out.append(_finding(node, exp, "rw", "ro", "mounted read-only", "the server exports it read-only to this "
                            "client, or the mount fell back to ro; check the export's client list"))
    if exp.kind == "nfs":
        out.extend(_nfs_findings(node, exp, got))
    missing = [o for o in exp.options if o not in _USERSPACE_OPTIONS and o != "ro" and not _option_present(o, got)]
    if missing:
        out.append(_finding(node, exp, ",".join(exp.options), ",".join(got.options),
                            f"option(s) {', '.join(missing)} not in effect", "remount with the spec's options "
                            "(systemctl restart the mount unit)"))
    return out


def _top_entries(observed: Sequence[MountEntry]) -> dict[str, MountEntry]:
    """Path -> the entry mounted on top there (later lines of the table cover earlier ones)."""
    top: dict[str, MountEntry] = {}
    for entry in observed:
        top[entry.target.rstrip("/") or "/"] = entry
    return top


def mount_findings(node: str, expected: Sequence[ExpectedMount], observed: Sequence[MountEntry]) -> list[Finding]:
    """Every expected mount of one node against its mount table (stacked mounts: the last entry is on top)."""
    top = _top_entries(observed)
    out: list[Finding] = []
    for exp in expected:
        out.extend(compare_mount(node, exp, top.get(exp.path.rstrip("/") or "/")))
    return out


def unit_name(path: str) -> str:
    """systemd's mount unit name for a path (``/lustre/scratch`` -> ``lustre-scratch.mount``), as systemd-escape -p."""
    trimmed = path.strip("/")
    if not trimmed:
        return "-.mount"
    out = []
    for i, ch in enumerate(trimmed):
        if ch == "/":
            out.append("-")
        elif ch.isalnum() or ch in ":_" or (ch == "." and i > 0):
            out.append(ch)
        else:
            out.append(f"\\x{ord(ch):02x}")
    return "".join(out) + ".mount"


# ---------------------------------------------------------------- probes, round trip, throughput
def _safe(path: str) -> str:
    if not _SAFE_PATH.match(path) or "/../" in f"{path}/":
        raise ValueError(f"unsafe mount path {path!r}")
    return path


def mounts_probe(expected: Sequence[ExpectedMount]) -> list[str]:
    """Touch automount points first (so autofs mounts the real filesystem), then print the kernel's table."""
    auto = [shlex.quote(_safe(e.path)) for e in expected if e.automount]
    touch = f"for p in {' '.join(auto)}; do ls -d \"$p\"/. >/dev/null 2>&1; done; " if auto else ""
    return ["sh", "-c", f"{touch}cat /proc/mounts"]


@dataclass(frozen=True, slots=True)
class RoundTrip:
    """Write ``token`` into ``path`` on ``writer``, read it back on ``reader``."""

    path: str
    writer: str
    reader: str
    file: str
    token: str

    def write_argv(self) -> list[str]:
        return ["sh", "-c", f"printf %s {shlex.quote(self.token)} > {shlex.quote(self.file)} && sync"]

    def read_argv(self) -> list[str]:
        return ["cat", self.file]

    def cleanup_argv(self) -> list[str]:
        return ["rm", "-f", self.file]


def plan_roundtrips(expected: Mapping[str, Sequence[ExpectedMount]],
                    token: Callable[[], str] = lambda: secrets.token_hex(8)) -> list[RoundTrip]:
    """One round trip per shared filesystem (same source and path on at least two nodes): first two nodes."""
    by_fs: dict[tuple[str, str], list[str]] = {}
    for node in sorted(expected):
        for exp in expected[node]:
            by_fs.setdefault((exp.sources[0], exp.path), []).append(node)
    trips = []
    for (_, path), nodes in sorted(by_fs.items()):
        if len(nodes) >= 2:
            tok = token()
            file = f"{_safe(path).rstrip('/')}/.provisioner-storage-check-{tok}"
            trips.append(RoundTrip(path, nodes[0], nodes[1], file, f"provisioner {nodes[0]} {tok}"))
    return trips


def roundtrip_finding(trip: RoundTrip, wrote: Completed, read: Completed | None) -> Finding | None:
    """None when the reader saw exactly what the writer wrote."""
    if wrote.rc != 0:
        return Finding(ROUNDTRIP_CHECK, "error", trip.writer, None, None, "write ok", f"exit {wrote.rc}",
                       f"{trip.path}: cannot write a test file ({wrote.stderr.strip()[:200] or 'no message'})",
                       "check the export is rw for this client and root_squash vs. directory permissions")
    got = None if read is None or read.rc != 0 else read.stdout
    if got == trip.token:
        return None
    observed = "unreadable" if got is None else f"{len(got)} bytes, different content"
    return Finding(ROUNDTRIP_CHECK, "error", trip.reader, None, None, trip.token, observed,
                   f"{trip.path}: file written on {trip.writer} is not visible from {trip.reader}",
                   "both nodes must mount the same export: compare their mount sources; a stale NFS handle "
                   "or a local directory under an unmounted path shows the same way", peer=trip.writer)


def dd_argv(path: str, mib: int) -> list[str]:
    """``dd`` writing ``mib`` MiB into a scratch file under ``path``; conv=fsync so the figure includes the flush."""
    if not 1 <= mib <= 1 << 20:
        raise ValueError(f"dd size {mib} MiB out of range")
    file = f"{_safe(path).rstrip('/')}/.provisioner-storage-dd"
    return ["sh", "-c", f"dd if=/dev/zero of={shlex.quote(file)} bs=1M count={mib} conv=fsync 2>&1; "
                        f"rc=$?; rm -f {shlex.quote(file)}; exit $rc"]


@dataclass(frozen=True, slots=True)
class DdResult:
    bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        """Decimal MB/s, the unit dd itself prints."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else float("inf")


def parse_dd(text: str) -> DdResult:
    """The ``N bytes (...) copied, S s, R MB/s`` summary of GNU dd (rate recomputed from bytes and seconds)."""
    matches = list(_DD_LINE.finditer(text))
    if not matches:
        raise ParseError("no 'bytes ... copied' summary in dd output")
    last = matches[-1]
    return DdResult(int(last.group("bytes")), float(last.group("secs").replace(",", ".")))


def throughput_finding(node: str, path: str, result: DdResult, min_mbps: float | None) -> Finding | None:
    """An error when the measured write rate is below the spec's floor."""
    if min_mbps is None or result.mb_per_s >= min_mbps:
        return None
    return Finding(THROUGHPUT_CHECK, "error", node, None, None, min_mbps, round(result.mb_per_s, 1),
                   f"{path}: dd wrote {result.mb_per_s:.0f} MB/s, the spec asks for at least {min_mbps:g}",
                   "check the transport (proto=rdma), nconnect, the server's disks and its network link")


# ---------------------------------------------------------------- orchestration
def _why(done: Completed) -> str:
    if done.unreachable:
        return done.stderr.strip() or "unreachable"
    if done.timed_out:
        return "timed out"
    return f"exit {done.rc}: {done.stderr.strip()[:200]}"


def optional_kinds(cluster: Cluster) -> frozenset[str]:
    """Kernel filesystems the site declares its nodes need not have (a role's ``*_require_*`` set to false)."""
    site = cluster.spec.site_vars
    return frozenset(kind for kind, (var, _, _) in KERNEL_SUPPORT.items() if site.get(var) is False)


def kernel_probe(kinds: Iterable[str]) -> list[str]:
    """One line ``kind=yes|no`` per kernel filesystem, by the same test the roles use."""
    lines = [f"if {KERNEL_SUPPORT[k][1]}; then echo {k}=yes; else echo {k}=no; fi" for k in sorted(set(kinds))]
    return ["sh", "-c", "; ".join(lines)]


def parse_kernel_probe(text: str) -> dict[str, bool]:
    """``{kind: has it}`` from :func:`kernel_probe` output; kinds not answered are absent (unknown)."""
    out: dict[str, bool] = {}
    for line in text.splitlines():
        kind, sep, answer = line.strip().partition("=")
        if sep and kind in KERNEL_SUPPORT and answer in ("yes", "no"):
            out[kind] = answer == "yes"
    return out


@dataclass(frozen=True, slots=True)
class NodeMounts:
    """One node's mounts judged: the result, the mounts that are fine, and those skipped by the site's word."""

    result: CheckResult
    healthy: list[ExpectedMount]
    skipped: list[ExpectedMount]


def judge_node(node: str, expected: Sequence[ExpectedMount], observed: Sequence[MountEntry],
               kernel: Mapping[str, bool], optional: frozenset[str]) -> NodeMounts:
    """Every expected mount of one node; a *missing* mount of an optional kind on a kernel seen to lack that
    filesystem is skipped with an info finding (never passed); everything else is compared as usual."""
    top = _top_entries(observed)
    found: list[Finding] = []
    healthy: list[ExpectedMount] = []
    skipped: list[ExpectedMount] = []
    for exp in expected:
        got = top.get(exp.path.rstrip("/") or "/")
        if got is None and exp.kind in optional and kernel.get(exp.kind) is False:
            var, _, what = KERNEL_SUPPORT[exp.kind]
            skipped.append(exp)
            found.append(_finding(node, exp, exp.sources[0], None, f"{exp.kind} mount skipped, not checked: the "
                                  f"kernel has no {what} and the site says it need not ({var}: false)",
                                  "nothing is mounted here, so no mount option is proven; "
                                  + ("the export is checked from user space instead (storage_export)"
                                     if exp.kind == "nfs" else "Lustre cannot be checked without a kernel client"),
                                  severity="info"))
            continue
        mine = compare_mount(node, exp, got)
        found.extend(mine)
        if not any(f.severity == "error" for f in mine):
            healthy.append(exp)
    measurements: dict[str, Value] = {"mounts_expected": len(expected), "mounts_ok": len(healthy)}
    if skipped:
        measurements["mounts_skipped"] = len(skipped)
    if skipped and not any(f.severity == "error" for f in found):
        whats = sorted({KERNEL_SUPPORT[e.kind][2] for e in skipped})
        reason = (f"no kernel {' or '.join(whats)} (declared optional): "
                  f"{', '.join(e.path for e in skipped)} not mounted")
        return NodeMounts(CheckResult.skip(CHECK, node, reason, found, measurements), healthy, skipped)
    return NodeMounts(CheckResult.from_findings(CHECK, node, found, measurements), healthy, skipped)


@dataclass(frozen=True, slots=True)
class ExportProbe:
    """An NFS export read and written from user space (libnfs), for clients whose kernel cannot mount it.

    ``writer`` copies a token file into the export over NFS, ``reader`` reads it back over NFS, and the
    server's own directory must hold the same bytes; read-only mounts only list the export.
    """

    server: str
    address: str
    export: str
    version: str
    writer: str
    reader: str
    name: str
    token: str
    read_only: bool = False

    def url(self, name: str = "") -> str:
        """``nfs://host/export/name?version=3|4`` (libnfs speaks NFSv4.0 for any 4.x the spec asks for)."""
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"nfs://{host}{_safe(self.export).rstrip('/')}/{name}?version={'3' if self.version == '3' else '4'}"

    @staticmethod
    def _guarded(tool: str, body: str) -> list[str]:
        guard = f'command -v {tool} >/dev/null || {{ echo "{tool}: not installed (libnfs-utils)" >&2; exit 127; }}; '
        return ["sh", "-c", guard + body]

    def write_argv(self) -> list[str]:
        return self._guarded("nfs-cp", f't=$(mktemp) && printf %s {shlex.quote(self.token)} > "$t" && '
                                       f'nfs-cp "$t" {shlex.quote(self.url(self.name))}; rc=$?; rm -f "$t"; exit $rc')

    def read_argv(self) -> list[str]:
        return self._guarded("nfs-cat", f"nfs-cat {shlex.quote(self.url(self.name))}")

    def list_argv(self) -> list[str]:
        return self._guarded("nfs-ls", f"nfs-ls {shlex.quote(self.url())}")

    @property
    def server_file(self) -> str:
        return f"{_safe(self.export).rstrip('/')}/{self.name}"


def plan_export_probes(skipped: Mapping[str, Sequence[ExpectedMount]],
                       token: Callable[[], str] = lambda: secrets.token_hex(8)) -> list[ExportProbe]:
    """One probe per NFS export that some node could not mount: first such client writes, the second reads."""
    by_export: dict[tuple[str, str], tuple[ExpectedMount, list[str]]] = {}
    for node in sorted(skipped):
        for exp in skipped[node]:
            if exp.kind == "nfs":
                by_export.setdefault((exp.server, exp.export), (exp, []))[1].append(node)
    probes = []
    for (_, _), (exp, nodes) in sorted(by_export.items()):
        tok = token()
        probes.append(ExportProbe(exp.server, exp.address, exp.export, exp.version or "4.2", nodes[0],
                                  nodes[1] if len(nodes) > 1 else nodes[0], f".provisioner-storage-check-{tok}",
                                  f"provisioner {nodes[0]} {tok}", read_only="ro" in exp.options))
    return probes


def _one_line(text: str, limit: int = 240) -> str:
    """A tool's stderr as one line (libnfs prints its error over two), cut to ``limit`` characters."""
    return "; ".join(line.strip() for line in text.strip().splitlines() if line.strip())[:limit]


def _export_error(probe: ExportProbe, node: str, observed: Value, message: str, hint: str) -> Finding:
    return Finding(EXPORT_CHECK, "error", probe.server, None, None, "served", observed,
                   f"{probe.server}:{probe.export}: {message}", hint, peer=node)


_EXPORT_HINT = ("is the NFS server running and serving this path (Ganesha: /var/log/ganesha/ganesha.log, "
                "dbus ShowExports; kernel: exportfs -v)? Does the export's client list include {node}? With "
                "root_squash, root writes as nobody and the directory must allow it")


def export_result(probe: ExportProbe, wrote: Completed, read: Completed | None,
                  on_server: Completed | None) -> CheckResult:
    """The ``storage_export`` result of one probe (see :class:`ExportProbe`); a missing tool is could-not-run."""
    measurements: dict[str, Value] = {"export": probe.export, "writer": probe.writer, "reader": probe.reader,
                                      "via": f"libnfs NFSv{'3' if probe.version == '3' else '4'}"}
    for done, node in ((wrote, probe.writer), (read, probe.reader)):
        if done is not None and (done.unreachable or done.timed_out or done.rc == 127):
            return CheckResult.could_not_run(EXPORT_CHECK, probe.server, f"{node}: {_why(done)}")
    if wrote.rc != 0:
        verb = "list" if probe.read_only else "write to"
        finding = _export_error(probe, probe.writer, f"exit {wrote.rc}", f"{probe.writer} cannot {verb} the export "
                                f"over NFS ({_one_line(wrote.stderr) or 'no message'})",
                                _EXPORT_HINT.format(node=probe.writer))
        return CheckResult.from_findings(EXPORT_CHECK, probe.server, [finding], measurements)
    found: list[Finding] = []
    if read is not None and (read.rc != 0 or read.stdout != probe.token):
        seen = f"exit {read.rc}" if read.rc != 0 else f"{len(read.stdout)} bytes, different content"
        found.append(_export_error(probe, probe.reader, seen, f"a file written over NFS from {probe.writer} is not "
                                   f"read back over NFS from {probe.reader}", _EXPORT_HINT.format(node=probe.reader)))
    if on_server is not None and (on_server.rc != 0 or on_server.stdout != probe.token):
        seen = "missing" if on_server.rc != 0 else "different content"
        found.append(_export_error(probe, probe.writer, seen, f"a file written over NFS is not in {probe.export} on "
                                   f"{probe.server} itself", "the server exports another directory than the spec's "
                                   "path (check the EXPORT Path / exports line)"))
    return CheckResult.from_findings(EXPORT_CHECK, probe.server, found, measurements)


def _server_skip(probe: ExportProbe, exp_kernel: bool, optional: frozenset[str], remote: Remote) -> str | None:
    """Why the export cannot be served at all (a kernel export on a server whose kernel has no nfsd, declared
    optional by the site), or None when it must be checked."""
    if not exp_kernel or "nfsd" not in optional:
        return None
    done = remote.run(probe.server, kernel_probe(["nfsd"]), timeout=PROBE_TIMEOUT_S)
    if done.rc == 0 and parse_kernel_probe(done.stdout).get("nfsd") is False:
        return (f"{probe.export} is a kernel export and {probe.server}'s kernel has no nfsd (declared optional): "
                "nothing can serve it")
    return None


def check_exports(probes: Sequence[ExportProbe], kernel_exports: set[tuple[str, str]], optional: frozenset[str],
                  remote: Remote) -> list[CheckResult]:
    """Run each :class:`ExportProbe`: write (or list), read back, look on the server, clean up."""
    results: list[CheckResult] = []
    for probe in probes:
        why = _server_skip(probe, (probe.server, probe.export) in kernel_exports, optional, remote)
        if why is not None:
            results.append(CheckResult.skip(EXPORT_CHECK, probe.server, why))
            continue
        if probe.read_only:
            listed = remote.run(probe.writer, probe.list_argv(), timeout=PROBE_TIMEOUT_S)
            results.append(export_result(probe, listed, None, None))
            continue
        wrote = remote.run(probe.writer, probe.write_argv(), timeout=PROBE_TIMEOUT_S)
        read = on_server = None
        if wrote.rc == 0:
            read = remote.run(probe.reader, probe.read_argv(), timeout=PROBE_TIMEOUT_S)
            on_server = remote.run(probe.server, ["cat", probe.server_file], timeout=PROBE_TIMEOUT_S)
            remote.run(probe.server, ["rm", "-f", probe.server_file], timeout=PROBE_TIMEOUT_S)
        results.append(export_result(probe, wrote, read, on_server))
    return results


def check_storage(cluster: Cluster, remote: Remote, write_mib: int = DEFAULT_WRITE_MIB,
                  token: Callable[[], str] = lambda: secrets.token_hex(8)) -> list[CheckResult]:
    """Mounts on every client, one round trip per shared filesystem, dd throughput when a floor is set, and
    the user-space export check for NFS mounts skipped on kernels declared unable to mount (module docstring)."""
    expected = expected_mounts(cluster)
    if not expected:
        return []
    optional = optional_kinds(cluster)
    results: list[CheckResult] = []
    tables = remote.run_many({n: mounts_probe(e) for n, e in expected.items()}, timeout=PROBE_TIMEOUT_S)
    observed: dict[str, list[MountEntry]] = {}
    for node in sorted(expected):
        done = tables.get(node)
        if done is None or done.rc != 0:
            results.append(CheckResult.could_not_run(CHECK, node, _why(done) if done else "not probed"))
            continue
        try:
            observed[node] = parse_mounts(done.stdout)
        except ParseError as exc:
            results.append(CheckResult.could_not_run(CHECK, node, exc.message))
    kernel = _probe_kernels(expected, observed, optional, remote)
    healthy: dict[str, list[ExpectedMount]] = {}
    skipped: dict[str, list[ExpectedMount]] = {}
    for node in sorted(observed):
        judged = judge_node(node, expected[node], observed[node], kernel.get(node, {}), optional)
        results.append(judged.result)
        healthy[node] = judged.healthy
        if judged.skipped:
            skipped[node] = judged.skipped
    results += _roundtrips(healthy, remote, token)
    kernel_exports = {(e.server, e.export) for mounts in skipped.values() for e in mounts if e.server_kernel}
    results += check_exports(plan_export_probes(skipped, token), kernel_exports, optional, remote)
    if cluster.spec.storage.min_write_mbps is not None:
        results += _throughput(healthy, remote, write_mib, cluster.spec.storage.min_write_mbps)
    return results


def _probe_kernels(expected: Mapping[str, Sequence[ExpectedMount]], observed: Mapping[str, Sequence[MountEntry]],
                   optional: frozenset[str], remote: Remote) -> dict[str, dict[str, bool]]:
    """Ask the kernel of each node that misses a mount of an optional kind whether it has that filesystem."""
    need: dict[str, set[str]] = {}
    for node, entries in observed.items():
        top = _top_entries(entries)
        kinds = {str(e.kind) for e in expected[node] if e.kind in optional and (e.path.rstrip("/") or "/") not in top}
        if kinds:
            need[node] = kinds
    if not need:
        return {}
    done = remote.run_many({n: kernel_probe(k) for n, k in need.items()}, timeout=PROBE_TIMEOUT_S)
    return {n: parse_kernel_probe(d.stdout) for n, d in done.items() if d.rc == 0}


def _roundtrips(healthy: Mapping[str, Sequence[ExpectedMount]], remote: Remote,
                token: Callable[[], str]) -> list[CheckResult]:
    results: list[CheckResult] = []
    for trip in plan_roundtrips(healthy, token):
        wrote = remote.run(trip.writer, trip.write_argv(), timeout=PROBE_TIMEOUT_S)
        read = remote.run(trip.reader, trip.read_argv(), timeout=PROBE_TIMEOUT_S) if wrote.rc == 0 else None
        if wrote.unreachable or (read is not None and read.unreachable):
            results.append(CheckResult.could_not_run(ROUNDTRIP_CHECK, trip.reader, "unreachable"))
            continue
        remote.run(trip.writer, trip.cleanup_argv(), timeout=PROBE_TIMEOUT_S)
        finding = roundtrip_finding(trip, wrote, read)
        results.append(CheckResult.from_findings(ROUNDTRIP_CHECK, trip.reader, [finding] if finding else [],
                                                 {"path": trip.path, "writer": trip.writer}))
    return results


def _throughput(healthy: Mapping[str, Sequence[ExpectedMount]], remote: Remote, write_mib: int,
                floor: float) -> list[CheckResult]:
    results: list[CheckResult] = []
    seen: set[tuple[str, str]] = set()
    for node in sorted(healthy):
        for exp in healthy[node]:
            if (exp.sources[0], exp.path) in seen:
                continue
            seen.add((exp.sources[0], exp.path))
            done = remote.run(node, dd_argv(exp.path, write_mib), timeout=DD_TIMEOUT_S)
            try:
                res = parse_dd(done.stdout + done.stderr)
            except ParseError:
                results.append(CheckResult.could_not_run(THROUGHPUT_CHECK, node, _why(done)))
                continue
            finding = throughput_finding(node, exp.path, res, floor)
            results.append(CheckResult.from_findings(
                THROUGHPUT_CHECK, node, [finding] if finding else [],
                {"path": exp.path, "write_mbps": round(res.mb_per_s, 1), "bytes": res.bytes}))
    return results
