"""The NCCL check once more inside the spec's container image (software.containers.image, #25 item 3): one srun
step with pyxis's --container-image over the largest partition's GPU nodes, reported like the plain run; a container
that never ran the test is could-not-run with pyxis's reason, never a fabric finding."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from provisioner.fabric import nccl
from provisioner.fabric.findings import CheckResult
from provisioner.remote import Completed
from provisioner.report.model import VerifyReport, nccl_lines
from tests.unit._parser_fixtures import load
from tests.unit.test_nccl_srun import IN_SERVICE, SPEC, Recorder, cluster, everywhere, real_run

IMAGE = "nvcr.io#nvidia/pytorch:24.05-py3"


def _run(reply: Any, partitions: dict[str, str] = IN_SERVICE) -> tuple[CheckResult, Recorder]:
    run = Recorder(reply)
    result = nccl.check_nccl_container(cluster(), run, IMAGE, has_tool=everywhere, as_root=True,
                                       partitions=partitions)
    return result, run


def test_one_srun_step_in_the_image_judged_and_reported_like_the_plain_run() -> None:
    result, run = _run(real_run)
    (host, argv), = run.calls          # once: no follow-ups, one partition
    assert host == "gpu01" and f"--container-image={IMAGE}" in argv and "--partition=gpu" in argv
    assert argv.index(f"--container-image={IMAGE}") < argv.index("all_reduce_perf")
    assert result.name == "nccl_container" and result.passed, result
    label = f"in container {IMAGE}, the default partition, Slurm partition gpu"
    plain = nccl.check_nccl(cluster(), Recorder(real_run), has_tool=everywhere, as_root=True, launch="auto",
                            partitions={"gpu01": "gpu", "gpu02": "gpu"})
    assert result.measurements[f"busbw_gbps {label}"] == plain.measurements["busbw_gbps"]
    assert result.measurements["image"] == IMAGE
    now = datetime.now(UTC)
    lines = nccl_lines(VerifyReport(cluster="sl", started=now, finished=now, checks=(result,)))
    assert len(lines) == 1 and lines[0].startswith(f"NCCL all-reduce ({label}): ")


def test_below_the_floor_in_the_container_is_a_finding_of_the_container_check() -> None:
    # eight NDR rails carry 400 GB/s: a 350 GB/s floor is reachable, and the captured 338.8 GB/s run is below it
    spec = cluster(SPEC.replace('device: "mlx5_[0-1]"', 'device: "mlx5_[0-7]"').replace("min_busbw_gbps: 80",
                                                                                      "min_busbw_gbps: 350"))
    below = nccl.check_nccl_container(spec, Recorder(real_run), IMAGE, has_tool=everywhere, as_root=True,
                                      partitions=IN_SERVICE)
    assert not below.passed and below.error is None
    assert [f.check for f in below.findings] == ["nccl_container"]
    assert "below the floor 350 GB/s" in below.findings[0].message and IMAGE in below.findings[0].message


def test_a_failed_pyxis_import_is_could_not_run_with_pyxis_reason() -> None:
    result, _ = _run(lambda argv: Completed(1, "", load("slurm", "srun_pyxis_import_failed.txt")))
    assert result.name == "nccl_container" and not result.passed and result.findings == ()
    assert result.error is not None and "pyxis: failed to import docker image" in result.error
    assert "pyxis: couldn't start container" in result.error and "not the fabric" in result.error


def test_srun_without_pyxis_and_an_image_without_the_test_are_could_not_run() -> None:
    # glibc getopt_long's message for an option srun does not know (posix/getopt.c: "%s: unrecognized option
    # '%s%s'"), what srun prints where plugstack.conf loads no pyxis
    no_pyxis = f"srun: unrecognized option '--container-image={IMAGE}'\nTry \"srun --help\" for more information\n"
    result, _ = _run(lambda argv: Completed(1, "", no_pyxis))
    assert result.error is not None and f"unrecognized option '--container-image={IMAGE}'" in result.error
    # Slurm's slurmstepd when the task's command is not in the container (execve() failing with ENOENT)
    missing = "slurmstepd: error: execve(): all_reduce_perf: No such file or directory\n"
    result, _ = _run(lambda argv: Completed(2, "", missing))
    assert result.error is not None and "all_reduce_perf: No such file or directory" in result.error
    assert result.findings == ()


def test_without_two_gpu_nodes_in_one_partition_it_could_not_run() -> None:
    result, run = _run(real_run, partitions={"gpu01": "gpu", "gpu03": "big"})
    assert run.calls == [] and result.error is not None and "pyxis starts containers only" in result.error


def test_the_plain_srun_step_has_no_container_image() -> None:
    argv = nccl.srun_argv(["gpu01", "gpu02"], 8, "8G", nccl.Launcher("srun", "gpu"))
    assert not any(a.startswith("--container-image") for a in argv)
