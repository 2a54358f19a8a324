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
    assert (out["flavor"], out["family"], out["version"]) == ("MLNX_OFED_LINUX", "mlnx_ofed", version)
    assert out["form"] == "short"


@pytest.mark.parametrize(
    ("name", "version"),
    [("openshift_docs_doca_24_07.txt", "24.07-0.6.1"), ("lshca102_internal_5_field.txt", "24.07-0.3.5.0.110")],
)
def test_ofed_info_doca_form(name: str, version: str) -> None:
    out = parse("ofed_info", load("ofed_info", name))
    assert (out["flavor"], out["family"], out["version"]) == ("OFED-internal", "doca_ofed", version)


def test_ofed_info_full_listing_indented_as_published() -> None:
    out = parse("ofed_info", load("ofed_info", "daocloud_full_23_10_indented_excerpt.txt"))
    assert (out["flavor"], out["version"], out["base"], out["form"]) == (
        "MLNX_OFED_LINUX",
        "23.10-1.1.9.0",
        "OFED-23.10-1.1.9",
        "full",
    )


def test_ofed_info_full_listing_through_grep_with_a_dated_base() -> None:
    out = parse("ofed_info", load("ofed_info", "ompi_users_15760_grep_ofed_1_5_2.txt"))
    assert (out["version"], out["base"], out["form"]) == ("1.5.2-1.0.0", "OFED-1.5.2-20101020-1520", "full")


def test_ofed_info_dash_n_has_a_version_and_no_flavour() -> None:
    out = parse("ofed_info", load("ofed_info", "nv_peer_memory79_dash_n.txt"))
    assert (out["flavor"], out["family"], out["version"], out["form"]) == (None, None, "5.0-2.1.8", "number")
    assert out["warnings"]


def test_ofed_info_doca_line_without_its_colon() -> None:
    line = load("ofed_info", "openshift_docs_doca_24_07.txt").strip().rstrip(":")
    assert line == "OFED-internal-24.07-0.6.1"
    out = parse("ofed_info", line + "\n")
    assert (out["flavor"], out["version"]) == ("OFED-internal", "24.07-0.6.1")
    assert any("no trailing ':'" in w for w in out["warnings"])


def test_ofed_info_rejects_a_bare_number_among_other_lines() -> None:
    with pytest.raises(ParseError, match="ofed_info"):
        parse("ofed_info", "5.0-2.1.8\n4.4.0-131-generic\n")


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


@pytest.mark.parametrize("name", ["docker_qnibng_generated_full.txt", "el6_opensm_3_3_9_package_default.txt"])
def test_opensm_conf_generated_file_null_engine_is_unset(name: str) -> None:
    out = parse("opensm-conf", load("opensm-conf", name))
    assert out["options"]["routing_engine"] == "(null)"
    assert out["routing_engines"] == [] and out["adaptive_routing"] is False
    assert out["warnings"] == ["routing_engine not set: opensm uses minhop"]
    assert out["options"]["sm_priority"] == "0" and out["options"]["log_file"] == "/var/log/opensm.log"


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("ib_pkey_setup_allow_both_pkeys.txt", {"allow_both_pkeys": "TRUE"}),
        ("ibv_message_passing_qos_only.txt", {"qos_high_limit": "255",
                                              "qos_vlarb_high": "0:255,0:255,0:255,0:255,0:255,0:255,0:255,0:255",
                                              "qos_vlarb_low": "1:128,1:128,1:128,1:128,1:128,1:128,2:64,2:64"}),
    ],
)
def test_opensm_conf_site_files_with_one_kind_of_option(name: str, options: dict[str, str]) -> None:
    assert parse("opensm-conf", load("opensm-conf", name))["options"] == options


def test_opensm_conf_rejects_an_upstart_job() -> None:
    with pytest.raises(ParseError, match=r"opensm\.conf"):
        parse("opensm-conf", 'description "opensm - subnet manager"\n\nstart on filesystem\n')


def test_opensm_conf_ar_engine_list() -> None:
    text = load("opensm-conf", "scinet10_routing_excerpt.txt").replace(
        "routing_engine minhop", "routing_engine ar_updn,updn"
    )
    out = parse("opensm-conf", text)
    assert out["routing_engines"] == ["ar_updn", "updn"]
    assert out["adaptive_routing"] is True


@pytest.mark.parametrize(
    ("name", "modules"),
    [
        ("nvidia_cloud_native_docs_grep_nvidia_gds.txt",
         ["nvidia_fs", "nvidia_peermem", "nvidia_modeset", "nvidia_uvm", "nvidia", "ib_core", "drm"]),
        ("gpud39_peermem_yaml_indented.txt", ["nvidia_peermem", "ib_core", "nvidia"]),
        ("cloud_native_stack_v4_grep_nv_peer_mem.txt", ["nv_peer_mem", "ib_core", "nvidia"]),
        ("deepops_slurm_grep_nv_one_line.txt", ["nv_peer_mem"]),
    ],
)
def test_lsmod_through_grep_has_no_header_and_is_not_complete(name: str, modules: list[str]) -> None:
    out = parse("lsmod", load("lsmod", name))
    assert list(out["modules"]) == modules
    assert out["complete"] is False
    assert any("no 'Module Size Used by' header" in w for w in out["warnings"])


def test_lsmod_grep_keeps_the_users_of_ib_core() -> None:
    out = parse("lsmod", load("lsmod", "nvidia_cloud_native_docs_grep_nvidia_gds.txt"))
    assert out["modules"]["ib_core"]["used_by"][2] == "nvidia_peermem"
    assert out["modules"]["nvidia"] == {"size": 39059456, "used_by_count": 115,
                                        "used_by": ["nvidia_uvm", "nvidia_peermem", "nvidia_modeset"]}


@pytest.mark.parametrize(
    ("name", "count"), [("rxe_dev75_soft_roce_full.txt", 7), ("moongen295_full_no_rdma_excerpt.txt", 32)]
)
def test_lsmod_full_listings_are_complete(name: str, count: int) -> None:
    out = parse("lsmod", load("lsmod", name))
    assert (len(out["modules"]), out["complete"], out["warnings"]) == (count, True, [])


def test_lsmod_rejects_headerless_text_with_a_line_that_is_no_module_row() -> None:
    with pytest.raises(ParseError, match="line 2 is not a 'module size count"):
        parse("lsmod", "nv_peer_mem            13163  0\nsomething else\n")
