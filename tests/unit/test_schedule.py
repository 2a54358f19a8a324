"""Properties of the pairwise bandwidth scheduler: disjoint rounds, coverage, and fault localisation."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.errors import UsageError
from provisioner.fabric.schedule import (
    Localisation,
    Measure,
    Pair,
    PairResult,
    Round,
    judge,
    localise,
    plan_full,
    plan_localisation,
    plan_quick_round1,
    run_quick,
    verdict_findings,
)

RAILS = (0, 1, 2, 3)


def names(n: int) -> list[str]:
    return [f"gpu{i:03d}" for i in range(n)]


def simulate(bad_ports: Collection[tuple[str, int]] = (), bad_links: Collection[tuple[str, str, int]] = ()) -> Measure:
    """A measure() that fails a pair when either port or the (sorted) link is in the fault set."""

    def measure(rnd: Round, rails: Sequence[int]) -> list[PairResult]:
        out: list[PairResult] = []
        for rail in rails:
            for p in rnd.pairs:
                bad = (p.server, rail) in bad_ports or (p.client, rail) in bad_ports or (*p.key, rail) in bad_links
                out.append(PairResult(p, rail, passed=not bad, gbps=50.0 if bad else 390.0))
        return out

    return measure


def assert_disjoint(rnd: Round) -> None:
    seen = [n for p in rnd.pairs for n in p.nodes]
    assert len(seen) == len(set(seen)), f"round {rnd.index} reuses a node: {rnd.pairs}"
    assert not set(seen) & set(rnd.idle)


def only_fault_named(
    loc: Localisation,
    nodes: list[str],
    rails: Sequence[int],
    *,
    port: tuple[str, int] | None = None,
    link: tuple[str, str, int] | None = None,
) -> None:
    for node in nodes:
        for rail in rails:
            v = loc.verdicts[(node, rail)]
            if port == (node, rail):
                assert v.status == "bad", v
            elif link is not None and rail == link[2] and node in link[:2]:
                assert v.status == "link", v
            else:
                assert v.status == "good", v
    assert list(loc.links) == ([link] if link else [])


# --- full mode -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 16, 33])
def test_full_mode_round_count(n: int) -> None:
    assert len(plan_full(names(n))) == (n - 1 if n % 2 == 0 else n)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=64))
def test_full_mode_covers_every_pair_once_with_disjoint_rounds(n: int) -> None:
    nodes = names(n)
    rounds = plan_full(nodes)
    keys = [p.key for r in rounds for p in r.pairs]
    assert len(keys) == len(set(keys)) == n * (n - 1) // 2
    assert set(keys) == set(combinations(nodes, 2))
    for r in rounds:
        assert_disjoint(r)
        assert len(r.idle) == n % 2  # odd n: exactly one node sits out each round
        assert r.busy() | set(r.idle) == set(nodes)


def test_full_mode_balances_server_role() -> None:
    for n in (8, 9, 16, 33):
        rounds = plan_full(names(n))
        servings = {x: sum(1 for r in rounds for p in r.pairs if p.server == x) for x in names(n)}
        assert max(servings.values()) - min(servings.values()) <= 1, servings
        assert max(servings.values()) == (n // 2 if n % 2 == 0 else (n - 1) // 2)


def test_full_mode_small_and_duplicate_inputs() -> None:
    assert plan_full(["solo"]) == []
    assert plan_full([]) == []
    with pytest.raises(UsageError, match="duplicate node names"):
        plan_full(["a", "b", "a"])


# --- quick mode round 1 ----------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=2, max_value=64))
def test_quick_round1_tests_every_node(n: int) -> None:
    nodes = names(n)
    rounds = plan_quick_round1(nodes)
    assert len(rounds) == (1 if n % 2 == 0 else 2)
    for r in rounds:
        assert_disjoint(r)
    first = rounds[0]
    assert len(first.pairs) == n // 2
    tested = {x for r in rounds for p in r.pairs for x in p.nodes}
    assert tested == set(nodes)
    if n % 2:
        # The odd node out is paired with the first node, in its own slot.
        assert rounds[1].pairs == (Pair(nodes[0], nodes[-1]),)


def test_quick_round1_sorts_input() -> None:
    rounds = plan_quick_round1(["d", "b", "c", "a"])
    assert rounds[0].pairs == (Pair("a", "b"), Pair("c", "d"))


def test_pair_rejects_self() -> None:
    with pytest.raises(ValueError, match="itself"):
        Pair("a", "a")


# --- localisation ----------------------------------------------------------------------------------------


def test_all_pass_needs_no_localisation() -> None:
    nodes = names(6)
    r1 = simulate()(plan_quick_round1(nodes)[0], RAILS)
    assert plan_localisation(nodes, RAILS, r1) == []
    loc = localise(r1, nodes=nodes, rails=RAILS)
    assert loc.all_good
    assert verdict_findings(loc) == []


def test_localisation_pairs_suspects_with_known_good_nodes() -> None:
    nodes = names(6)
    r1 = simulate(bad_ports={("gpu002", 1)})(plan_quick_round1(nodes)[0], RAILS)
    rounds = plan_localisation(nodes, RAILS, r1)
    assert len(rounds) == 1 and rounds[0].rails == (1,)
    (rnd,) = rounds
    assert_disjoint(rnd)
    partners = {x: (set(p.nodes) - {x}).pop() for p in rnd.pairs for x in p.nodes}
    # gpu002 and gpu003 failed together; each now meets a node that passed in round 1, not each other.
    assert partners["gpu002"] in {"gpu000", "gpu001", "gpu004", "gpu005"}
    assert partners["gpu003"] in {"gpu000", "gpu001", "gpu004", "gpu005"}
    assert partners["gpu002"] != partners["gpu003"]


def test_same_fault_on_all_rails_is_one_round_and_a_host_note() -> None:
    nodes = names(8)
    bad = {("gpu005", r) for r in RAILS}
    rounds, loc = run_quick(nodes, RAILS, simulate(bad_ports=bad))
    loc_rounds = [r for r in rounds if r.purpose == "localisation"]
    assert len(loc_rounds) == 1 and loc_rounds[0].rails == RAILS
    assert [(v.node, v.rail) for v in loc.with_status("bad")] == sorted(bad)
    assert any("gpu005: bad on all 4 rails" in n for n in loc.notes)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_single_bad_port_is_named(data: st.DataObject) -> None:
    n = data.draw(st.integers(min_value=3, max_value=64), label="n")
    nodes = names(n)
    port = (data.draw(st.sampled_from(nodes), label="bad node"), data.draw(st.sampled_from(RAILS)))
    rounds, loc = run_quick(nodes, RAILS, simulate(bad_ports={port}))
    assert len({r.index for r in rounds}) == (2 if n % 2 == 0 else 3)
    for r in rounds:
        assert_disjoint(r)
    only_fault_named(loc, nodes, RAILS, port=port)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_single_bad_link_among_tested_pairs_is_named(data: st.DataObject) -> None:
    n = data.draw(st.integers(min_value=3, max_value=64), label="n")
    nodes = names(n)
    tested = [p.key for r in plan_quick_round1(nodes) for p in r.pairs]
    a, b = data.draw(st.sampled_from(tested), label="bad link")
    link = (a, b, data.draw(st.sampled_from(RAILS), label="rail"))
    _, loc = run_quick(nodes, RAILS, simulate(bad_links={link}))
    only_fault_named(loc, nodes, RAILS, link=link)


@pytest.mark.parametrize("n", [3, 4, 5, 6, 7])
def test_every_single_fault_exhaustively_for_small_clusters(n: int) -> None:
    """Small n is where known-good partners are scarce: check every port and every tested link."""
    nodes = names(n)
    rails = (0,)
    for node in nodes:
        _, loc = run_quick(nodes, rails, simulate(bad_ports={(node, 0)}))
        only_fault_named(loc, nodes, rails, port=(node, 0))
    for rnd in plan_quick_round1(nodes):
        for p in rnd.pairs:
            _, loc = run_quick(nodes, rails, simulate(bad_links={(*p.key, 0)}))
            only_fault_named(loc, nodes, rails, link=(*p.key, 0))


def test_two_nodes_are_honestly_ambiguous() -> None:
    nodes = ["a", "b"]
    rounds, loc = run_quick(nodes, (0,), simulate(bad_ports={("a", 0)}))
    assert [r.purpose for r in rounds] == ["quick"]  # nothing to re-pair with
    assert {v.status for v in loc.verdicts.values()} == {"unknown"}
    assert "third node" in loc.verdicts[("a", 0)].reason
    assert any("only two nodes" in n for n in loc.notes)
    warnings = verdict_findings(loc)
    assert [f.severity for f in warnings] == ["warning", "warning"]


def test_dead_rail_is_reported_as_rail_wide_not_as_bad_ports() -> None:
    nodes = names(6)
    bad = {(n, 2) for n in nodes}
    _, loc = run_quick(nodes, RAILS, simulate(bad_ports=bad))
    assert all(loc.verdicts[(n, 2)].status == "unknown" for n in nodes)
    assert all(loc.verdicts[(n, r)].status == "good" for n in nodes for r in (0, 1, 3))
    assert any(note.startswith("rail 2: no test passed") for note in loc.notes)


def test_two_bad_ports_in_one_pair_stay_suspects_not_guesses() -> None:
    """Two faults in one pair: each failed with one known-good node only, which a link fault also explains."""
    nodes = names(8)
    bad = {("gpu000", 0), ("gpu001", 0)}
    _, loc = run_quick(nodes, (0,), simulate(bad_ports=bad))
    assert loc.with_status("bad") == []
    for node, rail in bad:
        v = loc.verdicts[(node, rail)]
        assert v.status == "unknown"
        assert "no second known-good partner" in v.reason
    assert all(loc.verdicts[(n, 0)].status == "good" for n in nodes[2:])
    assert sorted(f.node or "" for f in verdict_findings(loc)) == ["gpu000", "gpu001"]


def test_full_mode_results_localise_too() -> None:
    nodes = names(7)
    measure = simulate(bad_ports={("gpu004", 0)}, bad_links={("gpu000", "gpu001", 0)})
    results = [res for rnd in plan_full(nodes) for res in measure(rnd, (0,))]
    loc = localise(results)
    assert [v.node for v in loc.with_status("bad")] == ["gpu004"]
    assert loc.links == (("gpu000", "gpu001", 0),)
    kinds = sorted((f.severity, f.node, f.peer) for f in verdict_findings(loc, device_by_rail={0: "mlx5_0"}))
    assert kinds == [("error", "gpu000", "gpu001"), ("error", "gpu004", None)]


def test_untested_node_is_unknown_not_good() -> None:
    r1 = [PairResult(Pair("a", "b"), 0, passed=True)]
    loc = localise(r1, nodes=["a", "b", "c"], rails=[0])
    assert loc.verdicts[("c", 0)].status == "unknown"
    assert loc.verdicts[("c", 0)].reason == "not tested on this rail"
    assert not loc.all_good


# --- judging a bandwidth figure --------------------------------------------------------------------------


def test_judge_threshold_and_missing_figure() -> None:
    p = Pair("a", "b")
    assert judge(p, 0, 360.0, 400.0).passed
    low = judge(p, 0, 359.9, 400.0)
    assert not low.passed and "< 360.0 Gb/s" in low.detail
    assert not judge(p, 0, None, 400.0).passed
    with pytest.raises(UsageError):
        judge(p, 0, 1.0, 0.0)
