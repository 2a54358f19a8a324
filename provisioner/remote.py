"""Remote execution over SSH (with provisioner.hostkeys, the only modules that import paramiko).

Why it looks the way it does:

* **Host keys are verified, never learnt.** The client loads the spec's ``known_hosts`` and refuses any host
  whose key is missing or different (``RejectPolicy``). The error names the host, the address and the key's
  SHA256 fingerprint, and says how to accept it explicitly (``provision trust-host`` with the fingerprint the
  operator copied from the console or BMC; provisioner.hostkeys holds the keys and the decision).
* **A bastion is held to the same rule.** With ``ssh.jump`` every node is reached over a ``direct-tcpip``
  channel of one shared connection to the bastion (:class:`Bastion`), whose own key must be in the same
  known_hosts (:class:`provisioner.hostkeys.RejectBastion` names it and its fingerprint when it is not). A
  bastion that cannot be reached is tried once; every node then gets that one reason.
* **Commands are argv lists**, joined with :func:`shlex.join`. Every spec value that reaches them is already
  pattern-checked by the spec models; quoting them anyway costs nothing.
* **Nothing hangs.** Every command runs under the remote ``timeout`` (coreutils) and under a local deadline;
  a command that outlives its deadline returns ``rc = 124`` (the ``timeout`` convention) with what it
  printed so far. A node that cannot be reached returns ``rc = 255`` from :meth:`SshRemote.run_many` (the
  ``ssh`` convention) so one dead node does not stop a fleet-wide check; :meth:`SshRemote.run` raises.
* **Servers run in the background** (``ib_write_bw`` server side): :meth:`SshRemote.start` returns a handle
  to wait for or kill; the remote PID is captured so that kill really ends the process.

Checks never use this class directly: they take anything that implements :class:`Remote`, so the unit tests
can drive them with a fake that returns captured tool outputs.
"""

from __future__ import annotations

import contextlib
import math
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

import paramiko

from provisioner.errors import RemoteError, UsageError
from provisioner.hostkeys import RejectBastion, RejectWithFingerprint, fingerprint, load_known_hosts

if TYPE_CHECKING:
    from provisioner.spec.models import SshJump

RC_TIMEOUT = 124
RC_UNREACHABLE = 255
DEFAULT_WORKERS = 16
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,63}$")
_PID_MARK = "__provisioner_pid__"
_POLL_S = 0.02


class Completed(NamedTuple):
    """What one remote command did: exit status and its output (decoded as UTF-8, invalid bytes replaced)."""

    rc: int
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.rc == RC_TIMEOUT

    @property
    def unreachable(self) -> bool:
        return self.rc == RC_UNREACHABLE


class Background(Protocol):
    """A command started with :meth:`Remote.start` (e.g. the server side of ``ib_write_bw``)."""

    def wait(self, timeout: float) -> Completed:
        """Wait up to ``timeout`` seconds; after that the command is killed and ``rc`` is 124."""
        ...

    def kill(self) -> None:
        """End the command now (idempotent)."""
        ...


class Remote(Protocol):
    """What the checks need from a remote executor; :class:`SshRemote` and the tests' fake implement it."""

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        ...

    def start(
        self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> Background:
        ...

    def run_many(
        self, commands: Mapping[str, Sequence[str]], timeout: float, env: Mapping[str, str] | None = None
    ) -> dict[str, Completed]:
        ...


# ---------------------------------------------------------------- pure helpers


def split_sections(stdout: str, mark: str) -> tuple[str, dict[str, str]]:
    """A probe's output cut at its marker lines (``<mark><section name>``): (what came before the first marker,
    {section name: its text}). The probes of verify and health print one marker per reading they take."""
    head, sections, name = "", {}, None
    for line in stdout.splitlines(keepends=True):
        if line.startswith(mark):
            name = line[len(mark):].strip()
            sections[name] = ""
        elif name is None:
            head += line
        else:
            sections[name] += line
    return head, sections


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float | None = None) -> str:
    """The shell line for ``argv``: ``env K=V`` first, the remote ``timeout`` backstop, every word quoted.

    Environment names are checked (upper-case identifiers) because they are not quoted by shlex.
    """
    if not argv:
        raise UsageError("empty remote command")
    words: list[str] = []
    if env:
        for key, value in sorted(env.items()):
            if not _ENV_NAME.match(key):
                raise UsageError(f"invalid environment variable name {key!r} for a remote command")
            words.append(f"{key}={value}")
        words.insert(0, "env")
    if timeout is not None:
        words += ["timeout", "--kill-after=5", str(max(1, math.ceil(timeout)))]
    return shlex.join([*words, *argv])


@dataclass(frozen=True, slots=True)
class JumpTarget:
    """The bastion the nodes are reached through (``ssh.jump``): its host key is checked against the same
    known_hosts as the nodes', and it authenticates with the same key (or the agent)."""

    host: str
    user: str
    port: int
    key: Path | None
    known_hosts: Path

    @classmethod
    def of(cls, jump: SshJump, *, user: str, key: Path | None, known_hosts: Path) -> JumpTarget:
        """The spec's ``ssh.jump`` (or discover's ``--jump``) with the nodes' login user, key and known_hosts."""
        return cls(host=jump.host, user=jump.user or user, port=jump.port, key=key, known_hosts=known_hosts)

    @property
    def label(self) -> str:
        return f"bastion {self.user}@{self.host}:{self.port}"

    def as_target(self) -> SshTarget:
        """The bastion as a target of its own (what the known_hosts lookup and the key policy read)."""
        return SshTarget(name=self.host, address=self.host, user=self.user, port=self.port, key=self.key,
                         known_hosts=self.known_hosts)


@dataclass(frozen=True, slots=True)
class SshTarget:
    """How to reach one node: the spec's address, user, key and port, and the known_hosts file to trust; ``jump``
    is the bastion the connection goes through (None: straight to the node)."""

    name: str
    address: str
    user: str
    port: int
    key: Path | None
    known_hosts: Path
    jump: JumpTarget | None = None


def targets_from_cluster(cluster: object) -> dict[str, SshTarget]:
    """One :class:`SshTarget` per node of an expanded spec; relative paths are relative to the spec file."""
    from provisioner.spec.cluster import Cluster

    if not isinstance(cluster, Cluster):
        raise UsageError("targets_from_cluster needs an expanded Cluster")
    base = Path(cluster.file).resolve().parent
    ssh = cluster.spec.ssh

    def _path(p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else base / q

    key = _path(ssh.key) if ssh.key else None
    known_hosts = _path(ssh.known_hosts)
    jump = JumpTarget.of(ssh.jump, user=ssh.user, key=key, known_hosts=known_hosts) if ssh.jump else None
    return {
        n.name: SshTarget(
            name=n.name,
            address=n.address,
            user=ssh.user,
            port=ssh.port,
            key=key,
            known_hosts=known_hosts,
            jump=jump,
        )
        for n in cluster.nodes
    }


# ---------------------------------------------------------------- channels


def _collect(channel: paramiko.Channel, deadline: float) -> Completed:
    """Read a channel until the command exits or the deadline passes (then close it: rc 124)."""
    out: list[bytes] = []
    err: list[bytes] = []
    while True:
        busy = False
        if channel.recv_ready():
            out.append(channel.recv(65536))
            busy = True
        if channel.recv_stderr_ready():
            err.append(channel.recv_stderr(65536))
            busy = True
        if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
            rc = channel.recv_exit_status()
            break
        if time.monotonic() >= deadline:
            channel.close()
            rc = RC_TIMEOUT
            err.append(b"\n[provisioner] timed out waiting for the remote command\n")
            break
        if not busy:
            time.sleep(_POLL_S)
    channel.close()
    return Completed(rc, b"".join(out).decode("utf-8", "replace"), b"".join(err).decode("utf-8", "replace"))


class _SshBackground:
    """A background command; its first output line is the remote shell's PID (stripped from stdout)."""

    def __init__(self, remote: SshRemote, host: str, channel: paramiko.Channel, timeout: float) -> None:
        self._remote = remote
        self._host = host
        self._channel = channel
        self._deadline = time.monotonic() + timeout
        self._done: Completed | None = None
        self._lock = threading.Lock()

    def wait(self, timeout: float) -> Completed:
        with self._lock:
            if self._done is None:
                done = _collect(self._channel, min(self._deadline, time.monotonic() + timeout))
                if done.timed_out:
                    self._kill_remote(done.stdout)
                self._done = _strip_pid(done)
            return self._done

    def kill(self) -> None:
        with self._lock:
            if self._done is None:
                done = _collect(self._channel, time.monotonic())  # reads what is there, closes: rc 124
                self._kill_remote(done.stdout)
                self._done = _strip_pid(done)

    def _kill_remote(self, stdout: str) -> None:
        pid = _pid_of(stdout)
        if pid is not None:
            # If the node went away, the remote `timeout` wrapper ends the process anyway.
            with contextlib.suppress(RemoteError):
                self._remote.run(self._host, ["kill", "-TERM", str(pid)], timeout=10)


def _pid_of(stdout: str) -> int | None:
    m = re.search(rf"^{_PID_MARK}(\d+)$", stdout, re.MULTILINE)
    return int(m.group(1)) if m else None


def _strip_pid(done: Completed) -> Completed:
    lines = [ln for ln in done.stdout.splitlines(keepends=True) if not ln.startswith(_PID_MARK)]
    return Completed(done.rc, "".join(lines), done.stderr)


# ---------------------------------------------------------------- connecting (straight, or through a bastion)


def _connect(factory: Callable[[], paramiko.SSHClient], target: SshTarget, policy: paramiko.MissingHostKeyPolicy,
             timeout: float, sock: paramiko.Channel | None = None, *,
             bastion: JumpTarget | None = None) -> paramiko.SSHClient:
    """A client connected to a node (over ``sock``, a bastion's direct-tcpip channel, when given) with its key
    checked against known_hosts; every failure is a one-line RemoteError naming the node, or the bastion when
    ``bastion`` says that is what ``target`` is."""
    who = bastion.label if bastion else f"{target.name} ({target.address})"
    client = factory()
    try:
        keys = load_known_hosts(target)
        for hostname, entry in keys.items():
            for keytype, key in entry.items():
                client.get_host_keys().add(hostname, keytype, key)
        client.set_missing_host_key_policy(policy)
        client.connect(
            target.address,
            port=target.port,
            username=target.user,
            key_filename=str(target.key) if target.key else None,
            look_for_keys=False,
            allow_agent=target.key is None,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            sock=sock,
        )
    except RemoteError:
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        hint = (f"if the bastion was rebuilt, confirm the new fingerprint on its console, then replace its line in "
                f"{target.known_hosts}" if bastion else
                "if the node was reinstalled or swapped, confirm the new fingerprint on its console, then bring it "
                f"back: provision replace-node <cluster.yaml> {target.name} --host-key-fingerprint "
                f"{fingerprint(exc.key)}")
        raise RemoteError(
            f"{who}: host key CHANGED: offered {exc.key.get_name()} {fingerprint(exc.key)}, {target.known_hosts} "
            f"has {fingerprint(exc.expected_key)}; refusing to connect", hint=hint) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise RemoteError(
            f"{who}: authentication as {target.user} failed: {exc}",
            hint=("check ssh.jump.user (ssh.user if unset) and ssh.key in the spec" if bastion
                  else "check ssh.user and ssh.key in the spec"),
        ) from None
    except (OSError, EOFError, paramiko.SSHException) as exc:
        client.close()
        if bastion:
            raise RemoteError(f"{who}: cannot connect: {exc or 'the connection was closed'}",
                              hint="every node is reached through it (ssh.jump): check that it is up and reachable "
                              "from here") from None
        via = f" through {target.jump.label}" if target.jump else ""
        raise RemoteError(f"{target.name} ({target.address}:{target.port}): cannot connect{via}: "
                          f"{exc or 'the connection was closed'}") from None
    return client


class Bastion:
    """The one SSH connection to the jump host (``ssh.jump``) that every node's connection runs inside.

    Its host key is checked like a node's: it must be in the spec's known_hosts and is never accepted
    (:class:`provisioner.hostkeys.RejectBastion` names it and its fingerprint). Each node is then reached over
    a ``direct-tcpip`` channel of this connection (RFC 4254 section 7.2, what ``ssh -W`` and ProxyJump open).
    A bastion that cannot be reached fails once: the same error is given to every node after it, at once,
    instead of one connect timeout per node.
    """

    def __init__(self, jump: JumpTarget, *, connect_timeout: float = 10.0,
                 client_factory: Callable[[], paramiko.SSHClient] = paramiko.SSHClient) -> None:
        self.jump = jump
        self.connect_timeout = connect_timeout
        self._factory = client_factory
        self._client: paramiko.SSHClient | None = None
        self._failed: RemoteError | None = None
        self._lock = threading.Lock()

    def transport(self) -> paramiko.Transport:
        """The bastion's live transport, connected (and its host key checked) on first use."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            transport = self._client.get_transport() if self._client else None
            if transport is not None and transport.is_active():
                return transport
            try:
                self._client = self._connect()
            except RemoteError as exc:
                self._failed = exc
                raise
            transport = self._client.get_transport()
            if transport is None:  # pragma: no cover - paramiko sets it in connect()
                raise RemoteError(f"{self.jump.label}: SSH transport closed")
            return transport

    def _connect(self) -> paramiko.SSHClient:
        target = self.jump.as_target()
        return _connect(self._factory, target, RejectBastion(target), self.connect_timeout, bastion=self.jump)

    def channel_to(self, target: SshTarget) -> paramiko.Channel:
        """A ``direct-tcpip`` channel from the bastion to the node's SSH port (the node's own SSH runs in it)."""
        transport = self.transport()
        try:
            return transport.open_channel("direct-tcpip", (target.address, target.port), ("127.0.0.1", 0),
                                          timeout=self.connect_timeout)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise RemoteError(f"{target.name} ({target.address}:{target.port}): {self.jump.label} cannot reach it: "
                              f"{exc or 'the channel was refused'}") from None

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class Bastions:
    """One :class:`Bastion` per jump host, opened on first use and shared by every node behind it (verification's
    remote and the host-key reads of trust-host, replace-node and discover); closed together."""

    def __init__(self, connect_timeout: float = 10.0,
                 client_factory: Callable[[], paramiko.SSHClient] = paramiko.SSHClient) -> None:
        self.connect_timeout = connect_timeout
        self._factory = client_factory
        self._open: dict[JumpTarget, Bastion] = {}
        self._lock = threading.Lock()

    def get(self, jump: JumpTarget) -> Bastion:
        with self._lock:
            if jump not in self._open:
                self._open[jump] = Bastion(jump, connect_timeout=self.connect_timeout, client_factory=self._factory)
            return self._open[jump]

    def close(self) -> None:
        with self._lock:
            for bastion in self._open.values():
                bastion.close()
            self._open.clear()


# ---------------------------------------------------------------- the SSH remote


class SshRemote:
    """A pool of SSH connections to the cluster's nodes (one per node, reused), with bounded parallelism."""

    def __init__(
        self,
        targets: Mapping[str, SshTarget],
        *,
        max_workers: int = DEFAULT_WORKERS,
        connect_timeout: float = 10.0,
        client_factory: Callable[[], paramiko.SSHClient] = paramiko.SSHClient,
    ) -> None:
        self.targets = dict(targets)
        self.max_workers = max(1, max_workers)
        self.connect_timeout = connect_timeout
        self._factory = client_factory
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._locks: dict[str, threading.Lock] = {h: threading.Lock() for h in self.targets}
        self._bastions = Bastions(connect_timeout, client_factory)

    def __enter__(self) -> SshRemote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self._bastions.close()  # after the nodes: their connections run inside the bastions'

    def _target(self, host: str) -> SshTarget:
        try:
            return self.targets[host]
        except KeyError:
            raise RemoteError(f"{host} is not a node of this cluster") from None

    def client(self, host: str) -> paramiko.SSHClient:
        """The pooled connection to ``host``, opened (and host-key checked) on first use; through the bastion
        when the target names one (the bastion's connection is shared by every node behind it)."""
        target = self._target(host)
        with self._locks[host]:
            current = self._clients.get(host)
            transport = current.get_transport() if current else None
            if current is not None and transport is not None and transport.is_active():
                return current
            sock = self._bastions.get(target.jump).channel_to(target) if target.jump else None
            try:
                client = _connect(self._factory, target, RejectWithFingerprint(target), self.connect_timeout, sock)
            except RemoteError:
                if sock is not None:
                    sock.close()
                raise
            self._clients[host] = client
            return client

    def _open(self, host: str, line: str) -> paramiko.Channel:
        transport = self.client(host).get_transport()
        if transport is None:
            raise RemoteError(f"{host}: SSH transport closed")
        try:
            channel = transport.open_session(timeout=self.connect_timeout)
            channel.exec_command(line)
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(f"{host}: cannot start a command: {exc}") from None
        return channel

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        """Run ``argv`` on ``host``; rc 124 after ``timeout`` seconds. Raises RemoteError if unreachable."""
        channel = self._open(host, command_line(argv, env, timeout))
        return _collect(channel, time.monotonic() + timeout + 5)

    def start(
        self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> Background:
        """Start ``argv`` on ``host`` in the background (killed remotely after ``timeout`` seconds at most)."""
        line = f"echo {_PID_MARK}$$; exec {command_line(argv, env, timeout)}"
        channel = self._open(host, f"sh -c {shlex.quote(line)}")
        return _SshBackground(self, host, channel, timeout + 5)

    def run_many(
        self, commands: Mapping[str, Sequence[str]], timeout: float, env: Mapping[str, str] | None = None
    ) -> dict[str, Completed]:
        """Run one command per host in parallel (bounded); an unreachable host gets rc 255 and the reason."""

        def one(host: str) -> Completed:
            try:
                return self.run(host, commands[host], timeout, env)
            except RemoteError as exc:
                return Completed(RC_UNREACHABLE, "", str(exc))

        hosts = sorted(commands)
        if not hosts:
            return {}
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(hosts))) as pool:
            return dict(zip(hosts, pool.map(one, hosts), strict=True))
