"""SSH host keys: the one place that fingerprints, reads, records and decides on them.

`provision` never accepts a key it is merely offered. The connection policy (:class:`RejectWithFingerprint`,
used by provisioner.remote), first trust (`provision trust-host`, provisioner.trust, and `provision discover
--fingerprints`) and a replaced node (`provision replace-node`, provisioner.day2.replace) all read known_hosts here, and
one decision table (:func:`decide`) says when an offered key may be written: only when it is already trusted, or
when the operator gave its fingerprint (or, replacing a node, said --accept-new-host-key). Behind a bastion
(``ssh.jump``) the offered key is read through it (:func:`fetch_host_key`). With provisioner.remote, the only
module that imports paramiko.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import paramiko

from provisioner.errors import RemoteError, UsageError
from provisioner.userfile import read_user_bytes, read_user_text

if TYPE_CHECKING:
    from provisioner.remote import Bastion, JumpTarget, SshTarget


FINGERPRINT = re.compile(r"^SHA256:[A-Za-z0-9+/]{43}$")
"""OpenSSH's SHA256 fingerprint as ssh-keygen -lf prints it: 43 base64 characters, no padding."""


def check_fingerprint(value: str, where: str) -> str:
    """A SHA256 fingerprint as OpenSSH prints it, or a one-line UsageError naming ``where``."""
    text = value.strip()
    if not FINGERPRINT.match(text):
        raise UsageError(f"{where}: {value!r} is not a SHA256 fingerprint",
                         hint="copy it from `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the node's console, "
                         "e.g. SHA256:" + "A" * 43)
    return text


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:`` fingerprint of a public key (what ``ssh-keygen -lf`` prints)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    """The name a known_hosts line uses for ``address``: ``[addr]:port`` when the port is not 22."""
    return address if port == 22 else f"[{address}]:{port}"


class RejectWithFingerprint(paramiko.RejectPolicy):
    """RejectPolicy that says which key was refused and how to trust it on purpose."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
        t = self.target
        raise RemoteError(
            f"{t.name} ({hostname}): host key {key.get_name()} {fingerprint(key)} is not in {t.known_hosts}; "
            "refusing to connect",
            hint=f"compare the fingerprint with the node's console (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
            f"then accept it explicitly: provision trust-host SPEC {t.name} --fingerprint {fingerprint(key)}",
        )


class RejectBastion(paramiko.RejectPolicy):
    """RejectPolicy for the jump host (``ssh.jump``): names it as the bastion, with the refused key's fingerprint
    and the known_hosts line that would trust it once the operator has compared the fingerprint."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
        t = self.target
        line = f"{known_hosts_name(t.address, t.port)} {key.get_name()} {key.get_base64()}"
        raise RemoteError(
            f"bastion {t.user}@{t.address}:{t.port}: host key {key.get_name()} {fingerprint(key)} is not in "
            f"{t.known_hosts}; refusing to connect (no node behind it was contacted)",
            hint="compare the fingerprint with the bastion's console (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
            f"then trust it by adding this line to {t.known_hosts}: {line}",
        )


def load_known_hosts(target: SshTarget) -> paramiko.HostKeys:
    """known_hosts for ``target``; a key recorded under the node's name also counts for its address."""
    if not target.known_hosts.is_file():
        raise RemoteError(
            f"known_hosts file {target.known_hosts} does not exist",
            hint="create it with the nodes' verified keys (ssh.known_hosts in the spec names it)",
        )
    read_user_bytes(target.known_hosts, "a known_hosts file")  # a pipe or a huge file is refused, not loaded
    keys = paramiko.HostKeys()
    try:
        keys.load(str(target.known_hosts))
    except (OSError, paramiko.SSHException) as exc:
        raise RemoteError(f"cannot read known_hosts {target.known_hosts}: {exc}") from exc
    addr = known_hosts_name(target.address, target.port)
    by_name = keys.lookup(known_hosts_name(target.name, target.port))
    if keys.lookup(addr) is None and by_name is not None:
        for keytype, key in by_name.items():
            keys.add(addr, keytype, key)
    return keys


def _handshake(target: SshTarget, sock: socket.socket | paramiko.Channel, timeout: float) -> paramiko.PKey:
    """The key offered in an SSH key exchange over ``sock`` (no authentication; the transport is closed after)."""
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        return transport.get_remote_server_key()
    except (paramiko.SSHException, EOFError) as exc:  # EOFError: the server hung up during the handshake
        raise RemoteError(f"{target.name}: SSH handshake failed: {exc or 'the server closed the connection'}") from exc
    finally:
        transport.close()


def fetch_host_key(target: SshTarget, timeout: float = 10.0, *, bastion: Bastion | None = None) -> paramiko.PKey:
    """The host key ``target`` offers now (an SSH handshake, no authentication, nothing trusted or written).

    With ``ssh.jump`` the handshake runs inside a ``direct-tcpip`` channel of the bastion's connection (``bastion``,
    or a connection opened for this one read), never by dialling the node's address from here: that address is only
    meaningful behind the bastion. The bastion's own key must already be in known_hosts
    (:class:`RejectBastion`); an unknown or changed bastion key fails before any node is contacted."""
    if target.jump is not None:
        if bastion is None:  # a connection opened for this one read
            with KeyReader(timeout) as reader:
                return reader(target)
        return _handshake(target, bastion.channel_to(target), timeout)
    try:
        sock = socket.create_connection((target.address, target.port), timeout=timeout)
    except OSError as exc:
        raise RemoteError(f"{target.name} ({target.address}:{target.port}): {exc}") from exc
    return _handshake(target, sock, timeout)


class KeyReader:
    """Reads the keys several nodes offer (:func:`fetch_host_key`), sharing one bastion connection between all
    the nodes behind it, as verification does; a bastion that cannot be reached or is not trusted fails once and
    every node behind it gets that one reason. Use it as a context manager (it closes the bastions)."""

    def __init__(self, timeout: float = 10.0) -> None:
        from provisioner.remote import Bastions  # provisioner.remote imports this module

        self.timeout = timeout
        self._bastions = Bastions(timeout)

    def __call__(self, target: SshTarget) -> paramiko.PKey:
        if target.jump is None:
            return fetch_host_key(target, self.timeout)
        return fetch_host_key(target, self.timeout, bastion=self.bastion(target.jump))

    def bastion(self, jump: JumpTarget) -> Bastion:
        """The shared connection to ``jump`` (opened, and its key checked, on first use: ``.transport()``)."""
        return self._bastions.get(jump)

    def close(self) -> None:
        self._bastions.close()

    def __enter__(self) -> KeyReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def known_hosts_line(target: SshTarget, key: paramiko.PKey) -> str:
    """``name,address type base64``: the line that trusts ``key`` for the node under both names."""
    return f"{target.name},{known_hosts_name(target.address, target.port)} {key.get_name()} {key.get_base64()}"


def names_of(target: SshTarget) -> set[str]:
    return {target.name, known_hosts_name(target.name, target.port), known_hosts_name(target.address, target.port)}


def line_is_for(line: str, names: set[str]) -> bool:
    """Whether a known_hosts line names one of ``names`` (plain or hashed ``|1|salt|hash`` host fields)."""
    text = line.strip()
    if not text or text.startswith("#") or text.startswith("@"):
        return False  # comments and @cert-authority/@revoked markers are never a node's own key
    hosts = text.split(None, 1)[0].split(",")
    for host in hosts:
        if host.startswith("|1|"):
            if any(paramiko.HostKeys.hash_host(n, host) == host for n in names):
                return True
        elif host in names:
            return True
    return False


def recorded_host_keys(target: SshTarget) -> list[paramiko.PKey]:
    """The keys ``target``'s known_hosts trusts for the node (by name or address); empty when none."""
    if not target.known_hosts.is_file():
        return []
    keys: list[paramiko.PKey] = []
    names = names_of(target)
    for line in read_user_text(target.known_hosts, "a known_hosts file").splitlines():
        if not line_is_for(line, names):
            continue
        entry = paramiko.hostkeys.HostKeyEntry.from_line(line)
        if entry is not None and entry.key is not None:
            keys.append(entry.key)
    return keys


KNOWN_HOSTS_WAIT_S = 60.0
"""How long a writer waits for another one (each holds the lock for one read and rewrite of the file)."""


@contextlib.contextmanager
def known_hosts_lock(path: Path, command: str = "provision (known_hosts write)") -> Iterator[None]:
    """One writer of the known_hosts file ``path`` at a time, from reading it to its rewrite: a flock on
    ``<path>.lock`` beside it (the file itself is replaced by every atomic write, so a lock on it would not hold;
    it may live outside the state dir). Re-entrant within a thread. Without it concurrent trust-host runs lost
    lines (194 of 400 appends)."""
    from provisioner.state import acquire_lock

    lock = acquire_lock(path.with_name(path.name + ".lock"), command=command, wait_s=KNOWN_HOSTS_WAIT_S,
                        refusal=lambda who: f"known_hosts {path} is being written by {who}",
                        hint="wait for it to end, then run this again")
    try:
        yield
    finally:
        lock.release()


def _rewrite(target: SshTarget, key: paramiko.PKey, note: str | None) -> list[str]:
    """known_hosts with ``key``'s line added; with a ``note``, the node's old lines kept as ``# <note>: <line>``
    comments (ssh and paramiko skip them). Written atomically with its mode kept: a half-written known_hosts would
    lock every run out. Returns the old lines. Under :func:`known_hosts_lock` (callers that decide on what the
    file holds take it first, around their read)."""
    with known_hosts_lock(target.known_hosts):
        return _rewrite_locked(target, key, note)


def _rewrite_locked(target: SshTarget, key: paramiko.PKey, note: str | None) -> list[str]:
    from provisioner.state import write_text_atomic

    path = target.known_hosts
    lines = read_user_text(path, "a known_hosts file").splitlines() if path.is_file() else []
    names = names_of(target)
    old = [ln for ln in lines if note is not None and line_is_for(ln, names)]
    kept = [f"# {note}: {ln.strip()}" if ln in old else ln for ln in lines]
    kept.append(known_hosts_line(target, key))
    mode = path.stat().st_mode & 0o777 if path.is_file() else 0o644
    write_text_atomic(path, "\n".join(kept) + "\n", mode=mode)
    return old


def replace_host_key(target: SshTarget, key: paramiko.PKey, note: str) -> list[str]:
    """Trust ``key`` for the node instead of whatever known_hosts held for it; return the old lines, which stay
    in the file as ``# <note>: <old line>`` comments, so the file itself shows what was trusted before and when."""
    return _rewrite(target, key, note)


@dataclass(frozen=True)
class KeyVerdict:
    """What to do with an offered key: ``known`` (already trusted), ``add`` (first trust), ``replace`` (a replaced
    node's new key instead of the old), or ``refused`` (nothing may change; ``reason`` and ``hint`` say why)."""

    action: str
    offered: str
    known: tuple[str, ...]
    reason: str = ""
    hint: str | None = None


def decide(node: str, offered: str, known: Sequence[str], *, expected: str | None, replacing: bool = False,
           accept_new: bool = False) -> KeyVerdict:
    """The decision table for the key ``node`` offers, given the keys known_hosts trusts for it, the fingerprint the
    operator vouched for (``expected``), and whether the node is being replaced (``provision replace-node``)."""
    have = tuple(known)
    option = "--host-key-fingerprint" if replacing else "--fingerprint"

    def refused(reason: str, hint: str | None = None) -> KeyVerdict:
        return KeyVerdict("refused", offered, have, reason, hint)

    if offered in have:
        if expected is not None and expected != offered:
            return refused(f"{node} offers {offered}, which known_hosts already trusts, but {option} says {expected}; "
                           "nothing changed", "check which node the fingerprint was copied from")
        return KeyVerdict("known", offered, have, "already trusted")
    was = f"known_hosts has {', '.join(have)}" if have else "known_hosts has no key for it"
    if have and not replacing:
        return refused(f"{node} offers {offered} but known_hosts trusts {', '.join(have)}",
                       f"a swapped node is rebuilt with: provision replace-node SPEC {node} "
                       f"--host-key-fingerprint {offered}")
    if expected is not None:
        if expected != offered:
            return refused(f"{node} offers host key {offered}, not the {expected} you gave ({was}); nothing changed",
                           "someone may be in the middle, or the fingerprint is from another node: check it on the "
                           "node's console again")
        return KeyVerdict("replace" if replacing else "add", offered, have, "recorded in known_hosts")
    if replacing and accept_new:
        return KeyVerdict("replace", offered, have, "recorded in known_hosts (--accept-new-host-key)")
    return refused(f"{node} offers {'a new' if have else 'the'} host key {offered} ({was}); refusing to trust it "
                   "without a fingerprint",
                   "compare it with the node's console (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then rerun "
                   f"with {option} {offered}" + (" (or --accept-new-host-key)" if replacing
                                                 else " (or a --fingerprints file)"))


def append_host_key(target: SshTarget, key: paramiko.PKey) -> str:
    """Trust ``key`` for the node by adding its line to known_hosts (first trust); returns the line."""
    _rewrite(target, key, None)
    return known_hosts_line(target, key)
