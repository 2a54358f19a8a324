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
from typing import TYPE_CHECKING

from provisioner.errors import RemoteError, UsageError
from provisioner.hostkeys import (
    KeyReader,
    append_host_key,
    check_fingerprint,
    decide,
    fingerprint,
    known_hosts_lock,
    recorded_host_keys,
)
from provisioner.remote import SshTarget

if TYPE_CHECKING:
    import paramiko

__all__ = ["TrustResult", "check_fingerprint", "parse_fingerprints", "trust_hosts"]

_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class TrustResult:
    """One node's outcome: ``trusted`` (written now), ``known`` (already trusted), ``refused`` or ``unreachable``."""

    node: str
    status: str
    offered: str | None
    detail: str


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


_STATUS = {"known": "known", "add": "trusted", "refused": "refused"}
"""hostkeys.decide's actions as trust-host reports them (it never replaces a key: that is replace-node)."""


def trust_hosts(targets: Mapping[str, SshTarget], nodes: Sequence[str], expected: Mapping[str, str],
                fetch: Callable[[SshTarget], paramiko.PKey] | None = None, *,
                among: str = "the spec") -> list[TrustResult]:
    """Fetch each node's offered key and record it where the operator's fingerprint matches; never otherwise.

    ``fetch`` reads a node's offered key; by default a :class:`provisioner.hostkeys.KeyReader`, which goes
    through the bastion when the targets have ``ssh.jump`` (one connection for all of them). ``among`` names
    where ``targets`` came from, for the error about fingerprints given for other nodes."""
    unknown = sorted(set(expected) - set(targets))
    if unknown:
        raise UsageError(f"fingerprints given for nodes not in {among}: {', '.join(unknown)}")
    if fetch is None:
        with KeyReader() as reader:
            return _trust(targets, nodes, expected, reader)
    return _trust(targets, nodes, expected, fetch)


def _trust(targets: Mapping[str, SshTarget], nodes: Sequence[str], expected: Mapping[str, str],
           fetch: Callable[[SshTarget], paramiko.PKey]) -> list[TrustResult]:
    results: list[TrustResult] = []
    for node in nodes:
        target = targets[node]
        try:
            key = fetch(target)
        except RemoteError as exc:
            results.append(TrustResult(node, "unreachable", None, exc.message))
            continue
        with known_hosts_lock(target.known_hosts, command="provision trust-host"):  # read, decide, write: one step
            known = [fingerprint(k) for k in recorded_host_keys(target)]
            verdict = decide(node, fingerprint(key), known, expected=expected.get(node))
            if verdict.action == "add":
                append_host_key(target, key)
        detail = f"{verdict.reason}: {verdict.hint}" if verdict.hint else verdict.reason
        results.append(TrustResult(node, _STATUS[verdict.action], verdict.offered, detail))
    return results


def expected_fingerprints(chosen: Sequence[str], fingerprint: str | None,
                          fingerprints: Path | None) -> dict[str, str]:
    """``{node: SHA256:...}`` from --fingerprints FILE and --fingerprint (one node): trust-host's and discover's."""
    from provisioner.userfile import read_user_text

    expected: dict[str, str] = {}
    if fingerprints is not None:
        text = read_user_text(fingerprints, "a fingerprints file")
        expected.update(parse_fingerprints(text, str(fingerprints)))
    if fingerprint is not None:
        if len(chosen) != 1:
            raise UsageError("--fingerprint names one node's key; for several nodes use --fingerprints FILE")
        expected[chosen[0]] = check_fingerprint(fingerprint, "--fingerprint")
    return expected


def trust_spec(spec: Path, nodes: str, *, overlay: Path | None = None, fingerprint: str | None = None,
               fingerprints: Path | None = None, state_dir: Path | None = None,
               each: Callable[[TrustResult], None] = lambda _r: None) -> list[TrustResult]:
    """`provision trust-host`: the spec loaded once, ``nodes`` (a hostlist or host pattern) read and trusted
    where they offer the fingerprint given, each key trusted now recorded in the hardware history, then handed
    to ``each``."""
    from provisioner.phases import expand_limit
    from provisioner.remote import targets_from_cluster
    from provisioner.render.model import build_inventory
    from provisioner.spec import load_cluster
    from provisioner.state import record_host_key, state_dir_for

    cluster, _ = load_cluster(spec, overlay)
    chosen = expand_limit(nodes, [n.name for n in cluster.nodes], build_inventory(cluster).groups, what="NODES")
    expected = expected_fingerprints(chosen, fingerprint, fingerprints)
    results = trust_hosts(targets_from_cluster(cluster), chosen, expected)
    state = state_dir_for(cluster.name, state_dir)
    for r in results:
        if r.status == "trusted" and r.offered:
            record_host_key(state, r.node, old=[], new=r.offered, key_type="ssh")
        each(r)
    return results
