"""Host prerequisites of the lab: apt packages, a project-local containers.conf, a podman wrapper.

Podman 4.3 on this kind of host (Debian 12, hybrid cgroup v1, root without
CAP_SYS_RESOURCE, PID 1 not systemd) works only with runc, cgroupfs, a file events
logger and default ulimits under the hard limits.  Rather than edit the system's
``/etc/containers``, the lab writes its own ``containers.conf`` under the lab state dir
and names it in ``CONTAINERS_CONF`` for every podman call it makes; while that variable
is set podman reads only that file, so it carries everything needed.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from provisioner.errors import LabError

HOST_PACKAGES: tuple[str, ...] = (
    "podman", "runc", "netavark", "aardvark-dns", "iptables", "debootstrap", "zstd",
)
"""Debian packages the lab needs on the host (runc: crun fails on hybrid cgroups)."""

LAB_DIR_ENV = "PROVISIONER_LAB_DIR"
HOST_LOCK = Path("/run/lock/provisioner-lab-host.lock")
"""Host-wide, whatever the lab dir: every lab on this host shares podman's lab network (its addresses, its
creation and removal) and the node image, so the steps that read and change them run under this lock."""
HOST_LOCK_WAIT_S = 1800.0
"""How long a lab step waits for another one (the longest holder builds the node image: minutes)."""
DEFAULT_NOFILE = (1024, 1024)
DEFAULT_NPROC = (4096, 4096)

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    """Default progress callback: say nothing."""


def lab_dir() -> Path:
    """The lab state dir: ``$PROVISIONER_LAB_DIR`` or ``.lab/`` in the current directory."""
    configured = os.environ.get(LAB_DIR_ENV)
    return Path(configured).resolve() if configured else Path.cwd().resolve() / ".lab"


@contextlib.contextmanager
def host_lock(what: str) -> Iterator[None]:
    """Hold :data:`HOST_LOCK` for ``what`` (re-entrant within a thread; the kernel drops it if the process dies).
    Without it two labs brought up at once picked the same free addresses and the second's ``podman run``
    failed, and a ``lab down`` could remove the network between another lab's creating it and its containers
    joining it."""
    from provisioner.state import acquire_lock

    lock = acquire_lock(HOST_LOCK, command=f"provision lab ({what})", wait_s=HOST_LOCK_WAIT_S,
                        refusal=lambda who: f"the lab's host lock {HOST_LOCK} is still held by {who}",
                        hint="wait for that lab command to end, then run this again")
    try:
        yield
    finally:
        lock.release()


def cache_dir() -> Path:
    """Where built image tarballs are kept across labs: ``~/.cache/provisioner-lab``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "provisioner-lab"


# ---------------------------------------------------------------- apt packages


def installed_packages(names: Sequence[str]) -> set[str]:
    """Which of ``names`` dpkg reports as installed."""
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package} ${Status}\\n", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    return parse_dpkg_status(result.stdout)


def parse_dpkg_status(text: str) -> set[str]:
    """Package names whose dpkg status line says ``install ok installed``."""
    found: set[str] = set()
    for line in text.splitlines():
        name, _, status = line.partition(" ")
        if status.strip() == "install ok installed":
            found.add(name)
    return found


def ensure_host_packages(progress: Progress = _quiet) -> list[str]:
    """Install the missing host packages with apt; return what was installed.

    Raises LabError when something is missing and we are not root (apt and rootful
    podman both need it), naming the exact command to run instead.
    """
    missing = [p for p in HOST_PACKAGES if p not in installed_packages(HOST_PACKAGES)]
    if not missing:
        return []
    if os.geteuid() != 0:
        raise LabError(
            f"the lab needs these packages: {' '.join(missing)}",
            hint=f"run as root, or first: apt-get install {' '.join(missing)}",
        )
    progress(f"installing host packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=1800)
        if result.returncode != 0:
            raise LabError(f"{' '.join(cmd[:2])} failed: {_last_line(result.stderr or result.stdout)}")
    return missing


def require_root() -> None:
    """Rootful podman and debootstrap need root; say so before anything half-happens."""
    if os.geteuid() != 0:
        raise LabError("the lab runs rootful podman and debootstrap", hint="run it as root")


# ---------------------------------------------------------------- containers.conf


def _under_hard_limit(wanted: tuple[int, int], limit: int) -> tuple[int, int]:
    """Clamp a soft:hard ulimit pair to the caller's hard limit (podman's setrlimit would fail)."""
    hard = limit if limit != resource.RLIM_INFINITY else max(wanted)
    return (min(wanted[0], hard), min(wanted[1], hard))


def containers_conf_text(
    nofile: tuple[int, int] = DEFAULT_NOFILE, nproc: tuple[int, int] = DEFAULT_NPROC
) -> str:
    """The project-local containers.conf (pure, so it can be compared before writing)."""
    return (
        "# Written by provisioner's lab; podman reads it through CONTAINERS_CONF and then\n"
        "# reads no other containers.conf, so everything the host needs is here.\n"
        "[containers]\n"
        "# root here lacks CAP_SYS_RESOURCE: podman's default nofile=1048576 fails with EPERM.\n"
        f'default_ulimits = ["nofile={nofile[0]}:{nofile[1]}", "nproc={nproc[0]}:{nproc[1]}"]\n'
        "\n"
        "[engine]\n"
        "# crun fails on hybrid cgroup v1 (\"cgroups in hybrid mode not supported\"); runc works.\n"
        'runtime = "runc"\n'
        "# PID 1 of the host is not systemd: manage cgroups directly and log events to a file.\n"
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )


def ensure_containers_conf(directory: Path | None = None) -> Path:
    """Write ``<lab dir>/containers.conf`` if it differs; return its path."""
    directory = directory or lab_dir()
    directory.mkdir(parents=True, exist_ok=True)
    nofile = _under_hard_limit(DEFAULT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    nproc = _under_hard_limit(DEFAULT_NPROC, resource.getrlimit(resource.RLIMIT_NPROC)[1])
    text = containers_conf_text(nofile, nproc)
    path = directory / "containers.conf"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        # a temporary name of its own: lab steps sharing the lab dir (parallel test workers) write it at once
        fd, name = tempfile.mkstemp(prefix=".containers.conf.", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(name, 0o644)
        Path(name).replace(path)
    return path


# ---------------------------------------------------------------- podman wrapper


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def podman_env(conf: Path | None = None) -> dict[str, str]:
    """The environment every podman call gets: ours plus CONTAINERS_CONF."""
    return dict(os.environ, CONTAINERS_CONF=str(conf or ensure_containers_conf()))


def podman(
    *args: str,
    timeout: float = 120,
    check: bool = True,
    input_text: str | None = None,
    conf: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``podman args...`` with the lab's containers.conf.

    A failure (when ``check``) or a timeout raises LabError carrying podman's own last
    stderr line, which is the line that says what went wrong.
    """
    exe = shutil.which("podman")
    if exe is None:
        raise LabError("podman is not installed", hint="`provision lab up` installs it (as root)")
    try:
        result = subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            input=input_text,
            env=podman_env(conf),
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"podman {' '.join(args[:2])} took longer than {timeout:g} s") from exc
    if check and result.returncode != 0:
        raise LabError(f"podman {' '.join(args[:2])} failed: {_last_line(result.stderr or result.stdout)}")
    return result
