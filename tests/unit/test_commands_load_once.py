"""Every command that reads the spec reads it once and passes the model down (issue #28).

test_up_loads_once.py proves it for a whole `provision up` with its verify and drift steps. Here each day-2
command and `verify`/`plan` goes through ``cli.main`` on the Slurm lab's spec with its converges really planned
and journaled by the run engine (only the playbooks are scripted), its verification, SSH and Slurm faked, and
every read of the spec file counted. A rolling run used to load the spec again for each batch's converge, a
replaced node for each of its five converges and a watch round's failover for its slurm.conf converge: a spec
edited meanwhile was converged in part, and each load re-validated minutes of work later."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import paramiko
import pytest

import provisioner.day2.failover
import provisioner.day2.replace
import provisioner.day2.rolling
import provisioner.day2.watch
import provisioner.drift
import provisioner.phases
import provisioner.remote
import provisioner.spec.load
import provisioner.verify
from provisioner.cli import main
from provisioner.drift import DriftReport
from provisioner.health import NodeHealth
from provisioner.remote import Completed
from provisioner.report.model import VerifyReport
from provisioner.runner import FakeRun, PlaybookResult, fake_result
from provisioner.spec.cluster import Cluster
from provisioner.verify import VerifyRun
from tests.unit.test_failover import SlurmFake
from tests.unit.test_plan import LAB, _cluster, fleet

from ._parser_fixtures import load

# the spec pins a newer driver than the nodes' manifests report: a rolling run has batches to converge
NEWER = LAB.replace('version: "550.90.07"', 'version: "550.127.05"')
IBSTAT = load("ibstat", "mesa_cx4_initializing.txt")


class QuietRemote:
    """SSH to nodes that answer ibstat (a real capture: replace-node reads the new GUIDs) and nothing else."""

    def __init__(self, targets: Mapping[str, Any] | None = None, **_kw: Any) -> None:
        self.targets = targets

    def __enter__(self) -> QuietRemote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        if list(argv[:1]) == ["ibstat"]:
            return Completed(0, IBSTAT, "")
        return Completed(127, "", f"{argv[0]}: not found")

    def run_many(self, commands: Mapping[str, Sequence[str]], timeout: float,
                 env: Mapping[str, str] | None = None) -> dict[str, Completed]:
        return {h: self.run(h, argv, timeout, env) for h, argv in commands.items()}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    spec = tmp_path / "cluster.yaml"
    spec.write_text(NEWER)
    (tmp_path / "known_hosts").write_text("")
    seen: dict[str, Any] = {"spec": spec, "reads": [], "playbooks": [], "verified": 0}
    read = provisioner.spec.load.read_spec_text
    real_run = provisioner.phases._provision_run

    def counting_read(path: Any, what: str = "a spec file") -> str:
        if Path(path).resolve() == spec.resolve():
            seen["reads"].append(what)
        return read(path, what)

    def runner(playbook: Path, inventory_dir: Path, *, limit: Iterable[str], **kw: Any) -> PlaybookResult:
        seen["playbooks"].append(playbook.name)
        return fake_result(playbook.name, list(limit), FakeRun())

    def engine_run(spec: Path, cluster: Cluster, warnings: Any, options: Any, state_dir: Any, _runner: Any,
                   *rest: Any) -> Any:  # the real run engine (plan, lock, journal, steps), playbooks scripted
        return real_run(spec, cluster, warnings, options, state_dir, runner, *rest)

    def verify(cluster: Cluster, **kw: Any) -> VerifyRun:
        seen["verified"] += 1
        now = datetime.now(UTC)
        return VerifyRun(VerifyReport(cluster=cluster.name, started=now, finished=now, checks=()), None)

    def watch_probe(cluster: Cluster, remote: Any, nodes: Sequence[str], timeout: float = 20.0
                    ) -> dict[str, NodeHealth]:  # gpu01 fails the watch's health checks; the spare passes
        return {n: NodeHealth(n, ["gpu_count: 1 of 2 GPUs"] if n == "gpu01" else []) for n in nodes}

    monkeypatch.setattr(provisioner.spec.load, "read_spec_text", counting_read)
    monkeypatch.setattr(provisioner.phases, "_provision_run", engine_run)
    monkeypatch.setattr(provisioner.verify, "verify", verify)
    monkeypatch.setattr(provisioner.drift, "check_cluster",
                        lambda cluster, state_dir, **kw: DriftReport(checked_at="now", nodes=[]))
    monkeypatch.setattr(provisioner.drift, "fetch_manifests", lambda remote, names: (fleet(_cluster(LAB)), {}))
    monkeypatch.setattr(provisioner.remote, "SshRemote", QuietRemote)
    monkeypatch.setattr(provisioner.day2.replace, "SshRemote", QuietRemote)
    monkeypatch.setattr(provisioner.day2.replace, "fetch_host_key",
                        lambda target, timeout=10.0: paramiko.ECDSAKey.generate())
    monkeypatch.setattr(provisioner.day2.rolling, "SlurmCtl", lambda remote, controller: SlurmFake([]))
    monkeypatch.setattr(provisioner.day2.failover, "SlurmCtl", lambda remote, controller: SlurmFake([]))
    monkeypatch.setattr(provisioner.day2.watch, "check_nodes", watch_probe)
    monkeypatch.setattr(provisioner.day2.failover, "check_nodes",
                        lambda cluster, remote, nodes, timeout=20.0: {n: NodeHealth(n, []) for n in nodes})
    return seen


# per command: its arguments after the spec, and what must have happened for the count to prove something
COMMANDS = {
    "up": (["up"], [], "converged"),
    "rolling": (["up"], ["--rolling", "--batch", "1"], "converged"),
    "verify": (["verify"], ["--only", "links"], "verified"),
    "plan": (["plan"], ["--cached"], None),
    "replace-node": (["replace-node"], ["gpu01", "--accept-new-host-key"], "converged"),
    "watch-once": (["watch"], ["--once"], "converged"),
    "failover": (["failover"], ["gpu01"], "converged"),
    "drift": (["drift"], [], None),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_reads_the_spec_once(world: dict[str, Any], tmp_path: Path, command: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    head, tail, proof = COMMANDS[command]
    rc = main([*head, str(world["spec"]), *tail, "--out", str(tmp_path / "state")])
    err = capsys.readouterr().err
    assert rc in (0, 1), err  # 1: findings or changes planned; never could-not-run
    if proof == "converged":
        assert world["playbooks"], f"nothing converged: the count would prove nothing\n{err}"
    elif proof == "verified":
        assert world["verified"] == 1, err
    assert world["reads"] == ["a spec file"], f"the spec was read {len(world['reads'])} times\n{err}"
