"""The Slurm controller, driven the way an operator does: ``scontrol`` and ``squeue`` on the controller node.

What the commands mean (scontrol(1), squeue(1), slurm.conf(5), Slurm 22.05 as Debian 12 ships it):

* ``scontrol update NodeName=<list> State=DRAIN Reason=<text>``: no new job starts on the nodes; running jobs
  finish. The node shows ``State=ALLOCATED+DRAIN`` / ``MIXED+DRAIN`` while jobs run (sinfo: *draining*) and
  ``State=IDLE+DRAIN`` once they ended (sinfo: *drained*). A reason is required for DRAIN.
* ``scontrol update NodeName=<list> State=RESUME``: back to service (the DRAIN flag is cleared).
* ``scontrol update PartitionName=<p> Nodes=<list>``: the partition's node list is *replaced* by ``<list>``
  (runtime only: slurmctld reads slurm.conf again on restart, so the slurm role writes the same list there).
* ``scontrol show partition <p>``: the partition's record; ``Nodes=`` is the live node list as a hostlist.
* ``scontrol show node <list>``: one record per node, ``Key=Value`` words, records separated by a blank line;
  ``Reason=`` and ``OS=`` values hold spaces.
* ``squeue --noheader --nodelist=<list> --format=...``: the jobs *allocated* to those nodes (pending jobs have
  no nodes and are not listed).

Parsing is pure (:func:`parse_show_node`, :func:`parse_squeue`); :class:`SlurmCtl` runs the commands through a
:class:`provisioner.remote.Remote` on the controller. Captures of real output are under tests/fixtures/slurm/.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from provisioner.errors import ProvisionerError
from provisioner.remote import Completed, Remote
from provisioner.spec import hostlist

COMMAND_TIMEOUT_S = 30.0
SQUEUE_FORMAT = "%i|%T|%N|%u"
_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z_][A-Za-z0-9_]*)=")
_REASON_SAFE = re.compile(r"[^A-Za-z0-9 ._:,/()@+-]")
BUSY_STATES = frozenset({"ALLOCATED", "MIXED", "COMPLETING"})
"""Base states and flags that mean jobs still hold the node (scontrol's State= words)."""


class SlurmError(ProvisionerError):
    """A Slurm command failed on the controller (its message, one line)."""

    exit_code = 2


@dataclass(frozen=True)
class NodeState:
    """One node as ``scontrol show node`` reports it."""

    name: str
    state: str                      # e.g. IDLE+DRAIN, ALLOCATED, DOWN+NOT_RESPONDING
    reason: str = ""
    partitions: tuple[str, ...] = ()
    fields: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def words(self) -> set[str]:
        return {w for w in self.state.upper().split("+") if w}

    @property
    def base(self) -> str:
        return self.state.upper().split("+", 1)[0].rstrip("*~#%$@^-!")

    @property
    def drain(self) -> bool:
        """The DRAIN flag is set (draining or drained)."""
        return "DRAIN" in self.words or self.base in ("DRAINED", "DRAINING", "DRAIN")

    @property
    def busy(self) -> bool:
        """Jobs still hold the node (allocated, mixed or completing)."""
        return bool(({self.base} | self.words) & BUSY_STATES)

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.words and self.base not in ("DOWN", "UNKNOWN", "FUTURE")


@dataclass(frozen=True)
class Job:
    job_id: str
    state: str
    nodes: str
    user: str


def _records(text: str) -> list[dict[str, str]]:
    """``scontrol show`` output: one ``Key=Value`` dict per record (records separated by a blank line)."""
    out: list[dict[str, str]] = []
    for record in re.split(r"\n\s*\n", text.strip()):
        fields: dict[str, str] = {}
        for line in record.splitlines():
            line = line.strip()
            keys = list(_KEY.finditer(line))
            for i, m in enumerate(keys):
                end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
                fields[m.group(1)] = line[m.end():end].strip()
        out.append(fields)
    return out


def parse_show_partition(text: str) -> dict[str, list[str]]:
    """``scontrol show partition`` output: partition -> its nodes now (``Nodes=`` is a hostlist, ``(null)``
    when empty)."""
    out: dict[str, list[str]] = {}
    for fields in _records(text):
        name = fields.get("PartitionName")
        if name:
            nodes = fields.get("Nodes", "")
            out[name] = hostlist.expand(nodes) if nodes and nodes != "(null)" else []
    return out


def parse_show_node(text: str) -> dict[str, NodeState]:
    """``scontrol show node`` output (one or many records) by node name."""
    out: dict[str, NodeState] = {}
    for fields in _records(text):
        name = fields.get("NodeName")
        if not name:
            continue
        parts = tuple(p for p in fields.get("Partitions", "").split(",") if p and p != "(null)")
        out[name] = NodeState(name, fields.get("State", ""), fields.get("Reason", ""), parts, fields)
    return out


def parse_squeue(text: str) -> list[Job]:
    """``squeue --noheader --format=%i|%T|%N|%u`` lines."""
    jobs: list[Job] = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0]:
            jobs.append(Job(*parts))
    return jobs


def reason_text(text: str) -> str:
    """A drain reason Slurm and a shell both keep as one word list: no quotes, no '=' (it would read as a key)."""
    return " ".join(_REASON_SAFE.sub("-", text).split())[:200] or "provision"


# ---------------------------------------------------------------------------------------------------------
# commands (argv lists; every name in them is a spec hostname or partition name, pattern-checked by the spec)

def drain_argv(nodes: Sequence[str], reason: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={hostlist.compress(list(nodes))}", "State=DRAIN",
            f"Reason={reason_text(reason)}"]


def resume_argv(nodes: Sequence[str]) -> list[str]:
    return ["scontrol", "update", f"NodeName={hostlist.compress(list(nodes))}", "State=RESUME"]


def partition_argv(partition: str, nodes: Sequence[str]) -> list[str]:
    return ["scontrol", "update", f"PartitionName={partition}", f"Nodes={','.join(nodes)}"]


def show_node_argv(nodes: Sequence[str]) -> list[str]:
    return ["scontrol", "show", "node", hostlist.compress(list(nodes))]


def show_partition_argv(partition: str) -> list[str]:
    return ["scontrol", "show", "partition", partition]


def squeue_argv(nodes: Sequence[str]) -> list[str]:
    return ["squeue", "--noheader", f"--nodelist={hostlist.compress(list(nodes))}", f"--format={SQUEUE_FORMAT}"]


@dataclass
class SlurmCtl:
    """Slurm commands run on ``controller`` through ``remote``."""

    remote: Remote
    controller: str
    timeout: float = COMMAND_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def _run(self, argv: list[str]) -> Completed:
        done = self.remote.run(self.controller, argv, self.timeout)
        if done.rc != 0:
            why = (done.stderr.strip() or done.stdout.strip() or f"exit {done.rc}").splitlines()[-1]
            raise SlurmError(f"{' '.join(argv[:2])} on {self.controller} failed: {why}",
                             hint="check slurmctld on the controller (scontrol ping)")
        return done

    def drain(self, nodes: Sequence[str], reason: str) -> None:
        self._run(drain_argv(nodes, reason))

    def resume(self, nodes: Sequence[str]) -> None:
        self._run(resume_argv(nodes))

    def set_partition(self, partition: str, nodes: Sequence[str]) -> None:
        self._run(partition_argv(partition, nodes))

    def partition_nodes(self, partition: str) -> list[str]:
        """The partition's nodes as slurmctld has them now (what a change must start from, not the spec)."""
        return parse_show_partition(self._run(show_partition_argv(partition)).stdout).get(partition, [])

    def nodes(self, nodes: Sequence[str]) -> dict[str, NodeState]:
        return parse_show_node(self._run(show_node_argv(nodes)).stdout)

    def jobs(self, nodes: Sequence[str]) -> list[Job]:
        return parse_squeue(self._run(squeue_argv(nodes)).stdout)

    def busy_nodes(self, nodes: Sequence[str]) -> dict[str, list[str]]:
        """Nodes that still hold jobs -> those job ids (from squeue, and the node state for completing jobs)."""
        wanted = set(nodes)
        out: dict[str, list[str]] = {}
        for job in self.jobs(nodes):
            for n in hostlist.expand(job.nodes) if job.nodes else []:
                if n in wanted:
                    out.setdefault(n, []).append(job.job_id)
        for name, st in self.nodes(nodes).items():
            if st.busy and name in wanted:
                out.setdefault(name, [])
        return out

    def wait_idle(self, nodes: Sequence[str], max_wait_s: float, poll_s: float = 2.0,
                  progress: Callable[[str], None] = lambda _m: None) -> dict[str, list[str]]:
        """Wait until no job holds ``nodes`` or ``max_wait_s`` passed; return the nodes still busy (empty: all
        idle). Polls the controller every ``poll_s`` seconds (a condition, not a fixed sleep)."""
        deadline = self.clock() + max_wait_s
        last = ""
        while True:
            busy = self.busy_nodes(nodes)
            if not busy:
                return {}
            note = ", ".join(f"{n} (job {','.join(j) or 'completing'})" for n, j in sorted(busy.items()))
            if note != last:
                progress(f"waiting for jobs to end on {note}")
                last = note
            if self.clock() >= deadline:
                return busy
            self.sleep(min(poll_s, max(0.0, deadline - self.clock())))


def in_any(nodes: Iterable[str], states: dict[str, NodeState]) -> list[str]:
    """The nodes of ``nodes`` that Slurm does not know (absent from ``states``)."""
    return [n for n in nodes if n not in states]
