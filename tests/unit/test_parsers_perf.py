"""perftest, nccl-tests and nvidia-smi topo -m on real captured outputs."""

from __future__ import annotations

import pytest

from provisioner.errors import ParseError
from provisioner.parsers import parse
from provisioner.parsers.perftest import MIB_PER_S_TO_GBPS
from tests.unit._parser_fixtures import load


def test_perftest_mib_columns_are_converted_to_gbps() -> None:
    out = parse("perftest", load("perftest", "alibaba_amd_rocm_client_mib.txt"))
    assert (out["test"], out["program"], out["device"], out["role"], out["ok"]) == (
        "RDMA_Write",
        "ib_write_bw",
        "ionic_0",
        "client",
        True,
    )
    assert (out["gpudirect"], out["cuda_device"], out["bidirectional"]) == (True, 0, False)
    assert [r["bytes"] for r in out["results"]] == [2**i for i in range(1, 24)]
    last = out["results"][-1]
    assert last["iterations"] == 5000
    assert last["bw_avg_gbps"] == pytest.approx(19044.43 * MIB_PER_S_TO_GBPS)
    assert last["bw_avg_gbps"] == pytest.approx(159.76, abs=0.01)
    assert last["msg_rate_mpps"] == pytest.approx(0.002381)
    assert out["bw_avg_gbps"] == last["bw_avg_gbps"]


def test_perftest_bidirectional_gbits_client() -> None:
    out = parse("perftest", load("perftest", "alibaba_amd_ionic_bidir_client_gbits.txt"))
    assert (out["test"], out["bidirectional"], out["role"], out["device"]) == ("RDMA_Write", True, "client", "ionic_1")
    assert len(out["results"]) == 23
    assert out["results"][0] == {
        "bytes": 2,
        "iterations": 20000,
        "bw_peak_gbps": 0.147331,
        "bw_avg_gbps": 0.146472,
        "msg_rate_mpps": 9.154486,
    }
    assert out["bw_avg_gbps"] == 779.21
    assert out["ok"] is True and out["errors"] == []


def test_perftest_completion_error_block_is_a_failed_run() -> None:
    out = parse("perftest", load("perftest", "perftest173_completion_error_cuda.txt"))
    assert out["ok"] is False
    assert out["results"] == []
    assert out["error"] == "Completion with error at client"
    assert out["errors"][1:] == [
        "Failed status 4: wr_id 0 syndrom 0x51",
        "Failed to complete run_iter_bw function successfully",
    ]


def test_perftest_gbits_postlist_row() -> None:
    out = parse("perftest", load("perftest", "perftest273_postlist_gbits.txt"))
    assert out["test"] == "RDMA_Write" and out["device"] == "ib0"  # 'RDMA_Write Post List BW Test'
    (row,) = out["results"]
    assert row == {
        "bytes": 8,
        "iterations": 224958464,
        "bw_peak_gbps": 0.0,
        "bw_avg_gbps": 0.48,
        "msg_rate_mpps": 7.498617,
    }
    assert out["ok"] is True


def test_perftest_cuda_server_without_rows_is_not_ok() -> None:
    out = parse("perftest", load("perftest", "perftest241_cuda_server_partial.txt"))
    assert out["role"] == "server"
    assert out["gpudirect"] is True
    assert out["cuda_device"] == 0
    assert out["device"] == "mlx5_0"
    assert out["results"] == [] and out["bw_avg_gbps"] is None
    assert out["ok"] is False and out["error"] == "no bandwidth results were printed"


@pytest.mark.parametrize(
    ("name", "role", "error", "count"),
    [
        ("k8s_rdma_shared_169_no_devices.txt", None, "Did not detect devices", 3),
        ("k8s_rdma_shared_106_no_devices_flat.txt", None, "Did not detect devices", 3),
        ("perftest393_rtr_grh_required_client.txt", None, "Failed to modify QP 122273 to RTR", 4),
        ("perftest132_rdma_cm_client_rts.txt", None, "Failed to modify QP to RTS", 2),
        ("perftest132_rdma_cm_server_read_keys.txt", None, "ethernet_read_keys: Couldn't read remote address", 3),
        ("perftest54_rdma_cm_rejected.txt", None, "RDMA CM event error:", 7),
        ("libfabric5149_client_create_qp.txt", None, "Couldn't get device attributes", 4),
        ("libfabric5149_server_create_qp.txt", "server", "Couldn't get device attributes", 4),
    ],
)
def test_perftest_error_only_runs_are_perftest_output(name: str, role: str | None, error: str, count: int) -> None:
    out = parse("perftest", load("perftest", name))
    assert (out["ok"], out["role"], out["error"], out["results"]) == (False, role, error, [])
    assert len(out["errors"]) == count
    assert (out["test"], out["program"]) == (None, None)  # no header was printed


def test_perftest_rdma_cm_failure_keeps_the_event_and_errno_lines() -> None:
    out = parse("perftest", load("perftest", "perftest54_rdma_cm_rejected.txt"))
    assert out["errors"][1] == "Event: RDMA_CM_EVENT_REJECTED; error: -111."
    assert out["errors"][-1] == "ERRNO: No such file or directory."


def test_perftest_read_server_failing_after_its_header() -> None:
    out = parse("perftest", load("perftest", "sparkrdma31_read_bw_server_read_keys.txt"))
    assert (out["test"], out["program"]) == ("RDMA_Read", "ib_read_bw")
    assert (out["role"], out["device"]) == ("server", "mlx4_0")
    assert out["ok"] is False and out["results"] == []
    assert out["errors"] == [
        "ethernet_read_keys: Couldn't read remote address",
        "Unable to read to socket/rdam_cm",
        "Failed to exchange data between server and clients",
    ]


def test_perftest_send_bw_header_names_the_send_test() -> None:
    out = parse("perftest", load("perftest", "skypilot_nebius_send_bw_client.txt"))
    assert (out["test"], out["program"], out["role"], out["ok"]) == ("Send", "ib_send_bw", "client", True)
    assert out["results"] == [
        {"bytes": 65536, "iterations": 1000, "bw_peak_gbps": 357.12, "bw_avg_gbps": 353.53, "msg_rate_mpps": 0.674308}
    ]


def test_perftest_roce_sweep_client_and_its_server() -> None:
    client = parse("perftest", load("perftest", "cloud_native_stack_roce_client_sweep_gbits.txt"))
    server = parse("perftest", load("perftest", "cloud_native_stack_roce_server_last_row.txt"))
    assert [r["bytes"] for r in client["results"]] == [2**i for i in range(1, 24)]
    assert client["results"][0]["bw_peak_gbps"] == 0.080755
    assert (client["bw_avg_gbps"], server["bw_avg_gbps"]) == (52.52, 52.52)
    assert (client["role"], server["role"], len(server["results"])) == ("client", "server", 1)
    assert client["ok"] and server["ok"]


def test_perftest_cpu_frequency_warning_between_table_header_and_row() -> None:
    out = parse("perftest", load("perftest", "deepops_roce_rdma_cm_cpu_freq_warning.txt"))
    assert out["ok"] is True and out["errors"] == []
    assert out["bw_avg_gbps"] == 92.40
    assert out["warnings"] == [
        "Conflicting CPU frequency values detected: 1200.535000 != 1251.336000. CPU Frequency is not max."
    ]


def test_perftest_rejects_other_text_that_merely_fails() -> None:
    with pytest.raises(ParseError, match="not ib_\\*_bw output"):
        parse("perftest", "rmmod: ERROR: Module mlx_compat is in use by: nvme_core nvme_fabrics\n")


def test_nccl_tests_judges_the_largest_size_not_the_average() -> None:
    out = parse("nccl-tests", load("nccl-tests", "a3mega_16rank_allreduce.txt"))
    assert out["nranks"] == 16
    assert len(out["rows"]) == 31
    assert out["avg_busbw_gbs"] == pytest.approx(70.742)
    assert out["largest"] == {"size_bytes": 8589934592, "busbw_gbs": 338.82}
    big = out["rows"][-1]
    assert (big["oop_algbw_gbs"], big["ip_busbw_gbs"], big["wrong"], big["type"]) == (180.71, 337.35, 0, "float")
    assert out["out_of_bounds"] == 0
    assert out["ok"] is True


def test_nccl_tests_truncated_allgather_is_not_ok() -> None:
    out = parse("nccl-tests", load("nccl-tests", "nccl1435_allgather_partial.txt"))
    assert len(out["rows"]) == 7
    assert out["rows"][0]["type"] == "bfloat16"
    assert out["largest"] == {"size_bytes": 117440512, "busbw_gbs": 119.64}
    assert out["avg_busbw_gbs"] is None
    assert out["ok"] is False
    assert any("did not finish" in w for w in out["warnings"])


def test_nccl_tests_new_header_names_op_and_ranks() -> None:
    out = parse("nccl-tests", load("nccl-tests", "dgx_spark_header_v2_20.txt"))
    assert out["op"] == "all_reduce"
    assert out["nranks"] == 2
    assert [r["size_bytes"] for r in out["rows"]] == [8192, 16384, 32768, 65536]
    assert out["rows"][3]["oop_busbw_gbs"] == 0.96


def test_nccl_tests_rejects_json_that_is_not_a_report() -> None:
    with pytest.raises(ParseError, match="results"):
        parse("nccl-tests", '{"a": 1}')


def test_topo_gpu_nic_affinity_picks_pix() -> None:
    out = parse("nvidia-smi-topo", load("nvidia-smi-topo", "nccl933_8gpu_9nic_partial.txt"))
    assert out["gpus"] == [f"GPU{i}" for i in range(8)]
    assert out["nics"] == [f"NIC{i}" for i in range(9)]
    assert out["matrix"]["GPU0"]["NIC2"] == "PIX"
    assert out["matrix"]["GPU0"]["GPU1"] == "NV8"
    assert out["matrix"]["GPU6"]["NIC5"] == "PIX"
    assert out["gpu_nic_affinity"]["GPU0"] == ["NIC2"]
    assert out["gpu_nic_affinity"]["GPU4"] == ["NIC1"]
    assert "GPU7" not in out["gpu_nic_affinity"] or out["gpu_nic_affinity"]["GPU7"] == []
    assert out["nic_names"] == {}
    assert any("NIC Legend" in w for w in out["warnings"])


def test_topo_with_gpu_numa_id_column() -> None:
    out = parse("nvidia-smi-topo", load("nvidia-smi-topo", "deepep128_pcie_gpus_partial.txt"))
    assert len(out["nics"]) == 10
    assert {g: out["gpu_nic_affinity"][g] for g in ("GPU0", "GPU3", "GPU5")} == {
        "GPU0": ["NIC0"],
        "GPU3": ["NIC3"],
        "GPU5": ["NIC5"],
    }
    assert out["matrix"]["GPU4"]["NIC4"] == "PIX"


def test_topo_old_style_device_named_columns() -> None:
    out = parse("nvidia-smi-topo", load("nvidia-smi-topo", "ucx6327_old_mlx_columns_partial.txt"))
    assert out["nics"] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert out["gpu_nic_affinity"]["GPU0"] == ["mlx5_0"]
    assert out["matrix"]["GPU0"]["GPU3"] == "NV2"


def test_topo_affinity_lists_every_nic_at_the_closest_class() -> None:
    # Structure test on a two-line excerpt of the nccl#933 sample: GPU0 has NODE to NIC0/4/6/8.
    text = load("nvidia-smi-topo", "nccl933_8gpu_9nic_partial.txt").splitlines()
    row = text[1].replace("PIX", "SYS")
    out = parse("nvidia-smi-topo", "\n".join([text[0], row]))
    assert out["gpu_nic_affinity"]["GPU0"] == ["NIC0", "NIC4", "NIC6", "NIC8"]


def test_topo_nic_legend_maps_affinity_to_device_names() -> None:
    out = parse("nvidia-smi-topo", load("nvidia-smi-topo", "stelline_esc8000a_nic_legend.txt"))
    assert out["nic_names"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}
    assert out["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert out["matrix"]["GPU2"]["NIC3"] == "NODE"
    assert out["matrix"]["NIC0"]["NIC1"] == "PIX"
    # No NIC is PIX/PXB/PHB to any GPU here: the closest class is NODE, per NUMA node.
    assert out["gpu_nic_affinity"] == {
        "GPU0": ["mlx5_0", "mlx5_1"],
        "GPU1": ["mlx5_0", "mlx5_1"],
        "GPU2": ["mlx5_2", "mlx5_3"],
        "GPU3": ["mlx5_2", "mlx5_3"],
    }
    assert out["warnings"] == []


def test_nccl_tests_table_without_preamble_and_with_the_inplace_wrong_column_cut() -> None:
    full = parse("nccl-tests", load("nccl-tests", "skypilot_nebius_k8s_table_only.txt"))
    cut = parse("nccl-tests", load("nccl-tests", "skypilot_nebius_vm_inplace_wrong_cut.txt"))
    assert (full["nranks"], len(full["rows"])) == (None, 5)
    assert full["largest"] == {"size_bytes": 8589934592, "busbw_gbs": 467.28}
    # The VM paste lost the in-place #wrong column: the rows still count, the out-of-place #wrong still judges.
    assert len(cut["rows"]) == 5
    assert cut["largest"] == {"size_bytes": 8589934592, "busbw_gbs": 467.79}
    assert [r["wrong"] for r in cut["rows"]] == [0, 0, 0, 0, 0]
    assert cut["rows"][-1]["ip_busbw_gbs"] == 467.61
    assert cut["ok"] is True


def test_nccl_tests_mpirun_tagged_lines() -> None:
    out = parse("nccl-tests", load("nccl-tests", "aws_k8s_tester503_mpirun_tagged_excerpt.txt"))
    assert [r["size_bytes"] for r in out["rows"]] == [8, 16, 32]
    assert out["rows"][2]["oop_algbw_gbs"] == 0.00 and out["rows"][2]["wrong"] == 0
    assert out["ok"] is False  # the excerpt ends before 'Avg bus bandwidth'


@pytest.mark.parametrize(
    ("name", "error", "nranks"),
    [
        ("nccl_tests5_nccl1_header_failure.txt", "NCCL failure all_reduce.cu:95 'unhandled cuda error'", 8),
        (
            "rccl_tests50_internal_error.txt",
            "sharbox-ultra: Test NCCL failure common.cu:1285 'internal error - please report this issue to the NCCL "
            "developers'",
            4,
        ),
        (
            "nccl_tests280_failure_lines_only.txt",
            "c2211f46f318: Test NCCL failure common.cu:1005 'unhandled CUDA error'",
            None,
        ),
    ],
)
def test_nccl_tests_failure_before_any_row_is_a_failed_run(name: str, error: str, nranks: int | None) -> None:
    out = parse("nccl-tests", load("nccl-tests", name))
    assert (out["ok"], out["rows"], out["largest"], out["nranks"]) == (False, [], None, nranks)
    assert out["errors"][0] == error


def test_nccl_tests_old_error_column_tables() -> None:
    roce = parse("nccl-tests", load("nccl-tests", "deepops_roce_k8s_error_column.txt"))
    hdr = parse("nccl-tests", load("nccl-tests", "deepops_network_operator_dgx_a100_hdr.txt"))
    assert (len(roce["rows"]), roce["avg_busbw_gbs"], roce["largest"]["busbw_gbs"]) == (29, 7.76739, 22.92)
    assert (len(hdr["rows"]), hdr["avg_busbw_gbs"], hdr["largest"]["busbw_gbs"]) == (30, 53.7098, 188.53)
    assert all(r["wrong"] is None for r in roce["rows"] + hdr["rows"])  # 'error' is a float residue, not a count
    assert roce["ok"] and hdr["ok"]


def test_nccl_tests_broadcast_with_root_and_error_columns() -> None:
    out = parse("nccl-tests", load("nccl-tests", "nccl_tests82_broadcast_error_column_excerpt.txt"))
    (row,) = out["rows"]
    assert (row["size_bytes"], row["type"], row["oop_algbw_gbs"], row["ip_algbw_gbs"]) == (8, "float", 0.0, 0.0)
    assert out["nranks"] == 2 and out["ok"] is False


def test_nccl_tests_alltoall_na_wrong_and_zero_average() -> None:
    out = parse("nccl-tests", load("nccl-tests", "nccl_tests287_alltoall_inplace_na.txt"))
    (row,) = out["rows"]
    assert (row["size_bytes"], row["oop_algbw_gbs"], row["ip_algbw_gbs"]) == (33554432, 1715.44, 43046.10)
    assert row["wrong"] == 0  # the in-place #wrong is N/A
    assert (out["avg_busbw_gbs"], out["out_of_bounds"], out["nranks"]) == (0.0, 0, 1)


def test_topo_two_gpus_no_nic_tab_separated() -> None:
    out = parse("nvidia-smi-topo", load("nvidia-smi-topo", "club3090_1229_two_gpu_phb_tabs.txt"))
    assert (out["gpus"], out["nics"]) == (["GPU0", "GPU1"], [])
    assert out["matrix"] == {"GPU0": {"GPU0": "X", "GPU1": "PHB"}, "GPU1": {"GPU0": "PHB", "GPU1": "X"}}
    assert out["gpu_nic_affinity"] == {"GPU0": [], "GPU1": []}


def test_topo_one_pix_nic_per_gpu_across_three_numa_nodes() -> None:
    out = parse("nvidia-smi-topo", load("nvidia-smi-topo", "sglang13973_nv18_three_numa_partial.txt"))
    assert len(out["nics"]) == 9
    assert {g: out["gpu_nic_affinity"][g] for g in ("GPU0", "GPU3", "GPU5")} == {
        "GPU0": ["NIC0"],
        "GPU3": ["NIC4"],
        "GPU5": ["NIC6"],
    }
    assert "GPU6" not in out["matrix"]  # the excerpt ends at GPU5


def test_topo_mp_pcie_only_matrix() -> None:
    out = parse("nvidia-smi-topo", load("nvidia-smi-topo", "deepep60_topo_mp_14_nics_partial.txt"))
    assert len(out["nics"]) == 14
    assert out["matrix"]["GPU0"]["GPU1"] == "NODE" and out["matrix"]["GPU0"]["GPU4"] == "SYS"
    assert out["gpu_nic_affinity"]["GPU3"] == ["NIC7"]


@pytest.mark.parametrize(
    ("name", "gpu0", "gpu2"),
    [
        ("nccl2157_18_nics_pxb_header_unindented_partial.txt", ["NIC5", "NIC6", "NIC7", "NIC8"],
         ["NIC1", "NIC2", "NIC3", "NIC4"]),
        ("deepep145_18_nics_pxb_partial.txt", ["NIC0", "NIC1", "NIC2", "NIC3"], ["NIC6", "NIC7", "NIC8", "NIC9"]),
    ],
)
def test_topo_18_nics_four_pxb_per_gpu(name: str, gpu0: list[str], gpu2: list[str]) -> None:
    out = parse("nvidia-smi-topo", load("nvidia-smi-topo", name))
    assert len(out["nics"]) == 18 and len(out["gpus"]) == 8
    assert (out["gpu_nic_affinity"]["GPU0"], out["gpu_nic_affinity"]["GPU2"]) == (gpu0, gpu2)
