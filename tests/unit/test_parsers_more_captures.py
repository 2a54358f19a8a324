"""The fields that matter, on the real captures added for issue 15 ("more real captures"): sminfo, iblinkinfo,
ibstatus, opensm.conf, ibnetdiscover and ibqueryerrors, failures and odd forms included (each fixture is headed by
its public source)."""

from __future__ import annotations

import pytest

from provisioner import discover
from provisioner.errors import ParseError
from provisioner.fabric import cabling, sm, switchports
from provisioner.parsers import parse
from provisioner.parsers._common import diag_error_line, iberror_text
from tests.unit._parser_fixtures import load
from tests.unit.test_verify_checks import V100, cluster_from

# ---------------------------------------------------------------- sminfo


@pytest.mark.parametrize(
    ("name", "lid", "guid", "activity", "priority"),
    [
        ("k8s_test_infra373_switch_sm_priority0.txt", 2, "0xfc6a1c030082db00", 1671874, 0),
        ("ncp_ain_ibsim_standby_took_over.txt", 16, "0x0000000000100013", 788, 12),
        ("sysinfo_snapshot_vendor_example.txt", 3, "0x248a0703009c0196", 38526, 15),
    ],
)
def test_sminfo_whole_lines(name: str, lid: int, guid: str, activity: int, priority: int) -> None:
    out = parse("sminfo", load("sminfo", name))
    assert (out["ok"], out["lid"], out["guid"], out["activity_count"], out["priority"], out["state"]) == (
        True, lid, guid, activity, priority, "master")
    assert (out["error"], out["errors"], out["warnings"]) == (None, [], [])
    assert sm.read_sminfo(load("sminfo", name)) == sm.SmInfo(guid, lid, priority, "master", activity)


@pytest.mark.parametrize(
    ("name", "lid", "masked", "activity", "priority"),
    [
        ("fgci_ansible174_guid_redacted.txt", 394, "0x2cGUID", 28713761, 0),
        ("gruuuuu_ocp_sriov_guid_redacted.txt", 1, "0xe89e4903003xxxxx", 6306612, 15),
    ],
)
def test_sminfo_with_the_sm_guid_masked_in_the_paste(
        name: str, lid: int, masked: str, activity: int, priority: int) -> None:
    # Real posts with the GUID masked by their authors: once refused as "not sminfo output", now the line's
    # other fields are read and the GUID is unknown, said in a warning rather than passed on as a GUID.
    out = parse("sminfo", load("sminfo", name))
    assert (out["ok"], out["lid"], out["guid"], out["activity_count"], out["priority"], out["state"]) == (
        True, lid, None, activity, priority, "master")
    assert out["warnings"] == [f"sm guid {masked} is not hex (masked in the paste?): guid unknown"]
    # The role needs the master's GUID: a masked one is refused there, not turned into a made-up GUID.
    with pytest.raises(ParseError, match="no sm lid and guid"):
        sm.read_sminfo(load("sminfo", name))


def test_sminfo_that_could_not_open_the_umad_port_is_a_failed_sminfo_run() -> None:
    out = parse("sminfo", load("sminfo", "slimfly_cscs_umad_port_not_opened.txt"))
    assert out["ok"] is False
    assert out["error"] == "Failed to open '(null)' port '0'"
    assert out["errors"] == ["ibwarn: [55188] mad_rpc_open_port: can't open UMAD port ((null):0)",
                             "sminfo: iberror: failed: Failed to open '(null)' port '0'"]
    assert (out["lid"], out["guid"], out["priority"], out["state"]) == (None, None, None, None)
    with pytest.raises(ParseError, match="sminfo failed: Failed to open"):
        sm.read_sminfo(load("sminfo", "slimfly_cscs_umad_port_not_opened.txt"))
    # Not the "no SM answers" case: the role must show it to the operator, not read it as "no SM yet".
    with pytest.raises(ParseError, match="no known message"):
        sm.sminfo_result(255, "", load("sminfo", "slimfly_cscs_umad_port_not_opened.txt"))


def test_sminfo_through_grep_o_keeps_priority_and_state_only() -> None:
    out = parse("sminfo", load("sminfo", "ncp_ain_ibsim_grep_o_priority.txt"))
    assert (out["ok"], out["priority"], out["state"]) == (True, 14, "master")
    assert (out["lid"], out["guid"], out["activity_count"]) == (None, None, None)
    assert out["warnings"] == [
        "only the end of the sminfo line (filtered output?): sm lid, guid and activity count unknown"]
    with pytest.raises(ParseError, match="no sm lid and guid"):
        sm.read_sminfo(load("sminfo", "ncp_ain_ibsim_grep_o_priority.txt"))


def test_sminfo_rejects_another_tools_failure_and_a_bare_state_word() -> None:
    with pytest.raises(ParseError, match="sminfo"):
        parse("sminfo", load("ibnetdiscover", "infiniband_exporter26_mad_port_not_opened.txt"))
    with pytest.raises(ParseError, match="sminfo"):
        parse("sminfo", "ufm: Other SM is in the fabric: lid:1, guid:0xfc6a1c0300e7ecc0, priority:15, "
                        "state:SMINFO_MASTER, and a very long line of log text around it\n")


# ---------------------------------------------------------------- iblinkinfo


def test_iblinkinfo_two_cas_back_to_back_without_a_switch() -> None:
    out = parse("iblinkinfo", load("iblinkinfo", "archwiki_ddr_back_to_back_no_switch.txt"))
    links = [(lk["switch"], lk["node_type"], lk["port"], lk["peer"], lk["peer_port"]) for lk in out["links"]]
    assert links == [
        ("MT25408 ConnectX Mellanox Technologies", "ca", 1, "kvm mlx4_0", 1),
        ("hostname mlx4_0", "ca", 1, "MT25408 ConnectX Mellanox Technologies", 1),
    ]
    assert {(lk["width"], lk["lane_speed_gbps"], lk["rate_gbps"], lk["state"], lk["physical_state"])
            for lk in out["links"]} == {("4X", 5.0, 20.0, "active", "linkup")}
    assert out["warnings"] == []


def test_iblinkinfo_dual_port_ca_and_ca_block_after_the_switch() -> None:
    out = parse("iblinkinfo", load("iblinkinfo", "cc_rdma_test_qdr_dual_port_ca.txt"))
    cas = [lk for lk in out["links"] if lk["node_type"] == "ca"]
    sw = [lk for lk in out["links"] if lk["node_type"] == "switch"]
    assert len(cas) == 9 and len(sw) == 18
    assert {lk["switch"] for lk in sw} == {"Infiniscale-IV Mellanox Technologies"}
    # teaker-9's second port has no "CA:" line of its own; it stays teaker-9's, and both ends agree.
    assert [(lk["port"], lk["peer_port"]) for lk in cas if lk["switch"] == "teaker-9 HCA-1"] == [(1, 3), (2, 14)]
    assert [(lk["peer"], lk["peer_port"]) for lk in sw if lk["port"] in (3, 14)] == [
        ("teaker-9 HCA-1", 1), ("teaker-9 HCA-1", 2)]
    assert cas[-1]["switch"] == "teaker-10 HCA-1" and cas[-1]["peer_port"] == 2  # block printed after the switch
    assert [lk["port"] for lk in sw if lk["state"] == "down"] == [8, 10, 11, 12, 13, 15, 16, 17, 18]
    assert all(lk["physical_state"] == "polling" and lk["peer"] is None for lk in sw if lk["state"] == "down")
    assert {lk["rate_gbps"] for lk in out["links"] if lk["state"] == "active"} == {40.0}


def test_iblinkinfo_of_2010_switch_header_without_colon_and_down_ports_with_a_speed() -> None:
    out = parse("iblinkinfo", load("iblinkinfo", "ompi_users_13551_2010_ibm_hssm_port1.txt"))
    assert len(out["links"]) == 36
    assert {(lk["switch"], lk["node_type"]) for lk in out["links"]} == {("IBM HSSM", "switch")}
    active = {lk["port"]: (lk["peer"], lk["lane_speed_gbps"], lk["rate_gbps"]) for lk in out["links"]
              if lk["state"] == "active"}
    assert active == {
        1: ("faui36a HCA-1", 5.0, 20.0),
        2: ("MT25204 InfiniHostLx Mellanox Technologies", 2.5, 10.0),
        17: ("faui36b HCA-1", 10.0, 40.0),
        18: ("faui36c HCA-1", 10.0, 40.0),
        19: ("faui36d HCA-1", 5.0, 20.0),
        20: ("faui36e HCA-1", 5.0, 20.0),
        21: ("faui36f HCA-1", 5.0, 20.0),
    }
    down = [lk for lk in out["links"] if lk["state"] == "down"]
    assert len(down) == 29
    assert {(lk["width"], lk["lane_speed_gbps"], lk["rate_gbps"], lk["peer"]) for lk in down} == {
        ("4X", 2.5, None, None)}  # printed width/speed kept, no rate for a port without a link
    assert sorted(lk["port"] for lk in down if lk["physical_state"] == "polling") == list(range(22, 33))
    assert out["warnings"] == []


def test_iblinkinfo_of_2010_sdr_topspin_switch() -> None:
    out = parse("iblinkinfo", load("iblinkinfo", "ompi_users_13551_2010_topspin_port2.txt"))
    assert {lk["switch"] for lk in out["links"]} == {"Topspin Switch"}
    assert [(lk["port"], lk["peer"], lk["peer_port"], lk["rate_gbps"]) for lk in out["links"]
            if lk["state"] == "active"] == [
        (1, "faui36b HCA-1", 2, 10.0), (2, "faui36c HCA-1", 2, 10.0), (3, "faui36d HCA-1", 2, 10.0),
        (4, "faui36e HCA-1", 2, 10.0), (5, "faui36f HCA-1", 2, 10.0), (17, "faui36a HCA-1", 2, 10.0)]
    assert sum(lk["physical_state"] == "polling" for lk in out["links"]) == 18


def test_iblinkinfo_through_grep_has_no_owner_and_says_so() -> None:
    out = parse("iblinkinfo", load("iblinkinfo", "linpack_19a_grep_up_headerless.txt"))
    assert [(lk["switch"], lk["node_type"], lk["port"], lk["peer"], lk["peer_port"]) for lk in out["links"]] == [
        (None, None, 1, "MF0;SB7700:MSB7700/U1", 17),
        (None, None, 1, "MF0;SB7700:MSB7700/U1", 36),
        (None, None, 17, "n02 HCA-1", 1),
        (None, None, 18, "n01 HCA-1", 1),
        (None, None, 36, "mgt mlx5_0", 1),
        (None, None, 1, "MF0;SB7700:MSB7700/U1", 18),
    ]
    assert {lk["rate_gbps"] for lk in out["links"]} == {100.0}
    assert out["warnings"] == ["link lines before any 'CA:'/'Switch:' header (filtered output?): "
                               "the node those ports belong to is unknown (switch: null)"]


def test_cabling_never_places_a_cable_on_a_switch_named_none() -> None:
    # The grep'd capture says "n02 HCA-1" is on port 17 of *some* switch: the cable map must not read that as
    # a switch called "None" (which the findings would then tell a technician to move a cable from).
    c = cluster_from(V100.replace("gpu-v100-[0-3]", "n[01-02]").replace("10.0.0.[1-4]", "10.0.0.[1-2]")
                     .replace("ibswitch254", "sb7700").replace("ports: 1-4", "ports: 17-18"))
    live = cabling.live_map(c, parse("iblinkinfo", load("iblinkinfo", "linpack_19a_grep_up_headerless.txt")))
    assert all(where is None or where[0] != "None" for where in live.values()), live


# ---------------------------------------------------------------- ibstatus


def test_ibstatus_qdr_port_and_an_ethernet_port_down() -> None:
    out = parse("ibstatus", load("ibstatus", "cc_rdma_test_cx3_qdr_and_eth_port_down.txt"))
    assert out["ports"] == [
        {"device": "mlx4_0", "port": 1, "state": "active", "physical_state": "linkup", "rate_gbps": 40.0,
         "width": "4X", "speed": "QDR", "link_layer": "infiniband"},
        {"device": "mlx4_0", "port": 2, "state": "down", "physical_state": "disabled", "rate_gbps": 10.0,
         "width": "1X", "speed": "QDR", "link_layer": "ethernet"},
    ]
    assert out["warnings"] == ["mlx4_0 port 2: port is Down, rate 10 is a placeholder"]


def test_ibstatus_roce_ports_at_400_say_ndr_and_are_not_ib_links() -> None:
    out = parse("ibstatus", load("ibstatus", "infiniband_exporter26_roce_400g_ndr_words.txt"))
    assert [(p["device"], p["state"], p["physical_state"], p["rate_gbps"], p["width"], p["speed"], p["link_layer"])
            for p in out["ports"]] == [
        ("mlx5_0", "active", "linkup", 400.0, "4X", "NDR", "ethernet"),
        ("mlx5_1", "active", "linkup", 400.0, "4X", "NDR", "ethernet"),
    ]
    assert out["warnings"] == [
        f"{dev} port 1: Ethernet (RoCE) port: '4X NDR' is the kernel's InfiniBand wording for 400 Gb/s, "
        "not an InfiniBand link" for dev in ("mlx5_0", "mlx5_1")]


def test_ibstatus_of_ofed_1_3_1_has_no_link_layer_and_a_bare_width_when_down() -> None:
    out = parse("ibstatus", load("ibstatus", "ompi_users_7006_ofed_1_3_1_two_hcas.txt"))
    assert [(p["device"], p["port"], p["state"], p["physical_state"], p["rate_gbps"], p["width"], p["speed"])
            for p in out["ports"]] == [
        ("mlx4_0", 1, "active", "linkup", 20.0, "4X", "DDR"),
        ("mlx4_0", 2, "down", "polling", 10.0, "4X", None),
        ("mlx4_1", 1, "active", "linkup", 20.0, "4X", "DDR"),
        ("mlx4_1", 2, "down", "polling", 10.0, "4X", None),
    ]
    assert {p["link_layer"] for p in out["ports"]} == {None}  # OFED 1.3.1 printed no link_layer line
    assert out["warnings"] == [f"{d} port 2: port is Down, rate 10 is a placeholder" for d in ("mlx4_0", "mlx4_1")]


# ---------------------------------------------------------------- opensm.conf


def test_opensm_conf_3_3_5_package_default_is_older_than_3_3_9() -> None:
    old = parse("opensm-conf", load("opensm-conf", "el6_opensm_3_3_5_package_default.txt"))
    new = parse("opensm-conf", load("opensm-conf", "el6_opensm_3_3_9_package_default.txt"))
    assert old["routing_engines"] == [] and old["options"]["routing_engine"] == "(null)"
    assert old["warnings"] == ["routing_engine not set: opensm uses minhop"]
    assert old["options"]["partition_config_file"] == "/etc/ofed/partitions.conf"
    assert old["options"]["sm_priority"] == "15"  # RHEL 6.0 shipped its SM at the top priority; 3.3.9 at 0
    assert new["options"]["sm_priority"] == "0"
    assert {"hop_weights_file", "io_guid_file", "lash_start_vl", "sm_sl"} <= set(new["options"]) - set(old["options"])
    assert len(old["options"]) == 91


# ---------------------------------------------------------------- ibnetdiscover


def test_ibnetdiscover_that_could_not_open_the_mad_port_is_a_failed_run() -> None:
    text = load("ibnetdiscover", "infiniband_exporter26_mad_port_not_opened.txt")
    out = parse("ibnetdiscover", text)
    assert (out["ok"], out["error"]) == (False, "discover failed")
    assert (out["switches"], out["cas"], out["links"]) == ([], [], [])
    assert out["errors"] == [
        "ibwarn: [298726] mad_rpc_open_port: client_register for mgmt 1 failed",
        "/var/tmp/OFED_topdir/BUILD/rdma-core-2307mlnx47/libibnetdisc/ibnetdisc.c:802; can't open MAD port ((null):0)",
        "ibnetdiscover: iberror: failed: discover failed",
    ]
    with pytest.raises(ParseError, match="ibnetdiscover failed: discover failed"):  # never an empty fabric
        discover.read_fabric(text, "gpu01", {})


def test_ibnetdiscover_topologies_are_ok() -> None:
    out = parse("ibnetdiscover", load("ibnetdiscover", "rdma_core_man_voltaire_sdr.txt"))
    assert (out["ok"], out["error"]) == (True, None) and out["switches"]


# ---------------------------------------------------------------- ibqueryerrors


def test_ibqueryerrors_clean_run_has_a_summary_and_no_node() -> None:
    out = parse("ibqueryerrors", load("ibqueryerrors", "infiniband_exporter48_clean_node_thresholds.txt"))
    assert out["nodes"] == []
    assert out["summary"] == {"nodes_checked": 1, "bad_nodes": 0, "ports_checked": 1, "bad_ports": 0,
                              "pma_query_failures": 0}
    assert out["complete"] is True and out["errors"] == []


def test_ibqueryerrors_data_counters_keep_the_number_and_drop_the_human_copy() -> None:
    out = parse("ibqueryerrors", load("ibqueryerrors", "infiniband_exporter48_bad_node_data_excerpt.txt"))
    assert [(n["name"], n["type"], n["guid"]) for n in out["nodes"]] == [("maestro-3002 HCA-1", "ca", None)]
    port = out["nodes"][0]["ports"][0]
    assert (port["port"], port["guid"]) == (1, "0x0c42a1030079989c")
    assert port["counters"] == {"PortXmitWait": 2544, "PortXmitData": 6399401, "PortRcvData": 1758872,
                                "PortXmitPkts": 13959, "PortRcvPkts": 13514, "PortUnicastXmitPkts": 13959,
                                "PortUnicastRcvPkts": 13514}
    assert out["complete"] is False  # an excerpt: no summary, so nothing says the sweep ended


def test_ibqueryerrors_pasted_through_grep_keeps_each_port_apart() -> None:
    out = parse("ibqueryerrors", load("ibqueryerrors", "infiniband_exporter20_grep_symbolerror.txt"))
    assert [(n["name"], n["type"]) for n in out["nodes"]] == [(None, None), (None, None)]
    assert [(p["guid"], p["port"], p["counters"]) for n in out["nodes"] for p in n["ports"]] == [
        ("0x0c42a10300dcf8e2", 1, {"SymbolErrorCounter": 3, "PortXmitWait": 12097916}),
        ("0x0c42a10300dd0bea", 1, {"SymbolErrorCounter": 4, "PortXmitWait": 224462059})]
    assert out["complete"] is False and out["errors"] == []


def test_ibqueryerrors_port_all_with_extended_values_past_32_bits() -> None:
    out = parse("ibqueryerrors", load("ibqueryerrors", "ucx9590_port_all_extended_values.txt"))
    (node,) = out["nodes"]
    (port,) = node["ports"]
    assert port["port"] is None and port["guid"] == "0x1070fd0300370ea2"
    assert port["counters"] == {"LinkDownedCounter": 25, "PortRcvErrors": 26, "PortXmitDiscards": 2846,
                                "PortXmitWait": 14681376621}


def test_ibqueryerrors_discovery_timeouts_on_stderr_parse_as_errors_not_as_a_clean_fabric() -> None:
    stderr = load("ibqueryerrors", "infiniband_exporter12_discovery_timeouts_stderr.txt")
    alone = parse("ibqueryerrors", stderr)
    assert alone["nodes"] == [] and alone["complete"] is False and len(alone["errors"]) == 9
    assert alone["errors"][0].startswith("src/query_smp.c:195; umad (DR path slid 0; dlid 0; 0,1,13,9,15 Attr")
    # the clean run's stdout with these lines on stderr, as verify reads them: the sweep ended, yet not everywhere
    clean = load("ibqueryerrors", "infiniband_exporter48_clean_node_thresholds.txt")
    both = parse("ibqueryerrors", clean + "\n" + stderr)
    assert both["complete"] is True and len(both["errors"]) == 9
    gaps = switchports.sweep_gaps(both)
    assert [(f.severity, f.check) for f in gaps] == [("error", "switch_ports")]
    assert "9 discovery/query error(s)" in gaps[0].message and "0,1,13,9,15" in gaps[0].message
    assert switchports.sweep_gaps(parse("ibqueryerrors", clean)) == []


# ---------------------------------------------------------------- error lines as the tools print them


@pytest.mark.parametrize(
    ("line", "tool", "message"),
    [
        # guilbaults/infiniband-exporter#12 (ibqueryerrors on an HDR fabric with an unreachable node)
        ("src/query_smp.c:199; umad (DR path slid 0; dlid 0; 0,1,10,19 Attr 0x11:0) bad status 110; "
         "Connection timed out", "ibqueryerrors", None),
        # treydock/infiniband_exporter#26 (perfquery on a RoCE-only host)
        ("perfquery: iberror: failed: Failed to open '(null)' port '0'", "perfquery",
         "Failed to open '(null)' port '0'"),
        # constructed: IBEXIT prints argv[0], so a tool run by its path (ibhosts runs /usr/sbin/ibnetdiscover)
        ("/usr/sbin/ibnetdiscover: iberror: failed: discover failed", "ibnetdiscover", "discover failed"),
        ("sminfo: iberror: failed: query", "sminfo", "query"),
    ],
)
def test_diag_error_lines(line: str, tool: str, message: str | None) -> None:
    assert diag_error_line(line, tool)
    assert iberror_text(line, tool) == message


def test_another_tools_iberror_is_not_this_tools() -> None:
    assert not diag_error_line("perfquery: iberror: failed: Failed to open '(null)' port '0'", "ibnetdiscover")
    assert iberror_text("sminfo: iberror: failed: query", "ibnetdiscover") is None
    topology = load("ibnetdiscover", "rdma_core_man_voltaire_sdr.txt").splitlines()
    assert not [line for line in topology if diag_error_line(line.strip(), "ibnetdiscover")]
