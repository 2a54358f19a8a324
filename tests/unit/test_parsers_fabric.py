"""ibnetdiscover on the example output published in rdma-core's man page."""

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
