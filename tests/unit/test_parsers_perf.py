"""perftest, nccl-tests and nvidia-smi topo -m on real captured outputs."""

from __future__ import annotations

import pytest

from provisioner.errors import ParseError
from provisioner.parsers import parse
from provisioner.parsers.perftest import MIB_PER_S_TO_GBPS
from tests.unit._parser_fixtures import load


def test_perftest_mib_columns_are_converted_to_gbps() -> None:
    out = parse("perftest", load("perftest", "alibaba_amd_rocm_client_mib.txt"))
    assert (out["test"], out["device"], out["role"], out["ok"]) == ("ib_write_bw", "ionic_0", "client", True)
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
    assert (out["test"], out["bidirectional"], out["role"], out["device"]) == ("ib_write_bw", True, "client", "ionic_1")
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
    assert out["test"] == "ib_write_bw" and out["device"] == "ib0"
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
