"""`provision discover` drafts every subnet manager, master and standby (issue #26).

``sminfo`` answers for the master only (the SM its port's SM LID names). The SA answers ``saquery SMIR`` with one
SMInfoRecord per SM it knows, its own first (opensm's osm_sa_sminfo_record.c), each with its port GUID, priority
and state: discover matches those GUIDs to the probed nodes' ports. The lab's saquery answers that query from the
SM heartbeats (fabsim_sm.py); ``saquery -s`` (PortInfoRecords in the real tool) is not simulated and is refused.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from provisioner.fabric.sm import parse_sminfo_records
from provisioner.lab.simtools import labstate
from provisioner.spec import load_text
from provisioner.spec.cluster import Cluster
from tests.unit import test_discover as base

lab = base.lab
HOSTS = ("gpu01", "gpu02", "gpu03", "sm1", "sm2")


def _running_sms(root: Path, sms: dict[str, tuple[int, int, str]]) -> dict[str, str]:
    """Swept ports (Active, a LID, the master's LID as SM LID) and one SM heartbeat per ``{node: (lid,
    priority, state)}``, as the lab's opensm leaves them; returns {node: its SM's port GUID}."""
    master_lid = next(lid for lid, _, state in sms.values() if state == "master")
    guids: dict[str, str] = {}
    for i, host in enumerate(HOSTS):
        node = labstate.load_node(str(root), host)
        for j, port in enumerate(node["hcas"]):
            lid = sms[host][0] if host in sms and j == 0 else 100 + 10 * i + j
            port.update(state="active", lid=lid, sm_lid=master_lid)
        labstate.save_node(str(root), node)
        guids[host] = node["hcas"][0]["port_guid"]
    (root / "sm").mkdir(exist_ok=True)
    for host, (lid, priority, state) in sms.items():
        rec = {"guid": guids[host], "lid": lid, "priority": priority, "state": state, "activity_count": 7,
               "heartbeat": time.time()}
        (root / "sm" / f"{guids[host]}.json").write_text(json.dumps(rec))
    return guids


def _sminfo_answers(lab_dir: Path) -> dict[str, dict[str, tuple[int, str]]]:
    """Each node's real sminfo (the lab tool) in its probe, where the golden lab answers 'not found'."""
    tool = base.LabRemote(lab_dir)
    return {h: {"sminfo": tool._tool(h, "sminfo")} for h in HOSTS}


def test_the_lab_saquery_lists_the_master_first_and_refuses_dash_s(lab: tuple[Path, Cluster]) -> None:
    guids = _running_sms(lab[0] / "root", {"sm2": (2, 14, "standby"), "sm1": (1, 15, "master")})
    tool = base.LabRemote(lab[0])
    rc, out = tool._tool("gpu01", "saquery", "SMIR")
    assert rc == 0, out
    assert [(r.guid, r.lid, r.priority, r.state) for r in parse_sminfo_records(out)] == [
        (guids["sm1"], 1, 15, "master"), (guids["sm2"], 2, 14, "standby")]
    rc, out = tool._tool("gpu01", "saquery", "-s")
    assert rc == 1 and "SMIR" in out


def test_discover_drafts_the_master_and_the_standby(lab: tuple[Path, Cluster]) -> None:
    """Failed on the old code: only sm1 (the master sminfo names) was drafted, with a TODO for the standbys."""
    _running_sms(lab[0] / "root", {"sm1": (1, 15, "master"), "sm2": (2, 14, "standby")})
    draft, remote = base._draft(*lab, answers=_sminfo_answers(lab[0]))
    res = load_text(draft.text, "draft.yaml")
    assert res.cluster is not None and not res.errors, [d.format() for d in res.errors] + [draft.text]
    data: dict[str, Any] = yaml.safe_load(draft.text)
    assert data["fabric"]["subnet_manager"]["nodes"] == [{"node": "sm1", "priority": 15},
                                                         {"node": "sm2", "priority": 14}], draft.text
    assert sorted(n.name for n in res.cluster.nodes if "subnet_manager" in n.roles) == ["sm1", "sm2"]
    assert "    # saquery SMIR: master sm1, standby sm2" in draft.text
    assert "TODO add standby" not in draft.text
    assert ("gpu01", ("saquery", "SMIR")) in remote.commands


def test_an_sm_on_no_probed_node_is_named_in_a_comment(lab: tuple[Path, Cluster]) -> None:
    _running_sms(lab[0] / "root", {"sm1": (1, 15, "master"), "sm2": (2, 14, "standby")})
    draft, _ = base._draft(*lab, answers=_sminfo_answers(lab[0]), hosts="gpu[01-03],sm1",
                           addresses="10.213.38.[11-13],10.213.38.21")
    data = yaml.safe_load(draft.text)
    assert data["fabric"]["subnet_manager"]["nodes"] == [{"node": "sm1", "priority": 15}]
    assert "# SMs on no probed node (a switch, a UFM host?): standby 0x" in draft.text


def test_without_saquery_the_master_from_sminfo_stays_with_its_todo(lab: tuple[Path, Cluster]) -> None:
    _running_sms(lab[0] / "root", {"sm1": (1, 15, "master"), "sm2": (2, 14, "standby")})
    answers = _sminfo_answers(lab[0])
    draft, _ = base._draft(*lab, answers=answers, missing=("saquery",))
    data = yaml.safe_load(draft.text)
    assert data["fabric"]["subnet_manager"]["nodes"] == [{"node": "sm1", "priority": 15}]
    assert "TODO add standby SMs (sminfo shows only the master; saquery SMIR on gpu01: " in draft.text
