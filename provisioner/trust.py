"""``provision trust-host``: record the SSH host keys of new nodes, on the operator's word only.

A first bring-up has nodes whose keys nobody has recorded yet. The product never accepts a key it is merely
offered: the operator gives the fingerprint they read on the node's console or BMC (``ssh-keygen -lf
/etc/ssh/ssh_host_ed25519_key.pub``), per node or as a file of ``<node> SHA256:...`` lines for a whole rack,
and a key is written to known_hosts only when the node offers exactly that key. A node that already has a
*different* key recorded is not this command's business: that is a replaced node (``provision replace-node``),
whose history must say what changed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from provisioner.errors import RemoteError, UsageError
from provisioner.remote import SshTarget, fetch_host_key, fingerprint, known_hosts_line, recorded_host_keys

__all__ = ["TrustResult", "parse_fingerprints", "trust_hosts"]

FINGERPRINT = re.compile(r"^SHA256:[A-Za-z0-9+/]{43}$")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class TrustResult:
    """One node's outcome: ``trusted`` (written now), ``known`` (already trusted), ``refused`` or ``unreachable``."""

    node: str
    status: str
    offered: str | None
    detail: str


def check_fingerprint(value: str, where: str) -> str:
    """A SHA256 fingerprint as OpenSSH prints it, or a one-line UsageError naming ``where``."""
    text = value.strip()
    if not FINGERPRINT.match(text):
        raise UsageError(f"{where}: {value!r} is not a SHA256 fingerprint",
                         hint="copy it from `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the node's console")
    return text


def parse_fingerprints(text: str, source: str) -> dict[str, str]:
    """``<node> SHA256:...`` per line (``#`` comments and blank lines skipped); errors name the file and line."""
    result: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        where = f"{source}:{lineno}"
        if len(parts) != 2 or not _NODE.match(parts[0]):
            raise UsageError(f"{where}: expected '<node> SHA256:<fingerprint>', got {raw.strip()!r}")
        if parts[0] in result:
            raise UsageError(f"{where}: {parts[0]} is listed twice")
        result[parts[0]] = check_fingerprint(parts[1], where)
    return result


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text(encoding="utf-8") if path.is_file() else ""
    sep = "" if not existing or existing.endswith("\n") else "\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(f"{sep}{line}\n")


def decide(node: str, offered: str, known: Sequence[str], expected: str | None) -> TrustResult:
    """What to do with the key ``node`` offers, given what known_hosts holds and what the operator vouched for."""
    if offered in known:
        if expected is not None and expected != offered:
            return TrustResult(node, "refused", offered, f"already trusted with {offered}, but you gave {expected}: "
                               "check which node that fingerprint belongs to")
        return TrustResult(node, "known", offered, "already trusted")
    if known:
        return TrustResult(node, "refused", offered, f"offers {offered} but known_hosts trusts {', '.join(known)}; "
                           f"a swapped node is rebuilt with: provision replace-node SPEC {node} "
                           f"--host-key-fingerprint {offered}")
    if expected is None:
        return TrustResult(node, "refused", offered, "no fingerprint given: compare this one with the node's "
                           "console, then pass it with --fingerprint (or a --fingerprints file)")
    if expected != offered:
        return TrustResult(node, "refused", offered, f"offers {offered}, not the {expected} you gave: someone may be "
                           "in the middle, or the fingerprint is from another node")
    return TrustResult(node, "trusted", offered, "recorded in known_hosts")


def trust_hosts(targets: Mapping[str, SshTarget], nodes: Sequence[str], expected: Mapping[str, str],
                fetch: Callable[[SshTarget], paramiko.PKey] = fetch_host_key) -> list[TrustResult]:
    """Fetch each node's offered key and record it where the operator's fingerprint matches; never otherwise."""
    unknown = sorted(set(expected) - set(targets))
    if unknown:
        raise UsageError(f"fingerprints given for nodes not in the spec: {', '.join(unknown)}")
    results: list[TrustResult] = []
    for node in nodes:
        target = targets[node]
        try:
            key = fetch(target)
        except RemoteError as exc:
            results.append(TrustResult(node, "unreachable", None, exc.message))
            continue
        known = [fingerprint(k) for k in recorded_host_keys(target)]
        outcome = decide(node, fingerprint(key), known, expected.get(node))
        if outcome.status == "trusted":
            _append(target.known_hosts, known_hosts_line(target, key))
        results.append(outcome)
    return results
