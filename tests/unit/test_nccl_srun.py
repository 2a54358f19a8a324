"""The NCCL check on a cluster Slurm runs: srun for the nodes in a partition, mpirun for the rest, Slurm's refusals
read from real srun output (tests/fixtures/slurm/srun_*.txt)."""

from __future__ import annotations

from typing import Any

from provisioner.fabric import nccl
from provisioner.remote import Completed
from provisioner.spec import Cluster, load_text
from tests.unit._parser_fixtures import load

SPEC = """
cluster: {name: sl, os: debian-12}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5", ofed: {flavor: doca, version: "2.9.1"}}
profiles:
  g: {gpu: {model: H100-SXM5-80GB, count: 8}, hcas: [{device: "mlx5_[0-1]", rate: NDR}]}
  s: {hcas: [{device: mlx5_0, rate: NDR}]}
nodes:
  - {name: "gpu[01-05]", address: "10.0.0.[1-5]", profile: g}
  - {name: sm1, address: 10.0.0.9, profile: s, roles: [subnet_manager]}
fabric:
  rate: NDR
  subnet_manager: {kind: opensm, nodes: [{node: sm1, priority: 15}]}
slurm:
  controller: sm1
  partitions: [{name: gpu, nodes: "gpu[01-02]", default: true}, {name: big, nodes: "gpu[03-04]"}]
spares: {nodes: gpu05}
verify: {nccl: {min_busbw_gbps: 80}}
"""
IN_SERVICE = {"gpu01": "gpu", "gpu02": "gpu", "gpu03": "big", "gpu04": "big"}


def cluster(text: str = SPEC) -> Cluster:
    return load_text(text, "sl.yaml").cluster


def everywhere(host: str, tool: str) -> bool:
    return True


class Recorder:
    """The runner: records (launch host, argv) and answers with ``reply(argv)``."""

    def __init__(self, reply: Any) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.reply = reply

    def __call__(self, hosts: Any, argv: Any, env: dict[str, str]) -> Completed:
        self.calls.append((hosts[0], list(argv)))
        return self.reply(list(argv))


def real_run(argv: list[str]) -> Completed:
    return Completed(0, load("nccl-tests", "a3mega_16rank_allreduce.txt"), "")  # 2 nodes x 8 H100


def test_srun_argv_is_one_exclusive_pmix_step_with_a_rank_per_gpu() -> None:
    argv = nccl.srun_argv(["gpu01", "gpu02"], 8, "8G", nccl.Launcher("srun", "gpu", gres=True))
    assert argv[:3] == ["env", "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET"]  # not --export: it splits on ","
    step = argv[argv.index("srun"):argv.index("all_reduce_perf")]
    assert {"--mpi=pmix", "--nodelist=gpu01,gpu02", "--nodes=2", "--ntasks-per-node=8", "--exclusive",
            f"--immediate={nccl.SRUN_WAIT_S}", "--partition=gpu", "--gres=gpu:8"} <= set(step)
    assert argv[argv.index("all_reduce_perf"):] == ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1"]
    assert not any(a.startswith("--gres") for a in nccl.srun_argv(["a", "b"], 8, "8G", nccl.Launcher("srun", "p")))


def test_auto_starts_each_partition_with_srun_and_the_spare_is_said_alone() -> None:
    run = Recorder(real_run)
    result = nccl.check_nccl(cluster(), run, has_tool=everywhere, as_root=True, launch="auto",
                             partitions=IN_SERVICE)
    assert result.passed, result
    assert [(host, next(a for a in argv if a.startswith("--nodelist="))) for host, argv in run.calls] == [
        ("gpu01", "--nodelist=gpu01,gpu02"), ("gpu03", "--nodelist=gpu03,gpu04")]
    assert all("--partition=gpu" in a for h, a in run.calls[:1]) and "--partition=big" in run.calls[1][1]
    assert result.measurements["launcher the default partition, Slurm partition gpu"] == "srun"
    spare = [f for f in result.findings if f.node == "gpu05"]
    assert len(spare) == 1 and spare[0].severity == "info" and "srun cannot start" in spare[0].message


def test_two_spares_run_together_under_mpirun_and_explicit_mpirun_ignores_slurm() -> None:
    text = SPEC.replace('"gpu[03-04]"}]', '"gpu03"}]').replace("spares: {nodes: gpu05}",
                                                               'spares: {nodes: "gpu[04-05]"}')
    run = Recorder(real_run)
    parts = {"gpu01": "gpu", "gpu02": "gpu", "gpu03": "big"}
    result = nccl.check_nccl(cluster(text), run, has_tool=everywhere, as_root=True, launch="auto", partitions=parts)
    kinds = sorted((h, "srun" if "srun" in a else "mpirun") for h, a in run.calls)
    assert kinds == [("gpu01", "srun"), ("gpu04", "mpirun")], kinds
    assert [f.node for f in result.findings if f.severity == "info"] == ["gpu03"]  # alone in partition big
    run.calls.clear()
    assert nccl.check_nccl(cluster(), run, has_tool=everywhere, as_root=True, launch="mpirun",
                           partitions=IN_SERVICE).passed is False  # 5 nodes x 8 against a 16-rank capture
    assert len(run.calls) >= 1 and all("srun" not in a for _, a in run.calls) and "mpirun" in run.calls[0][1][2]


def test_drained_or_busy_nodes_make_the_check_could_not_run_with_slurms_words() -> None:
    refused = load("slurm", "srun_immediate_drained.txt")
    run = Recorder(lambda argv: Completed(1, "", refused))
    result = nccl.check_nccl(cluster(), run, has_tool=everywhere, as_root=True, launch="auto",
                             partitions=IN_SERVICE)
    assert not result.ran and result.error is not None
    assert "Required node not available (down, drained or reserved)" in result.error
    assert "Requested nodes are busy" in result.error and "--nccl-launcher mpirun" in result.error
    assert len(run.calls) == 2  # one per partition, no pair follow-ups: nothing was measured, nothing is blamed


def test_one_partition_refused_and_the_other_measured_is_still_not_proven() -> None:
    refused = load("slurm", "srun_immediate_drained.txt")
    run = Recorder(lambda argv: Completed(1, "", refused) if "--partition=big" in argv else real_run(argv))
    result = nccl.check_nccl(cluster(), run, has_tool=everywhere, as_root=True, launch="auto",
                             partitions=IN_SERVICE)
    assert not result.ran and result.error is not None
    assert "Slurm partition big: srun could not start" in result.error and "measured:" in result.error
    assert "Slurm partition gpu 338.8 GB/s" in result.error


def test_srun_without_the_pmix_library_is_a_finding_not_a_slow_node() -> None:
    text = load("slurm", "srun_pmix_without_libpmix.txt")
    run = Recorder(lambda argv: Completed(1, "", text))
    result = nccl.check_nccl(cluster(), run, has_tool=everywhere, as_root=True, launch="srun",
                             partitions={"gpu01": "gpu", "gpu02": "gpu"})
    errors = [f for f in result.findings if f.severity == "error"]
    assert not result.passed and errors and "srun cannot start MPI ranks" in errors[0].message
    assert "can not load PMIx library" in errors[0].message and "libpmix-dev" in errors[0].hint


def test_no_srun_on_the_launch_node_could_not_run() -> None:
    run = Recorder(real_run)
    result = nccl.check_nccl(cluster(), run, has_tool=lambda h, t: t != "srun", as_root=True, launch="auto",
                             partitions={"gpu01": "gpu", "gpu02": "gpu", "gpu03": "gpu"})
    assert not result.ran and result.error is not None and "no srun on gpu01" in result.error
    assert run.calls == [] or all("srun" not in a for _, a in run.calls)


def test_srun_messages_parse_only_when_srun_refused() -> None:
    assert nccl.srun_not_started(Completed(0, load("nccl-tests", "a3mega_16rank_allreduce.txt"), "")) is None
    assert nccl.srun_without_mpi(Completed(1, "", load("slurm", "srun_immediate_drained.txt"))) is None
    assert nccl.srun_not_started(Completed(1, "", load("slurm", "srun_pmix_without_libpmix.txt"))) is None
