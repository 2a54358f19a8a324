"""ibnetdiscover on the example output published in rdma-core's man page, and on real fabric captures."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.errors import ParseError
from provisioner.parsers import parse
from tests.unit._parser_fixtures import load

ISR = "0x005442ba00003080"
SW6 = "0x0008f10400410015"


@pytest.fixture(scope="module")
def topo() -> dict[str, Any]:
    return parse("ibnetdiscover", load("ibnetdiscover", "rdma_core_man_voltaire_sdr.txt"))


def test_switches_and_cas_with_descriptions(topo: dict[str, Any]) -> None:
    assert topo["switches"] == [
        {"guid": ISR, "name": "ISR9024 Voltaire", "num_ports": 24, "ports": [22, 10, 8, 6, 12], "lid": 6},
        {"guid": SW6, "name": "SW-6IB4 Voltaire", "num_ports": 8, "ports": [6, 4, 1, 3], "lid": 3},
    ]
    assert [c["guid"] for c in topo["cas"]] == [
        "0x0008f10403960984",
        "0x005442b100004900",
        "0x0008f10403961354",
        "0x0008f10403960558",
    ]
    assert {c["name"] for c in topo["cas"]} == {"MT23108 InfiniHost Mellanox Technologies"}
    assert all(c["num_ports"] == 2 for c in topo["cas"])


def test_each_link_is_reported_once(topo: dict[str, Any]) -> None:
    links = topo["links"]
    assert len(links) == 7
    pairs = {frozenset({(lk["from_guid"], lk["from_port"]), (lk["to_guid"], lk["to_port"])}) for lk in links}
    assert len(pairs) == 7
    isl = [lk for lk in links if {lk["from_guid"], lk["to_guid"]} == {ISR, SW6}]
    assert sorted((lk["from_port"], lk["to_port"]) for lk in isl) == [(6, 3), (10, 1)]


def test_link_record_shape(topo: dict[str, Any]) -> None:
    first = topo["links"][0]
    assert first == {
        "from_guid": ISR,
        "from_name": "ISR9024 Voltaire",
        "from_port": 22,
        "to_guid": "0x0008f10403961354",
        "to_name": "MT23108 InfiniHost Mellanox Technologies",
        "to_port": 1,
        "width": "4X",
        "speed": "SDR",
        "rate_gbps": 10.0,
    }


def test_narrow_links_keep_the_narrower_end_and_warn(topo: dict[str, Any]) -> None:
    by_port = {(lk["from_guid"], lk["from_port"]): lk for lk in topo["links"]}
    assert (by_port[(ISR, 10)]["width"], by_port[(ISR, 10)]["rate_gbps"]) == ("1X", 2.5)
    assert (by_port[(ISR, 12)]["width"], by_port[(ISR, 12)]["rate_gbps"]) == ("1X", 2.5)
    warnings = topo["warnings"]
    assert len([w for w in warnings if "far end" in w]) == 2
    assert len([w for w in warnings if "narrower than the fabric's 4X" in w]) == 2
    assert topo["errors"] == []


def test_rejects_iblinkinfo_output() -> None:
    with pytest.raises(ParseError, match="ibnetdiscover"):
        parse("ibnetdiscover", load("iblinkinfo", "linpack_edr_sb7700.txt"))


def _hk(name: str) -> dict[str, Any]:
    return parse("ibnetdiscover", load("ibnetdiscover", f"hyungkwang_{name}.txt"))


def test_crlf_capture_with_a_self_cabled_switch_and_sdr_trained_cas() -> None:
    text = load("ibnetdiscover", "hyungkwang_hdr_quantum_2019_crlf.txt")
    assert "\r\n" in text  # saved on Windows: the fixture keeps the bytes
    topo = parse("ibnetdiscover", text)
    assert [(s["lid"], len(s["ports"])) for s in topo["switches"]] == [(10, 21), (0, 40), (42, 21)]
    loop = [lk for lk in topo["links"] if lk["from_guid"] == lk["to_guid"]]
    assert [(lk["from_port"], lk["to_port"]) for lk in loop] == [(19, 20)]  # printed from both ports, kept once
    sdr = sorted((lk["from_name"], lk["to_name"], lk["rate_gbps"]) for lk in topo["links"] if lk["speed"] == "SDR")
    assert sdr == [
        ("Quantum Mellanox Technologies", "fit26 HCA-3", 10.0),
        ("fit101 HCA-1", "Quantum Mellanox Technologies", 10.0),
    ]
    assert [c["name"] for c in topo["cas"]] == ["fit101 HCA-1", "fit26 HCA-3"]


def test_terminal_paste_with_prompt_line_bom_and_spaces_for_tabs() -> None:
    topo = _hk("dgx_a100_qm8790_prompt")
    assert [(s["name"], s["lid"], s["num_ports"], len(s["ports"])) for s in topo["switches"]] == [
        ("sp69.cn.a0807.qm8790.krskp", 15, 41, 29)
    ]
    assert [c["name"] for c in topo["cas"]] == [
        "Mellanox Technologies Aggregation Node",
        "pg-spd140 mlx5_6",
        "pg-compute-ufm001 HCA-1",
    ]
    assert {lk["speed"] for lk in topo["links"]} == {"HDR"}
    sharp = [lk for lk in topo["links"] if lk["to_name"] == "Mellanox Technologies Aggregation Node"]
    assert [(lk["from_port"], lk["to_port"], lk["rate_gbps"]) for lk in sharp] == [(41, 1, 200.0)]
    assert topo["warnings"] == [] and topo["errors"] == []


def test_edr_director_fabric() -> None:
    topo = _hk("edr_cs7500_2019")
    assert [(s["name"], s["lid"], s["num_ports"]) for s in topo["switches"]] == [
        ("SwitchIB Mellanox Technologies", 1085, 37)
    ]
    assert {(lk["width"], lk["speed"], lk["rate_gbps"]) for lk in topo["links"]} == {("4X", "EDR", 100.0)}
    assert topo["cas"][-1]["name"] == "lassenufm1 HCA-1"


def test_ibdiagnet_written_topology_file() -> None:
    # ibdiagnet writes the same format with "[n](n)" port columns and 8-digit vendid.
    topo = _hk("ibdiagnet_cs8500_hdr")
    assert [(s["guid"], s["lid"]) for s in topo["switches"]] == [
        ("0xb8cef60300617c9a", 784),
        ("0xb8cef6030061787a", 14),
    ]
    by_port = {(lk["from_guid"], lk["from_port"]): lk for lk in topo["links"]}
    first = by_port[("0xb8cef6030061787a", 1)]
    got = (first["to_name"], first["to_port"], first["speed"], first["rate_gbps"])
    assert got == ("st21scr52 HCA-2", 1, "EDR", 100.0)
    assert "MT4123 ConnectX6   Mellanox Technologies" in [c["name"] for c in topo["cas"]]
    # st21scr52 HCA-2's own line is the far end of that link: counted once.
    assert len([lk for lk in topo["links"] if "st21scr52 HCA-2" in (lk["from_name"], lk["to_name"])]) == 1
