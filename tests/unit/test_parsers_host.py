"""ofed_info, lsmod and opensm.conf on real captured outputs."""

from __future__ import annotations

import pytest

from provisioner.errors import ParseError
from provisioner.parsers import parse
from tests.unit._parser_fixtures import load


@pytest.mark.parametrize(
    ("name", "version"),
    [("daocloud_mlnx_23_07.txt", "23.07-0.5.1.2"), ("ucx6327_mlnx_5_2.txt", "5.2-2.2.0.0")],
)
def test_ofed_info_mlnx(name: str, version: str) -> None:
    out = parse("ofed_info", load("ofed_info", name))
    assert (out["flavor"], out["version"]) == ("mlnx_ofed", version)


def test_ofed_info_doca_form() -> None:
    out = parse("ofed_info", load("ofed_info", "openshift_docs_doca_24_07.txt"))
    assert (out["flavor"], out["version"]) == ("doca_ofed", "24.07-0.6.1")


def test_lsmod_modules_and_users() -> None:
    out = parse("lsmod", load("lsmod", "mesa_rdma_modules.txt"))
    mods = out["modules"]
    assert len(mods) == 11
    assert mods["ib_core"]["size"] == 356352
    assert mods["ib_core"]["used_by_count"] == 8
    assert mods["ib_core"]["used_by"][0] == "rdma_cm" and len(mods["ib_core"]["used_by"]) == 8
    assert mods["mlx5_ib"] == {"size": 335872, "used_by_count": 0, "used_by": []}
    assert "nvidia_peermem" not in mods


def test_opensm_conf_routing_section() -> None:
    out = parse("opensm-conf", load("opensm-conf", "scinet10_routing_excerpt.txt"))
    assert out["routing_engines"] == ["minhop"]
    assert out["adaptive_routing"] is False
    assert out["options"]["connect_roots"] == "FALSE"


def test_opensm_conf_without_routing_engine_warns() -> None:
    out = parse("opensm-conf", load("opensm-conf", "scinet10_handover_excerpt.txt"))
    assert out["options"]["sm_priority"] == "15"
    assert out["routing_engines"] == []
    assert out["warnings"] == ["routing_engine not set: opensm uses minhop"]


def test_opensm_conf_ar_engine_list() -> None:
    text = load("opensm-conf", "scinet10_routing_excerpt.txt").replace(
        "routing_engine minhop", "routing_engine ar_updn,updn"
    )
    out = parse("opensm-conf", text)
    assert out["routing_engines"] == ["ar_updn", "updn"]
    assert out["adaptive_routing"] is True


def test_lsmod_rejects_a_grep_without_header() -> None:
    with pytest.raises(ParseError, match="lsmod"):
        parse("lsmod", "nv_peer_mem            13163  0\n")
