"""The SSH settings the converge gets with a bastion (ssh.jump): rendered from the spec, split as ansible splits
them, and run by the real OpenSSH client through loopback paramiko servers (tests/unit/_ssh_servers.py)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ansible.plugins.connection import ConnectionBase

from provisioner.errors import UsageError
from provisioner.render import build_inventory, render_files
from provisioner.render.ssh import Hop, ssh_common_args
from provisioner.spec import load_text
from provisioner.spec.cluster import Cluster
from tests.unit._ssh_servers import Site, site_servers

ROOT = Path(__file__).resolve().parents[2]
H100 = ROOT / "examples" / "h100-ndr-8node.yaml"
SSH_LINE = "ssh: {user: root, key: ~/.ssh/id_ed25519, known_hosts: known_hosts}"


def cluster_with(ssh_line: str, where: Path) -> Cluster:
    text = H100.read_text()
    assert SSH_LINE in text
    res = load_text(text.replace(SSH_LINE, ssh_line), str(where / "cluster.yaml"))
    assert res.cluster is not None, [d.format() for d in res.errors]
    return res.cluster


def test_jump_renders_a_proxy_command_with_the_same_strict_options(tmp_path: Path) -> None:
    cluster = cluster_with("ssh: {user: root, key: keys/id, known_hosts: kh, "
                           "jump: {host: bastion.example.com, user: ops, port: 2222}}", tmp_path)
    allv = build_inventory(cluster).groupvars["all"]
    kh, key = tmp_path / "kh", tmp_path / "keys" / "id"
    hop = (f"ssh -o StrictHostKeyChecking=yes -o UserKnownHostsFile={kh} -o BatchMode=yes -o ConnectTimeout=10 "
           f"-i {key} -p 2222 -l ops -W %h:%p bastion.example.com")
    assert allv["ansible_ssh_common_args"] == (
        f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={kh} -o ControlMaster=auto -o ControlPersist=60s "
        f"-o 'ProxyCommand={hop}'")
    # ansible splits the setting with shlex (ConnectionBase._split_ssh_args): ProxyCommand stays one -o value
    argv = ConnectionBase._split_ssh_args(allv["ansible_ssh_common_args"])
    assert argv[-2:] == ["-o", f"ProxyCommand={hop}"]
    # ssh runs it as `exec <command>` with the shell after expanding %h/%p: the hop's own argv
    assert shlex.split(hop.replace("%h:%p", "10.0.0.1:22")) == [
        "ssh", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={kh}", "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=10", "-i", str(key), "-p", "2222", "-l", "ops", "-W", "10.0.0.1:22",
        "bastion.example.com"]
    assert "ProxyJump" not in allv["ansible_ssh_common_args"]  # its hop would not get the strict options


def test_jump_user_defaults_to_ssh_user_and_the_file_stays_unsafe(tmp_path: Path) -> None:
    cluster = cluster_with("ssh: {user: admin, known_hosts: kh, jump: {host: 192.0.2.10}}", tmp_path)
    text = render_files(cluster)["group_vars/all.yml"]
    line = next(ln for ln in text.splitlines() if ln.startswith("ansible_ssh_common_args:"))
    assert line.startswith("ansible_ssh_common_args: !unsafe ")  # never templated by ansible
    value = yaml.safe_load(line.replace("!unsafe ", ""))["ansible_ssh_common_args"]
    assert value.endswith(f"-o UserKnownHostsFile={tmp_path / 'kh'} -o BatchMode=yes -o ConnectTimeout=10 "
                          "-p 22 -l admin -W %h:%p 192.0.2.10'")
    assert " -i " not in value  # no ssh.key: the agent, on both hops


def test_paths_ssh_would_reinterpret_are_refused_not_escaped() -> None:
    for bad in ("/srv/my cluster/known_hosts", "/srv/100%/known_hosts", "/srv/a'b/known_hosts", "/srv/$(id)/kh"):
        with pytest.raises(UsageError, match="ProxyCommand would reinterpret"):
            ssh_common_args(known_hosts=bad, key=None, jump=Hop("bastion", "ops", 22))
    # without a bastion the node options are as before (the golden files hold them)
    assert ssh_common_args(known_hosts="/srv/kh", key=None) == \
        "-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/srv/kh -o ControlMaster=auto -o ControlPersist=60s"


# --- the real OpenSSH client with the rendered options ------------------------------------------------------------
@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    if shutil.which("ssh") is None:
        pytest.skip("needs the OpenSSH client (ssh)")
    with site_servers(tmp_path) as servers:
        yield servers


def _openssh(site: Site, common_args: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """ssh as ansible runs it: its ssh_common_args split with shlex, then the node's port, user and address."""
    argv = ["ssh", "-F", "/dev/null", *ConnectionBase._split_ssh_args(common_args), *extra,
            "-o", "BatchMode=yes", "-i", str(site.client_file), "-p", str(site.node.port), "-l", "root", "127.0.0.1",
            "echo through-the-bastion"]
    return _run_ssh(argv)


def _run_ssh(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ssh and wait for it alone: its output goes to files, not pipes. The hop's own ssh (ProxyCommand, or
    ProxyJump's child) inherits ssh's stderr and lives until the test bastion closes the forwarded channel, which
    this stub may do only when the site stops; with pipes, communicate() waited for that too and a loaded CI run
    hit the 60 s timeout with ssh long done (returncode 0, the node's output read)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        rc = subprocess.run(argv, stdout=out, stderr=err, text=True, timeout=60, check=False).returncode
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, rc, out.read(), err.read())


def test_openssh_reaches_the_node_through_the_bastion(site: Site) -> None:
    args = ssh_common_args(known_hosts=str(site.known_hosts), key=str(site.client_file),
                           jump=Hop("127.0.0.1", "ops", site.bastion.port))
    done = _openssh(site, args, "-o", "ControlMaster=no")
    assert (done.returncode, done.stdout) == (0, "through-the-bastion\n"), done.stderr
    assert site.bastion.log.forwards == [("127.0.0.1", site.node.port)]
    assert site.node.log.commands == ["echo through-the-bastion"]


def test_openssh_reaches_the_node_with_known_hosts_under_an_odd_directory(site: Site, tmp_path: Path) -> None:
    """A spec directory with spaces, a quote and a shell substitution (issue #26): ssh reads the whole path as the
    one known_hosts file, checks the node against it and runs nothing of the name (was: split into words)."""
    odd = tmp_path / "my site" / "it's $(touch ran)"
    odd.mkdir(parents=True)
    shutil.copy(site.known_hosts, odd / "known_hosts")
    args = ssh_common_args(known_hosts=str(odd / "known_hosts"), key=None)
    done = _openssh(site, args, "-o", "ControlMaster=no")
    assert (done.returncode, done.stdout) == (0, "through-the-bastion\n"), done.stderr
    assert site.node.log.commands == ["echo through-the-bastion"] and site.bastion.log.connections == 0
    assert not list(tmp_path.rglob("ran"))


def test_openssh_refuses_an_unknown_bastion_key(site: Site, tmp_path: Path) -> None:
    only_node = tmp_path / "known_hosts.node"
    only_node.write_text(f"[127.0.0.1]:{site.node.port} {site.node.host_key.get_name()} "
                         f"{site.node.host_key.get_base64()}\n")
    args = ssh_common_args(known_hosts=str(only_node), key=str(site.client_file),
                           jump=Hop("127.0.0.1", "ops", site.bastion.port))
    done = _openssh(site, args, "-o", "ControlMaster=no")
    assert done.returncode == 255 and "Host key verification failed" in done.stderr, done.stderr
    assert site.bastion.log.forwards == [] and site.node.log.connections == 0
    assert only_node.read_text().count("\n") == 1  # not learnt


def test_openssh_proxyjump_would_not_carry_the_strict_options(site: Site, tmp_path: Path) -> None:
    """Why the hop is a ProxyCommand: with -o ProxyJump, the jump ssh gets -F but not the command line's
    -o options (openssh-portable ssh.c), so a config saying accept-new has it learn the unknown bastion key."""
    only_node = tmp_path / "known_hosts.node"
    only_node.write_text(f"[127.0.0.1]:{site.node.port} {site.node.host_key.get_name()} "
                         f"{site.node.host_key.get_base64()}\n")
    learnt = tmp_path / "learnt"
    config = tmp_path / "ssh_config"
    config.write_text(f"StrictHostKeyChecking accept-new\nUserKnownHostsFile {learnt}\nIdentityFile "
                      f"{site.client_file}\nBatchMode yes\n")
    argv = ["ssh", "-F", str(config), "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={only_node}",
            "-o", f"ProxyJump=ops@127.0.0.1:{site.bastion.port}", "-p", str(site.node.port), "-l", "root",
            "127.0.0.1", "echo via-proxyjump"]
    done = _run_ssh(argv)
    assert done.returncode == 0 and done.stdout == "via-proxyjump\n", done.stderr  # the bastion was not checked
    assert f"[127.0.0.1]:{site.bastion.port}" in learnt.read_text()  # its key was accepted and written
