"""ibstat, ibstatus, iblinkinfo, ibdev2netdev and sminfo on real captured outputs."""

from __future__ import annotations

import pytest

from provisioner.errors import ParseError
from provisioner.parsers import parse
from tests.unit._parser_fixtures import grep, load


def test_ibstat_initializing_port_without_ca_type() -> None:
    out = parse("ibstat", load("ibstat", "mesa_cx4_initializing.txt"))
    (dev,) = out["devices"]
    assert dev["name"] == "mlx5_0"
    assert dev["ca_type"] is None
    assert dev["firmware"] == "12.20.1010"
    assert dev["node_guid"] == "0x248a07030049aee0"
    (port,) = dev["ports"]
    assert port == {
        "port": 1,
        "state": "init",
        "physical_state": "linkup",
        "rate_gbps": 100.0,
        "base_lid": 65535,
        "sm_lid": 0,
        "port_guid": "0x248a07030049aee0",
        "link_layer": "infiniband",
    }
    assert any("no subnet manager" in w for w in out["warnings"])
    assert out["errors"] == []


def test_ibstat_unindented_paste_parses_the_same() -> None:
    out = parse("ibstat", load("ibstat", "azhpc_unindented_initializing.txt"))
    (dev,) = out["devices"]
    assert (dev["name"], dev["ca_type"], dev["num_ports"]) == ("mlx5_ib0", "MT4124", 1)
    (port,) = dev["ports"]
    assert port["state"] == "init"
    assert port["rate_gbps"] == 200.0
    assert port["sm_lid"] == 361
    assert port["port_guid"] == "0x00155dfffd34072b"


def test_ibstat_ibpanic_midway_keeps_parsed_devices() -> None:
    out = parse("ibstat", load("ibstat", "gpud_ibpanic_midway.txt"))
    (dev,) = out["devices"]
    assert dev["name"] == "mlx5_7"
    assert dev["node_guid"] is None  # the sample has '...' placeholders
    assert dev["ports"][0]["state"] == "active"
    assert dev["ports"][0]["rate_gbps"] == 200.0
    assert dev["ports"][0]["base_lid"] == 13305
    assert len(out["errors"]) == 1
    assert "mlx5_8" in out["errors"][0] and out["errors"][0].startswith("ibpanic:")


def test_ibstat_ibpanic_only_is_ibstat_output_with_an_error() -> None:
    out = parse("ibstat", load("ibstat", "azhpc_ibpanic_only.txt"))
    assert out["devices"] == []
    assert out["errors"] == ["ibpanic: [8371] main: stat of IB device 'mlx5_an0' failed: No such file or directory"]


def test_ibstat_down_port_rate_is_flagged_as_placeholder() -> None:
    out = parse("ibstat", load("ibstat", "rdma_core_pr847_down_placeholder_rate.txt"))
    (dev,) = out["devices"]
    assert dev["ca_type"] == "MT4099" and dev["num_ports"] == 2
    p1, p2 = dev["ports"]
    assert (p1["state"], p1["physical_state"], p1["rate_gbps"]) == ("down", "disabled", 10.0)
    assert (p2["state"], p2["physical_state"], p2["rate_gbps"]) == ("active", "linkup", 56.0)
    assert p2["base_lid"] is None  # the published excerpt ends at 'Base lid:'
    assert any("mlx4_0 port 1" in w and "placeholder" in w for w in out["warnings"])
    assert len([e for e in out["errors"] if e.startswith("ibwarn:")]) == 4


def test_ibstat_roce_ports_and_a_down_port() -> None:
    out = parse("ibstat", load("ibstat", "mooncake_roce_and_down.txt"))
    names = [d["name"] for d in out["devices"]]
    assert names == ["mlx5_0", "mlx5_1", "mlx5_10"]
    assert out["devices"][0]["ports"][0]["link_layer"] == "ethernet"
    assert out["devices"][1]["node_guid"] == "0x58a2e10300dae627"
    last = out["devices"][2]["ports"][0]
    assert (last["state"], last["physical_state"], last["rate_gbps"]) == ("down", "disabled", None)


def test_ibstatus_mixed_roce_ib_and_a_down_port() -> None:
    out = parse("ibstatus", load("ibstatus", "hubutui_nccl_notes_mixed_down.txt"))
    assert [p["device"] for p in out["ports"]] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert out["ports"][1] == {
        "device": "mlx5_1",
        "port": 1,
        "state": "active",
        "physical_state": "linkup",
        "rate_gbps": 200.0,
        "width": "4X",
        "speed": "HDR",
        "link_layer": "infiniband",
    }
    roce = out["ports"][0]
    assert (roce["link_layer"], roce["rate_gbps"], roce["speed"]) == ("ethernet", 100.0, "EDR")
    down = out["ports"][2]
    assert (down["state"], down["physical_state"], down["rate_gbps"]) == ("down", "disabled", 100.0)
    assert out["warnings"] == [
        "mlx5_0 port 1: Ethernet (RoCE) port: '4X EDR' is the kernel's InfiniBand wording for 100 Gb/s, "
        "not an InfiniBand link",
        "mlx5_2 port 1: port is Down, rate 100 is a placeholder",
    ]


def test_iblinkinfo_switch_and_ca_ports() -> None:
    out = parse("iblinkinfo", load("iblinkinfo", "linpack_edr_sb7700.txt"))
    links = out["links"]
    assert len(links) == 2 + 18
    ca = links[0]
    assert ca["switch"] == "n02 HCA-1"
    assert (ca["port"], ca["peer"], ca["peer_port"]) == (1, "MF0;SB7700:MSB7700/U1", 17)
    assert (ca["width"], ca["lane_speed_gbps"], ca["rate_gbps"]) == ("4X", 25.78125, 100.0)
    down = [lk for lk in links if lk["state"] == "down"]
    assert len(down) == 16
    assert all(lk["physical_state"] == "polling" and lk["peer"] is None and lk["rate_gbps"] is None for lk in down)
    sw18 = links[-1]
    assert (sw18["switch"], sw18["port"], sw18["peer"], sw18["peer_port"]) == (
        "MF0;SB7700:MSB7700/U1",
        18,
        "n01 HCA-1",
        1,
    )


def test_iblinkinfo_hdr_lane_speed_maps_to_200() -> None:
    out = parse("iblinkinfo", load("iblinkinfo", "nccltests71_hdr_edr_mix.txt"))
    agg = next(lk for lk in out["links"] if lk["switch"] == "Mellanox Technologies Aggregation Node")
    assert (agg["lane_speed_gbps"], agg["rate_gbps"], agg["peer_port"]) == (53.125, 200.0, 41)
    assert len(out["links"]) == 8


def test_ibdev2netdev_plain_and_column_t() -> None:
    plain = parse("ibdev2netdev", load("ibdev2netdev", "daocloud_roce_up.txt"))
    assert plain["mappings"] == [
        {"device": "mlx5_0", "port": 1, "netdev": "enp4s0f0np0", "netdev_up": True, "pci": None},
        {"device": "mlx5_1", "port": 1, "netdev": "enp4s0f1np1", "netdev_up": True, "pci": None},
    ]
    wide = parse("ibdev2netdev", load("ibdev2netdev", "imbue_h100_column_t.txt"))
    assert len(wide["mappings"]) == 12
    by_dev = {m["device"]: m for m in wide["mappings"]}
    assert by_dev["mlx5_0"] == {"device": "mlx5_0", "port": 1, "netdev": "ibp26s0", "netdev_up": False, "pci": None}
    assert by_dev["mlx5_7"]["netdev_up"] is True


def test_ibdev2netdev_down_netdev_matches_the_down_ibstatus_port() -> None:
    out = parse("ibdev2netdev", load("ibdev2netdev", "hubutui_nccl_notes_one_down.txt"))
    assert [(m["device"], m["netdev"], m["netdev_up"]) for m in out["mappings"]] == [
        ("mlx5_0", "ens13np0", True),
        ("mlx5_1", "ib0", True),
        ("mlx5_2", "ens17np0", False),
        ("mlx5_3", "ib1", True),
    ]


def test_ibdev2netdev_verbose_form() -> None:
    out = parse("ibdev2netdev", load("ibdev2netdev", "openshift_docs_verbose_bf3.txt"))
    assert out["mappings"] == [
        {"device": "mlx5_0", "port": 1, "netdev": "ibs2f0", "netdev_up": True, "pci": "0000:0d:00.0"},
        {"device": "mlx5_1", "port": 1, "netdev": "ens8f0np0", "netdev_up": True, "pci": "0000:a0:00.0"},
    ]


@pytest.mark.parametrize(
    ("name", "lid", "guid", "activity", "priority"),
    [
        ("bda_master_prio14.txt", 15, "0x0010e0406d5aa0a0", 26263191, 14),
        ("ompi_list_wrapped.txt", 2, "0x0002c90200259201", 6881, 0),
    ],
)
def test_sminfo(name: str, lid: int, guid: str, activity: int, priority: int) -> None:
    out = parse("sminfo", load("sminfo", name))
    assert (out["lid"], out["guid"], out["activity_count"], out["priority"], out["state"]) == (
        lid,
        guid,
        activity,
        priority,
        "master",
    )


def test_ibstat_rejects_ibstatus_output() -> None:
    with pytest.raises(ParseError, match="not ibstat output"):
        parse("ibstat", load("ibstatus", "hubutui_nccl_notes_mixed_down.txt"))


def test_ibstat_gpud_ibpanic_after_eight_space_indented_cas() -> None:
    out = parse("ibstat", load("ibstat", "gpud_testdata_a100_ibpanic_after_8.txt"))
    assert [d["name"] for d in out["devices"]] == [f"mlx5_{i}" for i in range(8)]
    assert {p["rate_gbps"] for d in out["devices"] for p in d["ports"]} == {200.0}
    assert out["errors"] == ["ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory"]


def test_ibstat_gpud_roce_ports_down_with_placeholder_rate() -> None:
    out = parse("ibstat", load("ibstat", "gpud_testdata_h100_polling_disabled.txt"))
    down = {d["name"]: (p["state"], p["physical_state"], p["rate_gbps"]) for d in out["devices"] for p in d["ports"]
            if p["state"] == "down"}
    assert down == {"mlx5_11": ("down", "polling", 40.0), "mlx5_5": ("down", "disabled", 40.0)}
    assert {p["link_layer"] for d in out["devices"] for p in d["ports"]} == {"ethernet"}
    assert sum("placeholder" in w for w in out["warnings"]) == 2


def test_ibstat_gpud_mixed_ib_and_ethernet() -> None:
    out = parse("ibstat", load("ibstat", "gpud_testdata_h100_some_down.txt"))
    layers = {d["name"]: d["ports"][0]["link_layer"] for d in out["devices"]}
    assert sum(v == "infiniband" for v in layers.values()) == 8
    assert [d["name"] for d in out["devices"] if d["ports"][0]["state"] == "down"] == ["mlx5_2", "mlx5_7", "mlx5_8"]
    active = parse("ibstat", load("ibstat", "gpud_testdata_a100_all_active.txt"))
    assert len(active["devices"]) == 9 and active["warnings"] == []
    roce = parse("ibstat", load("ibstat", "gpud_testdata_h100_all_active.txt"))
    assert {d["ports"][0]["rate_gbps"] for d in roce["devices"]} == {400.0, 100.0}


def test_ibstatus_old_format_without_link_layer() -> None:
    out = parse("ibstatus", load("ibstatus", "ompi_users_24833_ddr_init_no_link_layer.txt"))
    assert [(p["port"], p["state"], p["physical_state"], p["speed"], p["link_layer"]) for p in out["ports"]] == [
        (1, "active", "linkup", "DDR", None),
        (2, "init", "linkup", "DDR", None),
    ]


def test_ibstatus_training_port_and_a_block_cut_short() -> None:
    out = parse("ibstatus", load("ibstatus", "ompi_users_24855_training_partial.txt"))
    p1, p2 = out["ports"]
    assert (p1["state"], p1["physical_state"], p1["rate_gbps"], p1["width"], p1["speed"]) == (
        "down", "training", 10.0, "4X", None)
    assert (p2["device"], p2["port"], p2["state"], p2["rate_gbps"]) == ("mlx4_0", 2, None, None)
    assert out["warnings"] == ["mlx4_0 port 1: port is Down, rate 10 is a placeholder"]


def test_ibstatus_tabs_and_a_nine_port_host() -> None:
    fdr = parse("ibstatus", load("ibstatus", "heioy_books_cx3_fdr_tabs.txt"))
    assert [(p["rate_gbps"], p["speed"]) for p in fdr["ports"]] == [(56.0, "FDR"), (56.0, "FDR")]
    a100 = parse("ibstatus", load("ibstatus", "gpud_testdata_a100_hdr_nine_ports.txt"))
    assert len(a100["ports"]) == 9
    assert sum(p["speed"] == "HDR" and p["link_layer"] == "infiniband" for p in a100["ports"]) == 8


def test_ibstatus_through_grep_state_and_rate_lines_only() -> None:
    real = load("ibstatus", "gpud_testdata_a100_hdr_nine_ports.txt")
    out = parse("ibstatus", grep(real, r"^\s+(state|rate):"))
    assert len(out["ports"]) == 9
    assert all(p["device"] is None and p["state"] == "active" for p in out["ports"])
    assert [p["rate_gbps"] for p in out["ports"]].count(200.0) == 8
    assert any("unnamed" in w for w in out["warnings"])


def test_ibstatus_through_grep_after_context_keeps_the_device_names() -> None:
    real = load("ibstatus", "hubutui_nccl_notes_mixed_down.txt")
    filtered = grep(real, "Infiniband device", after=1)
    assert "--" in filtered.splitlines()
    out = parse("ibstatus", filtered)
    assert [p["device"] for p in out["ports"]] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert all(p["state"] is None for p in out["ports"])
    down = parse("ibstatus", grep(real, "state:"))
    assert [p["state"] for p in down["ports"]] == ["active", "active", "down", "active"]


def test_ibstatus_rejects_key_lines_that_read_as_nothing() -> None:
    with pytest.raises(ParseError, match="ibstatus"):
        parse("ibstatus", "state: fine\nrate: fast\n")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cloud_native_stack_one_down.txt", [("mlx5_0", "ens192f0", True), ("mlx5_1", "ens192f1", False)]),
        ("nvidia_cloud_native_docs_rst_indented.txt", [("mlx5_0", "ens64np1", True)]),
        ("sriov_operator382_vf_in_pod_down.txt", [("mlx5_3", "net1", False)]),
        ("heioy_mlx4_dual_port_ipoib.txt", [("mlx4_0", "ib0", True), ("mlx4_0", "ib1", True)]),
    ],
)
def test_ibdev2netdev_more_real_listings(name: str, expected: list[tuple[str, str, bool]]) -> None:
    out = parse("ibdev2netdev", load("ibdev2netdev", name))
    assert [(m["device"], m["netdev"], m["netdev_up"]) for m in out["mappings"]] == expected


def test_ibdev2netdev_two_ports_of_one_device_stay_apart() -> None:
    out = parse("ibdev2netdev", load("ibdev2netdev", "heioy_mlx4_dual_port_ipoib.txt"))
    assert [(m["device"], m["port"]) for m in out["mappings"]] == [("mlx4_0", 1), ("mlx4_0", 2)]


def test_ibdev2netdev_vfs_keep_their_netdev_names() -> None:
    out = parse("ibdev2netdev", load("ibdev2netdev", "openshift_sriov635_vfs_excerpt.txt"))
    assert len(out["mappings"]) == 16
    assert out["mappings"][0] == {"device": "mlx5_19", "port": 1, "netdev": "ibp75s0v7", "netdev_up": False,
                                  "pci": None}
    assert [m["device"] for m in out["mappings"] if m["netdev_up"]] == ["mlx5_2", "mlx5_4", "mlx5_6"]


def test_iblinkinfo_qdr_snippet_with_elisions() -> None:
    out = parse("iblinkinfo", load("iblinkinfo", "legoos_readme_qdr_snippet.txt"))
    assert [(lk["switch"], lk["peer_port"], lk["lane_speed_gbps"], lk["rate_gbps"]) for lk in out["links"]] == [
        ("wuklab00 mlx4_0", 1, 10.0, 40.0),
        ("wuklab01 mlx4_0", 2, 10.0, 40.0),
        ("wuklab02 mlx4_0", 3, 10.0, 40.0),
    ]
    assert {lk["peer"] for lk in out["links"]} == {"MF0;wuklab-ibsw:IS5035/U1"}
