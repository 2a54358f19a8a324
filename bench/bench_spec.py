"""Validate and render specs up to 16,384 nodes (a 131,072-GPU cluster): how long does it take?

Builds a spec of N nodes (8 x H100, 8 NDR rails each, rail-optimised leaves with 1:1 uplinks, two SMs) as YAML
text, then times load (YAML + schema + expansion + rules) and render (inventory files in memory), best of a few
runs. Prints a table; no assertion: machines are shared and noisy.

    python bench/bench_spec.py [N ...]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from provisioner.render import render_files, render_inventory
from provisioner.render.model import _group_name as group_name_cache
from provisioner.spec import load_text
from provisioner.spec.hostlist import _expand as hostlist_cache


def make_spec(n: int) -> str:
    pods = (n + 31) // 32
    cab = []
    for pod in range(pods):
        lo, hi = pod * 32 + 1, min(n, pod * 32 + 32)
        for r in range(8):
            cab.append(f'      - {{nodes: "gpu[{lo:05d}-{hi:05d}]", hca: mlx5_{r}, switch: leaf{pod * 8 + r + 1:05d}, '
                       f"ports: 1-{hi - lo + 1}}}")
    return f"""cluster: {{name: big, os: ubuntu-22.04}}
software:
  driver: {{version: "550.90.07"}}
  cuda: "12.4.1"
  nccl: "2.21.5"
  ofed: {{flavor: doca, version: "2.7.0"}}
repositories:
  cuda: {{url: "http://m/cuda", key: k.gpg}}
  doca: {{url: "http://m/doca", key: k.gpg}}
profiles:
  gpu8:
    gpu: {{model: H100-SXM5-80GB, count: 8, nvswitch: true}}
    hcas: [{{device: "mlx5_[0-7]", rate: NDR}}]
  svc:
    hcas: [{{device: mlx5_0, rate: NDR}}]
nodes:
  - {{name: "gpu[00001-{n:05d}]", address: "{_addr_range(n)}", profile: gpu8}}
  - {{name: "sm[1-2]", address: "10.255.0.[2-3]", profile: svc, roles: [subnet_manager]}}
switches:
  - {{name: "leaf[00001-{pods * 8:05d}]", tier: leaf, ports: 64, uplinks: 32}}
  - {{name: svcleaf, tier: leaf, ports: 64, uplinks: 2}}
fabric:
  rate: NDR
  topology:
    kind: rail_optimized
    cabling:
{chr(10).join(cab)}
      - {{nodes: "sm[1-2]", hca: mlx5_0, switch: svcleaf, ports: 1-2}}
  subnet_manager:
    nodes: [{{node: sm1, priority: 15}}, {{node: sm2, priority: 14}}]
    adaptive_routing: true
"""


def _addr_range(n: int) -> str:
    """A /24 per rack of 32 nodes (10.64.R.11-42, racks running on into 10.65...), as one hostlist item when n is a
    whole number of /16s or fits one: ClusterShell merges several multi-dimensional items slowly (see
    docs/benchmarks.md, "Scale")."""
    racks, rest = divmod(n, 32)
    items = []
    full16, left = divmod(racks, 256)
    if full16:
        items.append(f"10.[64-{63 + full16}].[0-255].[11-42]" if full16 > 1 else "10.64.[0-255].[11-42]")
    if left:
        items.append(f"10.{64 + full16}.[0-{left - 1}].[11-42]" if left > 1 else f"10.{64 + full16}.0.[11-42]")
    if rest:
        items.append(f"10.{64 + (racks // 256)}.{racks % 256}.[11-{10 + rest}]")
    return ",".join(items)


def best_of(fn, runs: int = 3) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The best wall-clock and the best CPU seconds of a few runs (CPU time is what a shared, loaded machine
    distorts least)."""
    walls, cpus = [], []
    for _ in range(runs):
        hostlist_cache.cache_clear()  # each run as a fresh `provision validate` process would see it
        group_name_cache.cache_clear()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus)


def main(sizes: list[int]) -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; seconds, best of 3 (wall / CPU)")
    print(f"{'nodes':>6} {'spec lines':>10} {'validate':>13} {'render':>13} {'files':>6} {'total':>13} "
          f"{'write s':>8} {'rewrite s':>9}")
    for n in sizes:
        text = make_spec(n)
        res = load_text(text, "big.yaml")
        assert not res.errors, [d.format() for d in res.errors[:3]]
        cluster = res.cluster
        assert cluster is not None and len(cluster.nodes) == n + 2
        v_wall, v_cpu = best_of(lambda: load_text(text, "big.yaml"))  # noqa: B023
        files: dict[str, str] = {}

        def rend() -> None:
            files.update(render_files(cluster))  # noqa: B023

        r_wall, r_cpu = best_of(rend)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            render_inventory(cluster, Path(tmp))
            t_write = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = render_inventory(cluster, Path(tmp))
            t_rewrite = time.perf_counter() - t0
            assert again.written == []
        print(f"{n:>6} {text.count(chr(10)):>10} {v_wall:>6.2f}/{v_cpu:<6.2f} {r_wall:>6.2f}/{r_cpu:<6.2f} "
              f"{len(files):>6} {v_wall + r_wall:>6.2f}/{v_cpu + r_cpu:<6.2f} {t_write:>8.2f} {t_rewrite:>9.2f}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [64, 512, 1024, 4096, 16384])
