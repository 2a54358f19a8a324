"""The dcgm check (provisioner/fabric/dcgm.py) on real ``dcgmi diag`` captures, the NVSwitch fabric state, host-side
causes, and verify keeping the diagnostic off nodes running Slurm jobs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from provisioner.fabric import causes, dcgm, gpudirect
from provisioner.fabric.findings import CheckResult, Finding
from provisioner.parsers import parse
from provisioner.parsers.nvidia_query import parse_nvidia_smi_fabric
from provisioner.remote import Completed
from provisioner.spec import load_text
from provisioner.verify import verify
from tests.unit._parser_fixtures import load
from tests.unit.test_verify_slurm_busy import SLURM_SPEC, SlurmRemote

H100_CUDA_DOWN = load("dcgmi", "nccl_tests264_h100_cuda_uninitialized_r3.txt")
GPU0_FAILS = load("dcgmi", "ml_engineering_gpu_memory_fail_gpu0_excerpt.txt")
HEALTHY = load("dcgmi", "awsome_distributed_training_p4de_r2_pass.txt")
NO_HOST_ENGINE = ("Error: unable to establish a connection to the specified host: localhost\n"
                  "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")
# `nvidia-smi -q -i 0 | grep -i -A 2 Fabric` as published in setup notes after fabric manager started (the
# Fabric Manager user guide's check), and before it had trained the fabric (State 'In Progress', Status 'N/A')
FABRIC_DONE = ("    Fabric\n        State                             : Completed\n"
               "        Status                            : Success\n")
FABRIC_WAITING = ("         Fabric\n            State                   : In Progress\n"
                  "            Status                  : N/A\n")


def _errors(result: CheckResult) -> list[Finding]:
    return [f for f in result.findings if f.severity == "error"]


def test_a_failed_test_is_an_error_naming_the_test_the_gpus_and_dcgms_words() -> None:
    result = dcgm.judge_diag("gpu02", 3, parse("dcgmi", H100_CUDA_DOWN))
    assert not result.passed and result.ran
    (error,) = _errors(result)
    assert error.node == "gpu02" and error.device is None and error.port is None  # the node: host-side
    assert error.message.startswith("DCGM diag level 3: GPU Memory (Hardware) failed on GPUs 0, 1, 2, 3, 4, 5, 6, 7:")
    assert "Unable to initialize CUDA library: 'system not yet initialized'" in error.message
    assert "not a cable" in error.hint and "reseat" not in error.hint
    skipped = [f.message for f in result.findings if f.severity == "info"]
    assert any("PCIe (Integration) skipped" in m for m in skipped) and len(skipped) == 3
    assert result.measurements["dcgm_version"] == "3.3.8" and result.measurements["level"] == 3


def test_one_failing_gpu_is_named_alone() -> None:
    (error,) = _errors(dcgm.judge_diag("gpu05", 2, parse("dcgmi", GPU0_FAILS)))
    assert "GPU Memory failed on GPU 0: GPU 0 Thermal violations totaling 13.3 seconds" in error.message
    assert error.observed == "Fail (GPU 0)"


def test_a_healthy_run_passes_with_nothing_to_say() -> None:
    result = dcgm.judge_diag("gpu01", 2, parse("dcgmi", HEALTHY))
    assert result.passed and result.findings == ()
    assert result.measurements["passed"] == result.measurements["tests"] == 11


def test_missing_dcgmi_no_host_engine_and_foreign_output_could_not_run_never_passed() -> None:
    missing = dcgm.diag_result("gpu01", 1, Completed(127, "", "dcgmi: not found on the PATH"))
    engine = dcgm.diag_result("gpu01", 1, Completed(254, NO_HOST_ENGINE, ""))  # the probe maps 255 to 254
    foreign = dcgm.diag_result("gpu01", 1, Completed(1, "Segmentation fault\n", ""))
    for r in (missing, engine, foreign):
        assert not r.ran and not r.passed and r.findings == ()
    assert "no dcgmi on gpu01's PATH" in (missing.error or "")
    assert "Unable to connect to host engine" in (engine.error or "") and "nv-hostengine" in (engine.error or "")
    assert "first line: 'Segmentation fault'" in (foreign.error or "")


def test_fabric_state_completed_passes_and_in_progress_names_fabric_manager() -> None:
    assert parse_nvidia_smi_fabric(FABRIC_DONE)["gpus"] == [{"bus_id": None, "state": "Completed",
                                                             "status": "Success"}]
    assert dcgm.fabric_result("gpu01", Completed(0, FABRIC_DONE, "")).passed
    waiting = dcgm.fabric_result("gpu02", Completed(0, FABRIC_WAITING, ""))
    (error,) = _errors(waiting)
    assert "State In Progress, Status N/A; fabric manager has not trained the fabric" in error.message
    assert "nvidia-fabricmanager" in error.hint and "not a cable" in error.hint
    old = dcgm.fabric_result("gpu03", Completed(0, "GPU 00000000:19:00.0\n    Product Name : NVIDIA A100\n", ""))
    assert not old.ran and "no Fabric section" in (old.error or "")


def test_a_failed_diagnostic_folds_the_nodes_gpudirect_and_nccl_findings() -> None:
    diag = dcgm.judge_diag("gpu03", 3, parse("dcgmi", H100_CUDA_DOWN))
    gdr = Finding(gpudirect.BW_CHECK, "error", "gpu03", "mlx5_0", None, 360, 12, "gpu03 rail 0: port is bad",
                  "reseat or swap the cable and transceiver", rail=0)
    other = Finding(gpudirect.BW_CHECK, "error", "gpu01", "mlx5_0", None, 360, 12, "gpu01 rail 0: port is bad",
                    "reseat or swap the cable and transceiver", rail=0)
    folded = causes.fold([diag, CheckResult.from_findings(gpudirect.BW_CHECK, None, [gdr, other])])
    mine, theirs = folded[1].findings
    assert "host-side cause, not a port or cable: DCGM diag level 3: GPU Memory" in mine.message
    assert "reseat" not in mine.hint and mine.severity == "error"
    assert theirs == other  # another node's finding is its own


class DcgmRemote(SlurmRemote):
    """The Slurm fake plus dcgmi: ``diag`` = node -> its dcgmi output (HEALTHY otherwise)."""

    def __init__(self, jobs: Mapping[str, str], diag: Mapping[str, str]) -> None:
        super().__init__(jobs)
        self.diag = dict(diag)

    def _answer(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None) -> Completed:
        if list(argv[:3]) == ["sh", "-c", dcgm.PROBE]:
            self.calls.append((host, tuple(argv), dict(env or {})))
            return Completed(0, self.diag.get(host, HEALTHY), "")
        return super()._answer(host, argv, env)


def test_verify_runs_the_diagnostic_off_busy_nodes_and_names_the_failing_node(tmp_path: Path) -> None:
    spec = SLURM_SPEC.replace("verify: {tests: [links, bandwidth, nccl]", "verify: {tests: [dcgm], dcgm: {level: 2}")
    res = load_text(spec, "cluster.yaml")
    assert res.cluster is not None, res
    remote = DcgmRemote({"n5": "41"}, {"n2": GPU0_FAILS})
    run = verify(res.cluster, remote=remote, state_dir=tmp_path, server_grace_s=0)  # type: ignore[arg-type]
    probed = sorted(h for h, a, _ in remote.calls if a[:3] == ("sh", "-c", dcgm.PROBE))
    assert probed == ["n1", "n2", "n3", "n4"]  # not n5 (job 41), not ctl (no GPUs)
    assert {a[-1] for h, a, _ in remote.calls if a[:3] == ("sh", "-c", dcgm.PROBE)} == {"2"}
    by_node = {c.node: c for c in run.report.checks if c.name == "dcgm"}
    assert set(by_node) == {"n1", "n2", "n3", "n4", "n5"}
    assert "Slurm runs job 41 on n5" in (by_node["n5"].error or "")
    assert [f.message.split(":")[0] for f in _errors(by_node["n2"])] == ["DCGM diag level 2"]
    assert by_node["n1"].passed and by_node["n3"].passed
    assert run.exit_code == 1  # n2 failed (a finding); n5 not proven is reported beside it
