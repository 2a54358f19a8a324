"""perftest, nccl-tests and nvidia-smi topo -m on real captured outputs."""

from __future__ import annotations

import json

import pytest

from provisioner.errors import ParseError
from provisioner.parsers import parse
from provisioner.parsers.perftest import MIB_PER_S_TO_GBPS
from tests.unit._parser_fixtures import load


def test_perftest_mib_columns_are_converted_to_gbps() -> None:
    out = parse("perftest", load("perftest", "cn_notes_send_bw_ud_client.txt"))
    assert (out["test"], out["device"], out["role"], out["ok"]) == ("ib_send_bw", "mlx4_0", "client", True)
    assert out["gpudirect"] is False and out["cuda_device"] is None
    assert [r["bytes"] for r in out["results"]] == [2**i for i in range(1, 13)]
    last = out["results"][-1]
    assert last["iterations"] == 1000
    assert last["bw_avg_gbps"] == pytest.approx(3018.58 * MIB_PER_S_TO_GBPS)
    assert last["bw_avg_gbps"] == pytest.approx(25.32, abs=0.01)
    assert last["msg_rate_mpps"] == pytest.approx(0.772757)
    assert out["bw_avg_gbps"] == last["bw_avg_gbps"]


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


def test_nccl_tests_json_shape_from_writer_source() -> None:
    # Not a captured file: a minimal document with the key layout nccl-tests' src/util.cu writes
    # (no public -J capture was found); values are placeholders, only the structure is tested.
    doc = {
        "version": 2,
        "args": ["./build/all_reduce_perf", "-J", "x.json"],
        "config": {"devices": [{"rank": 0}, {"rank": 1}]},
        "results": [
            {
                "size": 1,
                "count": 1,
                "type": "float",
                "redop": "sum",
                "root": "    -1",
                "out_of_place": {"time": 1.0, "alg_bw": 1.0, "bus_bw": 2.0, "nwrong": 0.0},
                "in_place": {"time": 1.0, "alg_bw": 1.0, "bus_bw": 3.0, "nwrong": 0.0},
            },
            {
                "size": 2,
                "count": 1,
                "type": "float",
                "redop": "sum",
                "root": "    -1",
                "out_of_place": {"time": 1.0, "alg_bw": 1.0, "bus_bw": 4.0, "nwrong": 1.0},
                "in_place": {"time": 1.0, "alg_bw": 1.0, "bus_bw": 5.0, "nwrong": None},
            },
        ],
        "out_of_bounds": {"count": 1, "okay": "false"},
        "average_bus_bandwidth": {"bandwidth": 3.0, "okay": "unchecked"},
        "errors": [],
    }
    out = parse("nccl-tests", json.dumps(doc))
    assert (out["format"], out["op"], out["nranks"]) == ("json", "all_reduce", 2)
    assert out["largest"] == {"size_bytes": 2, "busbw_gbs": 4.0}
    assert out["rows"][1]["wrong"] == 1
    assert out["ok"] is False


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
