"""NFS-Ganesha served for real between two lab containers, configured by the nfs_server role.

What this proves: the role's Ganesha configuration (EXPORT with FSAL VFS, Squash from the spec's options)
makes a server that another machine reads and writes over NFSv4: a file written on the server is read with
``nfs-cat`` (libnfs, user space) from the client, and a file written with ``nfs-cp`` lands on the server
owned by root (no_root_squash honoured).

What it cannot prove, and why: the lab kernel has no NFS client, no nfsd and no Lustre, so no kernel mount
happens here: not the kernel NFS server (exportfs), not a client mount (mount.nfs, proto=rdma, nconnect), not
NFS over RDMA (no HCA), not Lustre/LNet. Those are covered by the rendered units (molecule nfs_client,
lustre_client: systemd-analyze verify) and by the verification logic on captured mount tables (unit tests).

Needs root, podman, the lab image and the Debian mirror (nfs-ganesha, libnfs-utils). Run:
``pytest -m lab tests/lab/test_storage_lab.py``. Uses its own PROVISIONER_LAB_DIR and removes only the two
containers it created.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.remote import Completed

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

ROOT = Path(__file__).resolve().parents[2]
SUFFIX = uuid.uuid4().hex[:6]
SERVER = f"provstor-srv-{SUFFIX}"
CLIENT = f"provstor-cli-{SUFFIX}"


def _podman(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    from provisioner.lab.host import podman_env

    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=check,
                          env=podman_env())


def _exec(name: str, script: str, timeout: float = 600) -> str:
    done = _podman("exec", name, "sh", "-c", script, timeout=timeout, check=False)
    assert done.returncode == 0, f"{name}: {script}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    os.environ.setdefault("PROVISIONER_LAB_DIR", str(tmp_path_factory.mktemp("storlab")))
    from provisioner.lab import image, network
    from provisioner.lab.host import ensure_containers_conf, host_lock
    from provisioner.lab.names import NETWORK

    os.environ["CONTAINERS_CONF"] = str(ensure_containers_conf())
    image.ensure_image(lambda _m: None)

    def teardown() -> None:
        for name in (SERVER, CLIENT):  # only the containers this module created
            _podman("rm", "-f", "-t", "2", name, check=False)

    request.addfinalizer(teardown)
    common = ["run", "-d", "--systemd=always", f"--network={NETWORK}", "--label", "provisioner-storage-lab=1"]
    # podman gives these two the network's next free addresses: under the host lock, as a lab's bring-up picks
    # and takes its addresses, and no lab down removes the network between its creation and these joining it
    with host_lock("storage lab test containers"):
        network.ensure_network()
        _podman(*common, "--name", SERVER, "--hostname", SERVER, "--cap-add=DAC_READ_SEARCH",
                "--tmpfs=/export/ganesha:rw,mode=0755", image.IMAGE, "/sbin/init")
        _podman(*common, "--name", CLIENT, "--hostname", CLIENT, image.IMAGE, "/sbin/init")
    for name in (SERVER, CLIENT):
        _exec(name, "systemctl is-system-running --wait || true", timeout=120)
    _exec(CLIENT, "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libnfs-utils "
                  ">/dev/null")
    yield SERVER, CLIENT


def _apply_role(server: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    inventory = tmp / "inventory.yml"
    inventory.write_text(
        "all:\n  hosts:\n    " + server + ":\n      ansible_connection: containers.podman.podman\n"
        "      ansible_python_interpreter: /usr/bin/python3\n"
        "      nfs_server_ganesha_graceless: true\n"
        "      nfs_server_exports:\n"
        "        - {path: /export/ganesha, clients: 10.213.38.0/24, options: [rw, sync, no_root_squash],"
        " implementation: ganesha}\n", encoding="utf-8")
    play = tmp / "play.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  roles: [nfs_server]\n", encoding="utf-8")
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_FORCE_COLOR": "0",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run(["ansible-playbook", "-i", str(inventory), str(play)], capture_output=True, text=True,
                          timeout=900, env=env, check=False)


def test_ganesha_export_is_read_and_written_from_another_container(pair: tuple[str, str], tmp_path: Path) -> None:
    server, client = pair
    done = _apply_role(server, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    token = f"written-on-{server}-{uuid.uuid4().hex}"
    _exec(server, f"printf '%s\\n' {token} > /export/ganesha/hello.txt")
    url = f"nfs://{server}/export/ganesha"
    assert _exec(client, f"nfs-cat '{url}/hello.txt?version=4'") == token + "\n"
    back = f"from-{client}-{uuid.uuid4().hex}"
    _exec(client, f"printf '%s\\n' {back} > /tmp/back.txt && nfs-cp /tmp/back.txt '{url}/back.txt?version=4'")
    assert _exec(server, "cat /export/ganesha/back.txt") == back + "\n"
    assert _exec(server, "stat -c %u /export/ganesha/back.txt").strip() == "0"  # no_root_squash honoured


class _PodmanRemote:
    """provisioner.remote.Remote over ``podman exec`` (the two containers have no SSH set up here)."""

    def run(self, host: str, argv: list[str], timeout: float, env: dict[str, str] | None = None) -> Completed:
        done = _podman("exec", host, *argv, timeout=timeout, check=False)
        return Completed(done.returncode, done.stdout, done.stderr)

    def run_many(self, commands: dict[str, list[str]], timeout: float,
                 env: dict[str, str] | None = None) -> dict[str, Completed]:
        return {h: self.run(h, a, timeout) for h, a in commands.items()}

    def start(self, *args: object, **kwargs: object) -> object:
        raise AssertionError("not used")


def test_verify_export_probe_reads_and_writes_the_ganesha_export(pair: tuple[str, str], tmp_path: Path) -> None:
    """The user-space export check of `provision verify` (storage_export) against the real Ganesha export:
    nfs-cp from the client, nfs-cat back, the file on the server's disk, cleaned up; a path that is not
    exported is an error naming the server."""
    from provisioner.fabric import storage

    server, client = pair
    assert _apply_role(server, tmp_path).returncode == 0
    _exec(client, "command -v nfs-cp nfs-cat nfs-ls >/dev/null")
    good = storage.ExportProbe(server, server, "/export/ganesha", "4.2", client, client,
                               f".provisioner-storage-check-{SUFFIX}", f"token {uuid.uuid4().hex}")
    (result,) = storage.check_exports([good], set(), frozenset(), _PodmanRemote())  # type: ignore[arg-type]
    assert result.passed, result
    assert ".provisioner-storage-check" not in _exec(server, "ls -A /export/ganesha")  # cleaned up on the server
    bad = storage.ExportProbe(server, server, "/export/not-exported", "4.2", client, client, ".x", "t")
    (failed,) = storage.check_exports([bad], set(), frozenset(), _PodmanRemote())  # type: ignore[arg-type]
    assert failed.ran and not failed.passed
    assert failed.findings[0].node == server and "cannot write to the export over NFS" in failed.findings[0].message
