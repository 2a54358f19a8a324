"""The shortcuts that keep a 16,384-node spec fast must not change a byte of what they produce."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from provisioner.gcpause import without_gc
from provisioner.render.model import build_inventory
from provisioner.render.write import _dump, render_files
from provisioner.spec import load_text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import bench_spec  # type: ignore[import-not-found]  # noqa: E402

SPECS = {"bench-256": bench_spec.make_spec(256), "lab": (ROOT / "examples/lab/cluster.yaml").read_text(),
         **{p.name: p.read_text() for p in sorted(ROOT.glob("examples/*.yaml"))}}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_host_vars_shared_dumps_equal_a_whole_dump(name: str) -> None:
    cluster = load_text(SPECS[name], "x.yaml").cluster
    assert cluster is not None
    inv = build_inventory(cluster)
    files = render_files(cluster, inv)
    header = "Rendered by provisioner from x.yaml — do not edit"
    for host, hv in inv.hostvars.items():
        assert files[f"host_vars/{host}.yml"] == _dump(header, hv), host


def test_bench_generator_reaches_16384_nodes_with_short_hostlists() -> None:
    text = bench_spec.make_spec(16384)
    assert '{name: "gpu[00001-16384]", address: "10.[64-65].[0-255].[11-42]", profile: gpu8}' in text
    assert max(len(line) for line in text.splitlines()) < 512


def test_without_gc_leaves_the_collector_as_it_found_it() -> None:
    seen: list[bool] = []
    paused = without_gc(lambda: seen.append(gc.isenabled()))
    assert gc.isenabled()
    paused()
    gc.disable()
    try:
        paused()
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert seen == [False, False] and gc.isenabled()
