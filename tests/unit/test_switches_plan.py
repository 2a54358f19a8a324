"""Switch plans per device type (golden text), the review display, and the read-back parsers."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import ParseError
from provisioner.spec.load import load_cluster
from provisioner.switches.plan import (
    display,
    parse_nv_show_qos_roce,
    parse_show_ib_sm,
    plan_cluster,
    render_plan,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FIXTURES = Path(__file__).resolve().parents[1] / "switchemu" / "fixtures"


def _spec(tmp_path: Path, example: str, *replacements: tuple[str, str]) -> Path:
    text = (EXAMPLES / example).read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / "cluster.yaml"
    out.write_text(text)
    return out


def _strip_header(text: str) -> str:
    """Fixture files start with `#` source lines; the tool output follows."""
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))


MLNXOS_SWITCH_SM = """\
# ib-sw1 (10.1.255.1) — mellanox_mlnxos (netmiko: mellanox_mlnxos)
## enable the embedded subnet manager (the spec picks this switch's SM)
##   source: https://docs.nvidia.com/networking/display/MLNXOSv3104300/SM+Commands ; \
https://docs.nvidia.com/networking/display/nvidiamlnxosusermanualv3113006/subnet+manager
configure terminal
  ib sm
  ib smnode ib-sw1 sm-priority 15
exit
## save
configuration write
## expect: `show ib sm` sm = enabled  (the spec runs the fabric's SM on this switch)
"""

MLNXOS_HOST_SM = """\
# ib-sw1 (10.1.255.1) — mellanox_mlnxos (netmiko: mellanox_mlnxos)
## disable the embedded subnet manager (subnet_manager.kind is opensm)
##   source: https://docs.nvidia.com/networking/display/MLNXOSv3104300/SM+Commands
configure terminal
  no ib sm
exit
## save
configuration write
## expect: `show ib sm` sm = disabled  (a second SM would fight the host SMs for mastership)
"""

NVUE_TOR1 = """\
# tor1 (10.30.255.1) — nvidia_nvue (netmiko: cumulus_linux)
## lossless RoCE with PFC on the RoCE priority
##   source: https://docs.nvidia.com/networking-ethernet-software/cumulus-linux-514/Layer-1-and-Switch-Ports/\
Quality-of-Service/RDMA-over-Converged-Ethernet-RoCE/
nv set qos roce mode lossless
nv set qos pfc default-global switch-priority 3
nv set qos egress-queue-mapping default-global switch-priority 3 traffic-class 3
## classify RoCE by DSCP (DSCP 26 -> priority 3)
##   source: https://docs.nvidia.com/networking-ethernet-software/cumulus-linux-514/Layer-1-and-Switch-Ports/\
Quality-of-Service/
nv set qos mapping default-global trust l3
nv set qos mapping default-global dscp 26 switch-priority 3
## ECN marking on traffic class 3 (DCQCN)
##   source: https://docs.nvidia.com/networking-ethernet-software/cumulus-linux-514/Layer-1-and-Switch-Ports/\
Quality-of-Service/
nv set qos congestion-control default-global traffic-class 3 min-threshold 150000
nv set qos congestion-control default-global traffic-class 3 max-threshold 1500000
nv set qos congestion-control default-global traffic-class 3 ecn enable
## MTU 9000 on every front-panel port
##   source: https://docs.nvidia.com/networking-ethernet-software/cumulus-linux-514/Layer-1-and-Switch-Ports/\
Quality-of-Service/
nv set interface swp1-64 link mtu 9000
## save
nv config apply -y
## expect: `nv show qos roce` mode = lossless  (PFC needs lossless mode)
## expect: `nv show qos roce` pfc-priority = 3  (PFC must pause the priority RoCE uses)
## expect: `nv show qos roce` trust-mode = dscp|both  (the switch must classify RoCE the way the NICs mark it)
## expect: `nv show qos roce` congestion-mode = ECN  (DCQCN needs ECN marks from the switch)
"""


def test_mlnxos_switch_sm_golden() -> None:
    cluster, _ = load_cluster(EXAMPLES / "a100-hdr-4node.yaml")
    plans = plan_cluster(cluster)
    assert [p.name for p in plans] == ["ib-sw1"]
    assert render_plan(plans[0]) == MLNXOS_SWITCH_SM
    assert plans[0].reads == ("show ib sm", "show interfaces ib status")


def test_mlnxos_host_opensm_disables_switch_sm(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "a100-hdr-4node.yaml",
                 ("embedded_sm: true", "embedded_sm: false"),
                 ("subnet_manager: {kind: switch, switch: ib-sw1}",
                  "subnet_manager: {kind: opensm, build: upstream, nodes: [{node: dgx1, priority: 15}, "
                  "{node: dgx2, priority: 14}]}"))
    cluster, _ = load_cluster(spec)
    (plan,) = plan_cluster(cluster)
    assert render_plan(plan) == MLNXOS_HOST_SM
    assert plan.blocks[0].commands == ("no ib sm",)


def test_nvue_roce_golden() -> None:
    cluster, _ = load_cluster(EXAMPLES / "roce-200g-4node.yaml")
    plans = plan_cluster(cluster)
    assert [p.name for p in plans] == ["tor1", "tor2"]
    assert render_plan(plans[0]) == NVUE_TOR1
    assert render_plan(plans[1]) == NVUE_TOR1.replace("tor1 (10.30.255.1)", "tor2 (10.30.255.2)")


def test_nvue_pcp_trust_other_priority_and_no_ecn(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "roce-200g-4node.yaml",
                 ("roce: {pfc_priority: 3, ecn: true, dscp: 26, mtu: 9000, gid_index: 3}",
                  "roce: {pfc_priority: 5, ecn: true, dscp: 40, mtu: 4200, trust: pcp}"))
    cluster, _ = load_cluster(spec)
    plan = plan_cluster(cluster)[0]
    cmds = [c for b in plan.blocks for c in b.commands]
    assert "nv set qos pfc default-global switch-priority 5" in cmds
    assert "nv set qos egress-queue-mapping default-global switch-priority 5 traffic-class 3" in cmds
    assert "nv set qos mapping default-global trust l2" in cmds
    assert not any("dscp 40" in c for c in cmds)  # PCP trust: no DSCP map
    assert "nv set interface swp1-64 link mtu 4200" in cmds
    assert {(c.field, c.want) for c in plan.checks} >= {("pfc-priority", "5"), ("trust-mode", "pcp")}


@pytest.mark.parametrize("device_type", ["cumulus_linux", "dell_sonic"])
def test_other_roce_device_types(tmp_path: Path, device_type: str) -> None:
    spec = _spec(tmp_path, "roce-200g-4node.yaml", ("device_type: nvidia_nvue", f"device_type: {device_type}"))
    cluster, _ = load_cluster(spec)
    plan = plan_cluster(cluster)[0]
    cmds = [c for b in plan.blocks for c in b.commands]
    if device_type == "cumulus_linux":
        assert plan.netmiko_type == "cumulus_linux" and plan.apply_supported
        assert cmds[0] == "nv set qos roce mode lossless"
    else:
        assert not plan.apply_supported and plan.save == "sudo config save -y"
        assert cmds[0] == "sudo config qos reload -y"
        assert "sudo config interface pfc priority Ethernet0 3 on" in cmds
        assert "sudo config interface pfc priority Ethernet252 3 on" in cmds  # 64 ports x 4 lanes
        assert "sudo config interface mtu Ethernet4 9000" in cmds
        assert "sudo ecnconfig -p AZURE_LOSSLESS -gmin 150000 -gmax 1500000" in cmds
        assert any("display only" in n for n in plan.notes)


def test_unmanaged_switches_have_no_plan() -> None:
    cluster, _ = load_cluster(EXAMPLES / "h100-ndr-8node.yaml")
    assert plan_cluster(cluster) == []
    assert display(cluster).startswith("# no managed switches")


def test_display_lists_every_switch_with_its_commands() -> None:
    cluster, _ = load_cluster(EXAMPLES / "roce-200g-4node.yaml")
    text = display(cluster)
    assert text.count("nv config apply -y") == 2
    assert "# tor1 (10.30.255.1)" in text and "# tor2 (10.30.255.2)" in text


def test_parse_nv_show_qos_roce_real_output() -> None:
    rows = parse_nv_show_qos_roce(_strip_header((FIXTURES / "nv-show-qos-roce.txt").read_text()))
    assert rows["mode"] == "lossless-single-ipool"
    assert rows["pfc-priority"] == "3"
    assert rows["congestion-mode"] == "ECN"
    assert rows["trust-mode"] == "both"  # pcp,dscp
    assert rows["enable"] == "on"
    assert "0" not in rows  # the mapping tables after the === underline are not read


def test_parse_nv_show_qos_roce_rejects_other_text() -> None:
    with pytest.raises(ParseError):
        parse_nv_show_qos_roce("-bash: nv: command not found\n")


@pytest.mark.parametrize(("text", "want"), [("enable\n", "enabled"), ("disable\n", "disabled"),
                                             ("\n  Disabled.\n", "disabled")])
def test_parse_show_ib_sm(text: str, want: str) -> None:
    assert parse_show_ib_sm(text) == {"sm": want}


def test_parse_show_ib_sm_rejects_errors() -> None:
    with pytest.raises(ParseError, match="no enable/disable"):
        parse_show_ib_sm('% Unrecognized command "show".\nType "?" for help.\n')
