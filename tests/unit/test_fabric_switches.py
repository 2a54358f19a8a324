"""The fabric between the leaves, as verify judges it: planned vs live inter-switch links (real captures),
effective oversubscription, switch port counters (real ibqueryerrors), the load round's pairing, floors and
blame, and cabling in the default test selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.fabric import load, switchlinks, switchports
from provisioner.fabric.findings import Finding
from provisioner.fabric.perftest import PairRun
from provisioner.fabric.switchlinks import PlannedLink, Uplinks
from provisioner.parsers import parse
from provisioner.spec import Cluster, load_text
from provisioner.verify import select_tests
from tests.unit._parser_fixtures import load as fixture

HEAD = """
cluster: {name: ndr, os: ubuntu-22.04}
software: {driver: {version: "550.90.07"}, cuda: "12.4.1", nccl: "2.21.5"}
"""

NDR_SPEC = HEAD + """
profiles: {dgx: {hcas: [{device: mlx5_5, rate: NDR}]}}
nodes: [{name: "a08-p1-dgx-04-c[01-17]", address: "10.0.0.[1-17]", profile: dgx}]
switches:
  - {name: a09-p1-ibleaf-04-04, tier: leaf, ports: 64, uplinks: 16}
  - {name: "a10-p1-ibspine-0[2-4]", tier: spine, ports: 64}
  - {name: "b10-p1-ibspine-0[5-9]", tier: spine, ports: 64}
fabric:
  rate: NDR
  topology: {cabling: [{nodes: "a08-p1-dgx-04-c[01-17]", hca: mlx5_5, switch: a09-p1-ibleaf-04-04, ports: 1-17}]}
"""

IBSIM_SPEC = HEAD + """
profiles: {g: {hcas: [{device: mlx5_0, rate: SDR}]}}
nodes: [{name: "hxa-gpu0[3-4]", address: "10.0.0.[3-4]", profile: g}]
switches:
  - {name: hxa-su2-leaf-r2, tier: leaf, ports: 36, uplinks: 2}
  - {name: "hxa-spine0[1-2]", tier: spine, ports: 36}
fabric:
  rate: SDR
  topology: {cabling: [{nodes: "hxa-gpu0[3-4]", hca: mlx5_0, switch: hxa-su2-leaf-r2, ports: 1-2}]}
"""

LAB_SPEC = HEAD + """
profiles: {g: {hcas: [{device: "mlx5_[0-1]", rate: NDR}]}}
nodes: [{name: "gpu[01-04]", address: "10.0.0.[1-4]", profile: g}]
switches:
  - {name: "leaf[1-2]", tier: leaf, ports: 16, uplinks: 4}
  - {name: "spine[1-2]", tier: spine, ports: 16}
fabric:
  rate: NDR
  topology:
    kind: rail_optimized
    cabling:
      - {nodes: "gpu[01-04]", hca: mlx5_0, switch: leaf1, ports: 1-4}
      - {nodes: "gpu[01-04]", hca: mlx5_1, switch: leaf2, ports: 1-4}
"""


def cluster_of(text: str) -> Cluster:
    res = load_text(text, "cluster.yaml")
    assert res.cluster is not None, [d.format() for d in res.errors]
    return res.cluster


def errors(found: list[Finding]) -> list[str]:
    return sorted(f.message for f in found if f.severity == "error")


# ---------------------------------------------------------------- inter-switch links against real captures


def test_real_ndr_leaf_matches_the_plan_on_its_own_ports() -> None:
    """The NVIDIA topograph capture: 16 uplinks, 2 to each of 8 spines, on leaf ports 35-50 (not the plan's
    49-64): every planned link is there, on other ports, which costs no bandwidth and is no finding."""
    c = cluster_of(NDR_SPEC)
    planned = switchlinks.plan(c)
    assert [(p.port, p.peer) for p in planned[:3]] == [(49, "a10-p1-ibspine-02"), (50, "a10-p1-ibspine-03"),
                                                        (51, "a10-p1-ibspine-04")]
    text = fixture("ibnetdiscover", "topograph_ndr_qm9701_excerpt.txt")
    view = switchlinks.live_view(c, parse("ibnetdiscover", text))
    assert len(view.links) == 16 and {lk.a for lk in view.links} == {"a09-p1-ibleaf-04-04"}
    out = switchlinks.compare(c, planned, view)
    assert out.findings == [] and len(out.matched) == 16
    u = out.uplinks["a09-p1-ibleaf-04-04"]
    assert (u.planned, u.up, u.live_gbps, u.down_gbps) == (16, 16, 6400.0, 6800.0) and not u.short
    # the same capture without the leaf's second cable to spine 05 (line [42])
    cut = "\n".join(line for line in text.splitlines() if not line.startswith("[42]"))
    out = switchlinks.compare(c, planned, switchlinks.live_view(c, parse("ibnetdiscover", cut)))
    assert errors(out.findings) == [
        "a09-p1-ibleaf-04-04 ↔ b10-p1-ibspine-05: a planned link is missing (1 of 2 up, on a09-p1-ibleaf-04-04 "
        "port 41; in the plan's layout the missing one is a09-p1-ibleaf-04-04 port 60 ↔ b10-p1-ibspine-05 port 2)"]
    assert [f.message for f in out.findings if f.severity == "warning"] == [
        "a09-p1-ibleaf-04-04: 15 of 16 uplinks up → 1.13:1 (planned 1.06:1; 6800 Gb/s down, 6000 of 6400 Gb/s up)"]


def test_real_line_form_capture_shows_an_uplink_down() -> None:
    """ibsim's leaf (real infiniband-diags, -l form, no Switch: headers): the spec's names tell the uplinks. The
    capture is grep'd to the leaf's lines, so spine02, which no line reaches, is not in this view of the fabric."""
    c = cluster_of(IBSIM_SPEC)
    text = fixture("iblinkinfo", "ncp_ain_ibsim_leaf_uplinks_line_form.txt")
    view = switchlinks.live_view(c, parse("iblinkinfo", text))
    assert [(lk.a, lk.a_port, lk.b, lk.b_port, lk.shown()) for lk in view.links] == [
        ("hxa-su2-leaf-r2", 33, "hxa-spine01", 4, "Active/LinkUp 4X SDR")]
    assert view.down_ports == {("hxa-su2-leaf-r2", 34): "Down/Polling"}
    out = switchlinks.compare(c, switchlinks.plan(c), view)
    assert errors(out.findings) == ["hxa-spine02: not in the fabric (no port of it answers); its 1 planned links "
                                    "are down: hxa-su2-leaf-r2 port 36"]
    assert out.uplinks["hxa-su2-leaf-r2"].live_gbps == 10.0


def _live(c: Cluster, links: list[tuple[str, int, str, int, str, float]], down: set[str] = frozenset()) -> (  # type: ignore[assignment]
        switchlinks.LiveView):
    view = switchlinks.LiveView(seen={s.name for s in c.switches} - set(down))
    view.links = [switchlinks.LiveLink(a, pa, b, pb, "active", "linkup", w, r) for a, pa, b, pb, w, r in links]
    return view


def _planned_as_live(planned: list[PlannedLink]) -> list[tuple[str, int, str, int, str, float]]:
    return [(p.switch, p.port, p.peer, p.peer_port, "4X", 400.0) for p in planned]


def test_missing_degraded_miscabled_extra_and_wrong_tier_are_named_by_port() -> None:
    c = cluster_of(LAB_SPEC)
    planned = switchlinks.plan(c)
    assert [p.name() for p in planned if p.switch == "leaf1"] == [
        "leaf1 port 13 ↔ spine1 port 1", "leaf1 port 14 ↔ spine2 port 1", "leaf1 port 15 ↔ spine1 port 2",
        "leaf1 port 16 ↔ spine2 port 2"]
    live = _planned_as_live(planned)
    live[0] = ("leaf1", 13, "spine2", 9, "4X", 400.0)  # miscabled: lands on the other spine
    live[1] = ("leaf1", 14, "spine2", 1, "2X", 200.0)  # degraded width
    del live[5]  # leaf2 port 14 ↔ spine2 port 3: missing
    live += [("leaf1", 12, "leaf2", 12, "4X", 400.0),  # two leaves joined: wrong tier
             ("leaf2", 11, "spine1", 10, "4X", 400.0)]  # one more uplink than planned
    out = switchlinks.compare(c, planned, _live(c, live))
    assert errors(out.findings) == [
        "leaf1 port 12 ↔ leaf2 port 12: lands on the wrong tier: it links two leaf switches",
        "leaf1 port 13 ↔ spine2 port 9: miscabled, planned leaf1 port 13 ↔ spine1 port 1",
        "leaf1 port 14 ↔ spine2 port 1: degraded to 200 Gb/s (width 2X, planned 4X), planned 400 Gb/s",
        "leaf2 port 14 ↔ spine2 port 3: missing",
    ]
    mis = next(f for f in out.findings if "miscabled" in f.message)
    assert (mis.switch, mis.port, mis.hint) == ("leaf1", 13, "move the cable at spine2 port 9 to spine1 port 1")
    warned = sorted(f.message for f in out.findings if f.severity == "warning")
    assert warned == [
        "leaf1: 4 of 4 uplinks up, 1 degraded → 1.14:1 (planned 1.00:1; 1600 Gb/s down, 1400 of 1600 Gb/s up)",
        "leaf2 port 11 ↔ spine1 port 10: not planned (the spec plans 2 link(s) between leaf2 and spine1)",
        "leaf2: 3 of 4 uplinks up → 1.33:1 (planned 1.00:1; 1600 Gb/s down, 1200 of 1600 Gb/s up)",
    ]


def test_a_dead_spine_is_one_finding_listing_the_links_it_took() -> None:
    c = cluster_of(LAB_SPEC)
    planned = switchlinks.plan(c)
    live = [lk for lk in _planned_as_live(planned) if lk[2] != "spine2"]
    out = switchlinks.compare(c, planned, _live(c, live, down={"spine2"}))
    assert errors(out.findings) == ["spine2: not in the fabric (no port of it answers); its 4 planned links are "
                                    "down: leaf1 port 14,16; leaf2 port 14,16"]
    assert sorted(f.message.split(" →")[0] for f in out.findings if f.severity == "warning") == [
        "leaf1: 2 of 4 uplinks up", "leaf2: 2 of 4 uplinks up"]


# ---------------------------------------------------------------- switch port counters (real ibqueryerrors)


def test_real_switch_port_counters_are_judged_like_node_ports() -> None:
    c = cluster_of(LAB_SPEC.replace("leaf[1-2]", "leaf2,ys23ib4").replace("leaf1", "ys23ib4"))  # in sorted order
    counts = switchports.read_counters(c, parse("ibqueryerrors", fixture("ibqueryerrors",
                                                                         "linux_rdma_2021_sx6036.txt")))
    assert set(counts) == {("ys23ib4", p) for p in range(1, 9)}  # not "port ALL", not port 0, not the CAs
    assert counts[("ys23ib4", 5)]["symbol_error"] == 65535
    found = switchports.port_findings(counts, peers={("ys23ib4", 5): "gpu03 mlx5_0"})
    five = [f.message for f in found if f.port == 5]
    assert five == [
        "ys23ib4 port 5 (↔ gpu03 mlx5_0) flapped 10 times since the counters were last cleared (link_downed 2, "
        "link_error_recovery 8)",
        "ys23ib4 port 5 (↔ gpu03 mlx5_0) error counters above threshold: symbol_error 65535 (> 10), "
        "port_xmit_discards 649 (> 100)"]
    assert all(f.severity == "warning" and f.switch == "ys23ib4" and f.node is None for f in found)
    later = {k: dict(v) for k, v in counts.items()}
    later[("ys23ib4", 7)]["link_downed"] += 1
    grew = [f for f in switchports.port_findings(counts, later) if f.severity == "error"]
    assert [(f.port, f.message) for f in grew] == [(7, "ys23ib4 port 7 flapped during this verify run "
                                                       "(link_downed 2 -> 3)")]


# ---------------------------------------------------------------- the load round


def test_load_pairs_every_port_with_another_leaf_and_node() -> None:
    c = cluster_of(LAB_SPEC)
    flows, notes = load.plan_flows(c, c.nodes, switchlinks.plan(c))
    assert notes == [] and len(flows) == 8
    assert all(f.src_leaf != f.dst_leaf and f.src != f.dst for f in flows)
    assert sorted((f.src, f.src_dev) for f in flows) == sorted((f.dst, f.dst_dev) for f in flows)  # a permutation
    assert {(f.src, f.src_dev, f.dst, f.dst_dev) for f in flows if f.src == "gpu01"} == {
        ("gpu01", "mlx5_0", "gpu02", "mlx5_1"), ("gpu01", "mlx5_1", "gpu03", "mlx5_0")}
    assert load.plan_flows(c, c.nodes, []) == ([], [])  # no tier above the leaves: nothing crosses


def test_load_pairing_of_unequal_leaves_and_a_rail_spanning_leaves() -> None:
    spec = LAB_SPEC.replace("gpu[01-04]\", address: \"10.0.0.[1-4]\"", "gpu[01-05]\", address: \"10.0.0.[1-5]\"")
    spec = spec.replace('- {nodes: "gpu[01-04]", hca: mlx5_0, switch: leaf1, ports: 1-4}',
                        '- {nodes: "gpu[01-03]", hca: mlx5_0, switch: leaf1, ports: 1-3}\n'
                        '      - {nodes: "gpu[04-05]", hca: mlx5_0, switch: leaf2, ports: 5-6}')
    spec = spec.replace('- {nodes: "gpu[01-04]", hca: mlx5_1, switch: leaf2, ports: 1-4}',
                        '- {nodes: "gpu[01-05]", hca: mlx5_1, switch: leaf2, ports: 7-11}')
    c = cluster_of(spec)
    flows, notes = load.plan_flows(c, c.nodes, switchlinks.plan(c))
    rail0 = [f for f in flows if f.src_rail == 0]
    assert len(rail0) == 4 and all(f.src_leaf != f.dst_leaf for f in rail0)  # 3 on leaf1, 2 on leaf2: one idle
    assert notes == ["fabric_load: no partner on another leaf for gpu03 mlx5_0"]
    assert [f for f in flows if f.src_rail == 1] == []  # rail 1 sits on one leaf and is the only such rail


def test_load_floors_follow_the_planned_oversubscription() -> None:
    c = cluster_of(LAB_SPEC.replace("uplinks: 4", "uplinks: 2"))  # 2:1 leaves
    planned = switchlinks.plan(c)
    flows, _ = load.plan_flows(c, c.nodes, planned)
    assert set(load.expected_gbps(c, flows, planned).values()) == {200.0}  # 4 flows out over 2 uplinks


def _judge(c: Cluster, gbps: dict[tuple[str, str], float], bad: set[tuple[str, str]] = frozenset(),  # type: ignore[assignment]
           uplinks: dict[str, Uplinks] | None = None) -> list[Finding]:
    planned = switchlinks.plan(c)
    flows, _ = load.plan_flows(c, c.nodes, planned)
    runs = {f: PairRun(gbps.get((f.src, f.src_dev), 392.0), "") for f in flows}
    result = load.judge(flows, runs, load.expected_gbps(c, flows, planned), 0.9, set(bad), uplinks)
    return list(result.findings)


def test_slow_flows_through_a_leaf_short_of_uplinks_blame_the_leaf_not_the_nodes() -> None:
    c = cluster_of(LAB_SPEC)
    slow = {("gpu02", "mlx5_1"): 196.0, ("gpu04", "mlx5_1"): 196.0}  # two flows out of leaf2 share an uplink
    short = {"leaf2": Uplinks("leaf2", 4, 3, 0, 1600.0, 1200.0, 1600.0)}
    found = _judge(c, slow, uplinks=short)
    errs = [f for f in found if f.severity == "error"]
    assert [(f.switch, f.node) for f in errs] == [("leaf2", None)]
    assert errs[0].message == ("leaf2: 2 of 8 flows through it below their floor (slowest 196 Gb/s); 3 of 4 uplinks "
                               "up → 1.33:1 (planned 1.00:1): the switch's uplinks, not the nodes behind it")
    assert [f.severity for f in found if f.node is not None] == ["info", "info"]
    healthy = _judge(c, {})
    assert healthy == []


def test_slow_flows_of_a_named_port_a_port_under_load_and_a_leaf_pair() -> None:
    c = cluster_of(LAB_SPEC)
    port = ("gpu03", "mlx5_0")
    flows, _ = load.plan_flows(c, c.nodes, switchlinks.plan(c))
    into = next(f for f in flows if (f.dst, f.dst_dev) == port)
    slow = {port: 180.0, (into.src, into.src_dev): 180.0}  # both of gpu03 mlx5_0's flows
    found = _judge(c, slow, bad={port})
    assert [f.severity for f in found] == ["info"] * 4 and "explained by gpu03 mlx5_0" in found[0].message
    found = [f for f in _judge(c, slow) if f.severity == "error"]
    assert [(f.node, f.device, f.message) for f in found] == [(
        "gpu03", "mlx5_0", "gpu03 mlx5_0: 2 of its 2 flows in this round below their floor (180, 180 Gb/s), every "
        "other flow at rate: this port under load (its cable, transceiver or switch port)")]
    apart = [f for f in flows if f.src in ("gpu01", "gpu04") and f.src_dev == "mlx5_0"]  # no port in common
    assert len({(f.dst, f.dst_dev) for f in apart}) == 2
    found = _judge(c, {(f.src, f.src_dev): 150.0 for f in apart})
    assert errors(found) == ["leaf1 ↔ leaf2: 2 of 8 flows between these leaves below their floor, the ports at "
                             "both ends good in the pairwise rounds: the links or spines between them"]


def test_flows_without_perftest_are_could_not_run() -> None:
    c = cluster_of(LAB_SPEC)
    planned = switchlinks.plan(c)
    flows, _ = load.plan_flows(c, c.nodes, planned)
    runs = {f: PairRun(None, "exit 127: ib_write_bw: command not found") for f in flows}
    result = load.judge(flows, runs, load.expected_gbps(c, flows, planned), 0.9, set())
    assert not result.ran and "not installed" in (result.error or "")


# ---------------------------------------------------------------- cabling by default


@pytest.mark.parametrize(("spec", "want"), [
    (LAB_SPEC, True),  # planned node cables and uplinks
    (LAB_SPEC.replace("uplinks: 4", "uplinks: 0").replace("  - {name: \"spine[1-2]\", tier: spine, ports: 16}\n", ""),
     True),  # node cables only
    (LAB_SPEC.replace("  rate: NDR\n", "  rate: 400\n  type: roce\n  roce: {pfc_priority: 3, ecn: true}\n"),
     False),  # RoCE: no iblinkinfo to ask
])
def test_cabling_runs_by_default_when_the_spec_plans_it(spec: str, want: bool) -> None:
    c = cluster_of(spec)
    assert ("cabling" in select_tests(c, None)) is want
    assert select_tests(c, ["links"]) == ["links"]  # --only is exactly what was asked


def test_docs_document_the_new_checks() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "verification.md").read_text() + (docs / "lab.md").read_text()
    for word in ("switch_links", "switch_ports", "fabric_load", "uplink_down", "switch_down"):
        assert word in text, word
