"""provisioner.remote through a bastion (ssh.jump), against in-process paramiko SSH servers on 127.0.0.1.

The bastion server does what sshd does for ``ssh -W``/ProxyJump: it accepts ``direct-tcpip`` channels
(RFC 4254 section 7.2) after public-key authentication, connects to the destination, and relays bytes; it runs
no commands itself. The node server runs commands with ``sh -c``. Nothing leaves the loopback interface.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import pytest

from provisioner.errors import RemoteError
from provisioner.fabric import reach
from provisioner.hostkeys import fingerprint
from provisioner.remote import JumpTarget, SshRemote, SshTarget


def _keyfile(directory: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = directory / "id_ed25519"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    return path


@dataclass
class _Log:
    """What a server saw: connections accepted, commands run, direct-tcpip destinations asked for."""

    connections: int = 0
    commands: list[str] = field(default_factory=list)
    forwards: list[tuple[str, int]] = field(default_factory=list)


class _NodeServer(paramiko.ServerInterface):
    def __init__(self, client_key: paramiko.PKey, log: _Log) -> None:
        self.client_key = client_key
        self.log = log

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok: int = paramiko.common.AUTH_SUCCESSFUL if key == self.client_key else paramiko.common.AUTH_FAILED
        return ok

    def check_channel_request(self, kind: str, chanid: int) -> int:
        answer: int = (paramiko.common.OPEN_SUCCEEDED if kind == "session"
                       else paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED)
        return answer

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.log.commands.append(command.decode())

        def work() -> None:
            proc = subprocess.run(["sh", "-c", command.decode()], capture_output=True, check=False)
            channel.sendall(proc.stdout)
            channel.sendall_stderr(proc.stderr)
            channel.send_exit_status(proc.returncode)
            channel.close()

        threading.Thread(target=work, daemon=True).start()
        return True


class _BastionServer(_NodeServer):
    """Authenticates like a node, opens no sessions, relays direct-tcpip channels to their destination."""

    def __init__(self, client_key: paramiko.PKey, log: _Log) -> None:
        super().__init__(client_key, log)
        self.upstream: dict[int, socket.socket] = {}

    def check_channel_request(self, kind: str, chanid: int) -> int:
        refused: int = paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        return refused

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple[str, int],
                                           destination: tuple[str, int]) -> int:
        self.log.forwards.append(destination)
        try:
            self.upstream[chanid] = socket.create_connection(destination, timeout=5)
        except OSError:
            failed: int = paramiko.common.OPEN_FAILED_CONNECT_FAILED
            return failed
        opened: int = paramiko.common.OPEN_SUCCEEDED
        return opened


def _relay(chan: paramiko.Channel, sock: socket.socket) -> None:
    sock.settimeout(None)

    def pump(read: Callable[[int], bytes], write: Callable[[bytes], object], done: Callable[[], object]) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            while data := read(65536):
                write(data)
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            done()

    threading.Thread(target=pump, args=(chan.recv, sock.sendall, lambda: sock.shutdown(socket.SHUT_WR)),
                     daemon=True).start()
    threading.Thread(target=pump, args=(sock.recv, chan.sendall, chan.shutdown_write), daemon=True).start()


@dataclass
class _Sshd:
    port: int
    host_key: paramiko.PKey
    log: _Log
    stop: Callable[[], None]


@contextlib.contextmanager
def _sshd(tmp: Path, client_key: paramiko.PKey, bastion: bool) -> Iterator[_Sshd]:
    host_key = paramiko.Ed25519Key.from_private_key_file(_keyfile(tmp))
    log = _Log()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    transports: list[paramiko.Transport] = []

    def negotiate(t: paramiko.Transport) -> None:
        server: _NodeServer = (_BastionServer if bastion else _NodeServer)(client_key, log)
        with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
            t.start_server(server=server)
        while bastion and t.is_active():
            chan = t.accept(timeout=0.2)
            if chan is not None:
                assert isinstance(server, _BastionServer)
                _relay(chan, server.upstream.pop(chan.get_id()))

    def serve() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            log.connections += 1
            t = paramiko.Transport(sock)
            t.add_server_key(host_key)
            transports.append(t)
            threading.Thread(target=negotiate, args=(t,), daemon=True).start()

    def stop() -> None:
        listener.close()
        for t in transports:
            t.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield _Sshd(listener.getsockname()[1], host_key, log, stop)
    finally:
        stop()


@dataclass
class _Site:
    node: _Sshd
    bastion: _Sshd
    client_file: Path
    known_hosts: Path


@pytest.fixture
def site(tmp_path: Path) -> Iterator[_Site]:
    (tmp_path / "c").mkdir()
    (tmp_path / "n").mkdir()
    (tmp_path / "b").mkdir()
    client_file = _keyfile(tmp_path / "c")
    client_key = paramiko.Ed25519Key.from_private_key_file(client_file)
    with _sshd(tmp_path / "n", client_key, bastion=False) as node, \
            _sshd(tmp_path / "b", client_key, bastion=True) as bastion:
        known = tmp_path / "known_hosts"
        known.write_text("".join(f"[127.0.0.1]:{s.port} {s.host_key.get_name()} {s.host_key.get_base64()}\n"
                                 for s in (node, bastion)))
        yield _Site(node, bastion, client_file, known)


def _targets(site: _Site, names: tuple[str, ...] = ("node1",), *, bastion_port: int | None = None,
             node_port: int | None = None, known: Path | None = None) -> dict[str, SshTarget]:
    kh = known or site.known_hosts
    jump = JumpTarget(host="127.0.0.1", user="ops", port=bastion_port or site.bastion.port, key=site.client_file,
                      known_hosts=kh)
    return {n: SshTarget(name=n, address="127.0.0.1", user="root", port=node_port or site.node.port,
                         key=site.client_file, known_hosts=kh, jump=jump) for n in names}


def test_a_command_runs_on_the_node_through_the_bastion(site: _Site) -> None:
    with SshRemote(_targets(site, ("node1", "node2"))) as remote:
        done = remote.run("node1", ["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
        assert done == (3, "out\n", "err\n")
        many = remote.run_many({"node1": ["echo", "one"], "node2": ["echo", "two"]}, timeout=10)
        assert (many["node1"].stdout, many["node2"].stdout) == ("one\n", "two\n")
    # the node's SSH ran inside channels the bastion opened to it; the bastion ran nothing itself
    assert site.bastion.log.forwards == [("127.0.0.1", site.node.port)] * 2
    assert site.bastion.log.commands == []
    assert site.bastion.log.connections == 1  # one bastion connection for both nodes
    assert site.node.log.connections == 2 and len(site.node.log.commands) == 3


def test_unknown_bastion_key_is_refused_with_its_fingerprint_and_nothing_runs(site: _Site, tmp_path: Path) -> None:
    only_node = tmp_path / "known_hosts.node"
    only_node.write_text(f"[127.0.0.1]:{site.node.port} {site.node.host_key.get_name()} "
                         f"{site.node.host_key.get_base64()}\n")
    with SshRemote(_targets(site, ("node1", "node2"), known=only_node)) as remote:
        with pytest.raises(RemoteError) as err:
            remote.run("node1", ["touch", str(tmp_path / "ran")], timeout=5)
        many = remote.run_many({"node1": ["true"], "node2": ["true"]}, timeout=5)
    msg = err.value.message
    assert msg.startswith(f"bastion ops@127.0.0.1:{site.bastion.port}: ") and fingerprint(site.bastion.host_key) in msg
    assert f"[127.0.0.1]:{site.bastion.port} ssh-ed25519 {site.bastion.host_key.get_base64()}" in (err.value.hint or "")
    assert {d.rc for d in many.values()} == {255} and {d.stderr for d in many.values()} == {str(err.value)}
    assert site.bastion.log.forwards == [] and site.node.log.connections == 0
    assert not (tmp_path / "ran").exists()
    assert only_node.read_text().count("\n") == 1  # nothing learnt


def test_changed_bastion_key_is_refused(site: _Site, tmp_path: Path) -> None:
    other = paramiko.Ed25519Key.from_private_key_file(_keyfile(tmp_path))
    kh = tmp_path / "known_hosts.changed"
    kh.write_text(f"[127.0.0.1]:{site.bastion.port} {other.get_name()} {other.get_base64()}\n")
    with SshRemote(_targets(site, known=kh)) as remote, pytest.raises(RemoteError, match="CHANGED") as err:
        remote.run("node1", ["true"], timeout=5)
    assert err.value.message.startswith("bastion ops@127.0.0.1")
    assert fingerprint(site.bastion.host_key) in err.value.message and fingerprint(other) in err.value.message
    assert "replace-node" not in (err.value.hint or "")  # a node's remedy, not the bastion's
    assert site.node.log.connections == 0


def test_node_key_is_still_checked_behind_the_bastion(site: _Site, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts.bastion"
    kh.write_text(f"[127.0.0.1]:{site.bastion.port} {site.bastion.host_key.get_name()} "
                  f"{site.bastion.host_key.get_base64()}\n")
    with SshRemote(_targets(site, known=kh)) as remote, pytest.raises(RemoteError) as err:
        remote.run("node1", ["true"], timeout=5)
    assert err.value.message.startswith(f"node1 ([127.0.0.1]:{site.node.port}): host key ")
    assert fingerprint(site.node.host_key) in err.value.message
    assert "trust-host SPEC node1" in (err.value.hint or "")
    assert site.node.log.commands == []


def test_bastion_down_is_one_clear_reason_for_every_node(site: _Site) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now: connection refused
    made: list[paramiko.SSHClient] = []

    def factory() -> paramiko.SSHClient:
        made.append(paramiko.SSHClient())
        return made[-1]

    nodes = ("gpu01", "gpu02", "gpu03")
    remote = reach.ReachableRemote(SshRemote(_targets(site, nodes, bastion_port=port), client_factory=factory))
    remote.probe(nodes, timeout=5)
    assert len(made) == 1  # the bastion was tried once, not once per node
    reasons = set(remote.lost.values())
    assert sorted(remote.lost) == list(nodes) and len(reasons) == 1
    [why] = reasons
    assert why.startswith(f"bastion ops@127.0.0.1:{port}: cannot connect: ") and "\n" not in why
    results = reach.settle([], remote.lost)
    assert [(r.name, r.node, r.ran, r.error) for r in results] == [("ssh", n, False, why) for n in nodes]
    assert site.node.log.connections == 0


def test_a_node_the_bastion_cannot_reach_is_named_and_the_others_still_run(site: _Site) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    targets = {**_targets(site, ("good",)), **_targets(site, ("gone",), node_port=port)}
    with SshRemote(targets) as remote:
        many = remote.run_many({"good": ["echo", "ok"], "gone": ["true"]}, timeout=5)
    assert many["good"].stdout == "ok\n"
    assert many["gone"].unreachable
    assert many["gone"].stderr.startswith(f"gone (127.0.0.1:{port}): bastion ops@127.0.0.1:{site.bastion.port} "
                                          "cannot reach it: ")


def test_targets_from_a_spec_with_a_jump_host(tmp_path: Path) -> None:
    from provisioner.remote import targets_from_cluster
    from provisioner.spec import load_text

    root = Path(__file__).resolve().parents[2]
    text = (root / "examples" / "h100-ndr-8node.yaml").read_text()
    old = "ssh: {user: root, key: ~/.ssh/id_ed25519, known_hosts: known_hosts}"
    assert old in text
    spec = tmp_path / "cluster.yaml"
    spec.write_text(text.replace(old, "ssh: {user: root, known_hosts: kh, jump: {host: bastion.example.com}}"))
    res = load_text(spec.read_text(), str(spec))
    assert res.cluster is not None, [d.format() for d in res.errors]
    targets = targets_from_cluster(res.cluster)
    jumps = {t.jump for t in targets.values()}
    assert jumps == {JumpTarget(host="bastion.example.com", user="root", port=22, key=None,
                                known_hosts=tmp_path / "kh")}  # user defaults to ssh.user; one bastion for all
