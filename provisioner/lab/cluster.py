"""Bring a lab cluster up and down: one systemd container per node, reached over real SSH.

``lab_up`` prepares the host (packages, containers.conf, image, network), writes the
simulated hardware under ``.lab/<cluster>/``, starts the node containers in parallel,
gives each the lab's SSH key and its ``/dev/infiniband/umadN`` placeholders, and records
every node's SSH host key in a known_hosts file read over the trusted local channel
(``podman exec``), never by trusting the network on first use.  It writes
``overlay.yaml``, which the spec loader applies so that the product reaches the nodes.
Everything is idempotent: a second call with the same nodes changes nothing.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import LabError
from provisioner.lab import hardware, image, ipoib, network, vendor_repo
from provisioner.lab.hardware import LabCable, LabNodeSpec, LabSwitch
from provisioner.lab.host import (
    Progress,
    _quiet,
    ensure_containers_conf,
    ensure_host_packages,
    host_lock,
    lab_dir,
    podman,
    require_root,
)
from provisioner.lab.names import (
    CLUSTER_LABEL,
    FIRST_HOST_OCTET,
    HOST_LABEL,
    NETWORK,
    SUBNET,
    check_name,
    container_name,
)
from provisioner.lab.packages import VendorVersions
from provisioner.lab.simtools import labstate

VENDOR_REPO_DIR = "vendor-repo"
VENDOR_REPO_URL = f"file://{labstate.LAB_ROOT}/{VENDOR_REPO_DIR}"
"""Where every node sees the lab's vendor repository (``.lab/<cluster>/vendor-repo`` on the host)."""
VENDOR_SUITE = "bookworm"
SSHD_WAIT_S = 90
START_WORKERS = 4
"""Parallel ``podman run``s: more only queue on 2 cores and make podman's locks contend."""

_BOOT_SCRIPT = """\
set -e
umask 077
mkdir -p /root/.ssh
cat > /root/.ssh/.authorized_keys.tmp
mv /root/.ssh/.authorized_keys.tmp /root/.ssh/authorized_keys
umask 022
mkdir -p /dev/infiniband
# the containers share the host's kernel, which has no Debian headers: give it stand-in headers, as
# linux-headers-$(uname -r) would (a lab fault can remove them to rehearse the missing-headers failure);
# DKMS looks for build/include (dkms's _check_kernel_dir)
kb=/lib/modules/$(uname -r)/build
if [ ! -e "$kb/Makefile" ]; then
  mkdir -p "$kb/include" && echo "# provisioner lab stand-in for linux-headers-$(uname -r)" > "$kb/Makefile"
fi
i=0
while [ "$i" -lt "$1" ]; do [ -e /dev/infiniband/umad$i ] || : > /dev/infiniband/umad$i; i=$((i + 1)); done
n=0
until [ -s /etc/ssh/ssh_host_ed25519_key.pub ] && systemctl is-active --quiet ssh; do
  n=$((n + 1)); [ "$n" -lt "$2" ] || { echo "sshd did not start" >&2; exit 1; }
  sleep 0.25
done
cat /etc/ssh/ssh_host_ed25519_key.pub
"""
"""Run once per node through ``podman exec -i``: key, placeholders, wait for sshd, print its host key."""


@dataclass(frozen=True)
class NodeStatus:
    """What ``provision lab status`` shows for one node."""

    host: str
    container: str
    state: str
    ip: str | None
    faults: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class LabInfo:
    """The result of ``lab_up``."""

    cluster: str
    state_dir: Path
    overlay: Path
    addresses: dict[str, str]
    created: list[str]


# ---------------------------------------------------------------- pure helpers


def cluster_dir(cluster: str) -> Path:
    """``.lab/<cluster>/``: the state bind-mounted at ``/run/lab`` in every node."""
    return lab_dir() / check_name(cluster, "cluster name")


def allocate_addresses(hosts: Sequence[str], existing: dict[str, str], used: set[str],
                       subnet: str = SUBNET, preferred: Mapping[str, str] | None = None) -> dict[str, str]:
    """Fixed IPs for ``hosts``: keep what a host had; a new host gets its ``preferred`` address (the spec's) when
    that is on the lab network and free, else the lowest free one. Keeping the spec's addresses matters when the
    lab runs only some of the spec's nodes: a lowest-free address could be one the spec gives a node left out,
    and the overlay would then make the spec invalid (SPEC-DUP-ADDRESS)."""
    net = ipaddress.ip_network(subnet)
    taken = set(used) | {ip for h, ip in existing.items() if h in hosts}
    wanted: dict[str, str] = {}
    for host, ip in (preferred or {}).items():
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            continue
        if (host in hosts and host not in existing and addr in net and ip not in taken
                and int(addr) - int(net.network_address) >= FIRST_HOST_OCTET and addr != net.broadcast_address):
            wanted[host] = ip
            taken.add(ip)
    free = (str(a) for a in net.hosts() if int(a) - int(net.network_address) >= FIRST_HOST_OCTET
            and str(a) not in taken)
    result: dict[str, str] = {}
    for host in hosts:
        if host in existing:
            result[host] = existing[host]
            continue
        if host in wanted:
            result[host] = wanted[host]
            continue
        try:
            result[host] = next(free)
        except StopIteration:
            raise LabError(f"the lab subnet {subnet} has no free address left for {host}") from None
    return result


def known_hosts_text(entries: dict[str, tuple[str, str]]) -> str:
    """known_hosts lines ``host,ip keytype key`` for ``{host: (ip, public key line)}``."""
    lines = []
    for host in sorted(entries):
        ip, pub = entries[host]
        keytype, key = pub.split()[:2]
        lines.append(f"{host},{ip} {keytype} {key}")
    return "\n".join(lines) + "\n" if lines else ""


def parse_known_hosts(text: str) -> dict[str, tuple[str, str]]:
    """Inverse of :func:`known_hosts_text`."""
    entries: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and "," in parts[0]:
            host, ip = parts[0].split(",", 1)
            entries[host] = (ip, f"{parts[1]} {parts[2]}")
    return entries


LAB_SITE_VARS: dict[str, bool | str] = {
    # containers show no PCI bus: GPUs are counted through the (simulated) driver once it is installed
    "preflight_gpu_evidence": "nvidia-smi",
    # The nodes share the host's kernel, which has no NFS client, no nfsd and no Lustre: the storage roles write
    # and check the units and exports but report the mounts SKIPPED instead of failing, and `provision verify`
    # reports such a mount "skipped", never "passed" (it checks that the node's kernel really lacks the
    # filesystem before it does, and reads the export over NFS from user space instead, with libnfs).
    "nfs_client_require_kernel_nfs": False,
    "nfs_server_require_kernel_nfsd": False,
    "lustre_client_require_kernel_support": False,
    # libnfs-utils (nfs-ls/nfs-cat/nfs-cp) on the NFS clients: how verify reaches an export without a kernel mount
    "nfs_client_userspace_tools": True,
    # a lab has no NFS clients whose locks need reclaiming; without this, opens fail for 90 s after each restart
    "nfs_server_ganesha_graceless": True,
    # The nodes have no compiler toolchain (make, g++, a real nvcc): they install the lab repository's
    # "site-built" nccl-tests package (an MPI build) instead of compiling the pinned tag, which the lab cannot
    # prove (docs/lab-hardware-model.md, "nccl-tests and Open MPI").
    "nccl_tests_build_from_source": False,
    # The lab's IPoIB netdevs are veth links named like the spec's (provisioner/lab/ipoib.py): the ipoib role
    # configures and checks their addresses and MTU, and says the IPoIB mode and P_Key cannot take effect there;
    # `provision verify` reports those as not checked.
    "ipoib_require_infiniband": False,
    # the node image has no compiler, autotools or CUDA headers: perftest_cuda installs the site-build stand-in
    # package perftest-cuda instead of building perftest (the build itself is not proven in the lab)
    "perftest_cuda_build_from_source": False,
    # slurmd's cgroup plugins create cgroups under /sys/fs/cgroup, which podman mounts read-only in the lab's
    # containers ("unable to create cgroup '/sys/fs/cgroup/freezer/slurm_<node>' : Read-only file system", then
    # "slurmd initialization failed"): the lab tracks job processes by their parent PIDs instead and does not
    # confine tasks. Real nodes keep the role's cgroup defaults.
    "slurm_proctrack_type": "proctrack/linuxproc",
    "slurm_task_plugin": "task/none",
    # Without CPUs= slurmctld schedules one CPU per node, and a job with a task per GPU (the NCCL check under srun)
    # cannot start; real nodes take their line from `slurmd -C`, the lab's GPU nodes have two GPUs and see the
    # host's CPUs (two at least where the lab runs).
    "slurm_node_options": "CPUs=2",
}
"""What the lab cannot do like real nodes, as role variables (rendered into group_vars/all via site_vars)."""


def overlay_data(key: Path, known_hosts: Path, addresses: dict[str, str],
                 vendor_keyring: Path | None = None) -> dict[str, Any]:
    """What the spec loader overlays on the cluster spec to reach the lab nodes.

    With a vendor keyring, the spec's vendor mirrors are replaced by the lab's signed
    repository, which every node sees at ``/run/lab/vendor-repo`` (the loader deep-merges
    the overlay, so ``components`` replaces the spec's list). ``site_vars`` say what the lab
    kernel cannot do (:data:`LAB_SITE_VARS`).
    """
    data: dict[str, Any] = {
        "ssh": {"user": "root", "key": str(key), "known_hosts": str(known_hosts)},
        "addresses": dict(sorted(addresses.items())),
        "site_vars": dict(LAB_SITE_VARS),
    }
    if vendor_keyring is not None:
        repo = {"url": VENDOR_REPO_URL, "key": str(vendor_keyring), "suite": VENDOR_SUITE,
                "components": [vendor_repo.COMPONENT]}
        data["repositories"] = {"offline": True, "cuda": dict(repo), "doca": dict(repo)}
    return data


def vendor_gnupg_home(cluster: str) -> Path:
    """The vendor repository's signing key: in the lab dir but outside ``.lab/<cluster>/``,
    which is bind-mounted into every node (a node must never see the secret key)."""
    return lab_dir() / f".{check_name(cluster, 'cluster name')}.vendor-gnupg"


def ensure_vendor_repo(cluster: str, state_dir: Path, versions: VendorVersions,
                       progress: Progress = _quiet) -> Path:
    """Build (or reuse) the signed repo of the pinned and drift sets; return the armored public key's host path.

    ``keys/`` gets the key twice: ``lab-vendor.pub`` armored, as NVIDIA serves its repository keys (what the
    overlay hands the roles), and ``lab-vendor.gpg`` binary (what a test's hand-written ``signed-by=`` names).
    """
    from provisioner.lab.fromspec import drift_versions

    sets = [versions]
    drift = drift_versions(versions)
    if drift != versions:
        sets.append(drift)
    info = vendor_repo.build_vendor_repo(state_dir / VENDOR_REPO_DIR, sets, progress,
                                         gnupg_home=vendor_gnupg_home(cluster))
    keys = state_dir / "keys"
    keys.mkdir(exist_ok=True)
    for source in (info.keyring_path, info.armored_key_path):
        target = keys / source.name
        data = source.read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            tmp = target.with_name("." + target.name + ".tmp")
            tmp.write_bytes(data)
            tmp.chmod(0o644)
            tmp.replace(target)
    return keys / vendor_repo.ARMORED_KEY_NAME


_EXPORT_PATH = re.compile(r"^/[A-Za-z0-9._@+-]+(/[A-Za-z0-9._@+-]+)*$")


def export_mount_args(paths: Sequence[str]) -> list[str]:
    """``podman run`` arguments that make ``paths`` exportable by NFS-Ganesha inside the container.

    Ganesha's FSAL VFS opens files by handle (name_to_handle_at/open_by_handle_at): the container's
    overlayfs root has no handles, so each export gets its own tmpfs, and the container needs
    CAP_DAC_READ_SEARCH for open_by_handle_at. Paths reach the podman command line: strict pattern,
    no ``..`` and none of the ``:``/``,`` that --tmpfs would read as separators.
    """
    if not paths:
        return []
    args = ["--cap-add=DAC_READ_SEARCH"]
    for path in dict.fromkeys(paths):
        parts = path.split("/")
        if not _EXPORT_PATH.match(path) or ".." in parts or "." in parts or path.rstrip("/") == "":
            raise LabError(f"NFS export path {path!r} cannot be given to a lab container (absolute path of "
                           "A-Z a-z 0-9 . _ @ + - components, not the root)")
        args += ["--tmpfs", f"{path}:rw,mode=0755"]
    return args


def run_args(cluster: str, host: str, ip: str, state_dir: Path, image_name: str = image.IMAGE,
             exports: Sequence[str] = (), ipoib_links: Sequence[tuple[str, str]] = ()) -> list[str]:
    """``podman run`` arguments for one node container (``exports``: the NFS paths it serves, if any;
    ``ipoib_links``: its simulated IPoIB interfaces, ``(podman network, interface name)``)."""
    sys_class = state_dir / "nodes" / host / labstate.SYSFS_PREFIX
    # with more than one network, podman takes the address as an option of its network
    net = ["--network", f"{NETWORK}:ip={ip}"] if ipoib_links else ["--network", NETWORK, "--ip", ip]
    return [
        "run", "--detach",
        "--name", container_name(cluster, host),
        "--hostname", host,
        "--label", f"{CLUSTER_LABEL}={cluster}",
        "--label", f"{HOST_LABEL}={host}",
        *net,
        *ipoib.network_args(ipoib_links),
        "--systemd=always",
        "--volume", f"{state_dir}:{labstate.LAB_ROOT}:rw",
        "--volume", f"{sys_class}:/sys/class:ro",
        *export_mount_args(exports),
        image_name, "/sbin/init",
    ]


# ---------------------------------------------------------------- side effects


def ensure_ssh_key(ssh_dir: Path) -> str:
    """The lab's client key pair (ed25519, made here, never leaves the lab dir); return the public line."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private, public = ssh_dir / "id_ed25519", ssh_dir / "id_ed25519.pub"
    if private.is_file() and public.is_file():
        return public.read_text(encoding="utf-8").strip()
    ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    public.write_text(line.decode() + " provisioner-lab\n", encoding="utf-8")
    return public.read_text(encoding="utf-8").strip()


def _containers(cluster: str | None = None) -> dict[str, dict[str, Any]]:
    """Lab containers (of one cluster, or all) by name, as ``podman ps -a`` reports them."""
    label = f"{CLUSTER_LABEL}={cluster}" if cluster else CLUSTER_LABEL
    out = podman("ps", "-a", "--filter", f"label={label}", "--format", "json").stdout
    rows: list[dict[str, Any]] = json.loads(out or "[]") or []
    return {str(row["Names"][0]): row for row in rows}


def _used_addresses(exclude: str) -> set[str]:
    """Addresses other lab clusters hold: those of this lab dir, and those of running containers
    of other clusters on the network (a lab started from another lab dir, e.g. a CI run)."""
    used: set[str] = set()
    base = lab_dir()
    if base.is_dir():
        for overlay in base.glob("*/overlay.yaml"):
            if overlay.parent.name != exclude:
                data = yaml.safe_load(overlay.read_text(encoding="utf-8")) or {}
                used.update(str(ip) for ip in (data.get("addresses") or {}).values())
    # Every container on the lab network counts, labelled or not (other tools' test containers join it too).
    rows = json.loads(podman("ps", "-a", "--filter", f"network={NETWORK}", "--format", "json").stdout or "[]") or []
    others = [str(row["Names"][0]) for row in rows
              if str((row.get("Labels") or {}).get(CLUSTER_LABEL, "")) != exclude]
    if others:
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}"
        used.update(podman("inspect", "--format", fmt, *others, check=False).stdout.split())
    return used


def _load_overlay_addresses(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return {str(h): str(ip) for h, ip in (data.get("addresses") or {}).items()}


def _start(cluster: str, host: str, ip: str, state_dir: Path, existing: dict[str, Any] | None,
           exports: Sequence[str] = (), ipoib_links: Sequence[tuple[str, str]] = ()) -> bool:
    """Create or start one node's container; True when created."""
    if existing is None:
        podman(*run_args(cluster, host, ip, state_dir, exports=exports, ipoib_links=ipoib_links), timeout=180)
        return True
    missing = {net for net, _ in ipoib_links} - ipoib.attached(container_name(cluster, host))
    if missing:
        raise LabError(f"{host}'s container was created without the simulated IPoIB network(s) "
                       f"{', '.join(sorted(missing))} the spec now plans",
                       hint=f"recreate the lab: provision lab down {cluster}; provision lab up <spec>")
    if existing.get("State") in ("exited", "created", "stopped"):
        podman("start", container_name(cluster, host), timeout=120)
    return False


def _prepare_node(cluster: str, host: str, authorized_key: str, umads: int) -> str:
    """Install the key and placeholders, wait for sshd, and return the node's host public key."""
    result = podman(
        "exec", "-i", container_name(cluster, host), "sh", "-c", _BOOT_SCRIPT, "boot",
        str(umads), str(SSHD_WAIT_S * 4),
        input_text=authorized_key + "\n", timeout=SSHD_WAIT_S + 30,
    )
    pub = result.stdout.strip().splitlines()[-1:]
    if not pub or not pub[0].startswith("ssh-ed25519 "):
        raise LabError(f"{host}: could not read the SSH host key (got {result.stdout.strip()[:80]!r})")
    return pub[0]


def _write_text(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(mode)
    tmp.replace(path)


def _place_and_start(cluster: str, specs: Sequence[LabNodeSpec], state_dir: Path,
                     exports: Mapping[str, Sequence[str]], links: Mapping[str, Sequence[tuple[str, str]]],
                     progress: Progress) -> tuple[dict[str, str], dict[str, dict[str, Any]], list[str]]:
    """Make the networks, pick the nodes' addresses and start their containers, all under the host lock: the
    addresses are free only until the containers hold them. Returns the addresses, the containers that were
    there before and the hosts whose containers were created now."""
    hosts = [s.hostname for s in specs]
    with host_lock(f"lab up {cluster}"):
        network.ensure_network()
        made = ipoib.ensure_networks(links)
        if made:
            progress(f"simulated IPoIB networks created: {', '.join(made)}")
        addresses = allocate_addresses(hosts, _load_overlay_addresses(state_dir / "overlay.yaml"),
                                       _used_addresses(cluster),
                                       preferred={s.hostname: s.address for s in specs if s.address})
        current = _containers(cluster)
        progress(f"starting {len(hosts)} node container(s)")
        with ThreadPoolExecutor(max_workers=max(1, min(START_WORKERS, len(hosts)))) as pool:
            created_flags = list(pool.map(
                lambda h: _start(cluster, h, addresses[h], state_dir, current.get(container_name(cluster, h)),
                                 exports.get(h, ()), links.get(h, ())),
                hosts,
            ))
    return addresses, current, [h for h, made in zip(hosts, created_flags, strict=True) if made]


def lab_up(
    cluster_name: str,
    nodes: Sequence[LabNodeSpec],
    switches: Sequence[LabSwitch] = (),
    cables: Sequence[LabCable] = (),
    max_nodes: int | None = None,
    progress: Progress = _quiet,
    versions: VendorVersions | None = None,
    nfs_exports: Mapping[str, Sequence[str]] | None = None,
    ipoib_links: Mapping[str, Sequence[tuple[str, str]]] | None = None,
) -> LabInfo:
    """Bring the lab cluster up (or make sure it is up); see the module docstring.

    With ``versions`` (the spec's pins, :func:`provisioner.lab.fromspec.lab_versions`) it
    also builds the signed vendor repository and points the overlay's repositories at it.
    ``nfs_exports`` (:func:`provisioner.lab.fromspec.lab_nfs_exports`) names the paths each NFS
    server node exports; they get a Ganesha-exportable tmpfs when the container is created.
    ``ipoib_links`` (:func:`provisioner.lab.ipoib.lab_ipoib_links`) gives nodes their simulated IPoIB interfaces.
    """
    cluster = check_name(cluster_name, "cluster name")
    for spec in nodes:
        check_name(spec.hostname, "hostname")
    specs = list(nodes)
    if max_nodes is not None and len(specs) > max_nodes:
        progress(f"the lab brings up {max_nodes} of {len(specs)} nodes (max_nodes)")
        specs = specs[:max_nodes]
    problems = hardware.validate_cabling(specs, switches, [c for c in cables if c.node in
                                                           {s.hostname for s in specs}])
    if problems:
        raise LabError("lab cabling is inconsistent: " + "; ".join(problems))
    require_root()
    ensure_host_packages(progress)
    ensure_containers_conf()
    image.ensure_image(progress)
    links = {h: list(v) for h, v in (ipoib_links or {}).items()}

    state_dir = cluster_dir(cluster)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "sm").mkdir(exist_ok=True)
    hosts = [s.hostname for s in specs]
    exports = {h: list(paths) for h, paths in (nfs_exports or {}).items()}
    for paths in exports.values():
        export_mount_args(paths)  # a bad path fails here, before any container starts
    kept_cables = [c for c in cables if c.node in hosts]
    changed = hardware.write_lab_state(str(state_dir), cluster, specs, switches, kept_cables)
    if changed:
        progress(f"simulated hardware written for {len(changed)} node(s)")
    pub_key = ensure_ssh_key(state_dir / "ssh")
    keyring = ensure_vendor_repo(cluster, state_dir, versions, progress) if versions is not None else None

    overlay_path = state_dir / "overlay.yaml"
    addresses, current, created = _place_and_start(cluster, specs, state_dir, exports, links, progress)
    progress("waiting for sshd on every node")
    umads = {s.hostname: labstate.umad_count(labstate.load_node(str(state_dir), s.hostname)) for s in specs}
    paused = {name for name, row in current.items() if row.get("State") == "paused"}
    ready = [h for h in hosts if container_name(cluster, h) not in paused]
    with ThreadPoolExecutor(max_workers=max(1, min(START_WORKERS, len(ready)))) as pool:
        host_keys = dict(zip(ready, pool.map(lambda h: _prepare_node(cluster, h, pub_key, umads[h]), ready),
                             strict=True))

    reachable = {h: addresses[h] for h in ready}
    network.flush_neighbours([addresses[h] for h in created if h in reachable])
    progress("checking that every node answers SSH on its lab address")
    silent = network.wait_for_ssh(reachable)
    if silent:
        raise LabError("lab node(s) up but not reachable from this host: "
                       + "; ".join(f"{h}: {why}" for h, why in sorted(silent.items())),
                       hint=f"look at the bridge of podman network {NETWORK} (ip -br link; ip neigh); "
                            f"recreate the lab: provision lab down {cluster}; provision lab up <spec>")

    known_hosts = state_dir / "ssh" / "known_hosts"
    recorded = parse_known_hosts(known_hosts.read_text(encoding="utf-8")) if known_hosts.is_file() else {}
    entries: dict[str, tuple[str, str]] = {}
    for host in hosts:
        # A node's key is (re)recorded only when its container was made now: a key that
        # changed under a running node (a hardware swap) must NOT be accepted silently.
        if host in recorded and host not in created:
            entries[host] = recorded[host]
        elif host in host_keys:
            entries[host] = (addresses[host], host_keys[host])
    text = known_hosts_text(entries)
    if not known_hosts.is_file() or known_hosts.read_text(encoding="utf-8") != text:
        _write_text(known_hosts, text)
    overlay = yaml.safe_dump(overlay_data(state_dir / "ssh" / "id_ed25519", known_hosts, addresses, keyring),
                             sort_keys=False)
    if not overlay_path.is_file() or overlay_path.read_text(encoding="utf-8") != overlay:
        _write_text(overlay_path, overlay)
    progress(f"lab {cluster} is up: {len(hosts)} node(s), {len(created)} new")
    return LabInfo(cluster, state_dir, overlay_path, addresses, created)


def lab_down(cluster_name: str, progress: Progress = _quiet) -> list[str]:
    """Remove the cluster's containers and state; drop the network when no lab uses it. Returns the removed."""
    cluster = check_name(cluster_name, "cluster name")
    require_root()
    ensure_containers_conf()
    names = sorted(_containers(cluster))
    if names:
        progress(f"removing {len(names)} container(s)")
        done = podman("rm", "--force", "--time", "2", *names, timeout=60 + 10 * len(names), check=False)
        if done.returncode != 0:
            # A container whose systemd finished stopping while rm was killing it fails with "container state
            # improper: stopped" and stays behind; it is plain stopped now, and a second rm removes it.
            left = sorted(_containers(cluster))
            if left:
                podman("rm", "--force", "--time", "2", *left, timeout=60 + 10 * len(left))
    with host_lock(f"lab down {cluster}"):  # no other lab is between creating the network and joining it
        ipoib.remove_networks(cluster)
        network.remove_network_if_unused()
    state_dir = cluster_dir(cluster)
    if state_dir.exists():
        shutil.rmtree(state_dir)
    gnupg_home = vendor_gnupg_home(cluster)
    if gnupg_home.exists():
        shutil.rmtree(gnupg_home)
    return names


def lab_status(cluster_name: str) -> list[NodeStatus]:
    """Per node: container state, IP and injected faults (nodes of the state dir and containers)."""
    cluster = check_name(cluster_name, "cluster name")
    state_dir = cluster_dir(cluster)
    addresses = _load_overlay_addresses(state_dir / "overlay.yaml")
    rows = _containers(cluster)
    by_host = {str(r.get("Labels", {}).get(HOST_LABEL, "")): r for r in rows.values()}
    nodes_dir = state_dir / "nodes"
    hosts = sorted(set(by_host) | ({p.name for p in nodes_dir.iterdir()} if nodes_dir.is_dir() else set()))
    status = []
    for host in hosts:
        try:
            node = labstate.load_node(str(state_dir), host)
            faults = [{k: v for k, v in f.items() if k not in ("saved", "set")} for f in node.get("faults", [])]
        except FileNotFoundError:
            faults = []
        row = by_host.get(host)
        status.append(NodeStatus(host, container_name(cluster, host), str(row["State"]) if row else "absent",
                                 addresses.get(host), faults))
    try:  # switches with faults get a row of their own (no container: the lab's switches are state only)
        switch_faults = labstate.load_fabric(str(state_dir)).get("switch_faults", [])
    except (FileNotFoundError, ValueError):
        switch_faults = []
    for switch in sorted({str(f.get("switch")) for f in switch_faults}):
        mine = [{k: v for k, v in f.items() if k not in ("saved", "set", "saved_ports")} for f in switch_faults
                if f.get("switch") == switch]
        status.append(NodeStatus(switch, "-", "switch", None, mine))
    return status
