"""Quick vs full pairwise mode: rounds, scheduler wall time, and whether a simulated fault was named.

Run: .venv/bin/python bench/bench_schedule.py [--rails 8] [--seconds-per-round 10]

For each cluster size the scheduler plans quick mode against a simulated fabric with one bad port (a node
in the middle of the list, on one rail) and, separately, one bad link (a pair tested in round 1), then
checks that :func:`localise` named exactly that fault. Full mode is planned and its results (with the same
bad port, one rail) are localised too. Times are the scheduler's CPU work only (plan + localise, with a
trivial simulated measure); the fabric time column is rounds × an *assumed* per-round test duration.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from provisioner.fabric.schedule import (
    Localisation,
    Measure,
    PairResult,
    Round,
    localise,
    plan_full,
    plan_quick_round1,
    run_quick,
)

SIZES = (4, 5, 8, 16, 32, 33, 64, 128, 256, 512, 1024)


def simulate(bad_port: tuple[str, int] | None, bad_link: tuple[str, str, int] | None) -> Measure:
    def measure(rnd: Round, rails: Sequence[int]) -> list[PairResult]:
        out: list[PairResult] = []
        for rail in rails:
            for p in rnd.pairs:
                bad = (bad_port is not None and bad_port in ((p.server, rail), (p.client, rail))) or (
                    bad_link is not None and (*p.key, rail) == bad_link
                )
                out.append(PairResult(p, rail, passed=not bad))
        return out

    return measure


def named(loc: Localisation, bad_port: tuple[str, int] | None, bad_link: tuple[str, str, int] | None) -> bool:
    """True when exactly the injected fault is blamed and every other port is good."""
    bad = [(v.node, v.rail) for v in loc.with_status("bad")]
    unknown = loc.with_status("unknown")
    if bad_port is not None:
        return bad == [bad_port] and not unknown and not loc.links
    return not bad and not unknown and list(loc.links) == [bad_link]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rails", type=int, default=8, help="rails (HCAs per node), default 8")
    parser.add_argument("--seconds-per-round", type=float, default=10.0, help="assumed test time per round")
    parser.add_argument("--full-localise-max", type=int, default=1024, help="largest n to localise in full mode")
    args = parser.parse_args()
    rails = list(range(args.rails))
    spr = args.seconds_per_round
    print(f"rails={args.rails}; fabric time assumes {spr:g} s per round (ib_write_bw run + setup)")
    header = (
        f"{'nodes':>5} | {'quick rounds':>12} {'ms bad-port':>11} {'ok':>3} {'ms bad-link':>11} {'ok':>3} "
        f"{'fabric':>8} | {'full rounds':>11} {'ms plan':>8} {'ms loc(1 rail)':>14} {'ok':>3} {'fabric':>8}"
    )
    print(header)
    print("-" * len(header))
    for n in SIZES:
        nodes = [f"node{i:04d}" for i in range(n)]
        port = (nodes[n // 2], rails[-1])
        first = plan_quick_round1(nodes)[0].pairs[-1].key
        link = (*first, rails[0])

        t0 = time.perf_counter()
        rounds, loc = run_quick(nodes, rails, simulate(port, None))
        t_port = (time.perf_counter() - t0) * 1e3
        ok_port = named(loc, port, None)
        q_rounds = len({r.index for r in rounds})

        t0 = time.perf_counter()
        rounds_l, loc_l = run_quick(nodes, rails, simulate(None, link))
        t_link = (time.perf_counter() - t0) * 1e3
        ok_link = named(loc_l, None, link)
        q_rounds = max(q_rounds, len({r.index for r in rounds_l}))

        t0 = time.perf_counter()
        full = plan_full(nodes)
        t_plan = (time.perf_counter() - t0) * 1e3
        if n <= args.full_localise_max:
            one_rail_port = (port[0], 0)
            measure = simulate(one_rail_port, None)
            results = [res for rnd in full for res in measure(rnd, [0])]
            t0 = time.perf_counter()
            floc = localise(results, nodes=nodes, rails=[0])
            t_floc = f"{(time.perf_counter() - t0) * 1e3:14.1f}"
            ok_full = "yes" if named(floc, one_rail_port, None) else "NO"
        else:
            t_floc, ok_full = f"{'skipped':>14}", "-"
        print(
            f"{n:>5} | {q_rounds:>12} {t_port:>11.1f} {'yes' if ok_port else 'NO':>3} {t_link:>11.1f} "
            f"{'yes' if ok_link else 'NO':>3} {q_rounds * spr / 60:>6.1f} m | {len(full):>11} {t_plan:>8.1f} "
            f"{t_floc} {ok_full:>3} {len(full) * spr / 3600:>6.2f} h"
        )


if __name__ == "__main__":
    main()
