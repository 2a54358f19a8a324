"""The lab node image ``localhost/provisioner-lab-node:bookworm``, built locally with debootstrap.

No registry is reachable, so the image is made from the Debian mirror apt already uses
on this host.  It is built in two layers so that the slow part happens once:

1. the *base*: a debootstrap minbase root filesystem with the node packages, made fit
   to be many containers at once (empty machine-id, no baked SSH host keys), cached as
   ``~/.cache/provisioner-lab/base-<hash>.rootfs.tar.zst`` where the hash covers the
   base recipe only; it is rebuilt only when that recipe changes;
2. the *lab layer*: the simulated ``modprobe``/``lsmod``/``rmmod``/``modinfo``/``dmesg``/``dkms``/``sminfo``/
   ``saquery``/``iblinkinfo``/``ibnetdiscover``/``ibqueryerrors`` and the shared modules (``labstate.py``,
   ``labkernel.py``, ``fabsim_*.py``),
   copied into a container of the base and committed; its hash is the image's
   ``provisioner-lab.recipe`` label, so an edit of those files costs seconds, not a
   debootstrap.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import LabError
from provisioner.lab.host import (
    Progress,
    _last_line,
    _quiet,
    cache_dir,
    host_lock,
    podman,
    podman_env,
    require_root,
)

IMAGE = "localhost/provisioner-lab-node:bookworm"
BASE_REPO = "localhost/provisioner-lab-base"
SUITE = "bookworm"
MIRROR_ENV = "PROVISIONER_LAB_MIRROR"
RECIPE_LABEL = "provisioner-lab.recipe"
BASE_LABEL = "provisioner-lab.base"
BASE_RECIPE_VERSION = 1
"""Bump when build_rootfs() changes in a way the package list does not show."""

IMAGE_PACKAGES: tuple[str, ...] = (
    "systemd", "systemd-sysv", "dbus", "python3", "python3-apt", "openssh-server", "sudo",
    "iproute2", "kmod", "infiniband-diags", "ca-certificates", "gnupg",
)
"""python3-apt spares ansible's apt module installing it in every container on first use."""

SSH_HOSTKEYS_DROPIN = """\
# provisioner lab: every node makes its own SSH host keys at first start
# (they are not baked into the image, or all nodes would share one identity).
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
"""

LAB_LIB_DIR = "/usr/lib/provisioner-lab"
SIM_TOOL_NAMES = ("modprobe", "lsmod", "rmmod", "modinfo", "dmesg")
"""Names of nodetools/kmod_sim.py (the simulated kernel's module loader and its log)."""
LAB_MODULES = ("labstate.py", "labkernel.py", "fabsim_common.py", "fabsim_fabric.py", "fabsim_perftest.py",
               "fabsim_nccl.py", "fabsim_mpi.py", "fabsim_sm.py", "fabsim_pma.py")
"""Shared stdlib modules the simulated tools import from /usr/lib/provisioner-lab."""
MAD_TOOLS = ("sminfo", "saquery", "iblinkinfo", "ibnetdiscover", "ibqueryerrors")
"""Simulated MAD queries (real ones need an HCA); they shadow Debian's infiniband-diags."""
HARDWARE_TOOLS = ("lspci", "setpci")
"""Tools that read the simulated PCI hardware (node.json); they shadow Debian's pciutils."""
IPOIB_CHILD_TOOL = "/usr/local/sbin/plab-ipoib-children"
"""nodetools/ipoib_child_sim.py: the lab's stand-in for ib_ipoib's create_child (docs/lab-hardware-model.md)."""
IPOIB_CHILD_UNITS = {
    "plab-ipoib-children.service": f"""\
[Unit]
Description=provisioner lab: IPoIB P_Key children as the network configuration asks (the lab's ib_ipoib)

[Service]
Type=oneshot
ExecStart={IPOIB_CHILD_TOOL}

[Install]
WantedBy=multi-user.target
""",
    "plab-ipoib-children.path": """\
[Unit]
Description=provisioner lab: watch networkd's configuration for IPoIB P_Key children

[Path]
PathChanged=/etc/systemd/network
PathChanged=/run/systemd/network

[Install]
WantedBy=paths.target
""",
}
"""Run at boot and on every change of networkd's configuration directories, as the driver acts on every request."""
LAB_LINKS = {
    "/etc/systemd/system/multi-user.target.wants/plab-ipoib-children.service":
        "/etc/systemd/system/plab-ipoib-children.service",
    "/etc/systemd/system/paths.target.wants/plab-ipoib-children.path": "/etc/systemd/system/plab-ipoib-children.path",
}
"""Symbolic links of the lab layer (path -> target): ``systemctl enable`` of the units above."""
_PACKAGE_DIR = Path(__file__).resolve().parent


# ---------------------------------------------------------------- mirror selection (pure)


@dataclass(frozen=True)
class AptSource:
    """One apt source entry: the URIs and suites it serves."""

    uris: tuple[str, ...]
    suites: tuple[str, ...]
    types: tuple[str, ...] = ("deb",)


def parse_deb822(text: str) -> list[AptSource]:
    """Entries of a deb822 ``.sources`` file (stanzas split by blank lines, ``#`` comments)."""
    entries: list[AptSource] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "uris" not in fields:
            continue
        entries.append(
            AptSource(
                uris=tuple(fields["uris"].split()),
                suites=tuple(fields.get("suites", "").split()),
                types=tuple(fields.get("types", "deb").split()),
            )
        )
    return entries


def parse_one_line(text: str) -> list[AptSource]:
    """Entries of a one-line ``sources.list`` (``deb [opts] URI suite comp...``)."""
    entries: list[AptSource] = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) < 3 or words[0] not in ("deb", "deb-src"):
            continue
        rest = words[1:]
        if rest[0].startswith("["):
            while rest and not rest[0].endswith("]"):
                rest = rest[1:]
            rest = rest[1:]
        if len(rest) >= 2:
            entries.append(AptSource(uris=(rest[0],), suites=(rest[1],), types=(words[0],)))
    return entries


def _serves_debian(uri: str) -> bool:
    """A Debian archive URI ends in ``/debian`` (not ``/debian-security``, not a vendor repo)."""
    return bool(re.match(r"^https?://", uri)) and uri.rstrip("/").rsplit("/", 1)[-1] == "debian"


def pick_mirror(entries: Iterable[AptSource], suite: str = SUITE) -> str | None:
    """The first binary entry that serves Debian itself for ``suite``."""
    for entry in entries:
        if "deb" not in entry.types or suite not in entry.suites:
            continue
        for uri in entry.uris:
            if _serves_debian(uri):
                return uri
    return None


def host_mirror(etc_apt: Path = Path("/etc/apt"), suite: str = SUITE) -> str:
    """The mirror to debootstrap from: ``$PROVISIONER_LAB_MIRROR`` or the host's own apt entry."""
    override = os.environ.get(MIRROR_ENV)
    if override:
        return override
    entries: list[AptSource] = []
    one_line = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*.list"))]
    for path in one_line:
        if path.is_file():
            entries += parse_one_line(path.read_text(encoding="utf-8", errors="replace"))
    for path in sorted((etc_apt / "sources.list.d").glob("*.sources")):
        entries += parse_deb822(path.read_text(encoding="utf-8", errors="replace"))
    mirror = pick_mirror(entries, suite)
    if mirror is None:
        raise LabError(
            f"no Debian mirror for {suite} found in {etc_apt}/sources.list(.d)",
            hint=f"set {MIRROR_ENV}=http://deb.debian.org/debian (or your local mirror)",
        )
    return mirror


# ---------------------------------------------------------------- recipe hashes (pure)


def base_recipe_hash(suite: str = SUITE, packages: Iterable[str] = IMAGE_PACKAGES) -> str:
    """Hash of what goes into the debootstrap layer (the mirror is not part of it)."""
    recipe = {
        "version": BASE_RECIPE_VERSION,
        "suite": suite,
        "packages": sorted(packages),
        "ssh_dropin": SSH_HOSTKEYS_DROPIN,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def lab_files() -> dict[str, tuple[bytes, int]]:
    """Files of the lab layer: destination path -> (content, mode).

    The shared modules go to ``/usr/lib/provisioner-lab/``, where every simulated tool
    (those of the stand-in packages included) imports them from; no package ships them,
    since several packages would then own one path.  The simulated kernel-module and MAD
    tools are part of the simulated *hardware*, not of any package: they go to
    ``/usr/local/sbin``, ahead of Debian's real ones in root's PATH (sshd's and sudo's).
    """
    simtools = _PACKAGE_DIR / "simtools"
    kmod = (_PACKAGE_DIR / "nodetools" / "kmod_sim.py").read_bytes()
    files = {f"/usr/local/sbin/{name}": (kmod, 0o755) for name in SIM_TOOL_NAMES}
    files["/usr/local/sbin/dkms"] = ((_PACKAGE_DIR / "nodetools" / "dkms_sim.py").read_bytes(), 0o755)
    files[IPOIB_CHILD_TOOL] = ((_PACKAGE_DIR / "nodetools" / "ipoib_child_sim.py").read_bytes(), 0o755)
    for unit, text in IPOIB_CHILD_UNITS.items():
        files[f"/etc/systemd/system/{unit}"] = (text.encode(), 0o644)
    for module in LAB_MODULES:
        files[f"{LAB_LIB_DIR}/{module}"] = ((simtools / module).read_bytes(), 0o644)
    for tool in MAD_TOOLS + HARDWARE_TOOLS:
        files[f"/usr/local/sbin/{tool}"] = ((simtools / tool).read_bytes(), 0o755)
    return files


def image_recipe_hash(base_hash: str, files: dict[str, tuple[bytes, int]]) -> str:
    """Hash of the whole image: the base hash plus every lab-layer file and its mode."""
    digest = hashlib.sha256(base_hash.encode())
    for path in sorted(files):
        content, mode = files[path]
        digest.update(f"{path}\0{mode:o}\0".encode())
        digest.update(hashlib.sha256(content).digest())
    for path in sorted(LAB_LINKS):
        digest.update(f"{path}\0->\0{LAB_LINKS[path]}\0".encode())
    return digest.hexdigest()[:16]


def base_tarball(base_hash: str) -> Path:
    """Where the base root filesystem of this recipe is cached."""
    return cache_dir() / f"base-{base_hash}.rootfs.tar.zst"


# ---------------------------------------------------------------- building


def _image_label(image: str, label: str) -> str | None:
    result = podman("image", "inspect", "--format", f'{{{{index .Labels "{label}"}}}}', image, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def _run_streaming(cmd: list[str], log: Path, progress: Progress, prefix: str) -> None:
    """Run a long command, keep its output in ``log`` and pass its step lines to ``progress``."""
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if line.startswith(("I: Retrieving", "I: Validating", "I: Extracting", "I: Installing",
                                "I: Configuring", "I: Base system")):
                progress(f"{prefix}: {line[3:].strip()}")
        status = proc.wait()
    if status != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        raise LabError(f"{cmd[0]} failed: {tail[0] if tail else status}", hint=f"see {log}")


def build_rootfs(root: Path, mirror: str, log: Path, progress: Progress) -> None:
    """debootstrap into ``root`` and make the tree fit to be many containers at once."""
    if shutil.which("debootstrap") is None:
        raise LabError("debootstrap is not installed", hint="apt-get install debootstrap")
    progress(f"debootstrap {SUITE} from {mirror} (about a minute)")
    _run_streaming(
        ["debootstrap", "--variant=minbase", f"--include={','.join(IMAGE_PACKAGES)}",
         SUITE, str(root), mirror],
        log,
        progress,
        "debootstrap",
    )
    # Each container must get its own identity: an empty machine-id makes systemd use the
    # container's UUID; D-Bus's copy must point at it or every node shares one id.
    (root / "etc/machine-id").write_text("")
    dbus_id = root / "var/lib/dbus/machine-id"
    dbus_id.unlink(missing_ok=True)
    dbus_id.parent.mkdir(parents=True, exist_ok=True)
    dbus_id.symlink_to("/etc/machine-id")
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    dropin = root / "etc/systemd/system/ssh.service.d/provisioner-lab-hostkeys.conf"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(SSH_HOSTKEYS_DROPIN)
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    # Leave out what each container would only download again; make the empty apt lists
    # look stale, or ansible's apt cache_valid_time skips the update and finds nothing.
    lists = root / "var/lib/apt/lists"
    for path in lists.glob("*"):
        if path.is_file():
            path.unlink()
    for pattern in ("var/cache/apt/*.bin", "var/cache/apt/archives/*.deb", "var/log/*.log"):
        for path in root.glob(pattern):
            path.unlink()
    os.utime(lists, (0, 0))


def _pack(root: Path, tarball: Path) -> None:
    """tar | zstd into ``tarball`` atomically (numeric owners: the image keeps root's ids)."""
    tmp = tarball.with_name(tarball.name + ".tmp")
    with tmp.open("wb") as out:
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        zstd = subprocess.run(["zstd", "-q", "-T0", "-c"], stdin=tar.stdout, stdout=out, check=False)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or zstd.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise LabError(f"could not pack the image root filesystem into {tarball}")
    tmp.replace(tarball)


def _import_base(tarball: Path, tag: str, base_hash: str) -> None:
    """``zstd -dc tarball | podman import`` with the settings a systemd container needs."""
    exe = shutil.which("podman")
    if exe is None:
        raise LabError("podman is not installed", hint="`provision lab up` installs it (as root)")
    zstd = subprocess.Popen(["zstd", "-dc", str(tarball)], stdout=subprocess.PIPE)
    try:
        result = subprocess.run(
            [exe, "import", "--quiet",
             "--change", 'CMD ["/sbin/init"]',
             "--change", "STOPSIGNAL SIGRTMIN+3",
             "--change", f"LABEL {BASE_LABEL}={base_hash}",
             "-", tag],
            stdin=zstd.stdout, capture_output=True, text=True, env=podman_env(), check=False, timeout=600,
        )
    finally:
        assert zstd.stdout is not None
        zstd.stdout.close()
        zstd.wait()
    if result.returncode != 0:
        raise LabError(f"podman import failed: {_last_line(result.stderr)}")


def _add_lab_layer(base_tag: str, recipe: str, files: dict[str, tuple[bytes, int]]) -> None:
    """Copy the lab files into a container of the base and commit it as the node image."""
    name = f"plab-imagebuild-{os.getpid()}"
    podman("rm", "--force", "--ignore", name)
    podman("create", "--name", name, base_tag)
    try:
        with tempfile.TemporaryDirectory(prefix="plab-layer-") as staging:
            for dest, (content, mode) in files.items():
                path = Path(staging) / dest.lstrip("/")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
                path.chmod(mode)
            for dest, target in LAB_LINKS.items():
                link = Path(staging) / dest.lstrip("/")
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(target)
            podman("cp", f"{staging}/.", f"{name}:/")
        podman("commit", "--quiet", "--change", f"LABEL {RECIPE_LABEL}={recipe}", name, IMAGE, timeout=300)
    finally:
        podman("rm", "--force", "--ignore", name)


def ensure_image(progress: Progress = _quiet, *, rebuild: bool = False) -> str:
    """Make sure the node image of the current recipe exists; return its recipe hash.

    Quick when it does (one ``podman image inspect``); an import when only the cached
    base tarball exists; a debootstrap when neither does.
    """
    base_hash = base_recipe_hash()
    files = lab_files()
    recipe = image_recipe_hash(base_hash, files)
    if not rebuild and _image_label(IMAGE, RECIPE_LABEL) == recipe:
        return recipe
    require_root()
    with host_lock("node image"):  # parallel labs and molecule scenarios build it once; the others wait for it
        if not rebuild and _image_label(IMAGE, RECIPE_LABEL) == recipe:
            return recipe
        _build_image(base_hash, recipe, files, progress, rebuild=rebuild)
    return recipe


def _build_image(base_hash: str, recipe: str, files: dict[str, tuple[bytes, int]], progress: Progress, *,
                 rebuild: bool) -> None:
    """Import (or debootstrap) the base when it is missing or stale, then add the lab layer."""
    base_tag = f"{BASE_REPO}:{base_hash}"
    if rebuild or _image_label(base_tag, BASE_LABEL) != base_hash:
        tarball = base_tarball(base_hash)
        if rebuild or not tarball.is_file() or tarball.stat().st_size == 0:
            tarball.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="plab-rootfs-", dir="/var/tmp") as root:
                log = tarball.with_name(f"base-{base_hash}.debootstrap.log")
                build_rootfs(Path(root), host_mirror(), log, progress)
                progress(f"caching root filesystem as {tarball}")
                _pack(Path(root), tarball)
        progress(f"importing {tarball.name}")
        _import_base(tarball, base_tag, base_hash)
    progress("adding the lab's simulated tools to the image")
    old = podman("image", "inspect", "--format", "{{.Id}}", IMAGE, check=False).stdout.strip()
    _add_lab_layer(base_tag, recipe, files)
    if old:
        podman("image", "rm", old, check=False)  # fails harmlessly while a container uses it
