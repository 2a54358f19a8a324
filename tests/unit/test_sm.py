"""Unit tests for provisioner.fabric.sm: preflight, election check, AR from the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import ParseError
from provisioner.fabric import sm
from provisioner.lab.simtools import fabsim_sm

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SM1 = "0x0c42a10300000101"
SM2 = "0x0c42a10300000201"
FOREIGN = "0x0002c90300000001"


def _fixture(tool: str, name: str) -> str:
    """A fixture without its ``#`` header lines (Source/Shows/blank comment)."""
    lines = (FIXTURES / tool / name).read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.startswith("#")) + "\n"


def _master(guid: str, priority: int, state: str = "master") -> sm.SmInfo:
    return sm.SmInfo(guid=guid, lid=1, priority=priority, state=state)


# ---------------------------------------------------------------- GUIDs and sminfo


def test_port_guid_is_the_low_half_of_gid0() -> None:
    assert sm.port_guid_from_gid("fe80:0000:0000:0000:0c42:a103:0000:0101\n") == SM1


@pytest.mark.parametrize("gid", ["fe80::1", "fe80:0000:0000:0000:0000:0000:0000:0000", "garbage"])
def test_bad_gids_are_refused(gid: str) -> None:
    with pytest.raises(ParseError):
        sm.port_guid_from_gid(gid)


def test_norm_guid_makes_forms_equal() -> None:
    assert sm.norm_guid("0x10e0406d5aa0a0") == sm.norm_guid("0010E0406D5AA0A0") == "0x0010e0406d5aa0a0"
    with pytest.raises(ParseError):
        sm.norm_guid("0x" + "f" * 17)


def test_real_sminfo_capture_reads_as_master() -> None:
    info = sm.sminfo_result(0, _fixture("sminfo", "bda_master_prio14.txt"))
    assert info == sm.SmInfo("0x0010e0406d5aa0a0", 15, 14, "master", 26263191)


def test_sminfo_timeout_means_no_sm() -> None:
    stderr = "\n".join(fabsim_sm._timeout_lines("sminfo", 0))
    assert sm.sminfo_result(255, "", stderr) is None


def test_unknown_sminfo_failure_is_an_error() -> None:
    with pytest.raises(ParseError, match="exit status 1"):
        sm.sminfo_result(1, "", "sminfo: command not found")


def test_sminfo_records_from_the_lab_saquery() -> None:
    text = fabsim_sm.saquery_sm_records(
        [
            {"guid": SM1, "lid": 1, "priority": 15, "state": "master", "activity_count": 9},
            {"guid": SM2, "lid": 2, "priority": 14, "state": "standby", "activity_count": 4},
        ]
    )
    records = sm.parse_sminfo_records(text)
    assert [(r.guid, r.priority, r.state) for r in records] == [(SM1, 15, "master"), (SM2, 14, "standby")]


def test_sminfo_records_need_a_block() -> None:
    with pytest.raises(ParseError):
        sm.parse_sminfo_records("nothing here")


# ---------------------------------------------------------------- election rule and preflight


def test_equal_priority_lower_guid_wins() -> None:
    assert sm.beats(15, SM1, 15, SM2)
    assert not sm.beats(15, SM2, 15, SM1)
    assert sm.beats(1, SM2, 0, SM1)


def test_preflight_starts_on_an_empty_fabric() -> None:
    decision = sm.preflight(None, SM1, 15)
    assert (decision.action, decision.priority) == ("start", 15)


def test_preflight_rerun_on_the_master_keeps_priority() -> None:
    decision = sm.preflight(_master(SM1, 15), SM1, 15, own_guids=[SM1, SM2])
    assert (decision.action, decision.priority) == ("start", 15)


def test_preflight_standby_joins_below_the_master() -> None:
    decision = sm.preflight(_master(SM1, 15), SM2, 14, own_guids=[SM1, SM2])
    assert (decision.action, decision.priority) == ("start", 14)
    assert "standby" in decision.reason


@pytest.mark.parametrize("priority", [14, 15])
def test_preflight_refuses_to_displace_a_foreign_master(priority: int) -> None:
    decision = sm.preflight(_master(FOREIGN, 14), SM1, priority, own_guids=[SM1, SM2])
    assert decision.action == "refuse"
    assert FOREIGN in decision.reason and "opensm_allow_takeover" in decision.reason


def test_preflight_equal_priority_foreign_master_is_competing_even_if_it_wins_the_tie() -> None:
    decision = sm.preflight(_master(FOREIGN, 15), SM1, 15)
    assert decision.action == "refuse"  # FOREIGN's GUID is lower and would stay master: still refused


def test_preflight_lower_priority_may_join_a_foreign_master() -> None:
    decision = sm.preflight(_master(FOREIGN, 15), SM1, 14)
    assert (decision.action, decision.priority) == ("start", 14)


def test_preflight_takeover_when_allowed() -> None:
    decision = sm.preflight(_master(FOREIGN, 14), SM1, 15, allow_takeover=True)
    assert (decision.action, decision.priority) == ("start", 15)


def test_preflight_without_handover_rejoins_below_the_new_master() -> None:
    decision = sm.preflight(_master(SM2, 14), SM1, 15, own_guids=[SM1, SM2], handover=False)
    assert (decision.action, decision.priority) == ("start", 13)
    assert not sm.beats(decision.priority, SM1, 14, SM2)


def test_preflight_with_handover_takes_the_role_back() -> None:
    decision = sm.preflight(_master(SM2, 14), SM1, 15, own_guids=[SM1, SM2], handover=True)
    assert (decision.action, decision.priority) == ("start", 15)


def test_preflight_cannot_rejoin_below_priority_zero() -> None:
    decision = sm.preflight(_master(SM2, 0), SM1, 5, own_guids=[SM1, SM2])
    assert decision.action == "refuse"
    assert "opensm_handover" in decision.reason


# ---------------------------------------------------------------- election check


def _views(master_guid: str = SM1, sm2_state: str = "standby") -> list[sm.SmView]:
    master = _master(master_guid, 15 if master_guid == SM1 else 14)
    return [
        sm.SmView("sm1", SM1, 15, master, _master(SM1, 15, "master" if master_guid == SM1 else "standby")),
        sm.SmView("sm2", SM2, 14, master, _master(SM2, 14, sm2_state)),
    ]


def test_healthy_election_has_no_problems() -> None:
    assert sm.expected_master(_views()) == (SM1, 15)
    assert sm.check_election(_views()) == []


def test_two_masters_are_reported() -> None:
    problems = sm.check_election(_views(sm2_state="master"))
    assert any("exactly one master" in p for p in problems)
    assert any(p.startswith("sm2: own SM is master, expected standby") for p in problems)


def test_wrong_master_is_reported() -> None:
    problems = sm.check_election(_views(master_guid=SM2))
    assert any(f"reports master {SM2}, expected {SM1}" in p for p in problems)


def test_missing_sminfo_answers_are_reported() -> None:
    views = [sm.SmView("sm1", SM1, 15, None, None)]
    problems = sm.check_election(views)
    assert "sm1: no subnet manager answers sminfo" in problems


def test_a_tolerated_foreign_master_is_expected() -> None:
    foreign = _master(FOREIGN, 15)
    views = [sm.SmView("sm1", SM1, 14, foreign, _master(SM1, 14, "standby"))]
    assert sm.check_election(views, foreign) == []


# ---------------------------------------------------------------- adaptive routing


def test_real_nvidia_log_shows_ar_live() -> None:
    report = sm.routing_from_log(_fixture("opensm-log", "nvidia_5.21_ar_updn_excerpt.txt"))
    assert report.engine_in_use == "ar_updn" and report.adaptive_routing
    assert report.ar_cycles == 1 and report.subnet_up and report.warnings == []
    assert sm.check_adaptive_routing(report, True, ["ar_updn", "updn"]) == []


def test_real_ftree_log_is_not_ar() -> None:
    report = sm.routing_from_log(_fixture("opensm-log", "upstream_ftree_excerpt.txt"))
    assert report.engine_in_use == "ftree" and not report.adaptive_routing
    problems = sm.check_adaptive_routing(report, True, ["ar_ftree"])
    assert problems == ["adaptive routing is configured (ar_ftree) but the SM routes with ftree"]


def test_only_the_last_start_counts() -> None:
    old = _fixture("opensm-log", "nvidia_5.21_ar_updn_excerpt.txt")
    new = (
        "Jan 01 00:00:00 000001 [00000001] 0x03 -> OpenSM 3.3.23\n"
        "Jan 01 00:00:01 000001 [00000001] 0x01 -> setup_routing_engine: "
        "cannot find or setup routing engine 'ar_updn'\n"
    )
    report = sm.routing_from_log(old + new)
    assert report.engines_failed == ["ar_updn"] and not report.adaptive_routing and not report.subnet_up
    problems = sm.check_adaptive_routing(report, True, ["ar_updn"])
    assert len(problems) == 3


def test_lab_sim_log_is_read_from_its_setup_line() -> None:
    lines = [
        fabsim_sm.log_line(0x03, "OpenSM 5.18.0.MLNX20240128.e6ac1d3b", 0.0),
        fabsim_sm.log_line(0x80, "Entering MASTER state", 1.0),
        fabsim_sm.log_line(0x02, "setup_routing_engine: 'ar_updn' routing engine set up", 1.0),
        fabsim_sm.log_line(0x80, "SUBNET UP", 1.0),
    ]
    report = sm.routing_from_log("\n".join(lines))
    assert report.adaptive_routing and report.warnings


def test_ar_live_though_unwanted_is_reported() -> None:
    report = sm.routing_from_log(_fixture("opensm-log", "nvidia_5.21_ar_updn_excerpt.txt"))
    assert sm.check_adaptive_routing(report, False, ["updn"]) == [
        "adaptive routing is not wanted but the SM routes with ar_updn"
    ]


# ---------------------------------------------------------------- partitions


def test_partition_members_expand_to_port_guids() -> None:
    parts = [{"name": "training", "pkey": "0x0001", "members": ["gpu01", "gpu02"]}]
    guids = {"gpu01": ["0xAA", "0xab"], "gpu02": ["0x0c"]}
    assert sm.partition_members(parts, guids) == {
        "training": ["0x00000000000000aa", "0x00000000000000ab", "0x000000000000000c"]
    }


def test_partition_member_without_guid_fails_by_name() -> None:
    with pytest.raises(ValueError, match="member gpu09"):
        sm.partition_members([{"name": "t", "members": ["gpu09"]}], {})
