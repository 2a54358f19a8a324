"""The memlock check reads the locked-memory limit a job of ``verify.user`` gets on every GPU node: root's checks
cannot see it (root is exempt, CAP_IPC_LOCK), so a user's NCCL/MPI job failed to register memory where verify
passed. Without Slurm it reads a ``runuser`` login; where Slurm runs the node, a one-task ``srun`` step the user
starts. The remote is faked; the runuser and srun messages are the real ones (Debian 12's util-linux 2.38 and Slurm
22.05, docs/lab-hardware-model.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from provisioner.fabric import memlock, registry
from provisioner.remote import Completed
from provisioner.spec import Cluster, load_text
from provisioner.verify import verify
from tests.unit.test_verify_orchestrator import SPEC
from tests.unit.test_verify_slurm_busy import SLURM_SPEC, SlurmRemote

USER_SPEC = SPEC.replace("verify: {", "verify: {user: alice, ")
SLURM_USER_SPEC = SLURM_SPEC.replace("verify: {", "verify: {user: alice, ")
NO_USER = "runuser: user alice does not exist or the user entry does not contain all the required fields"
DRAINED = "srun: Required node not available (down, drained or reserved)\n"


class LimitRemote(SlurmRemote):
    """The fake cluster; ``runuser -u <user> -- [srun ...] sh -c PROBE`` prints that node's ``limits`` (soft, hard),
    or fails as runuser does when the user is missing (``limits[node] = None``), or as srun does on a drained node."""

    def __init__(self, limits: Mapping[str, tuple[str, str] | None], drained: Sequence[str] = ()) -> None:
        super().__init__({})
        self.limits = dict(limits)
        self.drained = set(drained)

    def _answer(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None) -> Completed:
        if "runuser" in argv:
            self.calls.append((host, tuple(argv), dict(env or {})))
            if list(argv[-3:]) != ["sh", "-c", memlock.PROBE]:
                return Completed(127, "", f"unexpected {argv}")
            if host in self.drained and "srun" in argv:
                return Completed(1, "", DRAINED)
            got = self.limits.get(host, ("unlimited", "unlimited"))
            if got is None:
                return Completed(1, "", NO_USER + "\n")
            return Completed(0, f"{got[0]}\n{got[1]}\n", "")
        return super()._answer(host, argv, env)


def load(text: str) -> Cluster:
    res = load_text(text, "cluster.yaml")
    assert res.cluster is not None, res
    return res.cluster


def probes(remote: LimitRemote) -> dict[str, tuple[str, ...]]:
    return {h: a for h, a, _ in remote.calls if "runuser" in a}


def memlock_results(run: object) -> dict[str | None, object]:
    return {c.node: c for c in run.report.checks if c.name == "memlock"}  # type: ignore[attr-defined]


def test_a_user_limited_to_8_mib_on_one_node_fails_there_naming_memlock_user_node_and_value(tmp_path: Path) -> None:
    remote = LimitRemote({"n2": ("8192", "8192")})
    run = verify(load(USER_SPEC), tests=["memlock"], remote=remote, state_dir=tmp_path,  # type: ignore[arg-type]
                 server_grace_s=0)
    assert probes(remote) == {n: ("runuser", "-u", "alice", "--", "sh", "-c", "ulimit -l; ulimit -H -l")
                              for n in ("n1", "n2", "n3", "n4")}
    results = memlock_results(run)
    assert sorted(results) == ["n1", "n2", "n3", "n4"]
    assert [n for n, c in results.items() if not c.passed] == ["n2"]  # type: ignore[attr-defined]
    (finding,) = run.report.findings()
    assert (finding.check, finding.severity, finding.node, finding.device, finding.port) == (
        "memlock", "error", "n2", None, None)  # the host, never a port or a cable
    assert (finding.expected, finding.observed) == ("unlimited", "8192 KiB")
    assert "memlock" in finding.message and "user alice on n2" in finding.message and "8192 KiB" in finding.message
    assert "limits.d" in finding.hint and "LimitMEMLOCK=infinity" in finding.hint
    assert results["n1"].measurements == {  # type: ignore[attr-defined]
        "user": "alice", "via": "runuser login", "soft": "unlimited", "hard": "unlimited"}
    assert run.exit_code == 1


def test_a_user_missing_on_a_node_could_not_run_there_and_is_named(tmp_path: Path) -> None:
    run = verify(load(USER_SPEC), tests=["memlock"], remote=LimitRemote({"n3": None}),  # type: ignore[arg-type]
                 state_dir=tmp_path, server_grace_s=0)
    n3 = memlock_results(run)["n3"]
    assert not n3.ran and not n3.passed  # type: ignore[attr-defined]
    assert "verify.user alice does not exist on n3" in n3.error  # type: ignore[attr-defined]
    assert run.report.findings() == [] and run.exit_code == 2  # not passed, not a hardware fault


def test_under_slurm_the_limit_is_read_in_a_job_step_the_user_starts_whatever_nccl_launches_with(
        tmp_path: Path) -> None:
    remote = LimitRemote({"n4": ("64", "unlimited")}, drained=["n5"])
    run = verify(load(SLURM_USER_SPEC), tests=["memlock"], remote=remote, state_dir=tmp_path,  # type: ignore[arg-type]
                 server_grace_s=0, nccl_launcher="mpirun")
    sent = probes(remote)
    assert sorted(sent) == ["n1", "n2", "n3", "n4", "n5"], "ctl has no GPUs"
    assert sent["n1"] == ("runuser", "-u", "alice", "--", "srun", "--job-name=provisioner-memlock", "--partition=gpu",
                          "--nodelist=n1", "--nodes=1", "--ntasks=1", "--immediate=60", "--time=1",
                          "sh", "-c", "ulimit -l; ulimit -H -l")
    results = memlock_results(run)
    assert results["n1"].passed and results["n1"].measurements["via"] == "srun in partition gpu"  # type: ignore[attr-defined]
    assert not results["n4"].passed and results["n4"].ran  # type: ignore[attr-defined]
    assert "may lock only 64 KiB" in run.report.findings()[0].message
    assert "srun as alice started no job step on n5" in results["n5"].error  # type: ignore[attr-defined]
    assert "drained" in results["n5"].error  # type: ignore[attr-defined]


def test_a_floor_accepts_a_large_finite_limit_and_still_fails_a_small_one() -> None:
    assert memlock.limit_findings("n1", "alice", "8192", "8192", floor_mib=8) == []
    (low,) = memlock.limit_findings("n1", "alice", "64", "8192", floor_mib=8)
    assert low.expected == "unlimited or at least 8192 KiB" and low.observed == "64 KiB"
    assert memlock.limit_findings("n1", "alice", "unlimited", "unlimited", floor_mib=None) == []
    assert len(memlock.limit_findings("n1", "alice", "16777216", "unlimited", floor_mib=None)) == 1


@pytest.mark.parametrize("stdout", ["", "unlimited\n", "8192\nlots\n", "8192\n8192\n8192\n", "-1\n-1\n"])
def test_output_that_is_not_two_limits_could_not_run(stdout: str) -> None:
    result = memlock.judge("n1", "alice", Completed(0, stdout, ""), None, "runuser login")
    assert not result.ran and "could not read the memlock limit of alice on n1" in (result.error or "")


def test_the_check_runs_by_default_only_with_a_verify_user() -> None:
    assert "memlock" in registry.default_for(load(USER_SPEC))
    assert "memlock" not in registry.default_for(load(SPEC))


def test_root_as_verify_user_is_refused_with_why() -> None:
    res = load_text(SPEC.replace("verify: {", "verify: {user: root, "), "cluster.yaml")
    assert res.cluster is None
    assert any("verify.user must be an unprivileged account" in d.message for d in res.diagnostics), res.diagnostics


def test_a_non_root_login_reads_the_limit_through_sudo() -> None:
    assert memlock.probe_argv("alice", "n1", None, as_root=False)[:6] == ["sudo", "-n", "runuser", "-u", "alice", "--"]
