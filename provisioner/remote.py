"""Remote execution over SSH (with provisioner.hostkeys, the only modules that import paramiko).

Why it looks the way it does:

* **Host keys are verified, never learnt.** The client loads the spec's ``known_hosts`` and refuses any host
  whose key is missing or different (``RejectPolicy``). The error names the host, the address and the key's
  SHA256 fingerprint, and says how to accept it explicitly (``provision trust-host`` with the fingerprint the
  operator copied from the console or BMC; provisioner.hostkeys holds the keys and the decision).
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
from typing import NamedTuple, Protocol

import paramiko

from provisioner.errors import RemoteError, UsageError
from provisioner.hostkeys import RejectWithFingerprint, fingerprint, load_known_hosts

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
class SshTarget:
    """How to reach one node: the spec's address, user, key and port, and the known_hosts file to trust."""

    name: str
    address: str
    user: str
    port: int
    key: Path | None
    known_hosts: Path


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

    return {
        n.name: SshTarget(
            name=n.name,
            address=n.address,
            user=ssh.user,
            port=ssh.port,
            key=_path(ssh.key) if ssh.key else None,
            known_hosts=_path(ssh.known_hosts),
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

    def __enter__(self) -> SshRemote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def _target(self, host: str) -> SshTarget:
        try:
            return self.targets[host]
        except KeyError:
            raise RemoteError(f"{host} is not a node of this cluster") from None

    def client(self, host: str) -> paramiko.SSHClient:
        """The pooled connection to ``host``, opened (and host-key checked) on first use."""
        target = self._target(host)
        with self._locks[host]:
            current = self._clients.get(host)
            transport = current.get_transport() if current else None
            if current is not None and transport is not None and transport.is_active():
                return current
            client = self._factory()
            keys = load_known_hosts(target)
            for hostname, entry in keys.items():
                for keytype, key in entry.items():
                    client.get_host_keys().add(hostname, keytype, key)
            client.set_missing_host_key_policy(RejectWithFingerprint(target))
            try:
                client.connect(
                    target.address,
                    port=target.port,
                    username=target.user,
                    key_filename=str(target.key) if target.key else None,
                    look_for_keys=False,
                    allow_agent=target.key is None,
                    timeout=self.connect_timeout,
                    banner_timeout=self.connect_timeout,
                    auth_timeout=self.connect_timeout,
                )
            except RemoteError:
                client.close()
                raise
            except paramiko.BadHostKeyException as exc:
                client.close()
                raise RemoteError(
                    f"{host} ({target.address}): host key CHANGED: offered {exc.key.get_name()} "
                    f"{fingerprint(exc.key)}, {target.known_hosts} has {fingerprint(exc.expected_key)}; "
                    "refusing to connect",
                    hint="if the node was reinstalled or swapped, confirm the new fingerprint on its console, "
                    f"then bring it back: provision replace-node <cluster.yaml> {host} --host-key-fingerprint "
                    f"{fingerprint(exc.key)}",
                ) from None
            except paramiko.AuthenticationException as exc:
                client.close()
                raise RemoteError(
                    f"{host} ({target.address}): authentication as {target.user} failed: {exc}",
                    hint="check ssh.user and ssh.key in the spec",
                ) from None
            except (OSError, paramiko.SSHException) as exc:
                client.close()
                raise RemoteError(f"{host} ({target.address}:{target.port}): cannot connect: {exc}") from None
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
