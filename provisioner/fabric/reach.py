"""Which nodes ``verify`` can reach at all, and keeping every check off the ones it cannot.

A node that refuses us (host key changed, SSH down, authentication failed) says nothing about its ports or
about its peers' ports. Measured anyway, each of its pairs fails, and localisation, which convicts a port that
failed against two good peers, names it "bad on all rails". So:

* it is reported **once**: one "could not run" result of the ``ssh`` check, on that node, with the reason
  (the SSH layer's message: which key was offered and which one known_hosts holds, or why the connection
  failed); the per-check "could not run" results it would otherwise collect are dropped as repeats;
* nothing more is sent to it: :class:`ReachableRemote` answers for it at once, so no check waits on a dead
  node again;
* the pairwise checks (bandwidth, GPUDirect bandwidth, NCCL) run among the nodes that answer, and each
  records its pairs with the lost node as **skipped**, with a short reason that points at the ``ssh`` result.

A node is lost when the first probe (``true`` on every node) gets the SSH convention's exit 255, or when a
later connection to it raises :class:`RemoteError` (the pair runner's ``run``/``start``); a check that lost a
node half-way is run again without it (see :mod:`provisioner.verify`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from provisioner.errors import RemoteError
from provisioner.fabric.findings import CheckResult
from provisioner.remote import RC_UNREACHABLE, Background, Completed, Remote
from provisioner.spec.cluster import Cluster

CHECK = "ssh"
PROBE = ["true"]


class ReachableRemote:
    """A :class:`Remote` that stops talking to nodes it could not reach, and remembers why (``lost``)."""

    def __init__(self, inner: Remote) -> None:
        self.inner = inner
        self.lost: dict[str, str] = {}

    def probe(self, nodes: Iterable[str], timeout: float) -> None:
        """Ask every node to run ``true``; the ones that cannot be reached are lost, with the reason."""
        for node, done in sorted(self.run_many({n: PROBE for n in nodes}, timeout).items()):
            if done.unreachable and node not in self.lost:
                self.lost[node] = done.stderr.strip() or "unreachable"

    def _not_sent(self, host: str) -> str:
        return f"{host} could not be reached earlier in this run; not contacted again"

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        if host in self.lost:
            raise RemoteError(self._not_sent(host))
        try:
            return self.inner.run(host, argv, timeout, env)
        except RemoteError as exc:
            self.lost.setdefault(host, str(exc))
            raise

    def start(
        self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> Background:
        if host in self.lost:
            raise RemoteError(self._not_sent(host))
        try:
            return self.inner.start(host, argv, timeout, env)
        except RemoteError as exc:
            self.lost.setdefault(host, str(exc))
            raise

    def run_many(
        self, commands: Mapping[str, Sequence[str]], timeout: float, env: Mapping[str, str] | None = None
    ) -> dict[str, Completed]:
        """Like the inner remote's, minus the lost nodes (rc 255 and "not contacted again" for them).

        An rc 255 from the inner remote does not mark a node lost here: some tools exit 255 themselves
        (``sminfo`` when no SM answers), so only the probe and a refused connection decide.
        """
        live = {h: a for h, a in commands.items() if h not in self.lost}
        done = self.inner.run_many(live, timeout, env) if live else {}
        done.update({h: Completed(RC_UNREACHABLE, "", self._not_sent(h)) for h in commands if h in self.lost})
        return done


def reachable(cluster: Cluster, lost: Mapping[str, str]) -> Cluster:
    """The cluster without the lost nodes (and their cables): what the pairwise checks are run over."""
    return replace(cluster, nodes=[n for n in cluster.nodes if n.name not in lost],
                   cables=[c for c in cluster.cables if c.node not in lost])


def skipped(check: str, nodes: Iterable[str], lost: Mapping[str, str]) -> list[CheckResult]:
    """One skipped result of ``check`` per lost node among ``nodes`` (its pairs were not run)."""
    return [CheckResult.skip(check, n, f"pairs with {n} not run: {n} could not be reached (see the {CHECK} result)")
            for n in sorted(set(nodes)) if n in lost]


def unless_lost(result: CheckResult, needed: Iterable[str], lost: Mapping[str, str]) -> CheckResult:
    """A cluster-wide "could not run" that only the lost nodes caused (fewer than two of ``needed`` left)
    becomes skipped: the cause is reported once already, by the lost nodes' ``ssh`` results."""
    wanted = sorted(set(needed))
    left = [n for n in wanted if n not in lost]
    if result.ran or result.node is not None or len(wanted) < 2 or len(left) >= 2:
        return result
    return CheckResult.skip(result.name, None, f"{result.error}: {len(wanted) - len(left)} of {len(wanted)} nodes "
                                               f"could not be reached (see the {CHECK} results)")


def settle(checks: Iterable[CheckResult], lost: Mapping[str, str]) -> list[CheckResult]:
    """The run's results with each lost node reported once: its ``ssh`` result first, then the rest minus
    the "could not run" results on lost nodes (each would repeat the same cause)."""
    once = [CheckResult.could_not_run(CHECK, node, why) for node, why in sorted(lost.items())]
    return once + [c for c in checks if c.ran or c.node not in lost]
