"""In-process paramiko SSH servers on 127.0.0.1 for the bastion tests: a node that runs commands with ``sh -c``,
and a bastion that does what sshd does for ``ssh -W``/ProxyJump: it accepts ``direct-tcpip`` channels
(RFC 4254 section 7.2) after public-key authentication, connects to the destination and relays bytes, and runs no
commands itself. Each records what it saw (:class:`Log`). Nothing leaves the loopback interface."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko


def keyfile(directory: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = directory / "id_ed25519"
    path.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    path.chmod(0o600)  # OpenSSH ignores a private key others can read
    return path


@dataclass
class Log:
    """What a server saw: connections accepted, commands run, direct-tcpip destinations asked for."""

    connections: int = 0
    commands: list[str] = field(default_factory=list)
    forwards: list[tuple[str, int]] = field(default_factory=list)


class NodeServer(paramiko.ServerInterface):
    def __init__(self, client_key: paramiko.PKey, log: Log) -> None:
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
            # EOF first, close later: this thread may finish before the transport thread has answered the exec
            # request (paramiko's Channel._handle_request replies after this callback returns), and a channel
            # closed before that answer fails the client's exec_command with "Channel closed." (seen under load
            # in CI). The close waits for the client's own EOF or close (paramiko clients) or half a second
            # (OpenSSH waits for ours), by which time the answer has long gone out.
            channel.shutdown_write()
            channel.settimeout(0.5)
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                while channel.recv(1024):
                    pass
            channel.close()

        threading.Thread(target=work, daemon=True).start()
        return True


class BastionServer(NodeServer):
    """Authenticates like a node, opens no sessions, relays direct-tcpip channels to their destination."""

    def __init__(self, client_key: paramiko.PKey, log: Log) -> None:
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


def relay(chan: paramiko.Channel, sock: socket.socket) -> None:
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
class Sshd:
    port: int
    host_key: paramiko.PKey
    log: Log
    stop: Callable[[], None]


@contextlib.contextmanager
def sshd(tmp: Path, client_key: paramiko.PKey, bastion: bool) -> Iterator[Sshd]:
    host_key = paramiko.Ed25519Key.from_private_key_file(keyfile(tmp))
    log = Log()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    transports: list[paramiko.Transport] = []

    def negotiate(t: paramiko.Transport) -> None:
        server: NodeServer = (BastionServer if bastion else NodeServer)(client_key, log)
        with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
            t.start_server(server=server)
        while bastion and t.is_active():
            chan = t.accept(timeout=0.2)
            if chan is not None:
                assert isinstance(server, BastionServer)
                relay(chan, server.upstream.pop(chan.get_id()))

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
        yield Sshd(listener.getsockname()[1], host_key, log, stop)
    finally:
        stop()


@dataclass
class Site:
    """A node and a bastion, a client key both accept, and a known_hosts that trusts both."""

    node: Sshd
    bastion: Sshd
    client_file: Path
    known_hosts: Path


@contextlib.contextmanager
def site_servers(tmp: Path) -> Iterator[Site]:
    for sub in ("c", "n", "b"):
        (tmp / sub).mkdir()
    client_file = keyfile(tmp / "c")
    client_key = paramiko.Ed25519Key.from_private_key_file(client_file)
    with sshd(tmp / "n", client_key, bastion=False) as node, sshd(tmp / "b", client_key, bastion=True) as bastion:
        known = tmp / "known_hosts"
        known.write_text("".join(f"[127.0.0.1]:{s.port} {s.host_key.get_name()} {s.host_key.get_base64()}\n"
                                 for s in (node, bastion)))
        yield Site(node, bastion, client_file, known)
