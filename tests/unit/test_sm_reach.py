"""Partition reachability of the simulated fabric (provisioner.lab.simtools.fabsim_reach)."""

from __future__ import annotations

from pathlib import Path

from provisioner.lab.simtools import fabsim_reach, fabsim_sm

A, B, C, SM = "0x0000000000000a01", "0x0000000000000b01", "0x0000000000000c01", "0x0000000000000501"
CONF = f"""
Default=0x7fff, ipoib : ALL=limited, SELF=full ;
tenant_a=0x0002, ipoib : {A}=full, {B}=full ;
storage=0x0003 : {A}=full, {C}=limited ;
"""


def _parts() -> list[dict[str, object]]:
    return fabsim_sm.parse_partitions(CONF)  # what the simulated SM writes to partitions.json


def test_members_of_a_tenant_partition_reach_each_other() -> None:
    assert fabsim_reach.can_reach(_parts(), "0x0002", A, B)


def test_a_node_outside_the_partition_cannot_reach_it() -> None:
    assert not fabsim_reach.can_reach(_parts(), "0x0002", C, A)
    assert not fabsim_reach.can_reach(_parts(), "0x8002", A, C)  # full-member bit ignored


def test_two_limited_members_cannot_talk_but_limited_reaches_full() -> None:
    assert not fabsim_reach.can_reach(_parts(), "0x7fff", A, C)
    assert fabsim_reach.can_reach(_parts(), "0x7fff", A, SM, sm_guid=SM)
    assert fabsim_reach.can_reach(_parts(), "0x0003", C, A)


def test_unknown_partition_reaches_nothing() -> None:
    assert not fabsim_reach.can_reach(_parts(), "0x0009", A, B)


def test_load_partitions_reads_the_sm_state(tmp_path: Path) -> None:
    assert fabsim_reach.load_partitions(str(tmp_path)) == []
    (tmp_path / "sm").mkdir()
    (tmp_path / "sm" / "partitions.json").write_text('[{"name": "x", "pkey": "0x1", "members": []}]')
    assert fabsim_reach.load_partitions(str(tmp_path))[0]["name"] == "x"
