"""``dcgmi diag`` on real captures (tests/fixtures/dcgmi/): results per test and GPU, DCGM's own words."""

from __future__ import annotations

import pytest

from provisioner.errors import ParseError
from provisioner.parsers import parse
from tests.unit._parser_fixtures import load


def _test(parsed: dict, name: str) -> dict:
    return next(t for t in parsed["tests"] if t["name"] == name)


def test_healthy_level_2_run_passes_with_its_sections_and_metadata() -> None:
    r = parse("dcgmi", load("dcgmi", "awsome_distributed_training_p4de_r2_pass.txt"))
    assert r["ok"] is True and r["failed"] == []
    assert r["metadata"] == {"dcgm_version": "3.3.3", "driver_version": "535.104.12",
                             "gpu_device_ids": "20b2,20b2,20b2,20b2,20b2,20b2,20b2,20b2"}
    assert [t["name"] for t in r["tests"] if t["section"] == "Deployment"][:2] == ["Denylist", "NVML Library"]
    pcie = _test(r, "PCIe")
    assert (pcie["section"], pcie["result"], pcie["results"]) == ("Integration", "pass",
                                                                  [{"result": "pass", "gpus": None}])
    assert _test(r, "GPU Memory")["section"] == "Hardware"
    assert all(t["result"] == "pass" for t in r["tests"])


def test_dcgm_4_rows_per_gpu_are_read() -> None:
    r = parse("dcgmi", load("dcgmi", "dcgm124_a10g_dcgm442_r2_per_gpu_rows.txt"))
    assert r["ok"] is True and r["metadata"]["dcgm_version"] == "4.4.2"
    assert [(t["section"], t["name"], t["result"]) for t in r["tests"]] == [
        ("Deployment", "software", "pass"), ("Hardware", "memory", "pass"), ("Integration", "pcie", "pass")]
    assert _test(r, "memory")["results"] == [{"result": "pass", "gpus": None}, {"result": "pass", "gpus": [0]}]


def test_one_gpu_failing_is_named_with_dcgms_wrapped_words_joined() -> None:
    r = parse("dcgmi", load("dcgmi", "ml_engineering_gpu_memory_fail_gpu0_excerpt.txt"))
    assert r["ok"] is False and r["failed"] == ["GPU Memory"]
    mem = _test(r, "GPU Memory")
    assert mem["result"] == "fail" and mem["failed_gpus"] == [0]
    assert mem["results"] == [{"result": "pass", "gpus": [1, 2, 3, 4, 5, 6, 7]}, {"result": "fail", "gpus": [0]}]
    (warning,) = mem["messages"]
    # the table cuts words at a fixed column ('second|s', 'GP|U 0'): joined as printed, never with a space added
    assert warning["kind"] == "warning" and warning["gpus"] == [0]
    assert warning["text"].startswith("GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into "
                                      "the test for GPU 0 Verify that the cooling")
    assert warning["text"].endswith("and any other components.")


def test_fail_all_names_the_gpus_dcgm_warned_about() -> None:
    r = parse("dcgmi", load("dcgmi", "nccl_tests264_h100_cuda_uninitialized_r3.txt"))
    assert r["ok"] is False and r["failed"] == ["GPU Memory"]
    mem = _test(r, "GPU Memory")
    assert mem["results"] == [{"result": "fail", "gpus": None}]
    assert mem["failed_gpus"] == list(range(8))
    assert len(mem["messages"]) == 8
    assert "Unable to initialize CUDA library: 'system not yet initialized'" in mem["messages"][3]["text"]
    assert mem["messages"][3]["gpus"] == [3]
    assert [_test(r, n)["result"] for n in ("PCIe", "Memory Bandwidth", "EUD Test")] == ["skip"] * 3
    persistence = _test(r, "Persistence Mode")
    assert persistence["result"] == "pass" and persistence["messages"][0]["kind"] == "info"
    assert " Enable persistence mode by running" in persistence["messages"][0]["text"]  # 'Enabl|e' joined


def test_an_error_before_any_test_of_a_section_fails_the_run() -> None:
    r = parse("dcgmi", load("dcgmi", "ml_engineering_row_remap_error_excerpt.txt"))
    assert r["ok"] is False and r["tests"] == []
    assert r["section_messages"] == [{"kind": "error", "section": "Deployment", "gpus": [3],
                                      "text": "GPU 3 has uncorrectable memory errors and row remappings are pending"}]


def test_no_host_engine_is_dcgmis_own_failure() -> None:
    # the two lines dcgmi prints without nv-hostengine (DCGM dcgmi/Command.cpp DoExecuteConnectionFailure)
    text = ("Error: unable to establish a connection to the specified host: localhost\n"
            "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")
    r = parse("dcgmi", text)
    assert r["ok"] is False and r["tests"] == []
    assert r["error"] == "Unable to connect to host engine. Host engine connection invalid/disconnected."


@pytest.mark.parametrize("text", ["bash: dcgmi: command not found\n", "Error: something else entirely\n",
                                  "| a | b |\n"])
def test_text_that_is_not_a_diag_table_is_rejected_quoting_its_first_line(text: str) -> None:
    with pytest.raises(ParseError, match="first line"):
        parse("dcgmi", text)
