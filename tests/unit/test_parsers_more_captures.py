"""The fields that matter, on the real captures added for issue 15 ("more real captures"): sminfo, iblinkinfo,
ibstatus, opensm.conf, ibnetdiscover and ibqueryerrors, failures and odd forms included (each fixture is headed by
its public source)."""

from __future__ import annotations

import pytest

from provisioner import discover
from provisioner.errors import ParseError
from provisioner.fabric import sm
from provisioner.parsers import parse
from provisioner.parsers._common import diag_error_line, iberror_text
from tests.unit._parser_fixtures import load

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
