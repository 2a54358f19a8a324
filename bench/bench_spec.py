"""Validate and render a 4,096-node spec: how long does it take?

Builds a spec of N nodes (8 x H100, 8 NDR rails each, rail-optimised leaves with 1:1 uplinks, two SMs) as YAML
text, then times load (YAML + schema + expansion + rules) and render (inventory files in memory), best of a few
runs. Prints a table; no assertion: machines are shared and noisy.

    python bench/bench_spec.py [N ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from provisioner.render import render_files, render_inventory
from provisioner.spec import load_text


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
    """10.64.X.Y for n nodes, 200 per /24, as one short two-dimensional hostlist expanded in step with the names."""
    full, rest = divmod(n, 200)
    parts = []
    if full:
        parts.append(f"10.64.[0-{full - 1}].[11-210]" if full > 1 else "10.64.0.[11-210]")
    if rest:
        parts.append(f"10.64.{full}.[11-{10 + rest}]")
    return ",".join(parts)


def best_of(fn, runs: int = 3) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(sizes: list[int]) -> None:
    print(f"{'nodes':>6} {'spec lines':>10} {'validate s':>10} {'render s':>9} {'files':>6} {'total s':>8} "
          f"{'write s':>8} {'rewrite s':>9}")
    for n in sizes:
        text = make_spec(n)
        res = load_text(text, "big.yaml")
        assert not res.errors, [d.format() for d in res.errors[:3]]
        cluster = res.cluster
        assert cluster is not None and len(cluster.nodes) == n + 2
        t_val = best_of(lambda: load_text(text, "big.yaml"))  # noqa: B023
        files: dict[str, str] = {}

        def rend() -> None:
            files.update(render_files(cluster))  # noqa: B023

        t_ren = best_of(rend)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            render_inventory(cluster, Path(tmp))
            t_write = time.perf_counter() - t0
            t0 = time.perf_counter()
            again = render_inventory(cluster, Path(tmp))
            t_rewrite = time.perf_counter() - t0
            assert again.written == []
        print(f"{n:>6} {text.count(chr(10)):>10} {t_val:>10.2f} {t_ren:>9.2f} {len(files):>6} {t_val + t_ren:>8.2f} "
              f"{t_write:>8.2f} {t_rewrite:>9.2f}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [64, 512, 1024, 4096])
