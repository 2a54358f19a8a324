"""Failover on the Slurm lab: how long from a lost GPU to the spare in the partition, and where the time goes.

Run (root, podman, the lab image present or buildable):

    PROVISIONER_LAB_DIR=/tmp/bench-failover .venv/bin/python bench/bench_failover.py [--keep] [--json FILE]

It brings up tests/lab/slurm_cluster.yaml (gpu01-02 in the partition, gpu03 the spare, sm1 the SM and Slurm
controller; real Slurm from the Debian mirror), converges it with `provision`, starts a job on gpu02, takes one of
gpu02's GPUs away (the lab's ``gpu_missing`` fault) and runs one round of `provision watch --once` as a systemd
timer would. Printed: the converge time, the watch round's wall time, and the failover's own timeline (fault seen,
drained, spare verified, spare in partition, persisted) in seconds since the watch saw the fault, with the spec's
budget. Figures are wall clock on whatever else the machine is doing; read them as noisy. The lab is taken down
at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from provisioner import cli
from provisioner.lab import faults, fromspec
from provisioner.lab.cluster import cluster_dir, lab_down, lab_up
from provisioner.lab.host import ensure_containers_conf, podman
from provisioner.lab.names import container_name
from provisioner.spec import load_cluster

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "tests" / "lab" / "slurm_cluster.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="benchfo", help="lab cluster name (containers are global to podman)")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    spec = work / "cluster.yaml"
    spec.write_text(SPEC.read_text(encoding="utf-8").replace("cluster: {name: slurmlab,",
                                                             f"cluster: {{name: {args.cluster},"), encoding="utf-8")
    state = work / "state"
    ensure_containers_conf()
    cluster, _ = load_cluster(spec)
    figures: dict[str, object] = {"cluster": args.cluster, "load_before": os.getloadavg()[0]}
    try:
        t = time.monotonic()
        info = lab_up(args.cluster, fromspec.lab_nodes(cluster), fromspec.lab_switches(cluster),
                      fromspec.lab_cables(cluster), versions=fromspec.lab_versions(cluster))
        fromspec.write_switch_links(str(cluster_dir(args.cluster)), fromspec.lab_switch_links(cluster))
        figures["lab_up_s"] = round(time.monotonic() - t, 1)
        common = [str(spec), "--overlay", str(info.overlay), "--out", str(state)]

        t = time.monotonic()
        rc = cli.main(common)
        figures["converge_s"] = round(time.monotonic() - t, 1)
        if rc != 0:
            print(f"converge failed (exit {rc}); see {state}", file=sys.stderr)
            return 1
        ctr = container_name(args.cluster, "sm1")
        podman("exec", ctr, "sbatch", "-p", "gpu", "-w", "gpu02", "-o", "/dev/null", "--wrap", "sleep 900")

        t = time.monotonic()
        faults.inject(str(cluster_dir(args.cluster)), "gpu02", "gpu_missing")
        rc = cli.main(["watch", "--once", "--peers", "1", *common])
        figures["watch_round_s"] = round(time.monotonic() - t, 1)
        figures["watch_exit"] = rc
        records = sorted((state / "failover").glob("*-gpu02.json"))
        if not records:
            print(f"no failover record under {state / 'failover'}", file=sys.stderr)
            return 1
        record = json.loads(records[-1].read_text(encoding="utf-8"))
        figures["timeline"] = record.get("timeline", [])
        figures["spare"] = record.get("spare")
        figures["budget_s"] = record.get("budget_s")
        figures["load_after"] = os.getloadavg()[0]
    finally:
        if not args.keep:
            lab_down(args.cluster)

    print(f"lab up {figures['lab_up_s']} s, converge {figures['converge_s']} s, "
          f"watch round (fault injected to exit) {figures['watch_round_s']} s, exit {figures['watch_exit']}")
    print(f"spare {figures['spare']}; failover timeline (s since the watch saw the fault; budget "
          f"{figures['budget_s']} s):")
    for ev in figures["timeline"]:  # type: ignore[attr-defined]
        print(f"  {ev['s']:8.1f}  {ev['event']}")
    print(f"load average {figures['load_before']:.1f} before, {figures['load_after']:.1f} after")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
