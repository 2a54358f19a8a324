"""The whole `provision cluster.yaml` on a real 4-node lab, green, then with faults, then resumed.

tests/lab/e2e_cluster.yaml (gpu01-03 + sm1, the SM and NFS server) runs through ``provisioner.cli.main``
exactly as the `provision` command would: validate ... report over SSH with verified host keys, the roles from
roles/, verify from provisioner.verify. The tests share one lab and one state directory and run in file order:

1. a fresh lab converges and verifies green from one command (exit 0);
2. with faults: gpu01 is paused while the gpu_stack phase is working on it (a run hook on the progress events,
   not a sleep), gpu02 loses its nvidia_peermem module, gpu03's mlx5_1 link trains at 2X; the run finishes sm1,
   sets each faulty node aside with its reason, prints the copy-pastable retry command, and exits 1;
3. the faults cleared, that retry command's `--resume` ends green (exit 0) and touches only the set-aside
   nodes, each from the phase it stopped in (the journal says so);
4. a hardware swap of gpu01 (new GUIDs, serials, SSH host keys): a plain run and a plain replace-node refuse the
   changed key; replace-node with ``--accept-new-host-key`` converges gpu01 alone, re-renders the SM's
   partitions.conf with the new GUIDs (nothing else in it), reloads the SM with SIGHUP (no restart, no change of
   master), the partition still admits gpu01, verification passes, and gpu02, gpu03 and sm1 are unchanged (every
   file under /etc: content, size and mtime; every package version). It runs on this lab, converged by the tests
   before it, rather than on a lab of its own: a second full converge would only repeat the first test's;
5. day 2, a partition gains a member: the spec adds gpu03 to tenant_a with a child address, and the fabric phase on
   gpu03 and sm1 brings the P_Key child up on the running lab (the lab makes it when the role configures it, as the
   kernel's create_child would), with its P_Key and address; it answers gpu01's child and verify passes it.

Run: ``PROVISIONER_LAB_DIR=/tmp/e2e-lab pytest -m lab tests/lab/test_e2e_lab.py`` (root, podman). On 2 shared
cores the first converge dominates (several minutes); the cluster name is ``e2etest`` unless
PROVISIONER_LAB_TEST_CLUSTER says otherwise (give each concurrent session its own).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from _labspec import SpecLab, cluster_name, spec_lab  # type: ignore[import-not-found]

from provisioner import cli
from provisioner.day2.replace import HostKeyRefused, observe, replace_node, summary_lines
from provisioner.errors import RemoteError
from provisioner.lab import faults
from provisioner.lab.host import podman
from provisioner.lab.names import container_name
from provisioner.lab.simtools import fabsim_reach, fabsim_sm
from provisioner.phases import PHASE_NAMES, RunOptions, one_line, provision_run
from provisioner.progress import LiveReporter
from provisioner.remote import SshRemote, targets_from_cluster
from provisioner.runner import control_path_dir
from provisioner.spec import load_cluster
from provisioner.state import RunJournal, hardware_history, last_run, list_runs, record_hardware

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

SPEC = Path(__file__).with_name("e2e_cluster.yaml")
CLUSTER = cluster_name("e2etest")
"""Container names are global to podman: two sessions with one name share (and break) one lab."""
HOSTS = ["gpu01", "gpu02", "gpu03", "sm1"]
CONVERGE = ["preflight", "repos", "ofed", "gpu_stack", "fabric", "storage"]
PAUSE_PHASE = "gpu_stack"


Lab = SpecLab


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One lab for the module, brought up as `provision lab up` does; always taken down."""
    yield spec_lab(request, tmp_path_factory, SPEC, CLUSTER)


@pytest.fixture(autouse=True)
def quick_ssh_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANSIBLE_TIMEOUT", "5")  # a paused node accepts TCP but never answers SSH


def provision(lab: Lab, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`provision SPEC --overlay OVERLAY --out STATE ARGS...` in this process; (exit code, stderr)."""
    capsys.readouterr()
    rc = cli.main([str(lab.spec), "--overlay", str(lab.info.overlay), "--out", str(lab.state), *args])
    return rc, capsys.readouterr().err


def journal(lab: Lab) -> RunJournal:
    j = last_run(lab.state)
    assert j is not None, "no run journal written"
    return j


def retry_line(stderr: str) -> str:
    lines = [ln.removeprefix("retry them: ") for ln in stderr.splitlines() if ln.startswith("retry them: ")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def test_fresh_lab_converges_and_verifies_green(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    rc, stderr = provision(lab, capsys)
    j = journal(lab)
    assert rc == 0, "\n".join(stderr.splitlines()[-40:])
    assert j.status == "passed" and j.set_aside == {} and j.stop_reason is None
    assert [p.name for p in j.phases] == list(PHASE_NAMES)
    for rec in j.phases:
        assert rec.status == "ok", (rec.name, rec.status, rec.note)
        assert rec.hosts == HOSTS and rec.ok == HOSTS, rec.name
    for host in HOSTS:
        assert j.hosts[host].completed == list(PHASE_NAMES), host
    verify_note = j.phase("verify").note or ""  # type: ignore[union-attr]
    assert verify_note.startswith("PASS"), verify_note
    assert f"run {j.run_id}: passed" in stderr and "retry them:" not in stderr
    # IPoIB: the role configured every planned interface and verify's ipoib check passed on every node
    report = json.loads((lab.state / "verify" / "latest" / "report.json").read_text(encoding="utf-8"))
    ipoib = {c["node"]: c for c in report["checks"] if c["name"] == "ipoib"}
    assert sorted(ipoib) == HOSTS and all(c["passed"] for c in ipoib.values()), ipoib
    assert ipoib["gpu01"]["measurements"] == {"interfaces": 3, "healthy": 3}  # rail0, its P_Key child, rail1
    # the NFS/RDMA mount names sm1's IPoIB address with proto=rdma,port=20049 (written; the lab cannot mount it)
    unit = podman("exec", container_name(CLUSTER, "gpu01"), "cat", "/etc/systemd/system/scratch.mount").stdout
    assert "What=10.30.0.21:/export/scratch\n" in unit and "proto=rdma,port=20049" in unit, unit


def _pause_on_first_task(lab: Lab, monkeypatch: pytest.MonkeyPatch, host: str) -> list[str]:
    """Pause ``host``'s container from inside the run, right after its first task of PAUSE_PHASE succeeded.

    A hook on the live view's event callback, which ansible-runner calls synchronously for each event: the
    node is frozen mid-phase, between two tasks, whatever the machine's load (no sleeps, no timing guess).
    Returns the list the hook appends to when it fired.
    """
    fired: list[str] = []
    original = LiveReporter.event

    def event(self: LiveReporter, phase: str, ev: Mapping[str, Any]) -> None:
        original(self, phase, ev)
        data = ev.get("event_data") or {}
        if (not fired and phase == PAUSE_PHASE and ev.get("event") == "runner_on_ok"
                and data.get("host") == host):
            faults.inject(lab.root, host, "unreachable")
            fired.append(str(data.get("task")))

    monkeypatch.setattr(LiveReporter, "event", event)
    return fired


def test_faults_set_nodes_aside_and_the_healthy_node_finishes(
        lab: Lab, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    before = journal(lab)
    assert before.status == "passed", "needs the green lab of the first test"
    faults.inject(lab.root, "gpu02", "peermem_missing")
    faults.inject(lab.root, "gpu03", "degraded_width", device="mlx5_1", port=1, width="2X")
    fired = _pause_on_first_task(lab, monkeypatch, "gpu01")
    # 3 of 4 nodes go down on purpose: allow it, or the engine (rightly) stops after the first
    rc, stderr = provision(lab, capsys, "--max-fail", "75")
    monkeypatch.undo()
    j = journal(lab)
    tail = "\n".join(stderr.splitlines()[-40:])
    assert fired, f"the pause hook never fired in {PAUSE_PHASE}"
    assert rc == 1, tail
    assert j.status == "partial" and j.stop_reason is None, (j.status, j.stop_reason)

    aside = j.set_aside
    assert sorted(aside) == ["gpu01", "gpu02", "gpu03"], aside
    assert (aside["gpu01"]["phase"], aside["gpu01"]["state"]) == (PAUSE_PHASE, "unreachable"), aside["gpu01"]
    assert (aside["gpu02"]["phase"], aside["gpu02"]["state"]) == ("gpu_stack", "failed"), aside["gpu02"]
    assert "nvidia_peermem" in aside["gpu02"]["reason"], aside["gpu02"]
    assert (aside["gpu03"]["phase"], aside["gpu03"]["state"]) == ("verify", "failed"), aside["gpu03"]
    assert "mlx5_1" in aside["gpu03"]["reason"] and "2X" in aside["gpu03"]["reason"], aside["gpu03"]

    # the healthy node went through every phase, the others stopped where their fault showed
    assert j.hosts["sm1"].completed == list(PHASE_NAMES)
    assert j.phase("report").hosts == ["sm1"]  # type: ignore[union-attr]
    assert PAUSE_PHASE not in j.hosts["gpu01"].completed and "ofed" in j.hosts["gpu02"].completed
    assert "gpu_stack" not in j.hosts["gpu02"].completed
    assert set(CONVERGE) <= set(j.hosts["gpu03"].completed) and "verify" not in j.hosts["gpu03"].completed

    # what a person reads: one line per set-aside node with its reason, and a command they can paste
    for host in ("gpu01", "gpu02", "gpu03"):
        sa = aside[host]
        assert f"  {host}: {sa['state']} in {sa['phase']}: {one_line(sa['reason'])}\n" in stderr
    assert "set aside (3):" in stderr
    cmd = shlex.split(retry_line(stderr))
    assert cmd[:2] == ["provision", str(lab.spec)] and "--resume" in cmd
    assert cmd[cmd.index("--limit") + 1] == "gpu[01-03]"
    assert cmd[cmd.index("--overlay") + 1] == str(lab.info.overlay)
    assert cmd[cmd.index("--out") + 1] == str(lab.state)
    assert cmd[cmd.index("--max-fail") + 1] == "75"
    # the verify report's error finding names the node, the device and the port
    report = lab.state / "verify" / "latest" / "report.json"
    assert report.is_file(), "verify wrote no report"
    errors = [f for f in _findings(json.loads(report.read_text(encoding="utf-8"))) if f["severity"] == "error"]
    assert any((f["node"], f["device"], f["port"]) == ("gpu03", "mlx5_1", 1) for f in errors), errors


def _findings(doc: object) -> Iterator[dict[str, Any]]:
    """Every finding object anywhere in a report.json (they carry check, severity, node, device, port)."""
    if isinstance(doc, dict):
        if {"check", "severity", "node", "device", "port"} <= doc.keys():
            yield doc
        for value in doc.values():
            yield from _findings(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _findings(item)


def test_resume_after_clearing_the_faults_is_green_and_touches_only_those_nodes(
        lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    failed = journal(lab)
    assert failed.status == "partial", "needs the faulted run of the second test"
    for host in ("gpu01", "gpu02", "gpu03"):
        faults.clear(lab.root, host)
    cmd = shlex.split(retry_line(_summary_of(failed)))
    assert cmd[0] == "provision"
    capsys.readouterr()
    rc = cli.main(cmd[1:])
    stderr = capsys.readouterr().err
    j = journal(lab)
    assert rc == 0, "\n".join(stderr.splitlines()[-40:])
    assert j.status == "passed" and j.resumed_from == failed.run_id and j.set_aside == {}
    # each set-aside node from the phase it stopped in; sm1 (finished) is not touched at all
    starts = {"gpu01": PAUSE_PHASE, "gpu02": "gpu_stack", "gpu03": "verify"}
    for rec in j.phases:
        if rec.name in ("validate", "render"):
            continue
        expected = [h for h, start in starts.items() if PHASE_NAMES.index(rec.name) >= PHASE_NAMES.index(start)]
        assert rec.hosts == expected, (rec.name, rec.hosts)
        assert rec.status == ("skipped" if not expected else "ok"), (rec.name, rec.status, rec.note)
    for host in HOSTS:
        assert j.hosts[host].completed[-1] == "report" and set(j.hosts[host].completed) == set(PHASE_NAMES), host
    assert len(list_runs(lab.state)) == 3


def _summary_of(j: RunJournal) -> str:
    from provisioner.phases import summary_lines

    return "\n".join(summary_lines(j))



# --- 4. replace-node after a hardware swap --------------------------------------------------------------------------

NODE, PEERS, SM = "gpu01", ["gpu02", "gpu03"], "sm1"
TENANT_PKEY = "0x8001"  # tenant_a: gpu01 and gpu02


def sh(host: str, command: str) -> str:
    """``command``'s output in ``host``'s container (the trusted local channel, not SSH)."""
    done = podman("exec", container_name(CLUSTER, host), "sh", "-c", command, check=False, timeout=120)
    return str(done.stdout)


def wait_for(what: str, probe: Callable[[], bool], deadline_s: float = 90.0) -> None:
    end = time.monotonic() + deadline_s
    while not probe():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(1.0)


def snapshot(host: str) -> dict[str, str]:
    """Every file under /etc (size, mtime, checksum) and every package version, as the container sees them."""
    files = sh(host, "find /etc -xdev -type f -printf '%p %s %T@ ' -exec md5sum {} \\; | awk '{print $1, $2, $3, $4}'")
    pkgs = sh(host, "dpkg-query -W -f '${Package} ${Version}\\n'")
    out = {f"pkg {ln.split(' ', 1)[0]}": ln for ln in pkgs.splitlines() if ln}
    out.update({f"file {ln.split(' ', 1)[0]}": ln for ln in files.splitlines() if ln})
    return out


def diff(a: dict[str, str], b: dict[str, str]) -> set[str]:
    """The keys whose line differs (added, removed or changed)."""
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def sm_service() -> dict[str, str]:
    text = sh(SM, "systemctl show opensmd -p MainPID -p ActiveEnterTimestampMonotonic -p ActiveState")
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)


def close_control_masters(state: Path) -> None:
    """A real swap reboots the node, which ends every SSH connection to it; the lab's swap only restarts sshd
    (sessions survive), so the multiplexed masters of the earlier runs are ended here, as a reboot would."""
    cp = control_path_dir(state)
    for sock in cp.glob("*") if cp.is_dir() else []:
        subprocess.run(["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "lab"], capture_output=True, timeout=20,
                       check=False)


def test_replace_node_after_a_hardware_swap(lab: Lab) -> None:
    assert journal(lab).status == "passed", "needs the green lab of the resume test"
    state, overlay = lab.state, lab.info.overlay
    cluster, _ = load_cluster(lab.spec, overlay)
    targets = targets_from_cluster(cluster)
    with SshRemote(targets) as remote:  # the hardware as it is now, serials included (verify records GUIDs)
        for host in (NODE, *PEERS, SM):
            obs = observe(remote, host)
            record_hardware(state, host, guids=obs.guids, serials=obs.serials)
        old = observe(remote, NODE)
        peer_guid = observe(remote, PEERS[0]).guids["mlx5_0/1"]
    before = {h: snapshot(h) for h in (*PEERS, SM)}
    parts_before = sh(SM, "cat /etc/opensm/partitions.conf")
    conf_before = sh(SM, "cat /etc/opensm/opensm.conf")
    service_before = sm_service()
    history_before = fabsim_sm.load_history(lab.root)
    kh = Path(targets[NODE].known_hosts)
    kh_before = kh.read_text()
    for guid in (old.guids["mlx5_0/1"], old.guids["mlx5_1/1"]):
        assert guid in parts_before

    faults.inject(lab.root, NODE, "hardware_swap")
    close_control_masters(state)
    new_fp = sh(NODE, "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub").split()[1]

    # a plain verify and a plain run refuse the changed host key
    with SshRemote(targets) as remote, pytest.raises(RemoteError, match="host key CHANGED"):
        remote.run(NODE, ["true"], timeout=10)
    plain = provision_run(lab.spec, RunOptions(only=["preflight"], limit=NODE, overlay=str(overlay)), state_dir=state)
    assert plain.status == "stopped" and plain.set_aside[NODE]["state"] == "unreachable"  # its only host is out
    assert "Host key verification failed" in plain.set_aside[NODE]["reason"]

    # replace-node without a flag: refused, the new fingerprint shown, nothing changed
    with pytest.raises(HostKeyRefused) as refused:
        replace_node(lab.spec, NODE, overlay=overlay, state_dir=state)
    assert new_fp in str(refused.value)
    assert kh.read_text() == kh_before

    # with the flag: converges gpu01, re-renders the SM's partitions, verifies
    result = replace_node(lab.spec, NODE, overlay=overlay, state_dir=state, accept_new_host_key=True)
    summary = "\n".join(summary_lines(result))
    assert result.exit_code == 0, summary
    assert result.fingerprint == new_fp and new_fp in summary
    # the node's own phases; the peers' MPI SSH trust of its new keys (gpu_stack, --tags nccl_mpi_ssh_trust); the
    # SM's partitions; then the node's own fabric phase (IPoIB, NCCL_IB_PKEY from the new P_Key table) and storage
    assert [(p, h) for p, h, _ in result.phases] == [
        ("preflight", NODE), ("repos", NODE), ("ofed", NODE), ("gpu_stack", NODE),
        ("gpu_stack", ",".join([NODE, *PEERS])), ("fabric", SM), ("fabric", NODE), ("storage", NODE)]
    assert result.peers == PEERS and result.report is not None and result.report.verdict.exit_code == 0

    new = result.observation
    swapped = {"mlx5_0/1", "mlx5_1/1"}
    assert all(new.guids[k] != old.guids[k] for k in swapped)
    changes = {(c.kind, c.key): (c.old, c.new) for c in hardware_history(state, NODE)}
    for key in swapped:
        assert changes[("guid", key)] == (old.guids[key], new.guids[key])
    assert ("serial", "gpu0") in changes and changes[("host_key", "ssh-ed25519")][1] == new_fp
    assert "# replaced " in kh.read_text() and new_fp not in kh_before

    # the SM: new GUIDs in partitions.conf, nothing else in it changed, opensm.conf untouched, SM reloaded
    parts_after = sh(SM, "cat /etc/opensm/partitions.conf")
    expected = parts_before
    for key in swapped:
        expected = expected.replace(old.guids[key], new.guids[key])
    assert parts_after == expected and parts_after != parts_before
    assert sh(SM, "cat /etc/opensm/opensm.conf") == conf_before
    assert result.sm_config_changed == [SM] and result.sm_reloaded == [SM] and result.sm_restarted == []
    service_after = sm_service()
    assert service_after["ActiveState"] == "active"
    assert service_after["MainPID"] == service_before["MainPID"]  # the same opensm, never stopped
    history = fabsim_sm.load_history(lab.root)
    assert history["restarts"] == history_before["restarts"], history["events"][-8:]
    assert history["mastership_changes"] == history_before["mastership_changes"]
    assert history["outages"] == history_before["outages"]

    # the partition still admits gpu01 (as enforced by the master SM now), and no longer the old board
    wait_for("the SM to enforce the new partitions", lambda: fabsim_reach.can_reach(
        fabsim_reach.load_partitions(lab.root), TENANT_PKEY, new.guids["mlx5_0/1"], peer_guid))
    assert not fabsim_reach.can_reach(fabsim_reach.load_partitions(lab.root), TENANT_PKEY, old.guids["mlx5_0/1"],
                                      peer_guid)

    # nothing else changed on the other nodes
    after = {h: snapshot(h) for h in (*PEERS, SM)}
    for peer in PEERS:
        assert diff(before[peer], after[peer]) == set(), peer
    assert diff(before[SM], after[SM]) == {"file /etc/opensm/partitions.conf"}


# --- 5. day 2: a partition gains a member ---------------------------------------------------------------------------

CHILD = "ibp23s0.8001"  # rail0's P_Key child of tenant_a (0x8001) on the GPU nodes' mlx5_0 port


def test_a_partition_member_added_on_day_2_gets_its_p_key_child(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    """The spec adds gpu03 to tenant_a with a child address; the fabric phase on gpu03 and the SM creates the child
    as the role configures it (networkd's .netdev, as on a real node; the lab stands in for the kernel), with the
    partition's P_Key and the planned address; it reaches the partition's other members and verify passes it."""
    assert journal(lab).status == "passed", "needs the green lab of the tests before"
    assert CHILD not in sh("gpu03", "ip -o link show"), "gpu03 is no member of tenant_a yet"
    text = lab.spec.read_text(encoding="utf-8")
    edited = text.replace('members: "gpu[01-02]"', 'members: "gpu[01-03]"').replace(
        'address: "10.31.0.[11-12]"', 'address: "10.31.0.[11-13]"')
    assert edited.count("gpu[01-03]") == text.count("gpu[01-03]") + 1 and "10.31.0.[11-13]" in edited
    lab.spec.write_text(edited, encoding="utf-8")
    t0 = time.monotonic()
    rc, stderr = provision(lab, capsys, "--limit", "gpu03,sm1", "--only", "fabric")
    took = time.monotonic() - t0
    assert rc == 0, "\n".join(stderr.splitlines()[-40:])
    print(f"day 2: fabric phase on gpu03 and sm1 with the new partition member in {took:.0f} s")
    # the child: gpu03's own, on its rail0 port, carrying tenant_a's P_Key, with the planned address and MTU
    link = sh("gpu03", f"ip -d -o link show dev {CHILD}")
    assert f"{CHILD}@ibp23s0:" in link and " mtu 2044 " in link and "state UP" in link, link
    assert sh("gpu03", f"cat /run/provisioner-lab/ipoib/{CHILD}.pkey").strip() == TENANT_PKEY
    assert "inet 10.31.0.13/24 " in sh("gpu03", f"ip -o -4 addr show dev {CHILD}")
    # the partition's existing members answer over it; the SM's partitions.conf names gpu03's port
    assert sh("gpu03", f"ping -n -q -c 1 -W 2 -I {CHILD} 10.31.0.11 >/dev/null && echo ok").strip() == "ok"
    assert "# member gpu03:" in sh(SM, "cat /etc/opensm/partitions.conf")
    capsys.readouterr()
    rc = cli.main(["verify", str(lab.spec), "--overlay", str(lab.info.overlay), "--out", str(lab.state),
                   "--only", "ipoib"])
    assert rc == 0, capsys.readouterr().err[-3000:]
    report = json.loads((lab.state / "verify" / "latest" / "report.json").read_text(encoding="utf-8"))
    ipoib = {c["node"]: c for c in report["checks"] if c["name"] == "ipoib"}
    assert ipoib["gpu03"]["passed"] and ipoib["gpu03"]["measurements"] == {"interfaces": 3, "healthy": 3}, ipoib
