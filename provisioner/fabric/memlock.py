"""memlock: the locked-memory limit a user's job gets on each GPU node.

RDMA registration (``ibv_reg_mr``) pins memory, and the kernel charges it to ``RLIMIT_MEMLOCK`` unless the process
has ``CAP_IPC_LOCK``. Every other check runs as root, which has it, so they pass where a user's NCCL/MPI job under
the default 8 MiB (or 64 KiB) fails with "ibv_reg_mr failed" / NCCL's "Cannot allocate memory". This check reads the
limit as ``verify.user`` would get it in a job:

- on a node in a Slurm partition: a one-task ``srun`` job step that user starts from the node (``runuser -u
  <user> -- srun ... sh -c 'ulimit -l; ulimit -H -l'``), so slurmd's own limit and slurm.conf's
  ``PropagateResourceLimits`` decide, as they do for a real job;
- elsewhere (no Slurm, spares): a ``runuser -u <user>`` login, whose PAM session applies ``limits.d``.

Soft below ``unlimited`` (or below ``verify.memlock_min_mib``) is an error on the node, never on a port or cable;
a user that does not exist on the node, or a step Slurm would not start, is *could not run*. The user name is one
argv element and the shell text is this module's constant: nothing from the spec or the node becomes code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from provisioner.fabric.findings import CheckResult, Finding
from provisioner.fabric.nccl import SRUN_WAIT_S, srun_not_started
from provisioner.remote import Completed
from provisioner.spec.cluster import Cluster, Node

CHECK = "memlock"
PROBE = "ulimit -l; ulimit -H -l"
"""What runs as the user: the soft then the hard limit, in KiB or ``unlimited`` (POSIX sh's ``ulimit -l``)."""
SRUN_TIMEOUT_S = SRUN_WAIT_S + 60
"""srun waits up to ``--immediate`` for its node, then starts one short task."""
_LIMIT = re.compile(r"^(unlimited|[0-9]{1,20})$")
_NO_USER = re.compile(r"^runuser: user (.{1,64}) does not exist", re.M)
HINT = ("converge the doca_ofed role (/etc/security/limits.d: '* soft memlock unlimited', '* hard memlock "
        "unlimited'; systemd DefaultLimitMEMLOCK=infinity) and, under Slurm, the slurm role (slurmd "
        "LimitMEMLOCK=infinity, slurm.conf PropagateResourceLimitsExcept=MEMLOCK); then restart slurmd and log in "
        "again. Root's checks cannot show this: root is exempt (CAP_IPC_LOCK)")


def gpu_nodes(cluster: Cluster) -> list[Node]:
    """The nodes jobs use RDMA from: every node with GPUs."""
    return [n for n in cluster.nodes if n.gpu_count]


def probe_argv(user: str, node: str, partition: str | None, *, as_root: bool) -> list[str]:
    """How to read ``user``'s limit on ``node``: a job step in ``partition``, or a login where there is none."""
    argv = [] if as_root else ["sudo", "-n"]
    argv += ["runuser", "-u", user, "--"]
    if partition is not None:
        argv += ["srun", "--job-name=provisioner-memlock", f"--partition={partition}", f"--nodelist={node}",
                 "--nodes=1", "--ntasks=1", f"--immediate={SRUN_WAIT_S}", "--time=1"]
    return [*argv, "sh", "-c", PROBE]


def read_limits(stdout: str) -> tuple[str, str] | None:
    """(soft, hard) from the probe's two lines; None when the output is not two limits."""
    lines = [ln.strip() for ln in stdout.strip().splitlines()]
    if len(lines) != 2 or not all(_LIMIT.match(ln) for ln in lines):
        return None
    return lines[0], lines[1]


def _enough(limit: str, floor_kib: int | None) -> bool:
    return limit == "unlimited" or (floor_kib is not None and int(limit) >= floor_kib)


def _shown(limit: str) -> str:
    return limit if limit == "unlimited" else f"{limit} KiB"


def limit_findings(node: str, user: str, soft: str, hard: str, floor_mib: int | None) -> list[Finding]:
    """An error when a job of ``user`` on ``node`` may lock less than unlimited (or ``floor_mib``)."""
    floor_kib = floor_mib * 1024 if floor_mib is not None else None
    if _enough(soft, floor_kib):
        return []
    wanted = "unlimited" if floor_kib is None else f"unlimited or at least {floor_kib} KiB"
    return [Finding(
        CHECK, "error", node, None, None, expected=wanted, observed=_shown(soft),
        message=(f"memlock: a job of user {user} on {node} may lock only {_shown(soft)} of memory (soft limit; hard "
                 f"{_shown(hard)}), expected {wanted}: its RDMA memory registration (ibv_reg_mr; NCCL 'Cannot "
                 "allocate memory') fails while root's checks pass"),
        hint=HINT)]


def judge(node: str, user: str, done: Completed, floor_mib: int | None, via: str) -> CheckResult:
    """The result for one node from the probe's completion (``via``: how it ran, for the reports)."""
    text = f"{done.stderr}\n{done.stdout}"
    if (missing := _NO_USER.search(text)) is not None:
        return CheckResult.could_not_run(CHECK, node, f"verify.user {user} does not exist on {node} "
                                                      f"({missing.group(0).strip()}): create it, or name another")
    if (why := srun_not_started(done)) is not None:
        return CheckResult.could_not_run(CHECK, node, f"srun as {user} started no job step on {node}: {why}")
    limits = read_limits(done.stdout) if done.rc == 0 else None
    if limits is None:
        tail = (done.stderr.strip().splitlines() or [""])[-1][:200]
        return CheckResult.could_not_run(CHECK, node, f"could not read the memlock limit of {user} on {node} "
                                                      f"({via}, exit {done.rc}{': ' + tail if tail else ''})")
    soft, hard = limits
    return CheckResult.from_findings(CHECK, node, limit_findings(node, user, soft, hard, floor_mib),
                                     {"user": user, "via": via, "soft": soft, "hard": hard})


def plan(cluster: Cluster, partitions: Mapping[str, str]) -> dict[str, tuple[list[str], str]]:
    """node -> (argv, how) for every GPU node: srun in its partition where Slurm runs it, a runuser login else."""
    user = cluster.spec.verify.user
    if user is None:
        return {}
    as_root = cluster.spec.ssh.user == "root"
    slurm = cluster.spec.slurm is not None
    out: dict[str, tuple[list[str], str]] = {}
    for n in gpu_nodes(cluster):
        part = partitions.get(n.name) if slurm else None
        out[n.name] = (probe_argv(user, n.name, part, as_root=as_root),
                       f"srun in partition {part}" if part is not None else "runuser login")
    return out


def check_memlock(cluster: Cluster, done: Mapping[str, Completed],
                  planned: Mapping[str, tuple[Sequence[str], str]]) -> list[CheckResult]:
    """One result per planned node that answered (lost nodes are reported by the run, once)."""
    user = cluster.spec.verify.user or ""
    floor = cluster.spec.verify.memlock_min_mib
    return [judge(node, user, done[node], floor, planned[node][1]) for node in sorted(planned) if node in done]
