"""Day 2 on a real Slurm: a rolling driver change under a running job, a failing batch and its resume, and a
spare taking a failed node's place, on a 4-node lab (tests/lab/slurm_cluster.yaml).

Slurm here is Debian's own (slurmctld on sm1, slurmd on gpu01-03, MUNGE), installed and configured by the slurm
role from the Debian mirror: draining, waiting for jobs, resuming and partition changes are what real Slurm does.
The tests share one lab and one state directory and run in file order:

1. a fresh lab converges with the slurm phase (exit 0): gpu01-02 idle in the partition, the spare gpu03
   registered with slurmctld and in no partition; its verification ran NCCL as an srun step over the partition
   with a job holding gpu01, verification sends it no traffic (its results could not run, naming the job), and
   `--include-busy` finds srun refusing the busy node, the job untouched either way;
   with a job holding gpu02, `verify --only dcgm` and `provision tune` could not run there, naming the job;
2. the driver pin moves to the lab's newer release and ``--rolling --batch 1`` runs with a job sleeping on gpu01
   and gpu01's mlx5_1 link trained at 2X: the spare's batch passes; gpu01's batch drains it, waits for the job to
   end (the job completes, it is not killed), converges, fails verification and stops there, gpu01 drained with
   the reason and the resume command printed (exit 1); with the link repaired, that command ends the rolling run
   (exit 0): every GPU node runs the new driver and every partition node is back in service;
3. with a job running on gpu02, gpu02 loses a GPU; one ``provision watch --once`` round sees it (twice, the
   confirmation probe), drains gpu02, verifies the spare against a healthy peer, puts gpu03 in gpu02's place in the
   partition and persists slurm.conf; the time from the fault to the spare in the partition is measured and must be
   inside the spec's failover budget (``bench/bench_failover.py`` reports the same timeline);
4. with the cluster put back as the spec has it (gpu01-02 in the partition, gpu03 the only spare), two ``provision
   failover`` processes start at once, for gpu01 and for gpu02: exactly one gets gpu03, the other is refused by
   the day-2 lock naming the holder (or, had it started after the first finished, finds no spare left), swaps.json
   holds one record and the live partition has no node that should not be there.

Run: ``PROVISIONER_LAB_DIR=/tmp/slurm-lab pytest -m lab tests/lab/test_slurm_lab.py`` (root, podman); the cluster
name is ``slurmlab`` unless PROVISIONER_LAB_TEST_CLUSTER says otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _labspec import SpecLab, cluster_name, spec_lab  # type: ignore[import-not-found]

from provisioner import cli
from provisioner.day2.rolling import load_last
from provisioner.fabric import nccl
from provisioner.lab import faults
from provisioner.lab.host import podman
from provisioner.lab.names import container_name
from provisioner.slurm.membership import SWAPS, load_swaps
from provisioner.spec import hostlist

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

SPEC = Path(__file__).with_name("slurm_cluster.yaml")
CLUSTER = cluster_name("slurmlab")
OLD_DRIVER, NEW_DRIVER = "550.90.07", "550.127.05"
HOSTS = ["gpu01", "gpu02", "gpu03", "sm1"]


Lab = SpecLab


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One lab for the module, brought up as `provision lab up` does; always taken down."""
    yield spec_lab(request, tmp_path_factory, SPEC, CLUSTER)


def provision(lab: Lab, capsys: pytest.CaptureFixture[str], *args: str, spec: Path | None = None) -> tuple[int, str]:
    """`provision ARGS... SPEC --overlay OVERLAY --out STATE` in this process; (exit code, stdout + stderr)."""
    capsys.readouterr()
    rc = cli.main([*args, str(spec or lab.spec), "--overlay", str(lab.info.overlay), "--out", str(lab.state)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def sh(host: str, command: str) -> str:
    """A command inside a lab node (the trusted local channel, not the product's SSH); fails on a non-zero exit."""
    done = podman("exec", container_name(CLUSTER, host), "sh", "-c", command, check=False, timeout=120)
    assert done.returncode == 0, f"{host}: {command}: exit {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


def node_state(name: str) -> dict[str, str]:
    """`scontrol show node NAME` on the controller, as key=value pairs (Reason keeps its spaces)."""
    text = sh("sm1", f"scontrol show node {shlex.quote(name)}")
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    reason = re.search(r"Reason=(.*?)(?: \[|$)", text, re.M)
    fields["Reason"] = reason.group(1).strip() if reason else ""
    return fields


def partition_nodes(partition: str = "gpu") -> str:
    return str(dict(re.findall(r"(\w+)=(\S*)", sh("sm1", f"scontrol show partition {partition}")))["Nodes"])


def job(job_id: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", sh("sm1", f"scontrol show job {shlex.quote(job_id)}")))


def wait_idle(node: str, deadline_s: float = 60.0) -> None:
    """Wait until Slurm has the node IDLE again (a cancelled job's node passes through COMPLETING)."""
    deadline = time.monotonic() + deadline_s
    while node_state(node)["State"] != "IDLE":
        assert time.monotonic() < deadline, node_state(node)
        time.sleep(0.5)


def submit(node: str, script: str) -> str:
    """A job running SCRIPT on NODE, started (RUNNING) before this returns."""
    job_id = sh("sm1", f"sbatch --parsable -p gpu -w {node} -o /dev/null --wrap {shlex.quote(script)}").strip()
    assert job_id.isdigit(), job_id
    deadline = time.monotonic() + 60
    while job(job_id)["JobState"] != "RUNNING":
        assert time.monotonic() < deadline, f"job {job_id} never started on {node}: {job(job_id)}"
        time.sleep(0.5)
    return job_id


def with_driver(lab: Lab, version: str) -> Path:
    text = lab.spec.read_text(encoding="utf-8")
    old = f'driver: {{version: "{OLD_DRIVER}"'
    assert old in text
    path = lab.spec.with_name(f"cluster-{version}.yaml")
    path.write_text(text.replace(old, f'driver: {{version: "{version}"'), encoding="utf-8")
    return path


def driver_version(host: str) -> str:
    return sh(host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").split()[0]


def test_fresh_cluster_runs_slurm(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = provision(lab, capsys)
    assert rc == 0, out[-4000:]
    assert "slurm: ok" in out, out[-3000:]
    assert re.search(r"^verify: (ok|PASS)", out, re.M) or "verify: PASS" in out, out[-3000:]
    assert partition_nodes() == "gpu[01-02]"
    for n in ("gpu01", "gpu02"):
        assert node_state(n)["State"] == "IDLE", node_state(n)
    spare = node_state("gpu03")
    assert spare["State"] == "IDLE" and spare.get("Partitions", "") == "", spare


def test_verify_starts_nccl_with_srun_and_a_busy_node_leaves_it_unproven(
        lab: Lab, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The fresh run's verification started the all-reduce the way jobs start: an srun step over the partition's
    nodes (Debian's PMIx plugin, real slurmctld); the spare, in no partition, is said alone. A node running a job
    then gets no traffic (could not run, naming the job); with --include-busy, srun refuses it (Slurm's words); the
    job is left running."""
    report = json.loads((lab.state / "verify" / "latest" / "report.json").read_text(encoding="utf-8"))
    check = next(c for c in report["checks"] if c["name"] == "nccl")
    assert check["passed"] and check["error"] is None, check
    gpu = "the default partition, Slurm partition gpu"
    assert check["measurements"][f"launcher {gpu}"] == "srun", check["measurements"]
    assert check["measurements"][f"busbw_gbps {gpu}"] >= 80, check["measurements"]
    spare = [f for f in check["findings"] if f["node"] == "gpu03"]
    assert [f["severity"] for f in spare] == ["info"] and "srun cannot start" in spare[0]["message"], spare
    steps = re.findall(r"JobName=provisioner-nccl\b.*?JobState=(\S+).*?\bNodeList=(\S+)",
                       sh("sm1", "scontrol show jobs --oneliner"))
    assert ("COMPLETED", "gpu[01-02]") in steps, steps  # the step Slurm ran (kept MinJobAge, 300 s)

    held = submit("gpu01", "sleep 600")
    monkeypatch.setattr(nccl, "SRUN_WAIT_S", 5)
    try:
        # slurmctld says gpu01 runs the job: no traffic goes there, its results could not run, naming the job
        rc, out = provision(lab, capsys, "verify", "--only", "bandwidth,nccl")
        assert rc == 2, out[-3000:]
        assert re.search(rf"^NOT RUN (bandwidth|nccl) gpu01: Slurm runs job {held} on gpu01", out, re.M), out[-3000:]
        assert "Requested nodes are busy" not in out, out[-3000:]  # srun was never asked for gpu01
        # --include-busy sends it anyway: srun's exclusive step cannot get gpu01 and says so; nothing is blamed
        rc, out = provision(lab, capsys, "verify", "--only", "nccl", "--include-busy")
        assert rc == 2, out[-3000:]
        assert "Requested nodes are busy" in out and "--nccl-launcher mpirun" in out, out[-3000:]
        assert job(held)["JobState"] == "RUNNING", job(held)  # verification did not touch the job
    finally:
        sh("sm1", f"scancel {held}")
    wait_idle("gpu01")


def test_dcgm_and_tune_on_a_node_running_a_job_could_not_run_naming_the_job(
        lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    """A job holds gpu02: `verify --only dcgm` runs no diagnostic there (it loads the GPUs) and reports gpu02's dcgm
    as could not run naming the job, never passed and never a hardware fault; `provision tune` leaves gpu02 out,
    naming the job, and with no two nodes of a partition left it could not run. Neither touches the job."""
    held = submit("gpu02", "sleep 600")
    try:
        rc, out = provision(lab, capsys, "verify", "--only", "dcgm")
        assert rc == 2, out[-3000:]
        assert re.search(rf"^NOT RUN dcgm gpu02: Slurm runs job {held} on gpu02", out, re.M), out[-3000:]
        report = json.loads((lab.state / "verify" / "latest" / "report.json").read_text(encoding="utf-8"))
        mine = [c for c in report["checks"] if c["node"] == "gpu02" and c["name"] == "dcgm"]
        assert len(mine) == 1 and not mine[0]["passed"] and f"job {held}" in mine[0]["error"], mine
        assert not [f for c in report["checks"] for f in c["findings"]
                    if f["node"] == "gpu02" and f["severity"] == "error"], report["checks"]
        rc, out = provision(lab, capsys, "tune", "--knobs", "NCCL_ALGO", "--repeats", "2")
        assert rc == 2, out[-3000:]
        assert re.search(rf"^NOT RUN tune: .*gpu02: Slurm runs job {held} on gpu02", out, re.M), out[-3000:]
        assert job(held)["JobState"] == "RUNNING", job(held)
    finally:
        sh("sm1", f"scancel {held}")
    wait_idle("gpu02")


def test_rolling_driver_change_waits_for_the_job_stops_at_a_failing_batch_and_resumes(
        lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    new = with_driver(lab, NEW_DRIVER)
    rc, out = provision(lab, capsys, "plan", spec=new)
    assert rc == 1, out[-3000:]
    assert "gpu01" in out and "gpu03" in out, out[-3000:]

    # A job on gpu01 that runs until the test releases it: released only once Slurm has drained gpu01 under it and
    # the rolling run is waiting, so the job ends by itself while the batch waits (never killed, never raced by a
    # timer). gpu01's link then comes back at 2X from its maintenance (injected while it is drained: a link
    # degraded before the run would also slow the spare's batch, whose verification uses gpu01 as a peer).
    job_id = submit("gpu01", "while [ ! -e /run/release-job ]; do sleep 1; done")
    seen: dict[str, str] = {}

    def release_then_fault() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            j = load_last(lab.state)
            batch = next((b for b in j.batches if b.nodes == ["gpu01"]), None) if j else None
            if batch is not None and batch.status == "waiting" and "DRAIN" in node_state("gpu01")["State"]:
                break
            time.sleep(0.5)
        else:
            return
        seen["state"], seen["job"] = node_state("gpu01")["State"], job(job_id)["JobState"]
        sh("gpu01", "touch /run/release-job")
        while job(job_id)["JobState"] in ("RUNNING", "COMPLETING") and time.monotonic() < deadline:
            time.sleep(0.5)
        faults.inject(lab.root, "gpu01", "degraded_width", device="mlx5_1", port=1, width="2X")
        seen["injected"] = "yes"

    helper = threading.Thread(target=release_then_fault, daemon=True)
    helper.start()
    rc, out = provision(lab, capsys, "up", "--rolling", "--batch", "1", "--max-wait", "300", spec=new)
    helper.join(timeout=5)
    assert seen.get("injected") == "yes", (seen, out[-3000:])
    assert "DRAIN" in seen["state"] and seen["job"] == "RUNNING", seen  # drained under a running job, waiting
    assert rc == 1, out[-4000:]
    journal = load_last(lab.state)
    assert journal is not None and journal.status == "stopped", journal
    by_node = {tuple(b.nodes): b for b in journal.batches}
    spare_batch, failed = by_node[("gpu03",)], by_node[("gpu01",)]
    assert journal.batches.index(spare_batch) < journal.batches.index(failed), "the spare goes first"
    assert spare_batch.status == "done" and failed.status == "failed", journal
    assert "mlx5_1" in (failed.reason or ""), failed.reason
    # the job ran to its end while gpu01 was drained: drained, then the job ended, then the converge began
    ended = job(job_id)
    assert ended["JobState"] == "COMPLETED", ended
    assert failed.drained_at is not None and failed.idle_at is not None
    assert failed.drained_at[:19] <= ended["EndTime"][:19] <= failed.idle_at[:19], (
        failed.drained_at, ended["EndTime"], failed.idle_at)
    gpu01 = node_state("gpu01")
    assert "DRAIN" in gpu01["State"] and f"provision rolling {journal.rolling_id}" in gpu01["Reason"], gpu01
    assert "failed" in gpu01["Reason"], gpu01
    assert driver_version("gpu02") == OLD_DRIVER, "the batch after the failing one was not touched"
    assert node_state("gpu02")["State"] == "IDLE"
    resume = [ln.removeprefix("fix it, then resume: ") for ln in out.splitlines()
              if ln.startswith("fix it, then resume: ")]
    assert len(resume) == 1, out[-3000:]

    faults.clear(lab.root, "gpu01")
    argv = shlex.split(resume[0])
    assert argv[0] == "provision", argv
    capsys.readouterr()
    rc = cli.main(argv[1:])
    res = capsys.readouterr()
    assert rc == 0, (res.out + res.err)[-4000:]
    journal = load_last(lab.state)
    assert journal is not None and journal.status == "passed", journal
    for host in ("gpu01", "gpu02", "gpu03"):
        assert driver_version(host) == NEW_DRIVER, host
    for n in ("gpu01", "gpu02", "gpu03"):
        assert node_state(n)["State"] == "IDLE", node_state(n)
    assert partition_nodes() == "gpu[01-02]"
    lab.spec.write_text(new.read_text(encoding="utf-8"), encoding="utf-8")  # the cluster runs the new pin now


def test_watch_puts_the_spare_in_a_node_that_lost_a_gpu(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    job_id = submit("gpu02", "sleep 600")
    t0 = time.monotonic()
    faults.inject(lab.root, "gpu02", "gpu_missing")
    rc, out = provision(lab, capsys, "watch", "--once", "--peers", "1")
    round_s = time.monotonic() - t0  # the fault injected to the watch round done: spare in partition and persisted
    assert rc == 1, out[-4000:]
    assert partition_nodes() == "gpu[01,03]", out[-3000:]
    gpu02 = node_state("gpu02")
    assert "DRAIN" in gpu02["State"] and "provision failover" in gpu02["Reason"], gpu02
    assert job(job_id)["JobState"] in ("RUNNING", "COMPLETING"), "a drain lets the job run on (it is lost with the GPU)"
    swaps = load_swaps(lab.state)
    assert [(s.failed, s.spare, s.partitions) for s in swaps] == [("gpu02", "gpu03", ("gpu",))], swaps
    record = json.loads(sorted((lab.state / "failover").glob("*-gpu02.json"))[-1].read_text(encoding="utf-8"))
    events = [e["event"] for e in record["timeline"]]
    assert events[:4] == ["fault seen", "drained", "spare verified", "spare in partition"], events
    assert events[-1] == "persisted", events
    conf = sh("sm1", "cat /etc/slurm/slurm.conf")
    assert re.search(r"^PartitionName=gpu Nodes=gpu01,gpu03 ", conf, re.M), conf
    budget = 600
    in_partition = next(e["s"] for e in record["timeline"] if e["event"] == "spare in partition")
    assert in_partition < budget and round_s < budget, (in_partition, round_s)
    print(f"failover: spare in partition {in_partition:.1f} s after the watch saw the fault; fault injected to the "
          f"round done (persisted) {round_s:.1f} s; budget {budget} s")


def put_back_as_specified(lab: Lab) -> None:
    """gpu01-02 in service in the partition, gpu03 the spare, no job, no fault, no swap recorded (the trusted
    local channel: what an operator would do by hand)."""
    sh("sm1", "scancel --user=root || true")
    for host in ("gpu01", "gpu02", "gpu03"):
        faults.clear(lab.root, host)
    (lab.state / SWAPS).unlink(missing_ok=True)
    sh("sm1", "scontrol update PartitionName=gpu Nodes=gpu[01-02]")
    for n in ("gpu01", "gpu02", "gpu03"):
        if "DRAIN" in node_state(n)["State"]:
            sh("sm1", f"scontrol update NodeName={n} State=RESUME")
    assert partition_nodes() == "gpu[01-02]"


def test_two_failovers_at_once_one_spare_one_swap(lab: Lab) -> None:
    put_back_as_specified(lab)
    t0 = time.monotonic()
    procs = {node: subprocess.Popen([sys.executable, "-m", "provisioner.cli", "failover", str(lab.spec), node,
                                     "--overlay", str(lab.info.overlay), "--out", str(lab.state), "--peers", "1",
                                     "--no-persist", "--reason", "concurrency test"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for node in ("gpu01", "gpu02")}
    out = {node: p.communicate(timeout=300)[0] for node, p in procs.items()}
    took = time.monotonic() - t0
    rc = {node: p.returncode for node, p in procs.items()}
    winners = [n for n, code in rc.items() if code == 0]
    assert len(winners) == 1, (rc, out)
    [won], [lost] = winners, [n for n in rc if n != winners[0]]
    assert f"gpu03 replaces {won} in gpu" in out[won], out[won][-3000:]
    refused = rc[lost] == 2 and f"is held by provision failover {won}, pid {procs[won].pid}" in out[lost]
    no_spare = rc[lost] == 1 and "no spare passed" in out[lost]
    assert refused or no_spare, (rc[lost], out[lost][-3000:])
    assert "Traceback" not in out[lost], out[lost]
    assert [(s.failed, s.spare) for s in load_swaps(lab.state)] == [(won, "gpu03")]
    members = hostlist.expand(partition_nodes())
    assert sorted(members) == sorted([lost, "gpu03"]), members
    for n in members:   # the loser stays in service unless it went on to drain itself (it asked for that)
        assert "DRAIN" not in node_state(n)["State"] or (no_spare and n == lost), (n, node_state(n))
    assert "DRAIN" in node_state(won)["State"], node_state(won)
    print(f"two failovers at once: {won} -> gpu03 (exit 0), {lost} exit {rc[lost]} "
          f"({'refused by the day-2 lock' if refused else 'no spare left'}); {took:.1f} s")
