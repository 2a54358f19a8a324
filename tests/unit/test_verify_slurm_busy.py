"""Where Slurm runs, verification sends no traffic to a node running a job: slurmctld is asked first (squeue, as
tests/fixtures/slurm/squeue_running.txt), the node's bandwidth, GPUDirect and NCCL results could not run, naming
the job, and the rest of the cluster is measured without it. NCCL of the nodes in a partition starts with srun."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from provisioner.remote import Completed
from provisioner.spec import Cluster, load_text
from provisioner.verify import verify
from tests.unit.test_verify_orchestrator import NCCL, SPEC, FakeRemote

SLURM_SPEC = SPEC.replace(
    'nodes: [{name: "n[1-4]", address: "10.0.0.[1-4]", profile: g}]',
    'nodes: [{name: "n[1-5]", address: "10.0.0.[1-5]", profile: g}, {name: ctl, address: 10.0.0.9, profile: c}]',
).replace("profiles:\n", "profiles:\n  c: {}\n") + (
    'slurm: {controller: ctl, partitions: [{name: gpu, nodes: "n[1-5]"}]}\n')
# n5 runs the job: the fake's ib_write_bw peers and its 16-rank NCCL capture are n1-n4 (4 nodes x 4 GPUs)


class SlurmRemote(FakeRemote):
    """The fake cluster plus a controller whose squeue lists ``jobs`` (node -> job id), and srun steps."""

    def __init__(self, jobs: Mapping[str, str], squeue_fails: bool = False) -> None:
        super().__init__()
        self.jobs = dict(jobs)
        self.squeue_fails = squeue_fails

    def _answer(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None) -> Completed:
        if argv and argv[0] == "squeue":
            self.calls.append((host, tuple(argv), dict(env or {})))
            if self.squeue_fails:
                return Completed(1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
            return Completed(0, "".join(f"{j}|RUNNING|{n}|alice\n" for n, j in sorted(self.jobs.items())), "")
        if argv and argv[0] == "scontrol":
            self.calls.append((host, tuple(argv), dict(env or {})))
            return Completed(0, "".join(f"NodeName={n} State={'ALLOCATED' if n in self.jobs else 'IDLE'} "
                                        "Partitions=gpu\n\n" for n in ("n1", "n2", "n3", "n4", "n5")), "")
        if argv and argv[-1] == "command -v srun":
            return Completed(0, "/usr/bin/srun\n", "")
        if argv and argv[0] == "env" and "srun" in argv:
            self.calls.append((host, tuple(argv), dict(env or {})))
            return Completed(0, NCCL, "")
        return super()._answer(host, argv, env)


def cluster() -> Cluster:
    res = load_text(SLURM_SPEC, "cluster.yaml")
    assert res.cluster is not None, res
    return res.cluster


def sent_to(remote: SlurmRemote, node: str, tool: str) -> list[tuple[str, ...]]:
    address = f"10.0.0.{node[1:]}"
    return [a for h, a, _ in remote.calls if a and a[0] == tool and (h == node or a[-1] == address)]


def test_a_node_running_a_job_gets_no_traffic_and_its_results_could_not_run(tmp_path: Path) -> None:
    remote = SlurmRemote({"n5": "41"})
    run = verify(cluster(), remote=remote, state_dir=tmp_path, server_grace_s=0)  # type: ignore[arg-type]
    assert [(h, a[0]) for h, a, _ in remote.calls if a[0] in ("squeue", "scontrol")] == [
        ("ctl", "squeue"), ("ctl", "scontrol")]
    assert sent_to(remote, "n5", "ib_write_bw") == [], "no pair touched the busy node"
    assert sent_to(remote, "n1", "ib_write_bw"), "the others were measured"
    steps = [a for _, a, _ in remote.calls if a[0] == "env" and "srun" in a]
    assert len(steps) == 1 and "--nodelist=n1,n2,n3,n4" in steps[0], steps  # NCCL: one srun step without n5
    busy = {c.name: c for c in run.report.checks if c.node == "n5" and not c.ran}
    assert set(busy) == {"bandwidth", "nccl"}, run.report.checks  # the spec's traffic checks (no gpudirect here)
    assert all("Slurm runs job 41 on n5" in (c.error or "") and "--include-busy" in (c.error or "")
               for c in busy.values())
    assert run.exit_code == 2, [f.message for f in run.report.findings()]  # n5 not proven, never at fault
    links = [c for c in run.report.checks if c.name == "links" and c.node == "n5"]
    assert links and links[0].ran, "checks that send no traffic still run on the busy node"


def test_include_busy_measures_every_node_and_mpirun_ignores_the_partitions(tmp_path: Path) -> None:
    remote = SlurmRemote({"n5": "41"})
    run = verify(cluster(), remote=remote, state_dir=tmp_path, server_grace_s=0,  # type: ignore[arg-type]
                 include_busy=True, nccl_launcher="mpirun")
    assert not [a for _, a, _ in remote.calls if a[0] in ("squeue", "scontrol")], "Slurm is not asked"
    assert sent_to(remote, "n5", "ib_write_bw"), "the node running the job is measured too"
    assert [a for _, a, _ in remote.calls if a[0] == "env"] == []
    launches = [a[-1] for _, a, _ in remote.calls if a[0] == "sh" and "mpirun " in a[-1]]
    assert launches and "10.0.0.5 slots=4" in launches[0]  # one all-reduce over all five, under mpirun
    assert not [c for c in run.report.checks if "Slurm runs job" in (c.error or "")]


def test_slurm_not_answering_is_said_and_every_node_is_measured(tmp_path: Path) -> None:
    remote = SlurmRemote({"n5": "41"}, squeue_fails=True)
    progress: list[str] = []
    run = verify(cluster(), remote=remote, state_dir=tmp_path, server_grace_s=0,  # type: ignore[arg-type]
                 progress=progress.append)
    assert sent_to(remote, "n2", "ib_write_bw")
    said = [n for n in run.report.notes if n.startswith("could not ask Slurm which nodes run jobs")]
    assert said and "Unable to contact slurm controller" in said[0], run.report.notes
    assert any(p.startswith("slurm: could not ask Slurm") for p in progress)


CONTAINERS = ('containers: {toolkit: "1.17.3", repository: {url: "http://m.example/nct", key: k.gpg, suite: /, '
              'components: []}, enroot: "3.5.0", enroot_mirror: "http://m.example/enroot", pyxis: "0.20.0", '
              'pyxis_source: "http://m.example/pyxis.tar.gz", scratch: /raid/enroot, image: "/images/nccl.sqsh"}')


def test_with_a_container_image_nccl_runs_once_more_in_it_and_is_reported_apart(tmp_path: Path) -> None:
    text = SLURM_SPEC.replace('ofed: {flavor: mlnx_ofed, version: "23.07"}}',
                              'ofed: {flavor: mlnx_ofed, version: "23.07"}, ' + CONTAINERS + "}", 1)
    assert text != SLURM_SPEC
    res = load_text(text, "cluster.yaml")
    assert res.cluster is not None, res
    remote = SlurmRemote({})
    run = verify(res.cluster, remote=remote, state_dir=tmp_path, server_grace_s=0)  # type: ignore[arg-type]
    steps = [a for _, a, _ in remote.calls if a[0] == "env" and "srun" in a]
    assert [any(x == "--container-image=/images/nccl.sqsh" for x in a) for a in steps] == [False, True], steps
    (plain,) = [c for c in run.report.checks if c.name == "nccl" and c.node is None]
    (inside,) = [c for c in run.report.checks if c.name == "nccl_container"]
    # the fake answers both steps with its 16-rank capture for n1-n5: the same verdict, found the same way
    assert [f.message for f in inside.findings] == [f.message for f in plain.findings] == [
        "all_reduce_perf ran with 16 ranks, not 5 nodes x 4 GPUs = 20"]
    assert {f.check for f in inside.findings} == {"nccl_container"}
    assert inside.measurements["image"] == "/images/nccl.sqsh"
    without = verify(cluster(), remote=SlurmRemote({}), state_dir=tmp_path,  # type: ignore[arg-type]
                     server_grace_s=0)
    assert not [c for c in without.report.checks if c.name == "nccl_container"]
