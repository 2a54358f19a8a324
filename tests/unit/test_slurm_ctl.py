"""Slurm's own output, parsed: real captures of Slurm 22.05.8 (tests/fixtures/slurm/, each headed by its source),
and the controller commands the rolling run and failover send, with a fake remote answering from the captures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from provisioner.remote import Completed
from provisioner.slurm.ctl import (
    SlurmCtl,
    SlurmError,
    drain_argv,
    parse_show_node,
    parse_show_partition,
    parse_squeue,
    partition_argv,
    reason_text,
    resume_argv,
    show_node_argv,
    squeue_argv,
)
from provisioner.spec.hostlist import compress

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def capture(name: str) -> str:
    lines = (FIX / name).read_text().splitlines(keepends=True)
    assert "source" in "".join(lines[:3]).lower()
    return "".join(ln for ln in lines if not ln.startswith("# "))


@pytest.mark.parametrize(("name", "state", "drain", "busy"), [
    ("show_node_idle.txt", "IDLE", False, False),
    ("show_node_allocated.txt", "ALLOCATED", False, True),
    ("show_node_draining.txt", "ALLOCATED+DRAIN", True, True),
    ("show_node_drained.txt", "IDLE+DRAIN", True, False),
    ("show_node_resumed.txt", "IDLE+NOT_RESPONDING", False, False),
])
def test_node_states_through_a_drain(name: str, state: str, drain: bool, busy: bool) -> None:
    st = parse_show_node(capture(name))["gpu01"]
    assert (st.state, st.drain, st.busy, st.partitions) == (state, drain, busy, ("gpu",))
    assert st.fields["OS"] == "Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0"
    assert st.fields["CfgTRES"] == "cpu=1,mem=1M,billing=1"


def test_a_reason_keeps_its_spaces_and_slurms_suffix() -> None:
    st = parse_show_node(capture("show_node_draining.txt"))["gpu01"]
    assert st.reason == ("provision rolling 20260101T000000.000000Z-abcdef batch 2/3 gpu01: gpu_stack "
                         "[root@2026-12-01T23:10:01]")


def test_several_records_and_a_node_in_no_partition() -> None:
    nodes = parse_show_node(capture("show_node_all.txt"))
    assert sorted(nodes) == ["gpu01", "gpu03"]
    assert nodes["gpu03"].partitions == () and nodes["gpu01"].partitions == ("gpu",)
    two = parse_show_node(capture("show_node_two_drained.txt"))
    assert two["gpu01"].state == "IDLE+DRAIN+NOT_RESPONDING" and not two["gpu01"].responding
    assert two["gpu03"].reason == "hostlist form [root@2026-12-01T23:10:03]" and two["gpu03"].drain


def test_squeue_lines() -> None:
    jobs = parse_squeue(capture("squeue_running.txt"))
    assert [(j.job_id, j.state, j.nodes, j.user) for j in jobs] == [("1", "RUNNING", "gpu01", "root")]
    assert parse_squeue(capture("squeue_empty.txt")) == []


def test_commands_are_argv_lists_with_hostlists_and_a_safe_reason() -> None:
    assert drain_argv(["gpu01", "gpu03"], "provision failover: xid=79 'bad'") == [
        "scontrol", "update", f"NodeName={compress(['gpu01', 'gpu03'])}", "State=DRAIN",
        "Reason=provision failover: xid-79 -bad-"]
    assert resume_argv(["gpu01"]) == ["scontrol", "update", "NodeName=gpu01", "State=RESUME"]
    assert partition_argv("gpu", ["gpu03", "gpu02"]) == ["scontrol", "update", "PartitionName=gpu",
                                                         "Nodes=gpu03,gpu02"]
    assert show_node_argv(["gpu01", "gpu02"]) == ["scontrol", "show", "node", "gpu[01-02]"]
    assert squeue_argv(["gpu02"]) == ["squeue", "--noheader", "--nodelist=gpu02", "--format=%i|%T|%N|%u"]
    assert reason_text("") == "provision" and len(reason_text("x" * 500)) == 200


class Controller:
    """Answers scontrol/squeue from captures, in turn; records every command."""

    def __init__(self, answers: Mapping[str, list[Completed]]) -> None:
        self.answers = {k: list(v) for k, v in answers.items()}
        self.calls: list[list[str]] = []

    def run(self, host: str, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> Completed:
        assert host == "sm1"
        self.calls.append(list(argv))
        queue = self.answers[argv[0] + " " + argv[1]]
        return queue.pop(0) if len(queue) > 1 else queue[0]


def test_wait_idle_polls_until_the_job_is_gone_and_gives_up_after_max_wait() -> None:
    ok = Completed(0, "", "")
    remote = Controller({
        "squeue --noheader": [Completed(0, capture("squeue_running.txt"), ""),
                              Completed(0, capture("squeue_empty.txt"), "")],
        "scontrol show": [Completed(0, capture("show_node_draining.txt"), ""),
                          Completed(0, capture("show_node_drained.txt"), "")],
        "scontrol update": [ok]})
    now = [0.0]
    naps: list[float] = []

    def nap(s: float) -> None:
        naps.append(s)
        now[0] += s

    ctl = SlurmCtl(remote, "sm1", clock=lambda: now[0], sleep=nap)
    said: list[str] = []
    assert ctl.wait_idle(["gpu01"], 60, progress=said.append) == {}
    assert said == ["waiting for jobs to end on gpu01 (job 1)"] and naps == [2.0]

    stuck = Controller({"squeue --noheader": [Completed(0, capture("squeue_running.txt"), "")],
                        "scontrol show": [Completed(0, capture("show_node_draining.txt"), "")]})
    now[0] = 0.0
    ctl = SlurmCtl(stuck, "sm1", clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert ctl.wait_idle(["gpu01"], 5) == {"gpu01": ["1"]}
    assert now[0] == 5.0


def test_a_refused_command_is_one_line_naming_the_controller() -> None:
    remote = Controller({"scontrol update": [Completed(1, "", "slurm_update error: Invalid node name specified\n")]})
    with pytest.raises(SlurmError, match="scontrol update on sm1 failed: slurm_update error: Invalid node name"):
        SlurmCtl(remote, "sm1").drain(["gpu09"], "x")


def test_a_partitions_live_node_list_is_read_from_slurm() -> None:
    """Failover changes a partition from what slurmctld has now (its Nodes= hostlist), not from the spec's list."""
    assert parse_show_partition(capture("show_partition_swapped.txt")) == {"gpu": ["gpu01", "gpu03"]}
    assert parse_show_partition("PartitionName=empty\n   Nodes=(null) State=UP\n") == {"empty": []}
    remote = Controller({"scontrol show": [Completed(0, capture("show_partition_swapped.txt"), "")]})
    assert SlurmCtl(remote, "sm1").partition_nodes("gpu") == ["gpu01", "gpu03"]
    assert remote.calls == [["scontrol", "show", "partition", "gpu"]]
    missing = Controller({"scontrol show": [Completed(1, "", "Partition gpu2 not found\n")]})
    with pytest.raises(SlurmError, match="scontrol show on sm1 failed: Partition gpu2 not found"):
        SlurmCtl(missing, "sm1").partition_nodes("gpu2")
