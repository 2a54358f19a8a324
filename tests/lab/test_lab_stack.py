"""The whole lab stack in real containers: what a lab node offers behaves like a real node.

Brings up 4 nodes of the bundled spec (examples/lab/cluster.yaml: gpu01, gpu02 with two NDR
rails, sm1/sm2 for opensm), installs the stand-in vendor packages with apt from the lab's
signed file repository (pinned versions win over the newer "drift" ones), starts the SM
through the opensm package's unit and checks what the product will find over SSH: real
``ibstat`` going from Initializing to Active, ``nvidia-smi``, ``ib_write_bw`` between two
containers over a real TCP rendezvous, ``all_reduce_perf`` across nodes, ``sminfo``; then one
test per fault kind shows the tool output change as a real node's would.

Tests run in file order and share the lab (module scope); each fault test clears its fault.
Waits poll a condition with a deadline; nothing asserts on timing.  Needs root, podman and
the Debian mirror (first run builds the image).  Run: ``pytest -m lab tests/lab/test_lab_stack.py``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import pytest
import yaml
from _labspec import APT, APT_PINS, MPI_PACKAGES, mpi_trust  # type: ignore[import-not-found]

from provisioner import parsers
from provisioner.fabric import nccl
from provisioner.lab import cluster, faults
from provisioner.lab.fromspec import lab_cables, lab_nodes, lab_switches, lab_versions
from provisioner.lab.host import podman, podman_env
from provisioner.lab.names import container_name
from provisioner.lab.simtools import labstate
from provisioner.spec.load import load_cluster, load_spec

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab" / "cluster.yaml"
CLUSTER = "l2stack"
GPU_NODES = ("gpu01", "gpu02")
SM_NODES = ("sm1", "sm2")
HOSTS = GPU_NODES + SM_NODES
PINS = APT_PINS
GPU_PACKAGES = f"nvidia-driver-550-open cuda-toolkit-12-4 libnccl2 nccl-tests perftest-cuda {MPI_PACKAGES}"
OFED_FIRST = "doca-ofed"
"""Installed and loaded (openibd) before the driver, whose DKMS build of nvidia_peermem needs the OFED symbols."""
SM_PACKAGES = "opensm"
NDR_GBPS = 400.0


@dataclass(frozen=True)
class Stack:
    info: cluster.LabInfo
    root: str
    overlay: dict[str, Any]


def sh(host: str, command: str, *, ok: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in ``host``'s container (the trusted local channel)."""
    done = podman("exec", container_name(CLUSTER, host), "sh", "-c", command, check=False, timeout=timeout)
    if ok:
        assert done.returncode == 0, f"{host}: {command}\n{done.stdout}\n{done.stderr}"
    return done


def wait_for(what: str, probe: Callable[[], bool], deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while not probe():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.3)


def ports(host: str) -> dict[str, dict[str, Any]]:
    """``ibstat`` (Debian's real binary) on ``host``, parsed: device -> port 1 record."""
    parsed = parsers.parse("ibstat", sh(host, "ibstat").stdout)
    return {d["name"]: d["ports"][0] for d in parsed["devices"]}


def ssh(stack: Stack, host: str, timeout: float = 30) -> paramiko.SSHClient:
    """Connect like the product does: the lab's known_hosts, RejectPolicy (never auto-add)."""
    client = paramiko.SSHClient()
    client.load_host_keys(stack.overlay["ssh"]["known_hosts"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(stack.overlay["addresses"][host], username=stack.overlay["ssh"]["user"],
                   key_filename=stack.overlay["ssh"]["key"], look_for_keys=False, allow_agent=False,
                   timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
    return client


def ssh_run(client: paramiko.SSHClient, command: str) -> str:
    _, stdout, stderr = client.exec_command(command, timeout=30)
    out = stdout.read().decode()
    assert stdout.channel.recv_exit_status() == 0, stderr.read().decode()
    return out


def _install(host: str) -> None:
    packages = GPU_PACKAGES if host in GPU_NODES else SM_PACKAGES
    sh(host, "install -D -m 0644 /run/lab/keys/lab-vendor.gpg /etc/apt/keyrings/lab-vendor.gpg && "
             "echo 'deb [signed-by=/etc/apt/keyrings/lab-vendor.gpg] file:/run/lab/vendor-repo bookworm main'"
             " > /etc/apt/sources.list.d/lab-vendor.list && "
             f"printf '%s' {shlex.quote(PINS)} > /etc/apt/preferences.d/lab-pins && "
             f"{APT} update", timeout=300)
    if host in GPU_NODES:
        sh(host, f"{APT} install -y --no-install-recommends {OFED_FIRST} && systemctl restart openibd", timeout=300)
    sh(host, f"{APT} install -y --no-install-recommends {packages}", timeout=300)
    if host in GPU_NODES:
        sh(host, "modprobe nvidia_peermem")


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    saved = os.environ.get("PROVISIONER_LAB_DIR")
    os.environ["PROVISIONER_LAB_DIR"] = str(tmp_path_factory.mktemp("stacklab"))
    spec, _ = load_cluster(EXAMPLE)

    def teardown() -> None:
        try:
            cluster.lab_down(CLUSTER)
            left = podman("ps", "-a", "--filter", f"label=provisioner-lab.cluster={CLUSTER}", "--format",
                          "{{.Names}}", check=False).stdout.split()
            assert left == [] and not cluster.cluster_dir(CLUSTER).exists()
            assert not cluster.vendor_gnupg_home(CLUSTER).exists()
        finally:
            if saved is None:
                os.environ.pop("PROVISIONER_LAB_DIR", None)
            else:
                os.environ["PROVISIONER_LAB_DIR"] = saved

    request.addfinalizer(teardown)  # runs after a failed bring-up too
    info = cluster.lab_up(CLUSTER, [n for n in lab_nodes(spec) if n.hostname in HOSTS], lab_switches(spec),
                          [c for c in lab_cables(spec) if c.node in HOSTS], versions=lab_versions(spec))
    with ThreadPoolExecutor(max_workers=len(HOSTS)) as pool:
        list(pool.map(_install, HOSTS))
    yield Stack(info, str(info.state_dir), yaml.safe_load(info.overlay.read_text()))


# ---------------------------------------------------------------- bring-up, packages


def test_overlay_points_the_spec_at_the_lab_repo(stack: Stack) -> None:
    result = load_spec(EXAMPLE, stack.info.overlay)
    assert result.cluster is not None and not result.errors, result.diagnostics
    cuda = result.cluster.spec.repositories.cuda
    assert cuda is not None and cuda.url == "file:///run/lab/vendor-repo"
    assert Path(cuda.key).is_file() and Path(stack.root) / "keys" / "lab-vendor.pub" == Path(cuda.key)
    listing = sh("gpu01", "ls -a /run/lab; ls -a /run/lab/vendor-repo").stdout
    assert "vendor-repo" in listing and "gnupg" not in listing  # the signing key never enters a node


def test_apt_installs_pinned_versions_over_drift(stack: Stack) -> None:
    policy = sh("gpu01", "apt-cache policy nvidia-utils-550 libnccl2").stdout
    assert "550.127.05-0ubuntu1" in policy and "2.23.4-1+cuda12.4" in policy  # the drift set is offered
    installed = sh("gpu01", "dpkg-query -W -f='${Package} ${Version}\\n' nvidia-utils-550 libnccl2 perftest-cuda "
                            "opensm doca-ofed infiniband-diags").stdout.splitlines()
    versions = dict(line.split(" ", 1) for line in installed)
    assert versions["nvidia-utils-550"] == "550.90.07-0ubuntu1"
    assert versions["libnccl2"] == "2.21.5-1+cuda12.4"
    assert versions["doca-ofed"] == "2.9.1-1"
    assert versions["perftest-cuda"] == "25.10.0-0.128-1+cuda12.4"  # not the drift set's 25.10.0-0.129
    assert versions["infiniband-diags"].startswith("44.")  # Debian's real one, whose ibstat reads sysfs
    ofed = parsers.parse("ofed_info", sh("gpu01", "ofed_info -s").stdout)
    assert "24.10-1.1.4" in str(ofed)


def test_ports_initializing_before_any_sm(stack: Stack) -> None:
    assert "State: Initializing" in sh("gpu01", "ibstat mlx5_0").stdout  # the real tool's words
    for host in HOSTS:
        for device, port in ports(host).items():
            assert (port["state"], port["physical_state"]) == ("init", "linkup"), (host, device, port)
            assert port["base_lid"] == 0 and port["rate_gbps"] == NDR_GBPS


def _start_sm(host: str, priority: int) -> None:
    sh(host, f"mkdir -p /etc/opensm && printf 'sm_priority {priority}\\n' > /etc/opensm/opensm.conf && "
             "systemctl start opensmd && systemctl is-active opensmd")


def test_sm_unit_brings_every_port_active(stack: Stack) -> None:
    _start_sm("sm1", 15)
    wait_for("ports Active", lambda: all(p["state"] == "active" for h in HOSTS for p in ports(h).values()))
    _start_sm("sm2", 14)
    sm_lid = ports("sm1")["mlx5_0"]["base_lid"]
    lids = []
    for host in HOSTS:
        for port in ports(host).values():
            assert port["physical_state"] == "linkup" and port["sm_lid"] == sm_lid
            lids.append(port["base_lid"])
    assert 0 not in lids and len(set(lids)) == len(lids) == 6
    assert "State: Active" in sh("gpu02", "ibstat mlx5_1").stdout


def test_sminfo_shows_the_master(stack: Stack) -> None:
    wait_for("sm2 standby", lambda: "state 2 SMINFO_STANDBY" in sh("gpu01", f"sminfo {_sm_lid('sm2')}",
                                                                     ok=False).stdout)
    info = parsers.parse("sminfo", sh("gpu01", "sminfo").stdout)
    assert info["lid"] == _sm_lid("sm1") and info["priority"] == 15 and info["state"] == "master", info


def _sm_lid(host: str) -> int:
    return int(ports(host)["mlx5_0"]["base_lid"])


def test_nvidia_smi_lists_the_gpus(stack: Stack) -> None:
    client = ssh(stack, "gpu01")
    try:
        out = ssh_run(client, "nvidia-smi -L")
    finally:
        client.close()
    assert len([line for line in out.splitlines() if line.startswith("GPU ")]) == 2
    assert "NVIDIA H100 80GB HBM3" in out


def write_bw(server: str, client: str, *args: str, env: str = "") -> tuple[subprocess.CompletedProcess[str],
                                                                         subprocess.CompletedProcess[str]]:
    """ib_write_bw server in one container, client in the other, rendezvous over the lab network."""
    ip = yaml.safe_load(Path(cluster.cluster_dir(CLUSTER), "overlay.yaml").read_text())["addresses"][server]
    flags = " ".join(args)
    exe = shutil.which("podman")
    assert exe is not None
    srv = subprocess.Popen([exe, "exec", container_name(CLUSTER, server), "sh", "-c",
                            f"{env} ib_write_bw {flags}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=podman_env())
    try:
        # 18515 = 0x4853; state 0A = LISTEN in the server container's own network namespace.
        wait_for("the ib_write_bw server", lambda: srv.poll() is not None or sh(
            server, "grep -c ':4853 00000000:0000 0A' /proc/net/tcp", ok=False).stdout.strip() not in ("", "0"))
        cli = sh(client, f"{env} ib_write_bw {flags} {ip}", ok=False)
        if cli.returncode != 0:  # a failed client leaves the server waiting, as the real one does
            sh(server, "pkill -f '^/usr/bin/python3 /usr/(local/)?bin/ib_write_bw' || true", ok=False)
        out, err = srv.communicate(timeout=30)
    finally:
        if srv.poll() is None:
            srv.kill()
    return subprocess.CompletedProcess(srv.args, srv.returncode, out, err), cli


def test_ib_write_bw_between_containers_near_line_rate(stack: Stack) -> None:
    srv, cli = write_bw("gpu02", "gpu01", "-d mlx5_0 -F --report_gbits")
    assert cli.returncode == 0 and srv.returncode == 0, cli.stderr + srv.stderr
    for text, role in ((cli.stdout, "client"), (srv.stdout, "server")):
        result = parsers.parse("perftest", text)
        assert result["role"] == role and result["ok"]
        assert 0.95 * NDR_GBPS <= result["results"][-1]["bw_avg_gbps"] <= NDR_GBPS


def _all_reduce(stack: Stack, run_id: str = "") -> tuple[subprocess.CompletedProcess[str], float]:
    """The product's launch (nccl.launch: mpirun, a hostfile of the nodes' addresses) from gpu01."""
    addresses = [stack.overlay["addresses"][h] for h in ("gpu01", "gpu02")]
    argv = nccl.launch(addresses, 2, "1G", as_root=True)
    env = f"export PROVISIONER_LAB_RUN_ID={run_id}; " if run_id else ""
    done = sh("gpu01", env + argv[2], ok=False, timeout=180)
    if done.returncode != 0:
        return done, 0.0
    parsed = parsers.parse("nccl-tests", done.stdout)
    assert parsed["ok"] and nccl.observed_ranks(done.stdout) == 4, done.stdout
    return done, float(parsed["largest"]["busbw_gbs"])


def set_nccl_conf(line: str) -> None:
    for host in GPU_NODES:
        sh(host, f"printf '%s\\n' {shlex.quote(line)} > /etc/nccl.conf")


def test_all_reduce_across_nodes_through_mpirun(stack: Stack) -> None:
    # mpirun starts gpu02's ranks over real ssh: with no verified host key for it, Open MPI's daemon fails
    refused, _ = _all_reduce(stack)
    assert refused.returncode != 0
    assert "Host key verification failed." in refused.stderr and "ORTE was unable" in refused.stderr
    known = Path(stack.overlay["ssh"]["known_hosts"]).read_text(encoding="utf-8")
    mpi_trust(lambda host, cmd: sh(host, cmd).stdout, GPU_NODES, known)
    set_nccl_conf("NCCL_IB_HCA==mlx5_0:1,=mlx5_1:1")  # how render wrote it: NCCL reads "=mlx5_1" as a name
    old, old_busbw = _all_reduce(stack)
    assert old.returncode == 0, old.stdout + old.stderr
    assert nccl.selected_rails(old.stdout) == {"gpu01": {("mlx5_0", 1)}, "gpu02": {("mlx5_0", 1)}}
    set_nccl_conf("NCCL_IB_HCA==mlx5_0:1,mlx5_1:1")
    done, busbw = _all_reduce(stack)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpu02" in done.stdout  # ranks on the second node are listed
    assert nccl.selected_rails(done.stdout) == {h: {("mlx5_0", 1), ("mlx5_1", 1)} for h in GPU_NODES}
    # Two NDR rails per node: 2 x 50 GB/s x ~0.94; the spec asks for at least 80 GB/s.
    assert 80 <= busbw <= 100, busbw
    assert old_busbw < 0.6 * busbw
    inject(stack, "gpu02", "port_down", device="mlx5_1")
    try:
        done, one_rail = _all_reduce(stack)
    finally:
        clear(stack, "gpu02", "port_down")
    assert done.returncode == 0 and one_rail < 0.6 * busbw  # NCCL skips the dead rail silently: only slower


# ---------------------------------------------------------------- faults, one per kind


def inject(stack: Stack, host: str, kind: str, **params: Any) -> None:
    faults.inject(stack.root, host, kind, **params)


def clear(stack: Stack, host: str, kind: str) -> None:
    assert faults.clear(stack.root, host, kind), f"{kind} was not recorded on {host}"


@pytest.mark.parametrize(("kind", "params", "want"), [
    ("port_down", {}, {"state": "down", "physical_state": "polling", "base_lid": 0}),
    ("port_disabled", {}, {"state": "down", "physical_state": "disabled"}),
    ("degraded_width", {"width": "2X"}, {"state": "active", "rate_gbps": 200.0}),
    ("degraded_rate", {}, {"state": "active", "rate_gbps": 200.0}),
])
def test_port_faults_show_in_ibstat(stack: Stack, kind: str, params: dict[str, Any], want: dict[str, Any]) -> None:
    before = ports("gpu01")["mlx5_1"]
    inject(stack, "gpu01", kind, device="mlx5_1", **params)
    try:
        port = ports("gpu01")["mlx5_1"]
        assert {k: port[k] for k in want} == want, port
        assert ports("gpu01")["mlx5_0"]["state"] == "active"  # the other rail is untouched
    finally:
        clear(stack, "gpu01", kind)
    assert ports("gpu01")["mlx5_1"] == before


def test_slow_link_halves_write_bw(stack: Stack) -> None:
    inject(stack, "gpu02", "slow_link", device="mlx5_0", bw_factor=0.5)
    try:
        _, cli = write_bw("gpu02", "gpu01", "-d mlx5_0 -F --report_gbits")
        assert cli.returncode == 0, cli.stderr
        avg = parsers.parse("perftest", cli.stdout)["results"][-1]["bw_avg_gbps"]
        assert 0.45 * NDR_GBPS <= avg <= 0.5 * NDR_GBPS
        assert ports("gpu02")["mlx5_0"]["state"] == "active"  # nothing in ibstat shows it
    finally:
        clear(stack, "gpu02", "slow_link")


def test_flapping_rail_breaks_some_runs(stack: Stack) -> None:
    inject(stack, "gpu02", "flapping", device="mlx5_1")
    try:
        results = [_all_reduce(stack, f"flap{i}")[0] for i in range(6)]
    finally:
        clear(stack, "gpu02", "flapping")
    failed = [done.stderr for done in results if done.returncode != 0]
    assert failed and len(failed) < len(results)
    assert "NET/IB" in failed[0]


def test_cables_swapped_show_in_iblinkinfo(stack: Stack) -> None:
    def landing() -> str:
        out = sh("gpu01", "iblinkinfo").stdout
        parsers.parse("iblinkinfo", out)
        block = out.split("CA: gpu01 mlx5_0:")[1].splitlines()[1]
        return block.split("==>")[1].split('"')[0].split()[1]

    assert landing() == "1[" or landing().startswith("1")
    inject(stack, "gpu01", "cables_swapped", device="mlx5_0", other_host="gpu02", other_device="mlx5_0")
    try:
        assert landing().startswith("2")
    finally:
        clear(stack, "gpu01", "cables_swapped")
    assert landing().startswith("1")


def test_peermem_missing(stack: Stack) -> None:
    inject(stack, "gpu01", "peermem_missing")
    try:
        assert "nvidia_peermem" not in sh("gpu01", "lsmod").stdout
        assert sh("gpu01", "modprobe nvidia_peermem", ok=False).returncode != 0
        _, cli = write_bw("gpu02", "gpu01", "-d mlx5_0 --use_cuda=0 -F --report_gbits")
        assert cli.returncode != 0 and "MR" in cli.stdout + cli.stderr
    finally:
        clear(stack, "gpu01", "peermem_missing")
    sh("gpu01", "modprobe nvidia_peermem")
    assert "nvidia_peermem" in sh("gpu01", "lsmod").stdout


def test_gpu_missing(stack: Stack) -> None:
    inject(stack, "gpu02", "gpu_missing")
    try:
        assert sh("gpu02", "nvidia-smi -L").stdout.count("GPU ") == 1
    finally:
        clear(stack, "gpu02", "gpu_missing")
    assert sh("gpu02", "nvidia-smi -L").stdout.count("GPU ") == 2


def test_unreachable(stack: Stack) -> None:
    inject(stack, "gpu02", "unreachable")
    try:
        with pytest.raises((OSError, paramiko.SSHException)):
            ssh(stack, "gpu02", timeout=2).close()
    finally:
        clear(stack, "gpu02", "unreachable")
    client = ssh(stack, "gpu02")
    try:
        assert ssh_run(client, "hostname").strip() == "gpu02"
    finally:
        client.close()


def test_sm_killed_standby_takes_over(stack: Stack) -> None:
    inject(stack, "sm1", "sm_killed")
    try:
        wait_for("sm2 master", lambda: "SMINFO_MASTER" in sh("gpu01", f"sminfo {_sm_lid('sm2')}", ok=False).stdout)
        wait_for("new SM LID on gpu01", lambda: ports("gpu01")["mlx5_0"]["sm_lid"] == _sm_lid("sm2"))
        assert sh("sm1", "systemctl is-active opensmd", ok=False).stdout.strip() != "active"
    finally:
        clear(stack, "sm1", "sm_killed")
    wait_for("sm1 master again", lambda: "SMINFO_MASTER" in sh("gpu01", f"sminfo {_sm_lid('sm1')}", ok=False).stdout)


def test_hardware_swap_new_guids_and_host_key_rejected(stack: Stack) -> None:
    old_guid = ports("gpu02")["mlx5_0"]["port_guid"]
    inject(stack, "gpu02", "hardware_swap")
    new_guid = ports("gpu02")["mlx5_0"]["port_guid"]
    assert new_guid != old_guid
    fabric = labstate.load_fabric(stack.root)
    assert fabric["nodes"]["gpu02"]["hcas"][0]["port_guid"] != old_guid
    wait_for("sshd back", lambda: sh("gpu02", "systemctl is-active ssh", ok=False).stdout.strip() == "active")
    with pytest.raises(paramiko.BadHostKeyException):
        ssh(stack, "gpu02").close()
