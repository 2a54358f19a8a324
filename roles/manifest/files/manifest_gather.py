#!/usr/bin/python3
"""Print, as one JSON object, what is installed on this node (the provisioner manifest role's gatherer).

It runs dpkg-query, apt-mark, apt-config, ofed_info and lsmod and reads /etc/os-release, /proc and
/sys/class/infiniband, all read-only. Every value comes from the node itself, never from the cluster spec, so that
comparing manifests across nodes (and with the spec) shows what really is there. The output has no
timestamp: the same node state always gives the same bytes, which keeps the role idempotent.

Usage: manifest_gather.py [--module-regex REGEX] [--mlxconfig-key KEY]... [--write PATH [--time-path PATH]
                          [--check]] PATTERN...   (dpkg-query name patterns)
With --write (the role's one task per phase), the manifest also goes to PATH (root, 0644, its folder root 0755)
when its bytes or those owners and modes differ, the UTC time of that change to --time-path, and what is printed
is {"changed": bool, "manifest": {...}}; --check (Ansible's check mode) writes nothing and says what would change.
With --mlxconfig-key (the parameters the spec pins), each device's next-boot values of those keys are recorded
from ``mlxconfig -d DEV query KEY...`` (none when mlxconfig is missing or fails: drift then names them unread).
Standard library only (runs with the node's python3).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

SCHEMA = 1
SYSFS_IB = "/sys/class/infiniband"
TIMEOUT_S = 60


def run(argv: list[str]) -> tuple[int, str]:
    """rc and stdout of a command; 127 when it does not exist (a node without OFED has no ofed_info)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except FileNotFoundError:
        return 127, ""
    except subprocess.TimeoutExpired:
        return 124, ""
    return done.returncode, done.stdout


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def os_release() -> dict[str, str]:
    """ID, VERSION_ID and PRETTY_NAME from /etc/os-release."""
    out: dict[str, str] = {}
    for line in (read("/etc/os-release") or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("ID", "VERSION_ID", "VERSION_CODENAME", "PRETTY_NAME"):
            out[key.lower()] = value.strip().strip('"')
    return out


def packages(patterns: list[str]) -> tuple[dict[str, str], list[str]]:
    """Installed packages matching the patterns: {name: version}, and those of them on hold.

    dpkg-query exits 1 when a pattern matches nothing; what it printed for the others still counts.
    The status abbreviation's first letter is the selection (h = hold), the second the state (i = installed).
    """
    rc, text = run(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n", "--", *patterns])
    if rc not in (0, 1):
        return {}, []
    found: dict[str, str] = {}
    held: list[str] = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or len(parts[2]) < 2 or parts[2][1] != "i":
            continue
        found[parts[0]] = parts[1]
        if parts[2][0] == "h":
            held.append(parts[0])
    return dict(sorted(found.items())), sorted(held)


def holds() -> list[str]:
    """Every package on hold (apt-mark showhold), not only the managed ones: a stray hold blocks upgrades."""
    rc, text = run(["apt-mark", "showhold"])
    return sorted({ln.strip() for ln in text.splitlines() if ln.strip()}) if rc == 0 else []


KERNEL_PACKAGE = re.compile(r"^linux-")
BLACKLIST_LINE = re.compile(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$')


def kernel_hold(held: list[str]) -> dict[str, list[str]]:
    """Whether the kernel is kept from moving: the held kernel packages (apt-mark hold) and the patterns
    unattended-upgrades skips (its Package-Blacklist, from apt's merged configuration)."""
    rc, text = run(["apt-config", "dump", "Unattended-Upgrade::Package-Blacklist"])
    blacklist = [m.group(1) for m in map(BLACKLIST_LINE.match, text.splitlines()) if m] if rc == 0 else []
    return {"held": sorted(p for p in held if KERNEL_PACKAGE.match(p)), "unattended_upgrades_blacklist": blacklist}


def ofed() -> str | None:
    """`ofed_info -s` without the trailing colon (OFED-internal-24.10-1.1.4.0 / MLNX_OFED_LINUX-23.10-...)."""
    rc, text = run(["ofed_info", "-s"])
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line.rstrip(":") if rc == 0 and line else None


def modules(regex: str) -> dict[str, str | None]:
    """Loaded modules matching ``regex`` (from lsmod, which the lab simulates) and their version if sysfs has it."""
    pattern = re.compile(regex)
    rc, text = run(["lsmod"])
    names = [ln.split()[0] for ln in text.splitlines()[1:] if ln.strip()] if rc == 0 else []
    return {n: read(f"/sys/module/{n}/version") for n in sorted(set(names)) if pattern.match(n)}


def guid_hex(colon: str | None) -> str | None:
    """'0c42:a103:0067:fa10' → '0x0c42a1030067fa10' (the form ibstat and the spec use)."""
    if not colon:
        return None
    digits = colon.replace(":", "").lower()
    return "0x" + digits if re.fullmatch(r"[0-9a-f]{16}", digits) else None


def port_guid(gid0: str | None) -> str | None:
    """The port GUID is the interface ID, the low 64 bits of GID index 0 (fe80::/64 + GUID)."""
    if not gid0:
        return None
    groups = gid0.split(":")
    return guid_hex(":".join(groups[4:8])) if len(groups) == 8 else None


MLX_PARAM = re.compile(r"^\s*\*?\s*([A-Z][A-Z0-9_]*)\s+(\S.*?)\s*$")


def mlxconfig(dev: str, keys: list[str]) -> dict[str, str] | None:
    """Next-boot values of ``keys`` on ``dev`` (the last column after 'Configurations:'), None when unread."""
    if not keys:
        return None
    rc, text = run(["mlxconfig", "-d", dev, "query", *keys])
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("Configurations:")), None)
    if rc != 0 or start is None:
        return None
    found = {m.group(1): m.group(2).split()[-1] for m in map(MLX_PARAM.match, lines[start + 1:]) if m}
    return {k: v for k, v in found.items() if k in keys}


def hcas(mlx_keys: list[str] | None = None) -> dict[str, dict[str, object]]:
    """Per RDMA device: firmware, board, node GUID and per port the GUID and link layer (and pinned mlxconfig)."""
    try:
        devices = sorted(os.listdir(SYSFS_IB))
    except OSError:
        return {}
    out: dict[str, dict[str, object]] = {}
    for dev in devices:
        base = os.path.join(SYSFS_IB, dev)
        ports: dict[str, dict[str, str | None]] = {}
        try:
            port_names = sorted(os.listdir(os.path.join(base, "ports")), key=lambda p: int(p) if p.isdigit() else 0)
        except OSError:
            port_names = []
        for port in port_names:
            pdir = os.path.join(base, "ports", port)
            ports[port] = {"port_guid": port_guid(read(os.path.join(pdir, "gids", "0"))),
                           "link_layer": read(os.path.join(pdir, "link_layer"))}
        out[dev] = {"fw_ver": read(os.path.join(base, "fw_ver")), "board_id": read(os.path.join(base, "board_id")),
                    "node_guid": guid_hex(read(os.path.join(base, "node_guid"))), "ports": ports}
        values = mlxconfig(dev, mlx_keys or [])
        if values is not None:
            out[dev]["mlxconfig"] = values
    return out


def cgroup(mountinfo: str | None = None) -> str | None:
    """The cgroup hierarchy the node booted: "v2" (cgroup2 at /sys/fs/cgroup, unified), "v1" (legacy or hybrid:
    a tmpfs of v1 controllers there), None when /sys/fs/cgroup is not mounted (proc(5) mountinfo: mount point is
    field 5, the file system type follows the " - " separator)."""
    text = read("/proc/self/mountinfo") if mountinfo is None else mountinfo
    for line in (text or "").splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) >= 5 and parts[4] == "/sys/fs/cgroup" and rest:
            return "v2" if rest.split()[0] == "cgroup2" else "v1"
    return None


def manifest_text(doc: dict[str, object]) -> str:
    """The file's bytes: what Ansible's to_nice_json(indent=2, sort_keys=true) gave, so no node rewrites it."""
    return json.dumps(doc, indent=2, sort_keys=True, separators=(",", ": ")) + "\n"


def _not_owned(path: str, mode: int) -> bool:
    st = os.stat(path)
    return (st.st_uid, st.st_gid, st.st_mode & 0o7777) != (0, 0, mode)


def _own(path: str, mode: int, check: bool) -> bool:
    """Make `path` root's with `mode` unless it is (or, with `check`, only say so); whether it was not."""
    if not _not_owned(path, mode):
        return False
    if not check:
        os.chown(path, 0, 0)
        os.chmod(path, mode)
    return True


def write_if_changed(path: str, text: str, mode: int = 0o644, check: bool = False) -> bool:
    """Write `text` to `path` (a temporary file renamed over it) unless it holds it already; then make it root's
    with `mode`. Whether anything changed (with `check`: would change; nothing is written)."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return _own(path, mode, check)
    except (OSError, UnicodeDecodeError):
        pass
    if check:
        return True
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    _own(tmp, mode, False)  # the umask narrowed what os.open made
    os.replace(tmp, path)
    return True


def record(doc: dict[str, object], path: str, time_path: str | None, check: bool) -> bool:
    """The manifest to `path` (its folder made root's 0755 first) and, when it changed, the time to `time_path`.
    Whether anything changed (with `check`: would change)."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        if check:
            return True
        os.makedirs(folder, mode=0o755)
    changed = _own(folder, 0o755, check)
    if write_if_changed(path, manifest_text(doc), check=check):
        changed = True
        if time_path and not check:
            write_if_changed(time_path, time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
    return changed


def parse_args(argv: list[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """({--module-regex, --write, --time-path, --check: value}, mlxconfig keys, package patterns)."""
    opts = {"--module-regex": r"^(nvidia|nvidia_[a-z_]+|ib_[a-z_]+|mlx5_[a-z_]+)$"}
    args = list(argv)
    mlx_keys: list[str] = []
    while args and args[0] in ("--module-regex", "--mlxconfig-key", "--write", "--time-path", "--check"):
        if args[0] == "--check":
            opts["--check"] = "1"
            args = args[1:]
            continue
        if len(args) < 2:
            break
        if args[0] != "--mlxconfig-key":
            opts[args[0]] = args[1]
        elif re.fullmatch(r"[A-Z][A-Z0-9_]{1,63}", args[1]):
            mlx_keys.append(args[1])
        args = args[2:]
    return opts, mlx_keys, args


def main(argv: list[str]) -> int:
    opts, mlx_keys, args = parse_args(argv)
    regex = opts["--module-regex"]
    installed, managed_held = packages(args)
    held = sorted(set(holds()) | set(managed_held))
    doc = {
        "schema": SCHEMA,
        "hostname": read("/proc/sys/kernel/hostname"),
        "os": os_release(),
        "kernel": read("/proc/sys/kernel/osrelease"),
        "packages": installed,
        "holds": held,
        "kernel_hold": kernel_hold(held),
        "ofed": ofed(),
        "modules": modules(regex),
        "hcas": hcas(mlx_keys),
        "cgroup": cgroup(),
    }
    if "--write" in opts:
        changed = record(doc, opts["--write"], opts.get("--time-path"), "--check" in opts)
        json.dump({"changed": changed, "manifest": doc}, sys.stdout, sort_keys=True)
    else:
        json.dump(doc, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
