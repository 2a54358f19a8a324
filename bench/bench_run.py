"""The run on the lab: converge time by cluster size, and what the orchestrator costs over plain ansible-playbook.

Run (root, podman, the lab image present or buildable):

    PROVISIONER_LAB_DIR=/tmp/bench-lab .venv/bin/python bench/bench_run.py --nodes 2,4,8 --overhead-nodes 4

For each size N it brings up a lab of N nodes (N-1 GPU nodes of tests/lab/e2e_cluster.yaml's profile plus sm1,
the SM and NFS server), then times through the run engine (`provision_run`, what `provision` runs):

(b) the converge phases (preflight ... storage) on the fresh lab ("first"), then the same again ("re-run": every
    task is an idempotence check; nothing should change);
(a) on the size given by --overhead-nodes, the same playbook (default playbooks/gpu_stack.yml) on the same
    rendered inventory, alternating --repeat times: through the engine (`--only gpu_stack`: validate, render,
    ansible-runner with its event callback, the journal) and through plain `ansible-playbook` with the same
    ansible.cfg settings (forks, pipelining, SSH multiplexing, fact cache). Medians and their ratio are printed.

Both ways share the fact cache and the SSH control sockets, so neither gets a cold start the other does not.
Figures are wall clock on whatever else the machine is doing: run it on a quiet machine, or read them as noisy.
The lab is taken down after each size (--keep leaves the last one up). Results: a table on stdout and, with
--json FILE, the raw times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from task_costs import render, task_costs  # bench/ is on sys.path: the script's own folder

from provisioner.collection import playbooks_dir
from provisioner.lab import fromspec
from provisioner.lab.cluster import LabInfo, cluster_dir, lab_down, lab_up
from provisioner.lab.host import ensure_containers_conf
from provisioner.lab.ipoib import lab_ipoib_links
from provisioner.phases import RunOptions, provision_run
from provisioner.runner import DEFAULT_FORKS, ansible_settings, render_ansible_cfg
from provisioner.spec import load_cluster
from provisioner.state import RunJournal, runs_dir

ROOT = Path(__file__).resolve().parents[1]
BASE_SPEC = ROOT / "tests" / "lab" / "e2e_cluster.yaml"
CONVERGE = ["preflight", "repos", "gpu_stack", "ofed", "fabric", "storage"]


@dataclass
class SizeResult:
    nodes: int
    lab_up_s: float
    first_s: float | None = None
    first_status: str | None = None
    rerun_s: float | None = None
    rerun_status: str | None = None
    first_tasks: dict[str, float | int] = field(default_factory=dict)
    rerun_tasks: dict[str, float | int] = field(default_factory=dict)
    engine_s: list[float] = field(default_factory=list)
    plain_s: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def scaled_spec(nodes: int, name: str, dest: Path) -> Path:
    """tests/lab/e2e_cluster.yaml with ``nodes - 1`` GPU nodes (cabled to leaf ports 1..N-1) and sm1."""
    gpus = nodes - 1
    if not 1 <= gpus <= 9:
        raise SystemExit(f"--nodes: {nodes} is outside 2..10 (the spec's address block holds 9 GPU nodes)")
    text = BASE_SPEC.read_text(encoding="utf-8")
    names = f'"gpu[01-{gpus:02d}]"' if gpus > 1 else "gpu01"
    addrs = f'"10.213.38.[11-{10 + gpus}]"' if gpus > 1 else "10.213.38.11"
    ports = f"1-{gpus}" if gpus > 1 else '"1"'
    text = text.replace('"gpu[01-03]"', names).replace('"10.213.38.[11-13]"', addrs)
    # the IPoIB addresses follow the GPU nodes (rail 0 also has sm1's), the tenant partition keeps two at most
    last = 10 + gpus
    text = text.replace('"10.30.0.[11-13,21]"', f'"10.30.0.[11-{last},21]"' if gpus > 1 else '"10.30.0.[11,21]"')
    text = text.replace('"10.30.1.[11-13]"', f'"10.30.1.[11-{last}]"' if gpus > 1 else "10.30.1.11")
    if gpus == 1:
        text = text.replace('members: "gpu[01-02]"', "members: gpu01").replace('"10.31.0.[11-12]"', "10.31.0.11")
    text = re.sub(r"ports: 1-3\}", f"ports: {ports}}}", text)
    text = text.replace("cluster: {name: e2e,", f"cluster: {{name: {name},")
    path = dest / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def timed(fn: Callable[[], str]) -> tuple[float, str]:
    start = time.perf_counter()
    status = fn()
    return time.perf_counter() - start, status


def bring_up(spec: Path) -> LabInfo:
    cluster, _ = load_cluster(spec)
    info = lab_up(cluster.name, fromspec.lab_nodes(cluster), fromspec.lab_switches(cluster),
                  fromspec.lab_cables(cluster), versions=fromspec.lab_versions(cluster),
                  nfs_exports=fromspec.lab_nfs_exports(cluster), ipoib_links=lab_ipoib_links(cluster))
    fromspec.write_switch_links(str(cluster_dir(cluster.name)), fromspec.lab_switch_links(cluster))
    return info


def engine_run(spec: Path, overlay: Path, state: Path, phases: list[str]) -> str:
    return engine_journal(spec, overlay, state, phases).status


def engine_journal(spec: Path, overlay: Path, state: Path, phases: list[str]) -> RunJournal:
    return provision_run(spec, RunOptions(only=phases, overlay=str(overlay), max_fail=100), state_dir=state)


def converge(spec: Path, overlay: Path, state: Path, label: str) -> tuple[float, str, dict[str, float | int]]:
    """One timed converge, and what its tasks cost (bench/task_costs.py) printed and returned."""
    start = time.perf_counter()
    journal = engine_journal(spec, overlay, state, CONVERGE)
    secs = time.perf_counter() - start
    costs = task_costs(runs_dir(state) / journal.run_id)
    print(f"  converge, {label}: {secs:.0f} s ({journal.status})", flush=True)
    print("    " + render(costs, 12).replace("\n", "\n    "), flush=True)
    return secs, journal.status, costs.summary()


def plain_run(playbook: Path, state: Path, cfg_dir: Path) -> str:
    """ansible-playbook on the engine's rendered inventory, with the engine's ansible.cfg settings."""
    cfg = cfg_dir / "ansible.cfg"
    cfg.write_text(render_ansible_cfg(ansible_settings(state, forks=DEFAULT_FORKS)), encoding="utf-8")
    env = {**os.environ, "ANSIBLE_CONFIG": str(cfg), "ANSIBLE_HOST_KEY_CHECKING": "True",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(state / "inventory"),
                           str(playbook)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, check=False)
    return "passed" if done.returncode == 0 else f"rc {done.returncode}: {done.stderr.strip()[-200:]}"


def overhead(res: SizeResult, spec: Path, overlay: Path, state: Path, phase: str, repeat: int, work: Path) -> None:
    playbook = playbooks_dir() / f"{phase}.yml"
    for i in range(repeat):
        for way in (("engine", "plain") if i % 2 == 0 else ("plain", "engine")):
            if way == "engine":
                secs, status = timed(lambda: engine_run(spec, overlay, state, [phase]))
                res.engine_s.append(secs)
            else:
                secs, status = timed(lambda: plain_run(playbook, state, work))
                res.plain_s.append(secs)
            print(f"  {phase} via {way}: {secs:.1f} s ({status})", flush=True)
            if status != "passed":
                res.notes.append(f"{way} run {i + 1}: {status}")


def bench_size(nodes: int, args: argparse.Namespace, work: Path) -> SizeResult:
    name = f"e2eb{nodes}"
    spec = scaled_spec(nodes, name, work)
    state = work / f"state-{name}"
    print(f"{nodes} nodes: lab up", flush=True)
    up_s, _ = timed(lambda: bring_up(spec).cluster)
    res = SizeResult(nodes, up_s)
    overlay = cluster_dir(name) / "overlay.yaml"
    try:
        if not args.skip_converge:
            res.first_s, res.first_status, res.first_tasks = converge(spec, overlay, state, "first")
            res.rerun_s, res.rerun_status, res.rerun_tasks = converge(spec, overlay, state, "re-run")
        if nodes == args.overhead_nodes:
            if args.skip_converge:  # the overhead runs compare re-runs: converge the phase once first
                engine_run(spec, overlay, state, CONVERGE)
            overhead(res, spec, overlay, state, args.phase, args.repeat, work)
    finally:
        if not (args.keep and nodes == args.sizes[-1]):
            lab_down(name)
    return res


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} s" if values else "-"


def report(results: list[SizeResult], phase: str) -> None:
    print("\n| nodes | lab up | converge, first run | converge, re-run | re-run host results | re-run s per result |"
          "\n|---:|---:|---:|---:|---:|---:|")
    for r in results:
        first = f"{r.first_s:.0f} s" + ("" if r.first_status == "passed" else f" ({r.first_status})") \
            if r.first_s is not None else "-"
        rerun = f"{r.rerun_s:.0f} s" + ("" if r.rerun_status == "passed" else f" ({r.rerun_status})") \
            if r.rerun_s is not None else "-"
        per = r.rerun_tasks.get("per_result_s", "-")
        print(f"| {r.nodes} | {r.lab_up_s:.1f} s | {first} | {rerun} | {r.rerun_tasks.get('host_results', '-')} "
              f"| {per} |")
    for r in results:
        if r.engine_s and r.plain_s:
            ratio = statistics.median(r.engine_s) / statistics.median(r.plain_s)
            print(f"\n{phase}.yml re-run on {r.nodes} nodes, {len(r.engine_s)}x each, alternating: engine median "
                  f"{median(r.engine_s)}, plain ansible-playbook median {median(r.plain_s)}, ratio {ratio:.2f}")
            print(f"  engine: {', '.join(f'{s:.1f}' for s in r.engine_s)}; "
                  f"plain: {', '.join(f'{s:.1f}' for s in r.plain_s)}")
        for note in r.notes:
            print(f"  note ({r.nodes} nodes): {note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="2,4,8", help="lab sizes (total nodes, sm1 included), comma-separated")
    ap.add_argument("--overhead-nodes", type=int, default=4, help="the size to compare engine vs plain on (0: none)")
    ap.add_argument("--phase", default="gpu_stack", help="the playbook of the overhead comparison")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each way (alternating)")
    ap.add_argument("--skip-converge", action="store_true", help="only the overhead comparison")
    ap.add_argument("--keep", action="store_true", help="leave the last lab up")
    ap.add_argument("--json", type=Path, help="write the raw results here")
    args = ap.parse_args(argv)
    args.sizes = [int(n) for n in args.nodes.split(",") if n]
    if os.geteuid() != 0:
        print("bench_run: needs root (rootful podman for the lab)", file=sys.stderr)
        return 2
    ensure_containers_conf()
    results: list[SizeResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        for n in args.sizes:
            results.append(bench_size(n, args, Path(tmp)))
    report(results, args.phase)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
