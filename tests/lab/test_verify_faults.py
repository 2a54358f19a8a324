"""Every fault the lab can inject is found by ``verify`` and pinned on the right node, device and port.

One lab (examples/lab/cluster.yaml: gpu01-03 with two NDR rails, sm1/sm2 running opensm as master and
standby) is brought up once for the module. The converge phase is stood in for by apt installs from the
lab's signed vendor repository (driver, CUDA, NCCL, nccl-tests, DOCA-OFED with perftest and the site build
perftest-cuda on the GPU nodes, opensm on the SM nodes), ``modprobe nvidia_peermem`` and starting the SM units;
from then on everything
goes through the product: ``verify(...)`` over SSH with verified host keys, Debian's real ``ibstat``, the
simulated ``ib_write_bw``/``all_reduce_perf``/``iblinkinfo``/``sminfo``.

Each fault test: inject → verify with the checks that should catch it → the finding names the right
node/device/port (switch port for cabling, the SM node for a dead SM) at the right severity, no healthy
node is blamed → clear, and the next test starts from a healthy lab. Tests run in file order; the
hardware swap (which cannot be undone) runs last. Needs root, podman and the Debian mirror.
Run: ``PROVISIONER_LAB_TEST_CLUSTER=<name> pytest -m lab tests/lab/test_verify_faults.py``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from _labspec import APT, APT_PINS, MPI_PACKAGES, cluster_name, mpi_trust  # type: ignore[import-not-found]

from provisioner.errors import LabError
from provisioner.fabric.findings import Finding
from provisioner.lab import cluster as lab
from provisioner.lab import faults
from provisioner.lab.fromspec import (
    lab_cables,
    lab_nodes,
    lab_switch_links,
    lab_switches,
    lab_versions,
    write_switch_links,
)
from provisioner.lab.host import ensure_containers_conf, podman
from provisioner.lab.ipoib import lab_ipoib_links
from provisioner.lab.names import container_name
from provisioner.lab.simtools import labstate
from provisioner.spec import Cluster, load_cluster
from provisioner.spec.models import DcgmCheck, GpuDirect
from provisioner.verify import VerifyRun, verify

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None, reason="needs root and podman"),
]

NAME = cluster_name("verifyfaults")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lab" / "cluster.yaml"
GPU_NODES = ("gpu01", "gpu02", "gpu03")
SM_NODES = ("sm1", "sm2")
HOSTS = GPU_NODES + SM_NODES
PINS = APT_PINS + """
Package: doca-ofed
Pin: version 2.9.1*
Pin-Priority: 1001
"""
PACKAGES = {"gpu": f"nvidia-driver-550-open cuda-toolkit-12-4 libnccl2 nccl-tests perftest-cuda {MPI_PACKAGES} "
                   "datacenter-gpu-manager", "sm": "opensm"}
OFED_FIRST = "doca-ofed"
"""Installed and loaded (openibd) before the driver, whose DKMS build of nvidia_peermem needs the OFED symbols."""
SM_PRIORITY = {"sm1": 15, "sm2": 14}


@dataclass(frozen=True)
class Lab:
    cluster: Cluster
    root: str


def sh(host: str, command: str, timeout: float = 300) -> str:
    """Run ``command`` in ``host``'s container (the trusted local channel the converge stand-in uses)."""
    done = podman("exec", container_name(NAME, host), "sh", "-c", command, check=False, timeout=timeout)
    assert done.returncode == 0, f"{host}: {command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def wait_for(what: str, probe: Callable[[], bool], deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not probe():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.5)


def _converge(host: str) -> None:
    """Stand-in for the converge phase: the vendor packages from the lab's signed repo, the module, the SM."""
    kind = "gpu" if host in GPU_NODES else "sm"
    sh(host, "install -D -m 0644 /run/lab/keys/lab-vendor.gpg /etc/apt/keyrings/lab-vendor.gpg && "
             "echo 'deb [signed-by=/etc/apt/keyrings/lab-vendor.gpg] file:/run/lab/vendor-repo bookworm main'"
             " > /etc/apt/sources.list.d/lab-vendor.list && "
             f"printf '%s' {shlex.quote(PINS)} > /etc/apt/preferences.d/lab-pins && "
             f"{APT} update && {APT} install -y --no-install-recommends {OFED_FIRST} && systemctl restart openibd && "
             f"{APT} install -y --no-install-recommends {PACKAGES[kind]}")
    if kind == "gpu":
        sh(host, "modprobe nvidia_peermem")
        # what the nvidia_driver role does: persistenced with persistence mode on (the packaged unit says off)
        sh(host, "mkdir -p /etc/systemd/system/nvidia-persistenced.service.d && printf '%s\n' '[Service]' "
                 "'ExecStart=' 'ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced "
                 "--persistence-mode --verbose' > /etc/systemd/system/nvidia-persistenced.service.d/pm.conf && "
                 "systemctl daemon-reload && systemctl restart nvidia-persistenced")
        sh(host, "systemctl enable --now nvidia-dcgm")  # what the dcgm role does: nv-hostengine, which dcgmi asks


def _configure_ipoib(cluster: Cluster, host: str) -> None:
    """Stand-in for the ipoib role: ping (Debian's, as the role installs it), each P_Key child's .network (from which
    the lab's stand-in for ib_ipoib makes the child at once), the planned address and MTU on each simulated IPoIB
    link, set up."""
    sh(host, "DEBIAN_FRONTEND=noninteractive apt-get -q update >/dev/null && "
             "DEBIAN_FRONTEND=noninteractive apt-get -q install -y --no-install-recommends iputils-ping >/dev/null")
    for child in [i.netdev for i in cluster.ipoib_of(host) if i.parent]:
        sh(host, f"printf '[Match]\\nName=%s\\n' {child} > /etc/systemd/network/50-ipoib-{child}.network && "
                 f"timeout 30 sh -c 'until ip link show dev {child} >/dev/null 2>&1; do sleep 0.2; done'")
    sh(host, " && ".join(f"ip addr replace {i.cidr} dev {i.netdev} && ip link set dev {i.netdev} mtu {i.mtu} up"
                         for i in cluster.ipoib_of(host)))


def _start_sm(host: str) -> None:
    sh(host, f"mkdir -p /etc/opensm && printf 'sm_priority {SM_PRIORITY[host]}\\n' > /etc/opensm/opensm.conf && "
             "systemctl start opensmd && systemctl is-active opensmd")


def _all_active(cluster: Cluster) -> bool:
    run = verify(cluster, tests=["links"], write=False)
    return run.exit_code == 0


@pytest.fixture(scope="module")
def labc(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    os.environ.setdefault("PROVISIONER_LAB_DIR", str(tmp_path_factory.mktemp("labdir")))
    ensure_containers_conf()
    spec = tmp_path_factory.mktemp("spec") / "cluster.yaml"
    # Three uplinks per leaf, as many as the GPU ports on it: one missing uplink then shows in the load round
    # (the example's eight would carry the three flows of a leaf even with a few gone).
    text = EXAMPLE.read_text().replace("cluster: {name: lab,", f"cluster: {{name: {NAME},")
    text = text.replace("uplinks: 8}", "uplinks: 3}")
    # every GPU node in tenant_a: NCCL runs one all-reduce per P_Key (a job cannot span two), and the slow-node
    # follow-up needs three nodes in one run
    text = text.replace('members: "gpu[01-02]"', 'members: "gpu[01-03]"').replace('"10.31.0.[11-12]"',
                                                                                 '"10.31.0.[11-13]"')
    # verify.user: the memlock check reads what a job of nobody (an unprivileged account every Debian node has) may
    # lock, through a runuser login (this lab runs no Slurm). The floor is the lab's ceiling: root in the containers
    # lacks CAP_SYS_RESOURCE and the host's hard limit is 8 MiB, so "unlimited" cannot be shown here; memlock_low's
    # 64 KiB is far below it (docs/lab-hardware-model.md).
    text = text.replace("verify:\n", "verify:\n  user: nobody\n  memlock_min_mib: 8\n")
    # no "cabling" in the list: a spec that plans cables gets the cabling check by default (the switch tests below)
    spec.write_text(text + "  tests: [links, ipoib, bandwidth, gpudirect, nccl]\n")
    base, _ = load_cluster(spec)

    def teardown() -> None:
        try:
            lab.lab_down(NAME)
        except LabError:  # seen once: podman rm --force racing a container that was still stopping
            lab.lab_down(NAME)
        left = podman("ps", "-a", "--filter", f"label=provisioner-lab.cluster={NAME}", "--format", "{{.Names}}",
                      check=False).stdout.split()
        assert left == [], left

    request.addfinalizer(teardown)  # also after a failed bring-up
    info = lab.lab_up(NAME, lab_nodes(base), lab_switches(base), lab_cables(base), versions=lab_versions(base),
                      ipoib_links=lab_ipoib_links(base))
    write_switch_links(str(info.state_dir), lab_switch_links(base))
    with ThreadPoolExecutor(max_workers=len(HOSTS)) as pool:
        list(pool.map(_converge, HOSTS))
    known_hosts = yaml.safe_load(info.overlay.read_text())["ssh"]["known_hosts"]
    mpi_trust(sh, GPU_NODES, Path(known_hosts).read_text(encoding="utf-8"))  # what the nccl role sets up
    for host in HOSTS:
        _configure_ipoib(base, host)
    _start_sm("sm1")
    cluster, _ = load_cluster(spec, info.overlay)
    wait_for("every port Active under sm1", lambda: _all_active(cluster))
    _start_sm("sm2")
    yield Lab(cluster, str(info.state_dir))


# ---------------------------------------------------------------- helpers


def serious(run: VerifyRun) -> list[Finding]:
    return [f for f in run.report.findings() if f.severity in ("error", "warning")]


def show(findings: Iterable[Finding]) -> list[str]:
    return [f"{f.severity} {f.check} {f.location()}: {f.message}" for f in findings]


def assert_only_blamed(run: VerifyRun, nodes: set[str]) -> None:
    """No error or warning names a node outside ``nodes`` (as the node or as the peer)."""
    wrong = [f for f in serious(run) if (f.node is not None and f.node not in nodes)
             or (f.peer is not None and f.peer not in nodes and f.severity == "error" and f.node not in nodes)]
    assert not wrong, show(wrong)


def inject(labc: Lab, host: str, kind: str, **params: Any) -> None:
    faults.inject(labc.root, host, kind, **params)


def clear(labc: Lab, host: str, kind: str) -> None:
    assert faults.clear(labc.root, host, kind), f"{kind} was not recorded on {host}"


# ---------------------------------------------------------------- healthy


def test_healthy_lab_passes_every_check(labc: Lab, tmp_path: Path) -> None:
    run = verify(labc.cluster, state_dir=tmp_path)
    not_run = [(c.name, c.node, c.error) for c in run.report.checks if not c.ran]
    assert not not_run, not_run
    assert run.exit_code == 0, show(run.report.findings())
    assert not serious(run), show(serious(run))
    ran = {c.name for c in run.report.checks}
    assert {"links", "versions", "subnet_manager", "ipoib", "bandwidth", "gpudirect", "gpudirect_bandwidth", "nccl",
            "cabling", "switch_links", "switch_ports", "fabric_load", "pcie", "memlock", "xid"} <= ran, ran
    memlock = {c.node: c.measurements for c in run.report.checks if c.name == "memlock"}
    assert sorted(memlock) == list(GPU_NODES) and all(m["via"] == "runuser login" for m in memlock.values()), memlock
    load = next(c for c in run.report.checks if c.name == "fabric_load")
    assert load.measurements["flows"] == 6 and load.measurements["flows_slow"] == 0  # every flow across leaves
    alone = {c.node: c.measurements for c in run.report.checks if c.name == "nccl_node"}  # each node's GPUs alone
    assert sorted(alone) == list(GPU_NODES), alone
    assert all(m["expected_busbw_gbps"] == 450.0 and 0.8 < float(m["efficiency"] or 0) < 0.85
               for m in alone.values()), alone


# ---------------------------------------------------------------- faults, one test per kind


def errors_of(run: VerifyRun, check: str) -> list[Finding]:
    return [f for f in run.report.findings() if f.check == check and f.severity == "error"]


@pytest.mark.parametrize(("kind", "host", "device", "params", "words"), [
    ("port_down", "gpu02", "mlx5_1", {}, "down/polling"),
    ("port_disabled", "gpu03", "mlx5_0", {}, "down/disabled"),
    ("degraded_width", "gpu01", "mlx5_1", {"width": "2X"}, ": width 2X, expected 4X"),
    ("degraded_rate", "gpu02", "mlx5_0", {}, ": speed HDR, expected NDR"),
])
def test_port_fault_is_named_by_links(labc: Lab, kind: str, host: str, device: str, params: dict[str, Any],
                                      words: str) -> None:
    inject(labc, host, kind, device=device, **params)
    try:
        run = verify(labc.cluster, tests=["links"], write=False)
    finally:
        clear(labc, host, kind)
    found = errors_of(run, "links")
    assert [(f.node, f.device, f.port) for f in found] == [(host, device, 1)], show(run.report.findings())
    assert words in found[0].message
    assert_only_blamed(run, {host})


def test_slow_link_is_named_by_bandwidth_only(labc: Lab) -> None:
    inject(labc, "gpu02", "slow_link", device="mlx5_1", bw_factor=0.5)
    try:
        run = verify(labc.cluster, tests=["links", "bandwidth"], write=False)
    finally:
        clear(labc, "gpu02", "slow_link")
    assert errors_of(run, "links") == []  # ibstat cannot see it: only a measurement can
    found = errors_of(run, "pairwise_bandwidth")
    assert [(f.node, f.device, f.rail, f.peer) for f in found] == [("gpu02", "mlx5_1", 1, None)], show(found)
    assert_only_blamed(run, {"gpu02"})


def test_flapping_port_is_named_by_its_counters(labc: Lab) -> None:
    """The flapping fault bounces the port once when injected and again on every traffic run over it
    (link_error_recovery +1 each run, link_downed +1 in the runs it drops): links alone warns about the
    counts, and links + bandwidth fails exactly that port because its counters grew during the run."""
    inject(labc, "gpu03", "flapping", device="mlx5_1")
    try:
        before = verify(labc.cluster, tests=["links"], write=False)
        run = verify(labc.cluster, tests=["links", "bandwidth"], write=False)
    finally:
        clear(labc, "gpu03", "flapping")
        assert faults.reset_counters(labc.root, "gpu03") == 2  # perfquery -R after the fix: next test starts at 0
    warned = [f for f in serious(before) if f.check == "links"]
    assert {(f.severity, f.node, f.device, f.port) for f in warned} == {("warning", "gpu03", "mlx5_1", 1)}, show(warned)
    assert sorted(f.message for f in warned) == [
        "mlx5_1/1 error counters above threshold: symbol_error 12 (> 10)",
        "mlx5_1/1 flapped 2 times since the counters were last cleared (link_downed 1, link_error_recovery 1)",
    ], show(warned)
    assert before.exit_code == 0
    found = errors_of(run, "links")
    assert [(f.node, f.device, f.port) for f in found] == [("gpu03", "mlx5_1", 1)], show(run.report.findings())
    assert "flapped during this verify run" in found[0].message and "link_error_recovery 1 -> " in found[0].message
    bandwidth = [f for f in serious(run) if f.check == "pairwise_bandwidth"]
    assert all(f.rail == 1 and "gpu03" in (f.node, f.peer) for f in bandwidth), show(bandwidth)
    assert_only_blamed(run, {"gpu03"})


def test_gpu_missing_is_named_by_gpudirect(labc: Lab) -> None:
    inject(labc, "gpu02", "gpu_missing")
    try:
        run = verify(labc.cluster, tests=["gpudirect"], write=False)
    finally:
        clear(labc, "gpu02", "gpu_missing")
    count = errors_of(run, "gpudirect")
    assert [(f.node, f.expected, f.observed) for f in count] == [("gpu02", 2, 1)], show(run.report.findings())
    assert "GPU1 missing" in count[0].message
    gdr = errors_of(run, "gpudirect_bandwidth")
    assert {(f.node, f.device, f.rail) for f in gdr} == {("gpu02", "mlx5_1", 1)}, show(gdr)
    assert_only_blamed(run, {"gpu02"})


CABLE_WORDS = re.compile(r"\b(cables?|ports?|transceivers?)\b", re.IGNORECASE)


def test_critical_xids_are_named_as_the_host_side_cause_and_no_cable(labc: Lab) -> None:
    """gpu_missing on gpu02 logs Xid 79 (its GPU1 leaves nvidia-smi), ecc_error on gpu03 logs Xid 48 (its GPU0
    stays): verify's xid check names each node, GPU, code and NVIDIA's meaning with the catalog's action, gpu02's
    GPUDirect findings fold under its Xid, and no finding on either node speaks of a cable, port or transceiver
    (the fold's own "not a port or cable ... no cable, transceiver or switch port is suspected" aside, checked as
    for peermem_missing)."""
    inject(labc, "gpu02", "gpu_missing")
    inject(labc, "gpu03", "ecc_error", index=0)
    try:
        run = verify(labc.cluster, tests=["gpudirect"], write=False)
    finally:
        clear(labc, "gpu02", "gpu_missing")
        clear(labc, "gpu03", "ecc_error")
    found = errors_of(run, "xid")
    assert [(f.node, f.device, f.observed) for f in found] == [
        ("gpu02", None, "Xid 79"), ("gpu03", "gpu0", "Xid 48")], show(run.report.findings())
    gone, dbe = found
    assert "(not listed by nvidia-smi) logged Xid 79: GPU has fallen off the bus" in gone.message, gone.message
    assert "gpu0 (PCI " in dbe.message and "logged Xid 48: double bit ECC error" in dbe.message, dbe.message
    assert "reboot the node" in gone.hint and "nvidia-smi -r -i 0" in dbe.hint
    gdr = [f for f in serious(run) if f.check == "gpudirect_bandwidth"]
    assert {(f.node, f.device) for f in gdr} == {("gpu02", "mlx5_1")}, show(gdr)
    for f in serious(run):
        if f.node not in ("gpu02", "gpu03"):
            continue
        if f.check == "gpudirect_bandwidth":
            assert "host-side cause, not a port or cable: gpu02: the GPU at PCI " in f.message, show([f])
            assert "reboot the node" in f.hint, show([f])
        else:
            assert not CABLE_WORDS.search(f"{f.message} {f.hint}"), show([f])
    assert run.exit_code == 1
    assert_only_blamed(run, {"gpu02", "gpu03"})


def test_pcie_degraded_and_acs_enabled_are_named_by_pcie_as_host_side(labc: Lab) -> None:
    healthy = verify(labc.cluster, tests=["pcie"], write=False)
    assert healthy.exit_code == 0 and {c.node for c in healthy.report.checks if c.passed} == set(GPU_NODES), \
        show(healthy.report.findings())
    inject(labc, "gpu02", "pcie_degraded", **faults.check_params("pcie_degraded", {"device": "mlx5_1", "width": "8"}))
    inject(labc, "gpu03", "acs_enabled")
    try:
        run = verify(labc.cluster, tests=["pcie"], write=False)
    finally:
        clear(labc, "gpu02", "pcie_degraded")
        clear(labc, "gpu03", "acs_enabled")
    down = [f for f in errors_of(run, "pcie") if f.node == "gpu02"]
    assert [(f.device, f.expected, f.observed) for f in down] == [("mlx5_1", "x16 32GT/s", "x8 32GT/s")], show(down)
    assert "gpu02: mlx5_1" in down[0].message and "cable" not in down[0].message
    assert "reseat the card" in down[0].hint and "not a cable" in down[0].hint
    acs = [f for f in errors_of(run, "pcie") if f.node == "gpu03"]
    assert acs and all("ACS redirect on" in f.message and "ECAP_ACS+0x6.w=0000" in f.hint for f in acs), show(acs)
    assert {f.message.split(" between ")[1].split(" has ")[0] for f in acs} == {"gpu0–mlx5_0", "gpu1–mlx5_1"}
    assert_only_blamed(run, {"gpu02", "gpu03"})


def test_ecc_error_is_named_by_the_watch_health_checks(labc: Lab) -> None:
    """verify measures the fabric; an uncorrectable ECC error is what `provision watch`'s health probe takes a node
    out of service for: the same probe over SSH names gpu01's GPU and nothing on gpu02 or gpu03."""
    from provisioner import health
    from provisioner.remote import SshRemote, targets_from_cluster

    inject(labc, "gpu01", "ecc_error", index=1, count=2)
    try:
        found = health.check_nodes(labc.cluster, SshRemote(targets_from_cluster(labc.cluster)), GPU_NODES)
    finally:
        clear(labc, "gpu01", "ecc_error")
    problems = {n: h.problems for n, h in found.items()}
    assert problems["gpu01"] and problems["gpu01"][0].startswith("ecc: uncorrectable ECC errors on "), problems
    assert "(2)" in problems["gpu01"][0], problems  # the Xid 48 line is judged in tests/unit/test_health.py
    assert problems["gpu02"] == [] and problems["gpu03"] == [], problems
    again = health.check_nodes(labc.cluster, SshRemote(targets_from_cluster(labc.cluster)), ["gpu01"])
    assert again["gpu01"].problems == []  # cleared as a reboot clears it: the counter and the kernel log


def test_healthy_lab_passes_dcgm_and_its_nvswitch_fabric(labc: Lab) -> None:
    run = verify(labc.cluster, tests=["dcgm"], write=False)
    assert run.exit_code == 0, show(run.report.findings())
    got = {(c.name, c.node): c for c in run.report.checks}
    assert set(got) == {(name, n) for name in ("dcgm", "nvswitch_fabric") for n in GPU_NODES}, sorted(got)
    assert all(c.passed and c.ran for c in got.values()), show(run.report.findings())
    assert got["dcgm", "gpu01"].measurements["passed"] == 9  # level 1 (the default): the nine Deployment tests


def test_dcgm_fail_is_named_on_its_node_in_dcgms_words_and_no_cable(labc: Lab) -> None:
    inject(labc, "gpu02", "dcgm_fail", gpu=1)
    try:
        run = verify(labc.cluster, tests=["dcgm"], write=False)
    finally:
        clear(labc, "gpu02", "dcgm_fail")
    found = errors_of(run, "dcgm")
    assert [(f.node, f.device, f.port) for f in found] == [("gpu02", None, None)], show(run.report.findings())
    assert found[0].message == ("DCGM diag level 1: Inforom (Deployment) failed on GPU 1: A corrupt InfoROM has been "
                                "detected in GPU 1."), found[0].message
    assert "not a cable" in found[0].hint and not any("reseat" in f.hint for f in serious(run)), show(serious(run))
    assert run.exit_code == 1
    assert_only_blamed(run, {"gpu02"})


def test_nvlink_down_fails_dcgm_level_2_on_that_gpu_while_the_fabric_stays_trained(labc: Lab) -> None:
    spec = labc.cluster.spec.model_copy(update={"verify": labc.cluster.spec.verify.model_copy(
        update={"dcgm": DcgmCheck(level=2)})})
    level2 = dataclasses.replace(labc.cluster, spec=spec)
    inject(labc, "gpu03", "nvlink_down", gpu=0)
    try:
        level1 = verify(labc.cluster, tests=["dcgm"], write=False)
        run = verify(level2, tests=["dcgm"], write=False)
        status = sh("gpu03", "nvidia-smi nvlink -s")
    finally:
        clear(labc, "gpu03", "nvlink_down")
    assert level1.exit_code == 0, show(level1.report.findings())  # level 1 runs no NVLink test, as DCGM's
    found = errors_of(run, "dcgm")
    assert [f.node for f in found] == ["gpu03"] and found[0].message == (
        "DCGM diag level 2: PCIe (Integration) failed on GPU 0: GPU 0's NvLink link 0 is currently down"), show(found)
    assert errors_of(run, "nvswitch_fabric") == []  # NVLink down, the fabric state still Completed/Success
    assert "\t Link 0: <inactive>" in status
    assert_only_blamed(run, {"gpu03"})


def test_nvlink_down_fails_the_single_node_all_reduce_on_that_node_and_no_cable(labc: Lab) -> None:
    """nvlink_down on gpu02: its GPUs alone (network disabled) fall to the PCIe figure, an error on gpu02 naming
    measured and expected; gpu01 and gpu03 pass theirs; the multi-node run gpu02 is in fails too, and nothing
    points at a port or cable."""
    from provisioner.report.model import nccl_lines

    inject(labc, "gpu02", "nvlink_down", gpu=0)
    try:
        run = verify(labc.cluster, tests=["nccl"], write=False)
    finally:
        clear(labc, "gpu02", "nvlink_down")
    found = errors_of(run, "nccl_node")
    assert [(f.node, f.device, f.port) for f in found] == [("gpu02", None, None)], show(run.report.findings())
    assert found[0].message.startswith("single-node all-reduce on gpu02 (2 GPUs, network disabled): bus bandwidth "), \
        found[0].message
    assert ("below the floor 315 GB/s (70% of the expected 450 GB/s); expected 450 GB/s from NVLink 450 GB/s per "
            "H100-SXM5-80GB") in found[0].message, found[0].message
    alone = {c.node: c for c in run.report.checks if c.name == "nccl_node"}
    assert alone["gpu01"].passed and alone["gpu03"].passed and not alone["gpu02"].passed
    assert not any("reseat" in f.hint for f in serious(run)), show(serious(run))
    # one cause, named where its effects are: gpu02's NCCL findings say host-side (the folded hint itself says "no
    # cable, transceiver or switch port is suspected", as for peermem_missing)
    for f in serious(run):
        if f.check == "nccl" and f.node == "gpu02":
            assert "host-side cause, not a port or cable: single-node all-reduce on gpu02" in f.message, show([f])
    assert any(line.startswith("NCCL all-reduce in gpu02 alone (network disabled): ") for line in nccl_lines(
        run.report)), nccl_lines(run.report)
    assert run.exit_code == 1
    assert_only_blamed(run, {"gpu02"})


def test_peermem_missing_is_named_by_gpudirect_and_nccl(labc: Lab) -> None:
    inject(labc, "gpu03", "peermem_missing")
    try:
        run = verify(labc.cluster, tests=["gpudirect", "nccl"], write=False)
    finally:
        clear(labc, "gpu03", "peermem_missing")
        sh("gpu03", "modprobe nvidia_peermem")  # clearing restores the module file, not the loaded module
    module = errors_of(run, "gpudirect")
    assert [f.node for f in module] == ["gpu03"] and "nvidia_peermem is not loaded" in module[0].message
    gdr = errors_of(run, "gpudirect_bandwidth")
    assert {(f.node, f.device) for f in gdr} == {("gpu03", "mlx5_0"), ("gpu03", "mlx5_1")}, show(gdr)
    nccl = errors_of(run, "nccl")
    assert [f.node for f in nccl] == [None, "gpu03"], show(nccl)  # the cluster run, then the follow-up's verdict
    assert_only_blamed(run, {"gpu03"})
    # one cause, named where its effects are: no cable, transceiver or port is suspected on gpu03
    for f in [*gdr, nccl[1]]:
        assert "host-side cause, not a port or cable: gpu03: nvidia_peermem is not loaded" in f.message, show([f])
        assert "reseat" not in f.hint, show([f])


def test_dmabuf_mode_needs_no_peermem_but_a_new_enough_kernel(labc: Lab) -> None:
    # gpudirect.mode dmabuf: --use_cuda_dmabuf through perftest-cuda, the open-module driver, no nvidia_peermem.
    spec = labc.cluster.spec.model_copy(update={"gpudirect": GpuDirect(mode="dmabuf")})
    dmabuf = dataclasses.replace(labc.cluster, spec=spec)
    sh("gpu03", "rmmod nvidia_peermem")
    node = labstate.load_node(labc.root, "gpu02")
    try:
        run = verify(dmabuf, tests=["gpudirect"], write=False)
        gdr = next(c for c in run.report.checks if c.name == "gpudirect_bandwidth")
        assert gdr.passed and gdr.skipped is None, show(run.report.findings())
        assert not serious(run), show(serious(run))
        labstate.save_node(labc.root, {**node, "kernel": "5.10.0-28-amd64"})  # rehearse a kernel without dma-buf MRs
        old = verify(dmabuf, tests=["gpudirect"], write=False)
    finally:
        labstate.save_node(labc.root, node)
        sh("gpu03", "modprobe nvidia_peermem")
    gdr_errors = errors_of(old, "gpudirect_bandwidth")
    assert {f.node for f in gdr_errors} == {"gpu02"} and "--use_cuda_dmabuf" in gdr_errors[0].message, show(gdr_errors)
    assert_only_blamed(old, {"gpu02"})


def test_gpudirect_without_a_cuda_perftest_could_not_run_with_the_reason(labc: Lab) -> None:
    """Stock perftest (DOCA's, Debian's) has no --use_cuda: a node whose CUDA build is gone leaves the GPUDirect
    bandwidth test not run, with that reason, never a pass and never a fabric fault (#12 rule 5). The old check ran
    the pairs anyway and blamed rail 0 and rail 1 of the node ("4 of 4 pairs failed")."""
    sh("gpu02", f"{APT} remove -y perftest-cuda")
    try:
        assert "--use_cuda" not in sh("gpu02", "ib_write_bw --help 2>&1 || true")  # the stock build is what is left
        run = verify(labc.cluster, tests=["gpudirect"], write=False)
    finally:
        sh("gpu02", f"{APT} install -y --no-install-recommends perftest-cuda")
    gdr = next(c for c in run.report.checks if c.name == "gpudirect_bandwidth")
    assert not gdr.passed and gdr.error is not None, (gdr.passed, gdr.error, show(run.report.findings()))
    assert "gpu02: " in gdr.error and "built without CUDA" in gdr.error, gdr.error
    assert not [f for f in run.report.findings() if f.severity == "error"], show(run.report.findings())
    assert {f.node for f in run.report.findings() if f.severity == "warning"} == {"gpu02"}, show(run.report.findings())
    assert run.exit_code == 2  # GPUDirect is required here: not measured is INCOMPLETE, never PASS


def test_slow_rail_fails_nccl_and_the_follow_up_names_the_node(labc: Lab) -> None:
    inject(labc, "gpu02", "slow_link", device="mlx5_1", bw_factor=0.5)
    try:
        run = verify(labc.cluster, tests=["nccl"], write=False)
    finally:
        clear(labc, "gpu02", "slow_link")
    nccl = errors_of(run, "nccl")
    assert [f.node for f in nccl] == [None, "gpu02"], show(run.report.findings())
    assert "below the floor 80 GB/s (verify.nccl.min_busbw_gbps)" in nccl[0].message
    assert_only_blamed(run, {"gpu02"})


def test_nccl_slow_fails_without_a_floor_in_the_spec_and_blames_no_cable(labc: Lab) -> None:
    """NCCL at 60 % with every link healthy (lab fault nccl_slow): a spec without min_busbw_gbps used to pass at any
    speed; now the floor is 80 % of what the rails carry (2 x NDR = 100 GB/s), the run fails naming measured and
    expected, the follow-up names gpu02, and neither the links nor the pairwise bandwidth blame a port."""
    nccl_cfg = labc.cluster.spec.verify.nccl.model_copy(update={"min_busbw_gbps": None})
    spec = labc.cluster.spec.model_copy(update={"verify": labc.cluster.spec.verify.model_copy(
        update={"nccl": nccl_cfg})})
    no_floor = dataclasses.replace(labc.cluster, spec=spec)
    healthy = verify(no_floor, tests=["nccl"], write=False)
    assert healthy.exit_code == 0, show(healthy.report.findings())
    [run_figures] = healthy.report.nccl_runs()
    assert run_figures["expected_busbw_gbps"] == 100.0 and run_figures["floor_gbps"] == 80.0
    assert 0.9 < float(run_figures["efficiency"] or 0) < 0.96, run_figures
    inject(labc, "gpu02", "nccl_slow", factor=0.6)
    try:
        run = verify(no_floor, tests=["links", "bandwidth", "nccl"], write=False)
    finally:
        clear(labc, "gpu02", "nccl_slow")
    nccl = errors_of(run, "nccl")
    assert [f.node for f in nccl] == [None, "gpu02"], show(run.report.findings())
    assert "below the floor 80 GB/s (80% of the expected 100 GB/s)" in nccl[0].message, nccl[0].message
    assert "expected 100 GB/s from 2 x 400 Gb/s rails per node" in nccl[0].message
    assert not [f for f in serious(run) if f.check != "nccl"], show(serious(run))  # no port, cable or pair
    assert_only_blamed(run, {"gpu02"})


def test_tune_runs_the_sweep_in_the_lab_and_recommends_nothing_the_lab_cannot_show(labc: Lab) -> None:
    """provision tune over the lab's real mpirun path: every setting runs, NCCL reports taking it, and with no
    simulated effect (no public source for one) nothing beats the defaults beyond the spread."""
    from provisioner.fabric import tune
    from provisioner.verify import tune_nccl

    run = tune_nccl(labc.cluster, knobs=["NCCL_IB_QPS_PER_CONNECTION"], repeats=2)
    assert run.error is None, run.error
    assert [(s.label, len(s.figures), s.confirmed) for s in run.settings] == [
        ("NCCL defaults", 2, True), ("NCCL_IB_QPS_PER_CONNECTION=2", 2, True),
        ("NCCL_IB_QPS_PER_CONNECTION=4", 2, True)]
    assert 85.0 < (run.settings[0].median or 0) < 96.0
    assert tune.recommend(run.settings) is None


def test_memlock_low_fails_the_memlock_check_on_its_node_while_the_root_checks_pass(labc: Lab) -> None:
    """A limits.d file lowers every login's locked-memory limit on gpu02 to 64 KiB (lab fault memlock_low): root's
    links and bandwidth checks cannot see it (root is exempt, CAP_IPC_LOCK) and stay green; the memlock check, run
    as nobody through runuser (PAM applies limits.d), fails on gpu02 only, naming memlock, the user and the value,
    on the host and never a port."""
    inject(labc, "gpu02", "memlock_low", kib=64)
    try:
        run = verify(labc.cluster, tests=["links", "bandwidth", "memlock"], write=False)
    finally:
        clear(labc, "gpu02", "memlock_low")
    memlock = errors_of(run, "memlock")
    assert [(f.node, f.device, f.port, f.observed) for f in memlock] == [("gpu02", None, None, "64 KiB")], show(
        run.report.findings())
    assert "memlock: a job of user nobody on gpu02 may lock only 64 KiB" in memlock[0].message, memlock[0].message
    assert not [f for f in serious(run) if f.check != "memlock"], show(serious(run))
    root_mode = [c for c in run.report.checks if c.name in ("links", "bandwidth", "fabric_load")]
    assert root_mode and all(c.passed for c in root_mode), [(c.name, c.node, c.passed) for c in root_mode]
    assert run.exit_code == 1


def test_unreachable_node_is_could_not_run_not_a_hang(labc: Lab) -> None:
    """SSH to gpu01 is down: one "could not run" for it, its bandwidth pairs skipped, gpu02-gpu03 measured."""
    inject(labc, "gpu01", "unreachable", method="pause")
    try:
        run = verify(labc.cluster, tests=["links", "bandwidth"], write=False)
    finally:
        clear(labc, "gpu01", "unreachable")
    assert [(c.name, c.node) for c in run.report.checks if not c.ran] == [("ssh", "gpu01")]
    assert run.exit_code == 2 and not serious(run), show(run.report.findings())
    assert [(c.name, c.node) for c in run.report.checks if c.skipped is not None] == [("bandwidth", "gpu01"),
                                                                                      ("fabric_load", "gpu01")]
    assert {pair for rail in run.report.bandwidth.values() for pair in rail} == {("gpu02", "gpu03")}


def _master_guid() -> str:
    out = podman("exec", container_name(NAME, "gpu01"), "sminfo", check=False).stdout
    return out.split("sm guid ")[1].split(",")[0] if "sm guid " in out else ""


def test_sm_killed_standby_takeover_names_the_dead_master(labc: Lab) -> None:
    healthy = _master_guid()
    inject(labc, "sm1", "sm_killed")
    try:
        wait_for("the standby to take over", lambda: _master_guid() not in ("", healthy))
        run = verify(labc.cluster, tests=["links", "sm"], write=False)
    finally:
        clear(labc, "sm1", "sm_killed")
    wait_for("sm1 master again", lambda: _master_guid() == healthy)
    assert errors_of(run, "links") == []  # every port follows the new SM LID: links alone sees nothing
    found = errors_of(run, "subnet_manager")
    assert [(f.node, f.device, f.port) for f in found] == [("sm1", "mlx5_0", 1)], show(run.report.findings())
    assert "sm2 (priority 14" in found[0].message and "no failover" in found[0].message
    assert_only_blamed(run, {"sm1"})


def test_cables_swapped_are_named_at_the_switch_ports(labc: Lab) -> None:
    inject(labc, "gpu01", "cables_swapped", device="mlx5_0", other_host="gpu02", other_device="mlx5_0")
    try:
        run = verify(labc.cluster, tests=["cabling"], write=False)
    finally:
        clear(labc, "gpu01", "cables_swapped")
    found = errors_of(run, "cabling")
    assert [(f.node, f.device, f.expected, f.observed) for f in found] == [
        ("gpu01", "mlx5_0", "leaf1 port 1", "leaf1 port 2"),
        ("gpu02", "mlx5_0", "leaf1 port 2", "leaf1 port 1"),
    ], show(run.report.findings())
    assert "move the cable from leaf1 port 2 to leaf1 port 1" in found[0].hint
    assert_only_blamed(run, {"gpu01", "gpu02"})


def test_ipoib_down_is_named_on_its_node_and_the_peers_stay_green(labc: Lab) -> None:
    inject(labc, "gpu02", "ipoib_down", netdev="ibp23s0")
    try:
        run = verify(labc.cluster, tests=["ipoib"], write=False)
    finally:
        clear(labc, "gpu02", "ipoib_down")
    found = errors_of(run, "ipoib")
    # the port's netdev and its P_Key child (tenant_a) are both down: a child is made on its parent's link, and
    # ib_ipoib brings a parent's children down with it (drivers/infiniband/ulp/ipoib/ipoib_main.c, ipoib_stop)
    assert [(f.node, f.device, f.port) for f in found] == [("gpu02", "mlx5_0", 1)] * 2, show(run.report.findings())
    assert sorted(f.message.split(":")[0] for f in found) == ["ibp23s0", "ibp23s0.8001"], show(found)
    assert all(": is down" in f.message for f in found), show(found)
    assert_only_blamed(run, {"gpu02"})  # gpu01/gpu03/sm1 ping another, healthy peer on rail0


def test_ipoib_wrong_address_is_named_with_both_addresses(labc: Lab) -> None:
    inject(labc, "gpu03", "ipoib_wrong_address", netdev="ibp41s0", address="10.30.1.99/24")
    try:
        run = verify(labc.cluster, tests=["ipoib"], write=False)
    finally:
        clear(labc, "gpu03", "ipoib_wrong_address")
    found = errors_of(run, "ipoib")
    assert [(f.node, f.device, f.expected, f.observed) for f in found] == [
        ("gpu03", "mlx5_1", "10.30.1.13/24", "10.30.1.99/24")], show(run.report.findings())
    assert_only_blamed(run, {"gpu03"})
    again = verify(labc.cluster, tests=["ipoib"], write=False)  # clearing put the planned address back
    assert again.exit_code == 0, show(again.report.findings())


# ---------------------------------------------------------------- switch faults (leaf ports 62-64 go up to spine1)


def default_verify(cluster: Cluster, *tests: str) -> VerifyRun:
    """`provision verify` with no --only, for a spec whose verify.tests lists ``tests`` (never cabling): what the
    default selection adds (versions and sm with links, cabling wherever the spec plans cables) runs too."""
    assert "cabling" not in tests
    spec = cluster.spec.model_copy(update={"verify": cluster.spec.verify.model_copy(update={"tests": list(tests)})})
    run = verify(dataclasses.replace(cluster, spec=spec), write=False)
    assert "switch_links" in {c.name for c in run.report.checks}, [c.name for c in run.report.checks]
    return run


def test_uplink_down_is_named_and_the_load_round_blames_the_leaf(labc: Lab) -> None:
    """One of leaf2's three uplinks gone: the link is named by both its ports, leaf2's oversubscription is
    given, and the load round (healthy above: no slow flow) blames leaf2, not the nodes on it."""
    inject(labc, "leaf2", "uplink_down", port=63)
    try:
        run = default_verify(labc.cluster, "links", "bandwidth")
    finally:
        assert faults.clear(labc.root, "leaf2", "uplink_down")
        faults.reset_switch_counters(labc.root)
    found = errors_of(run, "switch_links")
    assert [(f.switch, f.port, f.message) for f in found] == [(
        "leaf2", 63, "leaf2 port 63 ↔ spine1 port 5: missing (leaf2 port 63 is Down/Polling; spine1 port 5 is "
                     "Down/Polling)")], show(run.report.findings())
    warned = [f.message for f in serious(run) if f.check == "switch_links" and f.severity == "warning"]
    assert warned == ["leaf2: 2 of 3 uplinks up → 1.50:1 (planned 1.00:1; 1200 Gb/s down, 800 of 1200 Gb/s up)"]
    load = errors_of(run, "fabric_load")
    assert [(f.switch, f.node) for f in load] == [("leaf2", None)], show(run.report.findings())
    assert "2 of 3 uplinks up → 1.50:1 (planned 1.00:1): the switch's uplinks, not the nodes" in load[0].message
    assert errors_of(run, "pairwise_bandwidth") == []  # the pairs within a leaf never noticed
    assert_only_blamed(run, set())


def test_uplink_degraded_is_named_with_its_switch_port_counters(labc: Lab) -> None:
    inject(labc, "leaf1", "uplink_degraded", port=62, width="2X")
    try:
        run = default_verify(labc.cluster, "links")
    finally:
        assert faults.clear(labc.root, "leaf1", "uplink_degraded")
        faults.reset_switch_counters(labc.root)
    found = errors_of(run, "switch_links")
    assert [(f.switch, f.port, f.message) for f in found] == [(
        "leaf1", 62, "leaf1 port 62 ↔ spine1 port 1: degraded to 200 Gb/s (width 2X, planned 4X), planned 400 "
                     "Gb/s")], show(run.report.findings())
    counters = sorted((f.switch, f.port, f.message.split(": ")[-1]) for f in serious(run) if f.check == "switch_ports"
                      and "above threshold" in f.message)
    assert counters == [("leaf1", 62, "symbol_error 12 (> 10)"), ("spine1", 1, "symbol_error 12 (> 10)")], counters
    assert_only_blamed(run, set())


def test_switch_down_names_the_switch_and_every_link_it_took(labc: Lab) -> None:
    inject(labc, "spine1", "switch_down")
    try:
        run = default_verify(labc.cluster, "links")
    finally:
        assert faults.clear(labc.root, "spine1", "switch_down")
        faults.reset_switch_counters(labc.root)
    found = errors_of(run, "switch_links")
    assert [(f.switch, f.port, f.message) for f in found] == [(
        "spine1", None, "spine1: not in the fabric (no port of it answers); its 6 planned links are down: leaf1 "
                        "port 62-64; leaf2 port 62-64")], show(run.report.findings())
    assert errors_of(run, "cabling") == []  # the node cables are all where they should be
    assert_only_blamed(run, set())


def test_every_fault_kind_has_a_test_here() -> None:
    text = Path(__file__).read_text()
    assert [k for k in faults.FAULT_KINDS if f'"{k}"' not in text] == []


def test_hardware_swap_last_changed_host_key_stops_that_node_only(labc: Lab) -> None:
    """Runs last: a swapped board cannot be swapped back, and its new host key is never learnt silently.

    The node that refuses us is one "could not run" with the host-key reason; it is never measured, so no
    port of it (nor of a peer) is localised as bad; its pairs are skipped with the reason, and the other two
    GPU nodes are measured between themselves and pass.
    """
    inject(labc, "gpu02", "hardware_swap")
    wait_for("sshd back", lambda: podman("exec", container_name(NAME, "gpu02"), "systemctl", "is-active", "ssh",
                                         check=False).stdout.strip() == "active")
    run = verify(labc.cluster, tests=["links", "bandwidth", "gpudirect", "nccl"], write=False)
    not_run = [(c.name, c.node, c.error or "") for c in run.report.checks if not c.ran]
    assert [(n, h) for n, h, _ in not_run] == [("ssh", "gpu02")], not_run
    assert "host key CHANGED" in not_run[0][2] and "SHA256:" in not_run[0][2], not_run
    assert run.exit_code == 2 and not serious(run), show(run.report.findings())
    blamed = [f for f in run.report.findings() if "gpu02" in (f.node, f.peer) or "gpu02" in f.message]
    assert blamed == [], show(blamed)
    skipped = sorted((c.name, c.node, c.skipped or "") for c in run.report.checks if c.skipped is not None)
    assert [(n, h) for n, h, _ in skipped] == [("bandwidth", "gpu02"), ("fabric_load", "gpu02"),
                                               ("gpudirect_bandwidth", "gpu02"), ("nccl", "gpu02")], skipped
    assert all("gpu02 could not be reached" in why for _, _, why in skipped), skipped
    measured = {pair for rail in run.report.bandwidth.values() for pair in rail}
    assert measured and all("gpu02" not in pair for pair in measured), measured
    passed = {c.name for c in run.report.checks if c.passed and c.node is None}
    assert {"bandwidth", "gpudirect_bandwidth", "nccl"} <= passed, passed
